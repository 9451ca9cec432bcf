#!/usr/bin/env bash
# Builds Capstan, runs clang's thread-safety check
# (scripts/check-thread-safety.sh), then every test: the one command CI and
# developers run.
#
# With no arguments it then runs every libFuzzer harness (scripts/fuzz.sh,
# a clang + ASan + UBSan build in build-fuzz/) for a fixed, repeatable number
# of inputs over its seed corpus.
#
# Usage: scripts/test.sh [extra ctest arguments...]   e.g. -L unit, -R cluster
#   CAPSTAN_FUZZ_RUNS  inputs per fuzzer (default: 20000; 0 skips fuzzing)
#   CAPSTAN_BUILD_DIR  build directory (default: build)
#   CAPSTAN_JOBS       parallel compile jobs (default: 2)
#   CAPSTAN_TEST_JOBS  tests run in parallel (default: 2)
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/setup.sh
bash scripts/build.sh
# Clang's thread-safety analysis over every source file (annotations on
# mutex-held fields; see lib/sync/mutex.h).
bash scripts/check-thread-safety.sh "${CAPSTAN_BUILD_DIR:-build}"

build_dir=${CAPSTAN_BUILD_DIR:-build}
test_jobs=${CAPSTAN_TEST_JOBS:-2}
status=0
ctest --test-dir "$build_dir" --output-on-failure -j "$test_jobs" --timeout 600 "$@" || status=$?
fuzz_runs=${CAPSTAN_FUZZ_RUNS:-20000}
if [[ $# -eq 0 && $fuzz_runs != 0 ]]; then
  bash scripts/fuzz.sh --runs "$fuzz_runs" --seed 1 || status=1
fi
exit "$status"
