# Sourced by scripts/sanitize.sh and scripts/fuzz.sh: configures (once) the
# clang build directory for a sanitizer and sets $build to it.
#
#   configure_sanitizer_build address   -> build-asan (ASan + UBSan, fuzzers)
#   configure_sanitizer_build thread    -> build-tsan (TSan)
#   build_logged LOG [TARGETS...]       -> builds $build; its output goes to
#                                          $build/LOG, and on failure the
#                                          compiler's errors are printed

configure_sanitizer_build() {
  local kind=$1
  command -v clang++ >/dev/null || { echo "clang++ is missing (scripts/setup.sh installs it)" >&2; return 1; }
  local flags=()
  case $kind in
    address) build=build-asan; flags=(-DCAPSTAN_SANITIZE=address,undefined -DCAPSTAN_FUZZ=ON) ;;
    thread) build=build-tsan; flags=(-DCAPSTAN_SANITIZE=thread) ;;
    *) echo "configure_sanitizer_build: unknown kind '$kind'" >&2; return 1 ;;
  esac
  # Paths relative to the checkout in ccache's keys: a fresh clone (CI) reuses
  # the objects another checkout compiled with the same flags.
  export CCACHE_BASEDIR=$PWD
  if [[ ! -f $build/build.ninja ]]; then
    # -O1 without -g: fast enough to run the tests, and ccache can share
    # objects between checkouts (with -g it hashes the directory).
    CC=clang CXX=clang++ cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=None \
      -DCMAKE_CXX_FLAGS=-O1 -DCMAKE_C_FLAGS=-O1 "${flags[@]}" \
      -DCAPSTAN_BUILD_BENCH=OFF -DCAPSTAN_CUDA=OFF -DCAPSTAN_PYTHON=OFF >/dev/null
  fi
}

build_logged() {
  local log=$build/$1
  shift
  if ! ninja -C "$build" -j "${CAPSTAN_JOBS:-2}" "$@" >"$log" 2>&1; then
    grep -E -A12 '^FAILED:|error:' "$log" | head -80
    echo "the build of $build failed (whole log: $log)"
    return 1
  fi
  tail -1 "$log"
}
