#!/usr/bin/env bash
# bench/compare's contract with the benches, without TensorFlow or timing
# anything: `bench/compare --list` names every workload, and a Capstan bench
# prints the RESULT line the harness reads for its workload (parse_example,
# the quickest). Figures are never checked: benches are not tests.
#
# Usage: tests/scripts/bench_compare_test.sh REPO_ROOT BIN_DIR
set -euo pipefail
repo=$(cd "$1" && pwd)
bin=$(cd "$2" && pwd)
out=$(mktemp)
trap 'rm -f "$out"' EXIT

fail() { echo "FAIL: $*" >&2; exit 1; }

CAPSTAN_BUILD_DIR=$(dirname "$bin") "$repo/bench/compare" --list > "$out" 2>&1 || { cat "$out"; fail "bench/compare --list failed"; }
for workload in closures closure_latency ps_pull sparse_gather tfrecord shuffle parse_example \
                data_service_small data_service_large census_ps; do
  grep -q "^$workload " "$out" || { cat "$out"; fail "bench/compare --list does not name '$workload'"; }
done
key=$(awk '$1 == "parse_example" {print $2}' "$out")
[[ -n $key ]] || fail "no RESULT key for parse_example in bench/compare --list"

"$bin/pipeline_bench" --only parse_example > "$out" 2>&1 || { cat "$out"; fail "pipeline_bench --only parse_example failed"; }
grep -Eq "^RESULT $key [0-9.e+]+ examples/s$" "$out" ||
  { cat "$out"; fail "pipeline_bench printed no 'RESULT $key <value> examples/s' line for bench/compare"; }
echo "ok: bench/compare lists 10 workloads; pipeline_bench prints the RESULT line '$key' it reads"
