#!/usr/bin/env bash
# scale_bench (docs/scaling.md's per-unit costs) runs end to end in its quick
# form: links to every daemon log in, fake workers register with the
# coordinator and answer its pings, fake data workers get their tasks and
# splits from the dispatcher, in memory and journaled; every RESULT line is
# printed, and processes are cleaned up. Figures are never checked: benches
# are not tests.
#
# Usage: tests/scripts/scale_bench_test.sh BIN_DIR
set -euo pipefail
bin=$(cd "$1" && pwd)
out=$(mktemp)
trap 'rm -f "$out"' EXIT

fail() { echo "FAIL: $*" >&2; exit 1; }

"$bin/scale_bench" --quick > "$out" 2>&1 || { cat "$out"; fail "scale_bench --quick failed"; }
for daemon in ps-server coordinator worker-server data-dispatcher data-worker; do
  grep -Eq "^RESULT kib_per_idle_link_$daemon -?[0-9.e+]+ KiB$" "$out" ||
    { cat "$out"; fail "no figure for an idle link to the $daemon"; }
done
for key in coordinator_kib_per_registered_worker dispatcher_kib_per_data_worker dispatcher_kib_per_data_worker_journaled \
           coordinator_cpu_us_per_worker_ping dispatcher_cpu_us_per_heartbeat dispatcher_cpu_us_per_split \
           dispatcher_cpu_us_per_split_journaled dispatcher_cpu_us_per_client_heartbeat_20_tasks \
           dispatcher_cpu_us_per_client_heartbeat_unchanged_20_tasks; do
  grep -Eq "^RESULT $key -?[0-9.e+]+ (KiB|us)$" "$out" || { cat "$out"; fail "no 'RESULT $key' line"; }
done
# The coordinator pinged the fake workers (they registered and it calls back).
pings=$(sed -nE 's/^([0-9]+) pings answered.*/\1/p' "$out")
[[ -n $pings && $pings -gt 0 ]] || { cat "$out"; fail "the coordinator pinged none of the registered fake workers"; }
# Every fake data worker got its task of the job.
grep -q "with 20 workers (one task each: 1)" "$out" || { cat "$out"; fail "the fake data workers were not given a task"; }
grep -Eq "^500 splits in" "$out" || { cat "$out"; fail "the dispatcher did not hand out 500 splits"; }
for program in ps-server coordinator worker-server data-dispatcher data-worker; do
  if pgrep -f "$bin/$program .*scale_bench" > /dev/null; then fail "a $program started by scale_bench is still running"; fi
done
echo "ok: scale_bench --quick measured every unit: links, workers, pings, heartbeats, splits"
