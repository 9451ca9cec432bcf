#!/usr/bin/env bash
# Builds Capstan with clang and a sanitizer and runs the unit and integration
# tests in that build, except (the release build runs them all): the stress
# tests (label stress: they repeat what the integration tests check, for
# minutes); the long end-to-end runs of the examples (label long: census in
# its other modes, the CTR example's kill -9 recoveries, TensorBoard reading
# event files; they drive the paths the shorter tests cover, at 3-5x the
# time under a sanitizer); the timing tests (label timing: they assert how
# soon a slowed worker is noticed, which a sanitizer's uneven slowdown of the
# processes distorts); and what checks the source tree itself (label static).
# The five longest end-to-end scripts run under one of the two sanitizers
# (label only_asan or only_tsan), so the two runs fit CI's half hour.
#
#   address  build-asan/: ASan + UBSan (+ LeakSanitizer at every exit). The
#            same directory builds the libFuzzer harnesses (scripts/fuzz.sh).
#   thread   build-tsan/: ThreadSanitizer.
#
# Every process a test starts (daemons included) writes its sanitizer
# reports to BUILD/sanitizer-reports/; the run fails when a test fails or
# when any report is there, and prints the reports. Suppressions, each with
# its reason, are in tests/sanitizer/.
#
# Usage: scripts/sanitize.sh address|thread [extra ctest arguments...]
#   CAPSTAN_JOBS       parallel compile jobs (default: 2)
#   CAPSTAN_TEST_JOBS  tests run in parallel (default: 2)
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
kind=${1:-}
case $kind in
  address | thread) shift ;;
  -h | --help) sed -n '2,21p' "$0"; exit 0 ;;
  *) echo "sanitize.sh: the first argument must be 'address' or 'thread', not '$kind'" >&2; exit 2 ;;
esac

source scripts/sanitizer-build.sh
configure_sanitizer_build "$kind"
build_logged ninja.log || exit 1

reports=$PWD/$build/sanitizer-reports
rm -rf "$reports"
mkdir -p "$reports"
supp=$PWD/tests/sanitizer
# A too-large request must fail as the code expects (bad_alloc, an error
# reply), as it does without the sanitizer.
export ASAN_OPTIONS="detect_leaks=1:allocator_may_return_null=1:log_path=$reports/report:log_exe_name=1"
export LSAN_OPTIONS="suppressions=$supp/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:log_path=$reports/report:log_exe_name=1"
export TSAN_OPTIONS="allocator_may_return_null=1:halt_on_error=1:second_deadlock_stack=1:suppressions=$supp/tsan.supp:log_path=$reports/report:log_exe_name=1"

status=0
# The install test builds a program against the installed SDK with the
# system compiler and flags, which a sanitizer build's libraries cannot link.
# The longest end-to-end scripts run under one of the two sanitizers
# (labels only_asan, only_tsan: tests/CMakeLists.txt).
other=$([[ $kind == address ]] && echo only_tsan || echo only_asan)
ctest --test-dir "$build" --output-on-failure -j "${CAPSTAN_TEST_JOBS:-2}" --timeout 900 \
  -L 'unit|integration' -LE "stress|long|timing|static|$other" -E '^sdk_install_find_package$' "$@" || status=$?
bash scripts/check-leftovers.sh "$build" || status=1

# A report file holds errors, or only the warning an allocation the code
# expects to fail prints ("failed to allocate"), which is not a finding.
shopt -s nullglob
found=()
for f in "$reports"/*; do
  if grep -q -v -e 'failed to allocate 0x' -e '^$' "$f"; then found+=("$f"); fi
done
if [[ ${#found[@]} -gt 0 ]]; then
  echo "sanitize.sh ($kind): ${#found[@]} sanitizer report(s):"
  for f in "${found[@]}"; do
    echo "==== $f"
    grep -v "^$" "$f" | head -80
  done
  status=1
fi
if [[ $status -eq 0 ]]; then
  echo "sanitize.sh ($kind): every test passed, no sanitizer report"
fi
exit "$status"
