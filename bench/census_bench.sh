#!/usr/bin/env bash
# Training throughput of the census example (examples/census) in each mode
# with 1 and 2 workers (ps: worker-servers fed by the data service; sync and
# hybrid: replica processes; each with the hand-written Eigen model and,
# when built, the LibTorch one), on a local cluster: prints examples/s over
# --epochs epochs (default 2), the median of --runs runs (default 3), the
# modes alternating within each run.
#
# Usage: bench/census_bench.sh [--epochs N] [--runs N]   (after scripts/build.sh)
set -euo pipefail

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bin_dir=${CAPSTAN_BIN_DIR:-$repo_root/build/bin}
module=$repo_root/build/lib/libcensus_module.so
torch_module=$repo_root/build/lib/libcensus_torch_module.so
modules=(--module "$module")
variants=(ps:eigen)
if [[ -e $torch_module ]]; then
  modules+=(--module "$torch_module")
  variants+=(ps:torch)
fi
variants+=(sync:eigen hybrid:eigen)
# The replicas' LibTorch part (the census program's plugin).
if [[ -e $repo_root/build/lib/libcensus_torch_program.so ]]; then
  variants+=(sync:torch hybrid:torch)
fi
epochs=2
runs=3
while [[ $# -gt 0 ]]; do
  case "$1" in
    --epochs) epochs=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    *) echo "usage: $0 [--epochs N] [--runs N]" >&2; exit 2 ;;
  esac
done
run_dir=$(mktemp -d "${TMPDIR:-/tmp}/capstan-census-bench.XXXXXX")
cluster() { bash "$repo_root/scripts/local-cluster.sh" "$1" --run-dir "$run_dir" --bin-dir "$bin_dir" "${@:2}"; }
# shellcheck disable=SC2317  # run by the EXIT trap
cleanup() {
  cluster down >/dev/null 2>&1 || true
  rm -rf "$run_dir"
}
trap cleanup EXIT

printf '%-10s %8s %14s %10s\n' mode workers examples/s accuracy
for workers in 1 2; do
  declare -A rates=() accuracy=()
  for (( r = 0; r < runs; r++ )); do
    for variant in "${variants[@]}"; do
      mode=${variant%%:*} model=${variant#*:}
      cluster down >/dev/null 2>&1 || true
      cluster up --ps 2 --workers "$workers" --data-workers 2 "${modules[@]}" >/dev/null
      # shellcheck disable=SC1091  # written by local-cluster.sh
      . "$run_dir/cluster.env"
      out=$("$bin_dir/census" --coordinator "$COORDINATOR" --dispatcher "$DISPATCHER" --min-workers "$workers" \
        --data-dir "$repo_root/examples/census/data" --mode "$mode" --model "$model" --replicas "$workers" \
        --epochs "$epochs" --target-accuracy 0 --target-auc 0 2>&1)
      rates[$variant]+="$(sed -n 's/^census: trained .* (\([0-9]*\) examples\/s)$/\1/p' <<<"$out") "
      accuracy[$variant]=$(sed -n 's/^  accuracy  \([0-9.]*\)%.*/\1/p' <<<"$out")
    done
  done
  for variant in "${variants[@]}"; do
    median=$(tr ' ' '\n' <<<"${rates[$variant]}" | grep . | sort -n | sed -n "$(( (runs + 1) / 2 ))p")
    label=${variant%%:*}
    label="$label-${variant#*:}"
    printf '%-10s %8d %14s %9s%%\n' "$label" "$workers" "$median" "${accuracy[$variant]}"
  done
  unset rates accuracy
done
