#!/usr/bin/env bash
# Builds Capstan, runs clang's thread-safety check
# (scripts/check-thread-safety.sh), then every test: the one command CI and
# developers run.
#
# With no arguments it then builds the container image and runs the compose
# cluster end to end (scripts/container-test.sh), runs the unit and
# integration tests again under
# the sanitizers (scripts/sanitize.sh: ASan + UBSan + LeakSanitizer in
# build-asan/, ThreadSanitizer in build-tsan/, clang builds), and every
# libFuzzer harness (scripts/fuzz.sh, in build-asan/) for a fixed,
# repeatable number of inputs over its seed corpus.
#
# Usage: scripts/test.sh [extra ctest arguments...]   e.g. -L unit, -R cluster
#   CAPSTAN_SANITIZERS sanitizer runs (default: "address thread"; "" skips)
#   CAPSTAN_FUZZ_RUNS  inputs per fuzzer (default: 20000; 0 skips fuzzing)
#   CAPSTAN_BUILD_DIR  build directory (default: build)
#   CAPSTAN_JOBS       parallel compile jobs (default: 2)
#   CAPSTAN_TEST_JOBS  tests run in parallel (default: 2)
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/setup.sh --test
bash scripts/build.sh
# Clang's thread-safety analysis over every source file (annotations on
# mutex-held fields; see lib/sync/mutex.h).
bash scripts/check-thread-safety.sh "${CAPSTAN_BUILD_DIR:-build}"

build_dir=${CAPSTAN_BUILD_DIR:-build}
test_jobs=${CAPSTAN_TEST_JOBS:-2}
status=0
failed=()  # the stages that failed, named again at the end (CI keeps the tail)
# Names a failed stage; for a ctest stage, also the tests that failed there,
# each with the last lines it printed (CI keeps only the log's tail, and
# --output-on-failure printed them far above it).
stage_failed() {
  status=1
  failed+=("$1")
  local dir=${2:-}/Testing/Temporary
  if [[ -n ${2:-} && -s $dir/LastTestsFailed.log ]]; then
    failed+=("$(sed 's/^/    /' "$dir/LastTestsFailed.log")")
    local name
    while IFS=: read -r _ name; do
      failed+=("$(awk -v name="$name" '
          $0 ~ "^[0-9]+/[0-9]+ Test: " && substr($0, index($0, "Test: ") + 6) == name { inside = 1; n = 0; next }
          inside && /^<end of output>$/ { exit }
          inside { lines[n++ % 40] = $0 }
          END { printf "    --- the last lines %s printed:\n", name;
                for (i = (n > 40 ? n - 40 : 0); i < n; i++) print "    | " lines[i % 40] }' "$dir/LastTest.log")")
    done <"$dir/LastTestsFailed.log"
  fi
}
ctest --test-dir "$build_dir" --output-on-failure -j "$test_jobs" --timeout 600 "$@" ||
  stage_failed "ctest in $build_dir" "$build_dir"
bash scripts/check-leftovers.sh "$build_dir" || stage_failed "check-leftovers.sh $build_dir"
echo "test.sh: build and tests took $SECONDS s"
if [[ $# -eq 0 ]]; then
  # The image and the compose cluster end to end (Docker; fixed host ports,
  # so not inside ctest's parallel run).
  started=$SECONDS
  bash scripts/container-test.sh || stage_failed container-test.sh
  echo "test.sh: container-test.sh took $((SECONDS - started)) s"
  for kind in ${CAPSTAN_SANITIZERS-address thread}; do
    started=$SECONDS
    bash scripts/sanitize.sh "$kind" ||
      stage_failed "sanitize.sh $kind" "build-$([[ $kind == address ]] && echo asan || echo tsan)"
    echo "test.sh: sanitize.sh $kind took $((SECONDS - started)) s"
  done
  fuzz_runs=${CAPSTAN_FUZZ_RUNS:-20000}
  if [[ $fuzz_runs != 0 ]]; then
    started=$SECONDS
    bash scripts/fuzz.sh --runs "$fuzz_runs" --seed 1 || stage_failed fuzz.sh
    echo "test.sh: fuzz.sh took $((SECONDS - started)) s"
  fi
fi
for f in "${failed[@]}"; do echo "test.sh: FAILED: $f"; done
echo "test.sh: $SECONDS s in all, exit $status"
exit "$status"
