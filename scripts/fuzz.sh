#!/usr/bin/env bash
# Builds the libFuzzer harnesses (fuzz/) with clang, ASan and UBSan in
# build-asan/ (the directory scripts/sanitize.sh address also uses) and
# runs each (two at a time: CAPSTAN_JOBS) for a bounded time over its seed corpus (fuzz/corpus/NAME,
# committed; new inputs it finds go to a scratch copy).
# A crash, leak, hang or sanitizer report fails the run and leaves the input
# in build-asan/crashes/NAME/: add it to fuzz/corpus/NAME and fix the bug.
#
# Usage: scripts/fuzz.sh [--seconds N | --runs N] [--seed S] [NAME...]
#   default: 15 s each, all harnesses. --runs N --seed S (what
#   scripts/test.sh uses) makes a run repeatable: the same inputs every time.
set -euo pipefail

cd "$(dirname "$0")/.."
seconds=15
runs=
seed=0
names=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --seconds) seconds=$2; shift 2 ;;
    --seconds=*) seconds=${1#*=}; shift ;;
    --runs) runs=$2; shift 2 ;;
    --runs=*) runs=${1#*=}; shift ;;
    --seed) seed=$2; shift 2 ;;
    --seed=*) seed=${1#*=}; shift ;;
    -h | --help) sed -n '2,12p' "$0"; exit 0 ;;
    *) names+=("$1"); shift ;;
  esac
done
if [[ ${#names[@]} -eq 0 ]]; then
  # Every harness: fuzz/NAME_fuzz.cc.
  for source in fuzz/*_fuzz.cc; do
    name=${source#fuzz/}
    names+=("${name%_fuzz.cc}")
  done
fi
source scripts/sanitizer-build.sh
configure_sanitizer_build address
targets=()
for name in "${names[@]}"; do targets+=("${name}_fuzz"); done
build_logged ninja-fuzz.log "${targets[@]}" || exit 1

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
# One harness; its lines go to $build/NAME.summary, whose first line says
# "no crash" or "FAILED".
run_one() {
  local name=$1
  local seeds=fuzz/corpus/$name work=$build/corpus/$name crashes=$build/crashes/$name
  local log=$build/$name.log summary=$build/$name.summary
  rm -rf "$work"
  mkdir -p "$work" "$crashes"
  cp "$seeds"/* "$work"/ 2>/dev/null || true
  local limit
  if [[ -n $runs ]]; then limit=(-runs="$runs"); else limit=(-max_total_time="$seconds"); fi
  local start
  start=$(date +%s%N)
  if "$build/bin/${name}_fuzz" "${limit[@]}" -seed="$seed" -max_len=65536 -timeout=10 -rss_limit_mb=2048 \
      -artifact_prefix="$crashes/" -print_final_stats=1 "$work" "$seeds" >"$log" 2>&1; then
    local executed took
    executed=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
    took=$(( ($(date +%s%N) - start) / 1000000 ))
    echo "fuzz $name: ${executed:-?} inputs in ${took} ms, no crash; corpus $(ls "$seeds" | wc -l) seeds -> $(ls "$work" | wc -l)" >"$summary"
    return
  fi
  {
    echo "fuzz $name: FAILED (see $log; input in $crashes/)"
    grep -m5 "ERROR\|SUMMARY\|runtime error" "$log" || tail -20 "$log"
  } >"$summary"
}

# The harnesses are single-threaded: CAPSTAN_JOBS (default 2) run at once.
# Each outcome is read from its summary (a harness that left none failed),
# not from exit statuses, which `wait -n` may already have taken.
jobs=${CAPSTAN_JOBS:-2}
for name in "${names[@]}"; do
  rm -f "$build/$name.summary"
  while [[ $(jobs -rp | wc -l) -ge $jobs ]]; do wait -n || true; done
  run_one "$name" &
done
wait
failed=()
for name in "${names[@]}"; do
  summary=$build/$name.summary
  if [[ -s $summary ]]; then cat "$summary"; else echo "fuzz $name: FAILED (no summary; see $build/$name.log)"; fi
  head -n 1 "$summary" 2>/dev/null | grep -q ', no crash;' || failed+=("$name")
done
if [[ ${#failed[@]} -gt 0 ]]; then
  echo "fuzz.sh: failures in ${failed[*]}"
  exit 1
fi
if [[ -n $runs ]]; then budget="$runs inputs"; else budget="$seconds s"; fi
echo "fuzz.sh: ${#names[@]} harnesses, $budget each (seed $seed), no crash"
