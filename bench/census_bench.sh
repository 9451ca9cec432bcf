#!/usr/bin/env bash
# Training throughput of the census example (examples/census) in each mode
# with 1 and 2 workers (ps: worker-servers fed by the data service; sync and
# hybrid: replica processes; each with the hand-written Eigen model and,
# when built, the LibTorch one), on a local cluster: prints examples/s over
# --epochs epochs (default 2), the median of --runs runs (default 3), the
# modes alternating within each run.
#
# With --tf, TensorFlow's ParameterServerStrategy trains the same model
# (bench/peers/census_ps.py: 2 ps and the same number of workers as
# tf.distribute.Server processes on loopback) in each run too, alternating
# with the others, and the ratios of Capstan's ps medians to TensorFlow's are
# printed. TensorFlow (CPU) is installed from PyPI into bench/peers/.venv the
# first time (bench/peers/venv.sh; never a dependency of Capstan).
#
# Usage: bench/census_bench.sh [--epochs N] [--runs N] [--workers 1,2] [--only VARIANT,...] [--tf]
#   (after scripts/build.sh)
#   --workers  the worker counts to measure (default 1,2)
#   --only     the variants to run, of ps:eigen, ps:torch (when built),
#              sync:eigen, hybrid:eigen, sync:torch and hybrid:torch (when
#              the census program's LibTorch plugin is built) and tf:ps
#              (TensorFlow; as --tf) (default: all but tf:ps)
# Besides the table, prints one line per median for bench/compare:
#   RESULT census_<variant>_<W>w <examples/s> examples/s
# (variant ps_eigen, ps_torch, sync_eigen, hybrid_eigen, sync_torch,
# hybrid_torch, tf_ps).
set -euo pipefail

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bin_dir=${CAPSTAN_BIN_DIR:-$repo_root/build/bin}
lib_dir=$(cd "$bin_dir/.." && pwd)/lib
module=$lib_dir/libcensus_module.so
torch_module=$lib_dir/libcensus_torch_module.so
modules=(--module "$module")
built=(ps:eigen)
if [[ -e $torch_module ]]; then
  modules+=(--module "$torch_module")
  built+=(ps:torch)
fi
built+=(sync:eigen hybrid:eigen)
# The replicas' LibTorch part (the census program's plugin).
if [[ -e $lib_dir/libcensus_torch_program.so ]]; then
  built+=(sync:torch hybrid:torch)
fi
usage() {
  echo "usage: $0 [--epochs N] [--runs N] [--workers 1,2] [--only VARIANT,...] [--tf]" >&2
  exit 2
}
epochs=2
runs=3
worker_counts=(1 2)
only=""
tf=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --epochs) epochs=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --workers) IFS=, read -r -a worker_counts <<<"$2"; shift 2 ;;
    --only) only=$2; shift 2 ;;
    --tf) tf=1; shift ;;
    *) usage ;;
  esac
done
variants=()
if [[ -n $only ]]; then
  IFS=, read -r -a wanted <<<"$only"
  for v in "${wanted[@]}"; do
    if [[ $v == tf:ps ]]; then
      tf=1
    elif [[ " ${built[*]} " == *" $v "* ]]; then
      variants+=("$v")
    else
      echo "$0: unknown or unbuilt variant '$v' (this build has: ${built[*]} tf:ps)" >&2
      exit 2
    fi
  done
else
  variants=("${built[@]}")
fi
python=$repo_root/bench/peers/.venv/bin/python
if (( tf )); then
  # Its last line names TensorFlow's version; the rest is TensorFlow's start-up noise.
  if ! venv_out=$(TF_CPP_MIN_LOG_LEVEL=3 bash "$repo_root/bench/peers/venv.sh" 2>&1); then
    echo "$venv_out" >&2
    exit 1
  fi
  tail -n 1 <<<"$venv_out" >&2
  variants+=(tf:ps)
fi
run_dir=$(mktemp -d "${TMPDIR:-/tmp}/capstan-census-bench.XXXXXX")
cluster() { bash "$repo_root/scripts/local-cluster.sh" "$1" --run-dir "$run_dir" --bin-dir "$bin_dir" "${@:2}"; }
# shellcheck disable=SC2317  # run by the EXIT trap
cleanup() {
  cluster down >/dev/null 2>&1 || true
  rm -rf "$run_dir"
}
trap cleanup EXIT

label_of() {  # ps:torch -> ps-torch, tf:ps -> tf-ps: every row names its model
  echo "${1%%:*}-${1#*:}"
}

median_of() {  # the median of space-separated integers; nothing when there are none
  local sorted n
  sorted=$(tr ' ' '\n' <<<"$1" | { grep . || true; } | sort -n)
  n=$(grep -c . <<<"$sorted" || true)
  if (( n > 0 )); then sed -n "$(( (n + 1) / 2 ))p" <<<"$sorted"; fi
}

results=()
printf '%-10s %8s %14s %10s\n' mode workers examples/s accuracy
for workers in "${worker_counts[@]}"; do
  declare -A rates=() accuracy=() median=()
  for (( r = 0; r < runs; r++ )); do
    for variant in "${variants[@]}"; do
      mode=${variant%%:*} model=${variant#*:}
      cluster down >/dev/null 2>&1 || true
      if [[ $mode == tf ]]; then
        # Capstan's daemons are down: TensorFlow has the machine to itself.
        out=$(TF_CPP_MIN_LOG_LEVEL=3 "$python" "$repo_root/bench/peers/census_ps.py" --workers "$workers" --ps 2 \
          --epochs "$epochs" --data-dir "$repo_root/examples/census/data" 2>&1) || {
          echo "census_bench.sh: bench/peers/census_ps.py failed:" >&2
          tail -n 20 <<<"$out" >&2
        }
        rate=$(sed -n "s/^RESULT census_ps_${workers}w \([0-9.e+]*\) examples\/s$/\1/p" <<<"$out")
        [[ -n $rate ]] && rates[$variant]+="$(awk -v x="$rate" 'BEGIN { printf "%.0f", x }') "
        acc=$(sed -n "s/^RESULT census_test_accuracy_${workers}w \([0-9.e+-]*\) .*/\1/p" <<<"$out")
        [[ -n $acc ]] && accuracy[$variant]=$(awk -v x="$acc" 'BEGIN { printf "%.2f", 100 * x }')
        continue
      fi
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
    median[$variant]=$(median_of "${rates[$variant]:-}")
    printf '%-10s %8d %14s %9s%%\n' "$(label_of "$variant")" "$workers" "${median[$variant]:--}" \
      "${accuracy[$variant]:--}"
    if [[ -n ${median[$variant]} ]]; then
      results+=("RESULT census_${variant/:/_}_${workers}w ${median[$variant]} examples/s")
    fi
  done
  if [[ -n ${median[tf:ps]:-} ]]; then
    for variant in ps:torch ps:eigen; do
      if [[ -n ${median[$variant]:-} ]]; then
        awk -v c="${median[$variant]}" -v t="${median[tf:ps]}" -v l="$(label_of "$variant")" -v w="$workers" \
          'BEGIN { printf "  %s / tf-ps, %d worker(s): %.2fx\n", l, w, c / t }'
      fi
    done
  fi
  unset rates accuracy median
done
if (( ${#results[@]} > 0 )); then printf '%s\n' "${results[@]}"; fi
