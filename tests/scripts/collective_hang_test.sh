#!/usr/bin/env bash
# A hung rank is named (issue 36): census trains in strategy mode on 3
# workers (a 3-rank group, collective deadline 3 s); worker 2 is stopped
# (SIGSTOP) between steps, so the next step's all-reduce never hears from
# it. The
# survivors' deadline error must name its rank, with their flight records
# of the group in their logs ("the group's last ... operation(s)"), and
# `capstanctl dump` must name worker 2 as not answering (exit 1) while it
# prints the others' records, the failed collective among them.
#
# Usage: tests/scripts/collective_hang_test.sh REPO_ROOT BIN_DIR MODULE PROGRAM
set -euo pipefail

if [[ $# -ne 4 ]]; then
  echo "usage: $0 REPO_ROOT BIN_DIR MODULE PROGRAM" >&2
  exit 2
fi
# shellcheck source=tests/scripts/local_cluster.sh
. "$(dirname "$0")/local_cluster.sh" "$1" "$2"
module=$3
program=$4

if ! bash "$script" up --run-dir "$run_dir" --bin-dir "$bin_dir" --ps 1 --workers 3 --data-workers 0 \
  --module "$module"; then
  result fail "local-cluster.sh up failed"
fi
# shellcheck disable=SC1091  # written by local-cluster.sh
. "$run_dir/cluster.env"

census_pid=
stopped_pid=
# shellcheck disable=SC2317  # run by the EXIT trap
stop_all() {
  if [[ -n ${coordinator_pid:-} ]]; then kill -CONT "$coordinator_pid" 2>/dev/null || true; fi
  if [[ -n $stopped_pid ]]; then kill -CONT "$stopped_pid" 2>/dev/null || true; fi
  if [[ -n $census_pid ]]; then kill "$census_pid" 2>/dev/null || true; wait "$census_pid" 2>/dev/null || true; fi
}
# shellcheck disable=SC2154  # test_status is set by the trap itself
trap 'test_status=$?; stop_all; set +e; (exit $test_status); cleanup' EXIT TERM

"$program" --coordinator "$COORDINATOR" --data-dir "$repo_root/examples/census/data" --target-accuracy 0.5 \
  --target-auc 0.5 --model eigen --seed 1 --mode strategy --epochs 40 --min-workers 3 --log-every 1000 \
  --collective-timeout-ms 3000 >"$run_dir/census.out" 2>&1 &
census_pid=$!

# Steady: every worker has run 20 steps.
for _ in $(seq 1 120); do
  sleep 0.5
  kill -0 "$census_pid" 2>/dev/null || { cat "$run_dir/census.out"; result fail "census exited early"; }
  "$bin_dir/capstanctl" status "$COORDINATOR" 2>/dev/null | awk '$1 ~ /^[0-9]+$/ && $3 >= 20 { n++ } END { exit n == 3 ? 0 : 1 }' &&
    break
done
strategy=census-strategy
"$bin_dir/capstanctl" replicas "$COORDINATOR" "$strategy" >"$run_dir/replicas.out" 2>&1 || true
cat "$run_dir/replicas.out"
rank=$(awk '$1 ~ /^[0-9]+$/ && $3 == 2 { print $1 }' "$run_dir/replicas.out")
[[ -n $rank ]] || result fail "worker 2 holds no replica of $strategy"

# Stopped between steps, so that the others enter the next all-reduce
# without it: the coordinator is paused first (no step is dispatched), the
# step in flight finishes on every worker, worker 2 stops, and the
# coordinator goes on to dispatch the next step. (Stopped at a random
# moment, worker 2 might have done its part of the step's collectives and
# hang before it answers: the coordinator, not a collective, then notices,
# when its ping goes unanswered.)
coordinator_pid=$(cat "$run_dir/pids/coordinator.pid")
stopped_pid=$(cat "$run_dir/pids/worker2.pid")
kill -STOP "$coordinator_pid"
sleep 0.3
kill -STOP "$stopped_pid"
kill -CONT "$coordinator_pid"
echo "worker 2 (rank $rank, pid $stopped_pid) stopped between steps"

# The survivors' deadline error names the rank, with the group's records.
named=
for _ in $(seq 1 60); do
  sleep 0.5
  for log in "$run_dir/logs/worker0.log" "$run_dir/logs/worker1.log"; do
    if grep -Eq "rank\(s\) ([0-9]+, )*$rank(, [0-9]+)* stopped responding or died" "$log" &&
      grep -q "the group's last [0-9]* operation(s) here (flight recorder)" "$log"; then
      named=$log
      break 2
    fi
  done
done
[[ -n $named ]] || result fail "no survivor's log names rank $rank with the group's flight records within 30 s"
echo "--- $named"
grep -B 1 -A 17 "the group's last" "$named" | cut -c1-260 | sed -n 1,20p
records=$(grep -A 16 "the group's last" "$named")  # whole first: grep -q leaving early breaks a pipe
grep -Eq "collective [a-z_]+  failed in .*rank\(s\) ([0-9]+, )*$rank stopped" <<<"$records" ||
  result fail "the survivor's flight records do not show the failed all-reduce naming rank $rank"

# capstanctl dump: worker 2 does not answer; the others print their records.
status=0
"$bin_dir/capstanctl" --timeout-ms 3000 dump --last 4096 "$COORDINATOR" >"$run_dir/dump.out" 2>&1 || status=$?
grep -E '^(==|NO ANSWER)' "$run_dir/dump.out"
[[ $status -eq 1 ]] || result fail "capstanctl dump exited $status with a worker stopped, expected 1"
grep -q "^NO ANSWER: worker:2 " "$run_dir/dump.out" || result fail "capstanctl dump does not name worker 2 as not answering"
for who in coordinator ps:0 worker:0 worker:1; do
  grep -q "^== $who .* record(s) kept" "$run_dir/dump.out" || result fail "capstanctl dump has no records of $who"
done
grep -Eq "collective [a-z_]+  failed in .*rank\(s\) ([0-9]+, )*$rank stopped" "$run_dir/dump.out" ||
  result fail "capstanctl dump shows no failed all-reduce naming rank $rank"

kill -CONT "$stopped_pid"
stopped_pid=
result pass "worker 2 (rank $rank) stopped: the survivors' deadline error, their flight records and capstanctl dump name it"
