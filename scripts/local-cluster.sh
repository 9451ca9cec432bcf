#!/usr/bin/env bash
# Runs a whole Capstan cluster on this machine, on loopback, in the background:
# parameter servers, the coordinator, workers, the data dispatcher and data
# workers.
#
# Usage: scripts/local-cluster.sh up|down|status [options]
#   up       start the cluster; wait until every daemon answers /healthz;
#            print where each one listens and write RUN_DIR/cluster.env
#   down     stop every daemon of the cluster (SIGTERM, then SIGKILL after 10 s)
#   status   say which daemons are alive and run `capstanctl health` on them;
#            exit 0 when all are alive, 3 otherwise (also when none runs)
#
# Options:
#   --ps N             parameter servers (default 2)
#   --workers N        workers (default 2)
#   --data-workers N   data workers (default 1)
#   --run-dir DIR      logs, pids, port files and cluster.env go here
#                      (default: $CAPSTAN_RUN_DIR, else .run/cluster in the repo)
#   --bin-dir DIR      where the executables are
#                      (default: $CAPSTAN_BIN_DIR, else build/bin in the repo)
#   --base-port P      0 (default): every daemon picks free ports; otherwise
#                      daemon k (in start order) gets RPC port P+2k and HTTP
#                      port P+2k+1
#   --module PATH      a module (shared library of closures and dataset
#                      functions) that every worker and data worker loads
#                      (their --module); repeat it for several
#
# The coordinator is told the number of workers (--num-workers), so per-worker
# datasets are sharded for all of them however fast they register.
#
# Example: train with the CTR example's module on 2 PS and 2 workers:
#   scripts/local-cluster.sh up --module build/lib/libctr_module.so
#   . .run/cluster/cluster.env && build/bin/ctr --coordinator $COORDINATOR
#
# Layout of RUN_DIR: logs/NAME.log, pids/NAME.pid, ports/NAME.port (rpc_port,
# http_port, address, pid) and cluster.env, a shell fragment to `source`:
#   COORDINATOR=host:port PS_ADDRESSES=a,b WORKER_ADDRESSES=a,b
#   DISPATCHER=host:port DATA_WORKER_ADDRESSES=a ALL_ADDRESSES="a b c ..."
#
# Environment: the daemons inherit CAPSTAN_TOKEN (and CAPSTAN_TOKEN_FILE,
# CAPSTAN_LOG_LEVEL), so `CAPSTAN_TOKEN=secret scripts/local-cluster.sh up`
# starts a cluster that requires that token; keep it set for `status`
# (capstanctl reads it too). Other CAPSTAN_* variables and TF_CONFIG are not
# passed on: the script gives each daemon its address and peers itself.
set -euo pipefail

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
program=$(basename "$0")

usage() {
  sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '/^set -euo/d' -e 's/^# \{0,1\}//' >&2
  exit 2
}

die_usage() {
  echo "$program: $1" >&2
  echo "Run '$program --help' for usage." >&2
  exit 2
}

# --- Arguments ----------------------------------------------------------------
[[ $# -ge 1 ]] || usage
command=$1
shift
case "$command" in
  up | down | status) ;;
  -h | --help | help) usage ;;
  *) die_usage "unknown command '$command' (expected up, down or status)" ;;
esac

num_ps=2
num_workers=2
num_data_workers=1
run_dir=${CAPSTAN_RUN_DIR:-$repo_root/.run/cluster}
bin_dir=${CAPSTAN_BIN_DIR:-$repo_root/build/bin}
base_port=0
modules=()

need_value() {
  [[ $# -ge 2 && -n "$2" ]] || die_usage "option $1 needs a value"
}
need_number() {
  [[ "$2" =~ ^[0-9]+$ ]] || die_usage "option $1 needs a non-negative integer, got '$2'"
}

while [[ $# -gt 0 ]]; do
  case "$1" in
    --ps) need_value "$@"; need_number "$1" "$2"; num_ps=$2; shift 2 ;;
    --workers) need_value "$@"; need_number "$1" "$2"; num_workers=$2; shift 2 ;;
    --data-workers) need_value "$@"; need_number "$1" "$2"; num_data_workers=$2; shift 2 ;;
    --run-dir) need_value "$@"; run_dir=$2; shift 2 ;;
    --bin-dir) need_value "$@"; bin_dir=$2; shift 2 ;;
    --base-port) need_value "$@"; need_number "$1" "$2"; base_port=$2; shift 2 ;;
    --module) need_value "$@"; modules+=("$2"); shift 2 ;;
    --ps=* | --workers=* | --data-workers=* | --run-dir=* | --bin-dir=* | --base-port=* | --module=*)
      set -- "${1%%=*}" "${1#*=}" "${@:2}" ;;
    -h | --help) usage ;;
    *) die_usage "unknown option '$1'" ;;
  esac
done

[[ $num_ps -ge 1 ]] || die_usage "--ps must be at least 1"
(( base_port == 0 || (base_port >= 1024 && base_port <= 65000) )) ||
  die_usage "--base-port must be 0 or in 1024..65000, got $base_port"

# Modules go to the daemons as absolute paths: dlopen() looks a bare file name
# up in the library search path, not in the current directory.
module_flags=()
if [[ "$command" == up ]]; then
  for module in "${modules[@]+"${modules[@]}"}"; do
    [[ -f "$module" ]] || die_usage "--module: no such file '$module'"
    module_flags+=(--module "$(cd "$(dirname "$module")" && pwd)/$(basename "$module")")
  done
fi

if [[ "$command" == up ]]; then mkdir -p "$run_dir"; fi
if [[ -d "$run_dir" ]]; then run_dir=$(cd "$run_dir" && pwd); fi
if [[ -d "$bin_dir" ]]; then bin_dir=$(cd "$bin_dir" && pwd); fi
logs_dir=$run_dir/logs
pids_dir=$run_dir/pids
ports_dir=$run_dir/ports
env_file=$run_dir/cluster.env

# --- Helpers ------------------------------------------------------------------

# The executable a daemon NAME runs: ps0 -> ps-server, worker1 -> worker-server, ...
binary_of() {
  case "$1" in
    coordinator) echo coordinator ;;
    ps[0-9]*) echo ps-server ;;
    worker[0-9]*) echo worker-server ;;
    data-dispatcher) echo data-dispatcher ;;
    data-worker[0-9]*) echo data-worker ;;
    *) echo unknown ;;
  esac
}

# True when PID is alive and still runs NAME's executable (a pid file left
# over from before a reboot may name an unrelated process).
pid_alive() {
  local name=$1 pid=$2
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  kill -0 "$pid" 2>/dev/null || return 1
  if [[ -r /proc/$pid/cmdline ]]; then
    local cmdline
    cmdline=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null || true)
    # A zombie has an empty command line: not alive for our purposes.
    [[ "$cmdline" == *"$(binary_of "$name")"* ]] || return 1
  fi
  return 0
}

# Names of the daemons that have pid files, in start order (ps, coordinator,
# workers, dispatcher, data workers).
pid_file_names() {
  local f name
  local -a found=()
  [[ -d "$pids_dir" ]] || return 0
  for f in "$pids_dir"/*.pid; do
    [[ -e "$f" ]] || continue
    name=$(basename "$f" .pid)
    found+=("$name")
  done
  [[ ${#found[@]} -gt 0 ]] || return 0
  local pattern
  for pattern in 'ps[0-9]*' coordinator 'worker[0-9]*' data-dispatcher 'data-worker[0-9]*'; do
    for name in "${found[@]}"; do
      # shellcheck disable=SC2053  # the pattern is meant to glob
      if [[ "$name" == $pattern ]]; then echo "$name"; fi
    done | sort -V
  done
  for name in "${found[@]}"; do
    if [[ "$(binary_of "$name")" == unknown ]]; then echo "$name"; fi
  done
  return 0
}

read_pid() {
  local f=$pids_dir/$1.pid
  if [[ -r "$f" ]]; then tr -d ' \n' <"$f"; fi
}

# Value of KEY in a port file ("key: value" lines).
port_file_value() {
  sed -n "s/^$2: *//p" "$1" | head -n 1
}

# Stops the daemons named by the pid files, dependents first. Prints what it
# stopped unless QUIET=1.
stop_all() {
  local -a names=()
  local name pid i stopped=0
  mapfile -t names < <(pid_file_names)
  for (( i = ${#names[@]} - 1; i >= 0; i-- )); do
    name=${names[i]}
    pid=$(read_pid "$name")
    if pid_alive "$name" "$pid"; then
      kill -TERM "$pid" 2>/dev/null || true
      local waited=0
      while pid_alive "$name" "$pid" && (( waited < 100 )); do
        sleep 0.1
        waited=$(( waited + 1 ))
      done
      if pid_alive "$name" "$pid"; then
        kill -KILL "$pid" 2>/dev/null || true
        [[ "${QUIET:-0}" == 1 ]] || echo "stopped $name (pid $pid) with SIGKILL: it ignored SIGTERM for 10 s"
      else
        [[ "${QUIET:-0}" == 1 ]] || echo "stopped $name (pid $pid)"
      fi
      stopped=$(( stopped + 1 ))
    else
      [[ "${QUIET:-0}" == 1 ]] || echo "$name (pid ${pid:-?}) was not running"
    fi
    rm -f "$pids_dir/$name.pid" "$ports_dir/$name.port"
  done
  rm -f "$env_file"
  if [[ "${QUIET:-0}" != 1 ]]; then
    if [[ ${#names[@]} -eq 0 ]]; then
      echo "no cluster running in $run_dir"
    else
      echo "stopped $stopped daemon(s) of the cluster in $run_dir"
    fi
  fi
  return 0
}

# Prints the last lines of a daemon's log, indented.
log_tail() {
  local log=$logs_dir/$1.log
  if [[ -s "$log" ]]; then
    echo "--- last lines of $log:" >&2
    tail -n 20 "$log" | sed 's/^/    /' >&2
  else
    echo "--- $log is empty" >&2
  fi
}

fail_up() {
  echo "$program: $1" >&2
  [[ -n "${2:-}" ]] && log_tail "$2"
  echo "$program: stopping the daemons already started" >&2
  QUIET=1 stop_all
  exit 1
}

# The environment the daemons get: ours without the CAPSTAN_* variables that
# are not theirs (a daemon would take CAPSTAN_<KEY> for one of its keys, and
# log a warning for any other), and without TF_CONFIG (the script wires the
# cluster itself).
daemon_env=(env -u TF_CONFIG)
while IFS= read -r var; do
  case "$var" in
    CAPSTAN_TOKEN | CAPSTAN_TOKEN_FILE | CAPSTAN_LOG_LEVEL) ;;
    CAPSTAN_*) daemon_env+=(-u "$var") ;;
  esac
done < <(compgen -e)

# Global results of start_daemon.
started_address=
started_http_port=

declare -A daemon_address=()
declare -A daemon_http_port=()
declare -a daemon_order=()
next_port=$base_port

# start_daemon NAME [flags...]: starts NAME in the background, waits for its
# port file and records its address.
start_daemon() {
  local name=$1
  shift
  local binary
  binary=$(binary_of "$name")
  local exe=$bin_dir/$binary
  local log=$logs_dir/$name.log
  local port_file=$ports_dir/$name.port
  local rpc_port=0 http_port=0
  if (( base_port != 0 )); then
    rpc_port=$next_port
    http_port=$(( next_port + 1 ))
    next_port=$(( next_port + 2 ))
  fi
  rm -f "$port_file" "$port_file.tmp"
  {
    echo "=== $(date '+%Y-%m-%dT%H:%M:%S') $exe --host 127.0.0.1 --port $rpc_port" \
         "--http-port $http_port --port-file $port_file $*"
  } >>"$log"
  # setsid: the daemons outlive this script and the terminal that ran it.
  local -a launcher=()
  if command -v setsid >/dev/null 2>&1; then launcher=(setsid); fi
  "${daemon_env[@]}" "${launcher[@]}" "$exe" --host 127.0.0.1 --port "$rpc_port" \
    --http-port "$http_port" --port-file "$port_file" "$@" </dev/null >>"$log" 2>&1 &
  local pid=$!
  echo "$pid" >"$pids_dir/$name.pid"
  daemon_order+=("$name")

  local waited=0
  while [[ ! -s "$port_file" ]]; do
    if ! kill -0 "$pid" 2>/dev/null; then
      local rc=0
      wait "$pid" 2>/dev/null || rc=$?
      fail_up "$name ($binary) exited with status $rc while starting" "$name"
    fi
    if (( waited >= 150 )); then
      fail_up "$name ($binary) wrote no port file ($port_file) within 15 s" "$name"
    fi
    sleep 0.1
    waited=$(( waited + 1 ))
  done
  local file_pid
  file_pid=$(port_file_value "$port_file" pid)
  if [[ -n "$file_pid" && "$file_pid" != "$pid" ]]; then
    # setsid forked (it does when it would otherwise lead a process group).
    pid=$file_pid
    echo "$pid" >"$pids_dir/$name.pid"
  fi
  started_address=$(port_file_value "$port_file" address)
  started_http_port=$(port_file_value "$port_file" http_port)
  if [[ -z "$started_address" || -z "$started_http_port" ]]; then
    fail_up "$name: cannot read address and http_port from $port_file" "$name"
  fi
  daemon_address[$name]=$started_address
  daemon_http_port[$name]=$started_http_port
}

join_by() {
  local sep=$1
  shift
  local out="" item
  for item in "$@"; do out+="${out:+$sep}$item"; done
  echo "$out"
}

# --- Commands -----------------------------------------------------------------

cmd_up() {
  local name pid
  local -a running=()
  while IFS= read -r name; do
    pid=$(read_pid "$name")
    if pid_alive "$name" "$pid"; then running+=("$name (pid $pid)"); fi
  done < <(pid_file_names)
  if [[ ${#running[@]} -gt 0 ]]; then
    echo "$program: a cluster is already running in $run_dir: ${running[*]}" >&2
    echo "$program: stop it with: $0 down --run-dir $run_dir" >&2
    exit 1
  fi
  # Leftovers of a cluster that died on its own.
  QUIET=1 stop_all

  local binary
  for binary in ps-server coordinator worker-server data-dispatcher data-worker capstanctl; do
    [[ -x "$bin_dir/$binary" ]] ||
      { echo "$program: $bin_dir/$binary not found; build first (scripts/build.sh) or pass --bin-dir" >&2; exit 1; }
  done
  mkdir -p "$logs_dir" "$pids_dir" "$ports_dir"

  local i
  local -a ps_addresses=() worker_addresses=() data_worker_addresses=()
  for (( i = 0; i < num_ps; i++ )); do
    start_daemon "ps$i" --task-index "$i"
    ps_addresses+=("$started_address")
  done
  local -a coordinator_flags=(--ps "$(join_by , "${ps_addresses[@]}")")
  if (( num_workers > 0 )); then coordinator_flags+=(--num-workers "$num_workers"); fi
  start_daemon coordinator "${coordinator_flags[@]}"
  local coordinator=$started_address
  for (( i = 0; i < num_workers; i++ )); do
    start_daemon "worker$i" --task-index "$i" --coordinator "$coordinator" \
      "${module_flags[@]+"${module_flags[@]}"}"
    worker_addresses+=("$started_address")
  done
  start_daemon data-dispatcher
  local dispatcher=$started_address
  for (( i = 0; i < num_data_workers; i++ )); do
    start_daemon "data-worker$i" --task-index "$i" --dispatcher "$dispatcher" \
      "${module_flags[@]+"${module_flags[@]}"}"
    data_worker_addresses+=("$started_address")
  done

  # Every daemon must answer /healthz (its RPC port is then listening).
  local -a pending=("${daemon_order[@]}")
  local deadline=$(( SECONDS + 30 ))
  while [[ ${#pending[@]} -gt 0 ]]; do
    local -a still=()
    for name in "${pending[@]}"; do
      pid=$(read_pid "$name")
      if ! pid_alive "$name" "$pid"; then
        fail_up "$name (pid $pid) exited after start" "$name"
      fi
      if ! curl -fsS --max-time 2 -o /dev/null "http://127.0.0.1:${daemon_http_port[$name]}/healthz" 2>/dev/null; then
        still+=("$name")
      fi
    done
    pending=("${still[@]+"${still[@]}"}")
    [[ ${#pending[@]} -eq 0 ]] && break
    if (( SECONDS >= deadline )); then
      fail_up "no 200 from /healthz within 30 s: ${pending[*]}" "${pending[0]}"
    fi
    sleep 0.2
  done

  local all
  all=$(join_by ' ' "${ps_addresses[@]}" "$coordinator" "${worker_addresses[@]+"${worker_addresses[@]}"}" \
    "$dispatcher" "${data_worker_addresses[@]+"${data_worker_addresses[@]}"}")
  {
    echo "# Written by scripts/local-cluster.sh up on $(date '+%Y-%m-%dT%H:%M:%S'); source it."
    echo "RUN_DIR=$(printf '%q' "$run_dir")"
    echo "BIN_DIR=$(printf '%q' "$bin_dir")"
    echo "COORDINATOR=$coordinator"
    echo "PS_ADDRESSES=$(join_by , "${ps_addresses[@]}")"
    echo "WORKER_ADDRESSES=$(join_by , "${worker_addresses[@]+"${worker_addresses[@]}"}")"
    echo "DISPATCHER=$dispatcher"
    echo "DATA_WORKER_ADDRESSES=$(join_by , "${data_worker_addresses[@]+"${data_worker_addresses[@]}"}")"
    echo "ALL_ADDRESSES=\"$all\""
  } >"$env_file"

  printf '%-16s %-22s %-10s %s\n' NAME RPC_ADDRESS HTTP_PORT PID
  for name in "${daemon_order[@]}"; do
    printf '%-16s %-22s %-10s %s\n' "$name" "${daemon_address[$name]}" \
      "${daemon_http_port[$name]}" "$(read_pid "$name")"
  done
  echo
  echo "cluster up: ${#daemon_order[@]} daemons${CAPSTAN_TOKEN:+ (token required)}"
  echo "logs:       $logs_dir/NAME.log"
  echo "addresses:  $env_file (source it; e.g. $bin_dir/capstanctl health \$ALL_ADDRESSES)"
  echo "status:     $0 status --run-dir $run_dir"
  echo "stop:       $0 down --run-dir $run_dir"
}

cmd_down() {
  stop_all
}

cmd_status() {
  local -a names=()
  mapfile -t names < <(pid_file_names)
  if [[ ${#names[@]} -eq 0 ]]; then
    echo "no cluster running in $run_dir"
    exit 3
  fi
  local name pid alive=0 dead=0 address
  local -a addresses=()
  printf '%-16s %-8s %-22s %s\n' NAME PID RPC_ADDRESS STATE
  for name in "${names[@]}"; do
    pid=$(read_pid "$name")
    address=
    [[ -r "$ports_dir/$name.port" ]] && address=$(port_file_value "$ports_dir/$name.port" address)
    if pid_alive "$name" "$pid"; then
      printf '%-16s %-8s %-22s %s\n' "$name" "$pid" "${address:--}" alive
      alive=$(( alive + 1 ))
      [[ -n "$address" ]] && addresses+=("$address")
    else
      printf '%-16s %-8s %-22s %s\n' "$name" "${pid:--}" "${address:--}" "NOT RUNNING (log: $logs_dir/$name.log)"
      dead=$(( dead + 1 ))
    fi
  done
  echo
  if [[ ${#addresses[@]} -gt 0 ]]; then
    local ctl=$bin_dir/capstanctl
    if [[ ! -x "$ctl" && -r "$env_file" ]]; then
      local env_bin
      # shellcheck disable=SC1090  # written by cmd_up
      env_bin=$(. "$env_file" && echo "${BIN_DIR:-}")
      if [[ -x "$env_bin/capstanctl" ]]; then ctl=$env_bin/capstanctl; fi
    fi
    if [[ -x "$ctl" ]]; then
      "${daemon_env[@]}" "$ctl" health "${addresses[@]}" ||
        echo "capstanctl health reported a failure (see above)"
      echo
    else
      echo "($ctl not found: skipping capstanctl health)"
    fi
  fi
  echo "$alive alive, $dead not running (run dir $run_dir)"
  [[ $dead -eq 0 ]] || exit 3
  exit 0
}

case "$command" in
  up) cmd_up ;;
  down) cmd_down ;;
  status) cmd_status ;;
esac
