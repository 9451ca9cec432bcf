#!/usr/bin/env bash
# A straggler is named: the census example trains on a local cluster of 3
# workers in MODE (ps: closures on the parameter servers; strategy: the 3
# workers are MirroredStrategy's replicas) while worker 2 is stopped and
# continued in bursts (SIGSTOP 0.5 s, SIGCONT 0.25 s). Within 30 s of the
# first burst, `capstanctl status` must show worker 2 with the highest
# straggler score (at least 1.5), the coordinator's log must name it once
# from then on ("worker 2 is a straggler"), its score must be on the coordinator's
# /metrics, and where the time went must be on the workers' /metrics and in
# the program's progress line.
#
# Usage: tests/scripts/straggler_test.sh REPO_ROOT BIN_DIR MODULE PROGRAM ps|strategy [TORCH_MODULE]
set -euo pipefail

if [[ $# -ne 5 && $# -ne 6 ]]; then
  echo "usage: $0 REPO_ROOT BIN_DIR MODULE PROGRAM ps|strategy [TORCH_MODULE]" >&2
  exit 2
fi
# shellcheck source=tests/scripts/local_cluster.sh
. "$(dirname "$0")/local_cluster.sh" "$1" "$2"
module=$3
program=$4
mode=$5
modules=(--module "$module")
if [[ -n ${6:-} ]]; then modules+=(--module "$6"); fi

if ! bash "$script" up --run-dir "$run_dir" --bin-dir "$bin_dir" --ps 1 --workers 3 --data-workers 0 \
  "${modules[@]}"; then
  result fail "local-cluster.sh up failed"
fi
# shellcheck disable=SC1091  # written by local-cluster.sh
. "$run_dir/cluster.env"

census_pid=
burst_pid=
# shellcheck disable=SC2317  # run by the EXIT trap
stop_all() {
  if [[ -n $burst_pid ]]; then kill "$burst_pid" 2>/dev/null || true; wait "$burst_pid" 2>/dev/null || true; fi
  if [[ -n ${straggler_pid:-} ]]; then kill -CONT "$straggler_pid" 2>/dev/null || true; fi
  if [[ -n $census_pid ]]; then kill "$census_pid" 2>/dev/null || true; wait "$census_pid" 2>/dev/null || true; fi
}
# shellcheck disable=SC2154  # test_status is set by the trap itself
trap 'test_status=$?; stop_all; set +e; (exit $test_status); cleanup' EXIT TERM

# Epochs enough to outlast a slow machine's settling (it is stopped at the end).
census_args=(--mode "$mode" --model eigen --epochs 200 --min-workers 3 --seed 1 --log-every 20)
"$program" --coordinator "$COORDINATOR" --data-dir "$repo_root/examples/census/data" \
  --target-accuracy 0.5 --target-auc 0.5 "${census_args[@]}" >"$run_dir/census.out" 2>&1 &
census_pid=$!

status_of() { "$bin_dir/capstanctl" status "$COORDINATOR" 2>&1 || true; }

# The bursts start once training is steady: every worker has a score and
# has run 100 closures or steps, and (for up to 60 s more) none is slow: the
# first runs, slower, weigh in the averages for some seconds. On a machine
# busy with other work a score may stay above 1.3; the bursts start anyway.
scored=0
for _ in $(seq 1 150); do
  sleep 1
  kill -0 "$census_pid" 2>/dev/null || { cat "$run_dir/census.out"; result fail "census exited early"; }
  scored=$(status_of | awk '$1 ~ /^[0-9]+$/ && $3 >= 100 && $5 ~ /^[0-9.]+$/ { n++ } END { print n + 0 }')
  [[ $scored -eq 3 ]] && break
done
[[ $scored -eq 3 ]] || { status_of; result fail "the 3 workers had not run 100 times each with a score after 150 s"; }
for _ in $(seq 1 60); do
  settled=$(status_of | awk '$1 ~ /^[0-9]+$/ && $5 ~ /^[0-9.]+$/ && $5 < 1.3 { n++ } END { print n + 0 }')
  [[ $settled -eq 3 ]] && break
  sleep 1
done
echo "--- before the bursts"
status_of
# What the coordinator logs from here on (a worker slowed by the machine
# before the bursts may have been named already, and recovered).
log=$run_dir/logs/coordinator.log
lines_before=$(wc -l <"$log")
named_since() { tail -n "+$((lines_before + 1))" "$log" | grep -c "worker 2 is a straggler" || true; }

straggler_pid=$(cat "$run_dir/pids/worker2.pid")
(
  while true; do
    kill -STOP "$straggler_pid" 2>/dev/null || exit 0
    sleep 0.5
    kill -CONT "$straggler_pid" 2>/dev/null || exit 0
    sleep 0.25
  done
) &
burst_pid=$!

named=0
bursts_began=$SECONDS
while ((SECONDS - bursts_began < 30)); do
  sleep 1
  top=$(status_of | awk '$1 ~ /^[0-9]+$/ && $5 ~ /^[0-9.]+$/ { if ($5 > best) { best = $5; task = $1 } }
                         END { if (best >= 1.5) print task }')
  if [[ $top == 2 ]] && [[ $(named_since) -ge 1 ]]; then
    named=$((SECONDS - bursts_began))
    break
  fi
done
echo "--- after the bursts"
status_of
[[ $named -gt 0 ]] || result fail "worker 2 was not named the straggler with the highest score within 30 s"
echo "worker 2 named the straggler after $named s of bursts"
if [[ $(named_since) -ne 1 ]]; then
  result fail "the coordinator's log names worker 2 $(named_since) times while it is slowed, not once"
fi

coordinator_http=$(sed -n "s/^http_port: //p" "$run_dir/ports/coordinator.port")
worker_http=$(sed -n "s/^http_port: //p" "$run_dir/ports/worker0.port")
metrics=$(curl -fsS "http://127.0.0.1:$coordinator_http/metrics")
grep -q 'capstan_coordinator_straggler_score{worker="2"}' <<<"$metrics" ||
  result fail "the coordinator's /metrics has no straggler score for worker 2"
grep -q 'capstan_coordinator_worker_phase_seconds_count{phase="input",worker="2"}' <<<"$metrics" ||
  result fail "the coordinator's /metrics has no phase histogram for worker 2"
# Read whole before grep -q: with pipefail, grep leaving early would fail
# curl's write (exit 23) and the pipeline with it.
worker_metrics=$(curl -fsS "http://127.0.0.1:$worker_http/metrics")
grep -q 'capstan_worker_phase_seconds_count{phase="compute"}' <<<"$worker_metrics" ||
  result fail "worker 0's /metrics has no phase histogram"
grep -Eq 'compute [0-9]+%' "$run_dir/census.out" ||
  { cat "$run_dir/census.out"; result fail "the progress line does not say where the time went"; }
result pass "$mode mode: worker 2 (SIGSTOP bursts) named the straggler with the highest score after $named s"
