#!/usr/bin/env bash
# bench/compare's contract with the benches, without TensorFlow or timing
# anything: `bench/compare --list` names every workload with its peer, and
# Capstan's benches print the RESULT lines the harness reads (parse_example,
# the quickest TensorFlow row; a 4-byte all-reduce, a Gloo and PyTorch
# row; DDP, PyTorch's, where LibTorch is built). Figures are never checked: benches are not tests.
#
# Usage: tests/scripts/bench_compare_test.sh REPO_ROOT BIN_DIR
set -euo pipefail
repo=$(cd "$1" && pwd)
bin=$(cd "$2" && pwd)
out=$(mktemp)
list=$(mktemp)
trap 'rm -f "$out" "$list"' EXIT

fail() { echo "FAIL: $*" >&2; exit 1; }

CAPSTAN_BUILD_DIR=$(dirname "$bin") "$repo/bench/compare" --list > "$list" 2>&1 || { cat "$list"; fail "bench/compare --list failed"; }
for workload in "closures tf" "closure_latency tf" "ps_pull tf" "sparse_gather tf" "tfrecord tf" "shuffle tf" \
                "parse_example tf" "data_service_small tf" "data_service_large tf" "census_ps tf" \
                "allreduce_4b_tcp_gloo gloo" "allreduce_64mib_shm_gloo gloo" "allreduce_1mib_tcp_torch torch" \
                "ddp torch"; do
  read -r name peer <<<"$workload"
  awk -v n="$name" -v p="$peer" '$1 == n && $2 == p { found = 1 } END { exit !found }' "$list" ||
    { cat "$list"; fail "bench/compare --list does not name '$name' against peer '$peer'"; }
done
key=$(awk '$1 == "parse_example" {print $3}' "$list")
[[ -n $key ]] || fail "no RESULT key for parse_example in bench/compare --list"

"$bin/pipeline_bench" --only parse_example > "$out" 2>&1 || { cat "$out"; fail "pipeline_bench --only parse_example failed"; }
grep -Eq "^RESULT $key [0-9.e+]+ examples/s$" "$out" ||
  { cat "$out"; fail "pipeline_bench printed no 'RESULT $key <value> examples/s' line for bench/compare"; }
key=$(awk '$1 == "allreduce_4b_tcp_gloo" {print $3}' "$list")
[[ $key == allreduce_4b_2r_tcp ]] || { cat "$list"; fail "the 4-byte all-reduce's RESULT key is '$key', not allreduce_4b_2r_tcp"; }
"$bin/collective_bench" --ranks 2 --transports tcp --sizes 4 > "$out" 2>&1 ||
  { cat "$out"; fail "collective_bench --sizes 4 failed"; }
grep -Eq "^RESULT $key [0-9.e+]+ us$" "$out" ||
  { cat "$out"; fail "collective_bench printed no 'RESULT $key <value> us' line for bench/compare"; }
if "$bin/collective_bench" --sizes 6 > "$out" 2>&1; then fail "collective_bench --sizes 6 (not a multiple of 4) succeeded"; fi
grep -q "multiples of 4 bytes (float32), not 6" "$out" || { cat "$out"; fail "--sizes 6 was not refused clearly"; }
if [[ -x $bin/ddp_bench ]]; then  # built with LibTorch
  key=$(awk '$1 == "ddp" {print $3}' "$list")
  "$bin/ddp_bench" --steps 2 --warmup 1 --width 64 > "$out" 2>&1 || { cat "$out"; fail "ddp_bench failed"; }
  grep -Eq "^RESULT $key [0-9.e+]+ steps/s$" "$out" ||
    { cat "$out"; fail "ddp_bench printed no 'RESULT $key <value> steps/s' line for bench/compare"; }
fi
echo "ok: bench/compare lists its workloads with their peers; pipeline_bench, collective_bench (and ddp_bench) print the RESULT lines it reads"
