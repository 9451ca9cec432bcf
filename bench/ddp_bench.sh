#!/usr/bin/env bash
# Data-parallel training of a dense MLP on 2 processes of this host: Capstan
# from C++ (build/bin/ddp_bench, MirroredModule on Capstan's collectives)
# and from Python (bench/python_ddp.py, capstan.torch.DistributedDataParallel
# over the same collectives) against PyTorch's DistributedDataParallel on
# gloo (bench/peers/ddp.py), the same model and batch, all three with
# Debian's python3-torch / libtorch. Runs them alternately --runs times
# (default 3) and prints each one's median steps/s and the ratios.
#
# Usage: bench/ddp_bench.sh [--runs N] [--steps N] [--warmup N] [--layers N] [--width N] [--batch N] [--threads N]
#        (after scripts/build.sh)
set -euo pipefail

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bin_dir=${CAPSTAN_BIN_DIR:-$repo_root/build/bin}
python=${CAPSTAN_TORCH_PYTHON:-/usr/bin/python3}
runs=3
shared=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --runs) runs=$2; shift 2 ;;
    --steps|--warmup|--layers|--width|--batch|--threads) shared+=("$1" "$2"); shift 2 ;;
    *) echo "usage: $0 [--runs N] [--steps N] [--warmup N] [--layers N] [--width N] [--batch N] [--threads N]" >&2
       exit 2 ;;
  esac
done

median() { tr ' ' '\n' <<<"$1" | grep . | sort -g | sed -n "$(( (runs + 1) / 2 ))p"; }
figure() { sed -n 's/^RESULT ddp_mlp \([0-9.e+-]*\) steps\/s$/\1/p' <<<"$1"; }

capstan="" python_capstan="" pytorch=""
for (( r = 0; r < runs; r++ )); do
  out=$("$bin_dir/ddp_bench" "${shared[@]}")
  [[ $r -eq 0 ]] && grep -v '^RESULT' <<<"$out"
  capstan+="$(figure "$out") "
  # Not from the repository root: its torch/ would shadow the torch package.
  out=$(cd "${TMPDIR:-/tmp}" && PYTHONPATH="$bin_dir/../python" CAPSTAN_BIN_DIR="$bin_dir" \
    "$python" "$repo_root/bench/python_ddp.py" "${shared[@]}")
  [[ $r -eq 0 ]] && grep -v '^RESULT' <<<"$out"
  python_capstan+="$(figure "$out") "
  out=$(cd "${TMPDIR:-/tmp}" && "$python" "$repo_root/bench/peers/ddp.py" "${shared[@]}")
  [[ $r -eq 0 ]] && grep -v '^RESULT' <<<"$out"
  pytorch+="$(figure "$out") "
done
c=$(median "$capstan") y=$(median "$python_capstan") p=$(median "$pytorch")
printf '%-36s %10s   runs: %s\n' "" "steps/s" ""
printf '%-36s %10s   %s\n' "capstan MirroredModule (C++)" "$c" "$capstan"
printf '%-36s %10s   %s\n' "capstan.torch DDP (Python)" "$y" "$python_capstan"
printf '%-36s %10s   %s\n' "pytorch DDP (gloo)" "$p" "$pytorch"
awk -v c="$c" -v p="$p" 'BEGIN { printf "capstan (C++) / pytorch: %.2fx\n", c / p }'
awk -v y="$y" -v p="$p" 'BEGIN { printf "capstan (Python) / pytorch: %.2fx\n", y / p }'
