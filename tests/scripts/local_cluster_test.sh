#!/usr/bin/env bash
# Checks scripts/local-cluster.sh end to end: up, status, capstanctl health of
# every role, down, and status after down.
#
# Usage: tests/scripts/local_cluster_test.sh REPO_ROOT BIN_DIR   (run by CTest)
set -euo pipefail

if [[ $# -ne 2 ]]; then
  echo "usage: $0 REPO_ROOT BIN_DIR" >&2
  exit 2
fi
# shellcheck source=tests/scripts/local_cluster.sh
. "$(dirname "$0")/local_cluster.sh" "$1" "$2"
ctl=$bin_dir/capstanctl

passed=0
failed=0
pass() { echo "PASS: $1"; passed=$(( passed + 1 )); }
fail() { echo "FAIL: $1"; failed=$(( failed + 1 )); }

# Alive, and not a zombie waiting for a parent (or an init) to reap it.
running() {
  kill -0 "$1" 2>/dev/null || return 1
  local state
  state=$(ps -o stat= -p "$1" 2>/dev/null || true)
  [[ -n "$state" && "$state" != Z* ]]
}

finish() {
  echo "local_cluster_test: $passed passed, $failed failed"
  [[ $failed -eq 0 ]]
}

lc() { bash "$script" "$1" --run-dir "$run_dir" --bin-dir "$bin_dir" "${@:2}"; }

# --- up -------------------------------------------------------------------------
up_status=0
lc up || up_status=$?
if [[ $up_status -eq 0 ]]; then
  pass "local-cluster.sh up exits 0"
else
  fail "local-cluster.sh up exited $up_status"
  show_logs
  finish
  exit 1
fi

if [[ -r "$run_dir/cluster.env" ]]; then
  pass "up writes cluster.env"
else
  fail "up wrote no $run_dir/cluster.env"
  finish
  exit 1
fi
# shellcheck disable=SC1091  # written by local-cluster.sh
. "$run_dir/cluster.env"
for var in COORDINATOR PS_ADDRESSES WORKER_ADDRESSES DISPATCHER DATA_WORKER_ADDRESSES ALL_ADDRESSES; do
  if [[ -n "${!var:-}" ]]; then pass "cluster.env sets $var"; else fail "cluster.env lacks $var"; fi
done
read -r -a all_addresses <<<"${ALL_ADDRESSES:-}"
if [[ ${#all_addresses[@]} -eq 7 ]]; then
  pass "ALL_ADDRESSES lists 7 daemons"
else
  fail "ALL_ADDRESSES lists ${#all_addresses[@]} daemons, expected 7: ${ALL_ADDRESSES:-}"
fi

pids=()
for pid_file in "$run_dir"/pids/*.pid; do
  [[ -e "$pid_file" ]] && pids+=("$(cat "$pid_file")")
done
if [[ ${#pids[@]} -eq 7 ]]; then
  pass "up writes 7 pid files"
else
  fail "up wrote ${#pids[@]} pid files, expected 7"
fi

# --- status ---------------------------------------------------------------------
status_rc=0
lc status >/dev/null || status_rc=$?
if [[ $status_rc -eq 0 ]]; then pass "status exits 0 while the cluster runs"; else fail "status exited $status_rc while the cluster runs"; fi

# --- capstanctl health: every role, all ready --------------------------------------
# Workers and data workers become ready once they reach their peers: poll.
health_ok=0
health_out=
deadline=$(( SECONDS + 20 ))
while :; do
  health_rc=0
  # stderr apart: the table is parsed by line (a sanitizer build may print
  # notes there).
  health_out=$("$ctl" health "${all_addresses[@]}" 2>"$run_dir/health.err") || health_rc=$?
  if [[ $health_rc -eq 0 ]]; then
    missing=
    for role in coordinator ps worker data_dispatcher data_worker; do
      awk -v r="$role" 'NR > 1 && $2 == r { found = 1 } END { exit !found }' <<<"$health_out" ||
        missing+=" $role"
    done
    not_ready=$(awk 'NR > 1 && $6 != "yes"' <<<"$health_out")
    rows=$(awk 'NR > 1' <<<"$health_out" | wc -l)
    if [[ -z "$missing" && -z "$not_ready" && $rows -eq ${#all_addresses[@]} ]]; then
      health_ok=1
      break
    fi
  fi
  (( SECONDS < deadline )) || break
  sleep 0.5
done
if [[ $health_ok -eq 1 ]]; then
  pass "capstanctl health lists coordinator, ps, worker, data_dispatcher, data_worker, all READY yes"
else
  fail "capstanctl health did not show all five roles ready within 20 s:"
  echo "$health_out"
  cat "$run_dir/health.err"
  show_logs
fi

# --- down -------------------------------------------------------------------------
down_rc=0
lc down || down_rc=$?
if [[ $down_rc -eq 0 ]]; then pass "down exits 0"; else fail "down exited $down_rc"; fi

left=()
for pid in "${pids[@]}"; do
  if running "$pid"; then left+=("$pid"); fi
done
if [[ ${#left[@]} -eq 0 ]]; then pass "down stops every daemon"; else fail "still running after down: ${left[*]}"; fi

if compgen -G "$run_dir/pids/*.pid" >/dev/null; then
  fail "down left pid files: $(ls "$run_dir/pids")"
else
  pass "down removes the pid files"
fi

status_rc=0
lc status >/dev/null || status_rc=$?
if [[ $status_rc -eq 3 ]]; then pass "status exits 3 after down"; else fail "status exited $status_rc after down, expected 3"; fi

down_rc=0
lc down >/dev/null || down_rc=$?
if [[ $down_rc -eq 0 ]]; then pass "down with nothing running exits 0"; else fail "second down exited $down_rc"; fi

finish
