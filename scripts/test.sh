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
ctest --test-dir "$build_dir" --output-on-failure -j "$test_jobs" --timeout 600 "$@" || status=$?
bash scripts/check-leftovers.sh "$build_dir" || status=1
echo "test.sh: build and tests took $SECONDS s"
if [[ $# -eq 0 ]]; then
  # The image and the compose cluster end to end (Docker; fixed host ports,
  # so not inside ctest's parallel run).
  started=$SECONDS
  bash scripts/container-test.sh || status=1
  echo "test.sh: container-test.sh took $((SECONDS - started)) s"
  for kind in ${CAPSTAN_SANITIZERS-address thread}; do
    started=$SECONDS
    bash scripts/sanitize.sh "$kind" || status=1
    echo "test.sh: sanitize.sh $kind took $((SECONDS - started)) s"
  done
  fuzz_runs=${CAPSTAN_FUZZ_RUNS:-20000}
  if [[ $fuzz_runs != 0 ]]; then
    started=$SECONDS
    bash scripts/fuzz.sh --runs "$fuzz_runs" --seed 1 || status=1
    echo "test.sh: fuzz.sh took $((SECONDS - started)) s"
  fi
fi
echo "test.sh: $SECONDS s in all, exit $status"
exit "$status"
