#!/usr/bin/env bash
# A timeline of the whole cluster (issue 36): the census example trains on a
# local cluster (1 parameter server, 2 workers) with --trace, which records
# 12 s of every daemon and the program itself, from 0.5 s after its first
# step, into one Chrome trace; the file
# must pass check_trace.py (every event has ph/ts/pid/tid, durations nest,
# async RPCs pair, flows link a closure's schedule on the program to its
# run on a worker), name each process and hold closures, phases, RPCs and
# schedules (at least one flow: a flow needs a closure's schedule and its
# run both in the window, and census keeps 32 closures in flight, which a
# loaded sanitizer build takes seconds to run: 3 s once held none). Then
# census trains in strategy mode (the workers as
# MirroredStrategy's replicas) while `capstanctl trace` records 2 s: steps
# and collectives with their sequence numbers; `capstanctl dump` prints
# every daemon's flight records; a bad request gets a clear error.
#
# Usage: tests/scripts/trace_test.sh REPO_ROOT BIN_DIR MODULE PROGRAM
set -euo pipefail

if [[ $# -ne 4 ]]; then
  echo "usage: $0 REPO_ROOT BIN_DIR MODULE PROGRAM" >&2
  exit 2
fi
# shellcheck source=tests/scripts/local_cluster.sh
. "$(dirname "$0")/local_cluster.sh" "$1" "$2"
module=$3
program=$4
check="python3 $repo_root/tests/scripts/check_trace.py"

if ! bash "$script" up --run-dir "$run_dir" --bin-dir "$bin_dir" --ps 1 --workers 2 --data-workers 0 \
  --module "$module"; then
  result fail "local-cluster.sh up failed"
fi
# shellcheck disable=SC1091  # written by local-cluster.sh
. "$run_dir/cluster.env"

census_pid=
# shellcheck disable=SC2317  # run by the EXIT trap
stop_census() {
  if [[ -n $census_pid ]]; then kill "$census_pid" 2>/dev/null || true; wait "$census_pid" 2>/dev/null || true; fi
}
# shellcheck disable=SC2154  # test_status is set by the trap itself
trap 'test_status=$?; stop_census; set +e; (exit $test_status); cleanup' EXIT TERM

data=(--data-dir "$repo_root/examples/census/data" --target-accuracy 0.5 --target-auc 0.5 --model eigen --seed 1)

# 1. census --trace: the cluster and the program, flows from schedule to run.
echo "--- census (ps mode) with --trace"
if ! "$program" --coordinator "$COORDINATOR" "${data[@]}" --mode ps --epochs 3 --min-workers 2 --log-every 1000 \
  --trace "$run_dir/census.json" --trace-after 0.5 --trace-seconds 12 >"$run_dir/census.out" 2>&1; then
  cat "$run_dir/census.out"
  result fail "census with --trace failed"
fi
grep 'trace' "$run_dir/census.out"
[[ -s $run_dir/census.json ]] || { cat "$run_dir/census.out"; result fail "census --trace wrote no file"; }
$check "$run_dir/census.json" --processes census,coordinator,ps:0,worker:0,worker:1 \
  --kinds closure,phase,rpc,schedule --flows 1 || result fail "the census trace is not a valid cluster trace"

# 2. capstanctl trace while the strategy trains: steps and collectives (a
# fresh cluster: the variables of ps mode hold the names).
echo "--- census (strategy mode) and capstanctl trace"
bash "$script" down --run-dir "$run_dir" --bin-dir "$bin_dir" >/dev/null
if ! bash "$script" up --run-dir "$run_dir" --bin-dir "$bin_dir" --ps 1 --workers 2 --data-workers 0 \
  --module "$module" >/dev/null; then
  result fail "local-cluster.sh up (again) failed"
fi
# shellcheck disable=SC1091  # written by local-cluster.sh
. "$run_dir/cluster.env"
"$program" --coordinator "$COORDINATOR" "${data[@]}" --mode strategy --epochs 40 --min-workers 2 --log-every 1000 \
  >"$run_dir/strategy.out" 2>&1 &
census_pid=$!
for _ in $(seq 1 120); do
  sleep 0.5
  kill -0 "$census_pid" 2>/dev/null || { cat "$run_dir/strategy.out"; result fail "census (strategy) exited early"; }
  "$bin_dir/capstanctl" status "$COORDINATOR" 2>/dev/null | awk '$1 ~ /^[0-9]+$/ && $3 >= 20 { n++ } END { exit n == 2 ? 0 : 1 }' &&
    break
done
"$bin_dir/capstanctl" trace --seconds 2 --out "$run_dir/strategy.json" "$COORDINATOR" ||
  result fail "capstanctl trace failed"
$check "$run_dir/strategy.json" --processes coordinator,ps:0,worker:0,worker:1 --kinds step,collective,rpc,phase ||
  result fail "the strategy trace is not a valid cluster trace"
python3 - "$run_dir/strategy.json" <<'PY' || result fail "the collectives do not carry their group, rank and sequence number"
import json, re, sys
events = json.load(open(sys.argv[1]))["traceEvents"]
collectives = [e for e in events if e.get("cat") == "collective"]
pattern = re.compile(r"^generation \d+, rank [01] of 2, seq \d+")
bad = [e for e in collectives if not pattern.match(e.get("args", {}).get("detail", ""))]
if bad:
    print("collective without group/rank/seq:", bad[0])
    sys.exit(1)
print(f"{len(collectives)} collectives, e.g. {collectives[0]['name']}: {collectives[0]['args']['detail']}")
PY

# 3. capstanctl dump: every daemon's flight records.
"$bin_dir/capstanctl" dump --last 300 "$COORDINATOR" >"$run_dir/dump.out" 2>&1 ||
  { cat "$run_dir/dump.out"; result fail "capstanctl dump failed with every daemon up"; }
head -n 40 "$run_dir/dump.out"
for who in coordinator ps:0 worker:0 worker:1; do
  grep -q "^== $who " "$run_dir/dump.out" || result fail "capstanctl dump has no section for $who"
done
grep -Eq 'step census_sync_step  finished in' "$run_dir/dump.out" ||
  result fail "the workers' flight records show no finished step"

# 4. Bad requests: clear errors, the daemons stay up.
if out=$("$bin_dir/capstanctl" trace --seconds 0 --out "$run_dir/x.json" "$COORDINATOR" 2>&1); then
  result fail "capstanctl trace --seconds 0 succeeded"
fi
grep -q 'at most 600 seconds, not 0' <<<"$out" || { echo "$out"; result fail "--seconds 0 was not refused clearly"; }
"$bin_dir/capstanctl" health "$COORDINATOR" >/dev/null || result fail "the coordinator is down after a bad trace request"

stop_census
census_pid=
result pass "census --trace and capstanctl trace: valid Chrome traces of the cluster; capstanctl dump prints every daemon"
