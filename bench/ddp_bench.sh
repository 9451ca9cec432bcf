#!/usr/bin/env bash
# Data-parallel training of a dense MLP on 2 processes of this host: Capstan
# (build/bin/ddp_bench, MirroredModule on Capstan's collectives) against
# PyTorch's DistributedDataParallel on gloo (bench/peers/ddp.py, Debian's
# python3-torch), the same model and batch. Runs them alternately --runs
# times (default 3) and prints each one's median steps/s and the ratio.
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

capstan="" pytorch=""
for (( r = 0; r < runs; r++ )); do
  out=$("$bin_dir/ddp_bench" "${shared[@]}")
  [[ $r -eq 0 ]] && grep -v '^RESULT' <<<"$out"
  capstan+="$(figure "$out") "
  # Not from the repository root: its torch/ would shadow the torch package.
  out=$(cd "${TMPDIR:-/tmp}" && "$python" "$repo_root/bench/peers/ddp.py" "${shared[@]}")
  [[ $r -eq 0 ]] && grep -v '^RESULT' <<<"$out"
  pytorch+="$(figure "$out") "
done
c=$(median "$capstan") p=$(median "$pytorch")
printf '%-28s %10s   runs: %s\n' "" "steps/s" ""
printf '%-28s %10s   %s\n' "capstan MirroredModule" "$c" "$capstan"
printf '%-28s %10s   %s\n' "pytorch DDP (gloo)" "$p" "$pytorch"
awk -v c="$c" -v p="$p" 'BEGIN { printf "capstan / pytorch: %.2fx\n", c / p }'
