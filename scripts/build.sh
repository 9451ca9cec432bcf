#!/usr/bin/env bash
# Installs missing dependencies (scripts/setup.sh), configures the build
# directory once, and builds.
#
# Usage: scripts/build.sh [extra cmake configure arguments...]
#   CAPSTAN_BUILD_DIR  build directory, relative to the repository root or
#                      absolute (default: build)
#   CAPSTAN_JOBS       parallel compile jobs (default: 2)
# Extra arguments (e.g. -DCAPSTAN_SANITIZE=address) are passed to cmake when it
# configures; to change the options of an existing build directory, delete it or
# run cmake on it yourself.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/setup.sh

# ccache keys name paths relative to the checkout, and not the build
# directory (-g would hash it): a fresh clone elsewhere (CI) reuses the
# objects another clone compiled. Debug info then names that clone's paths.
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD}
export CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-true}

build_dir=${CAPSTAN_BUILD_DIR:-build}
jobs=${CAPSTAN_JOBS:-2}

if [[ ! -f "$build_dir/CMakeCache.txt" || ! -f "$build_dir/build.ninja" ]]; then
  cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@"
elif [[ $# -gt 0 ]]; then
  echo "build.sh: $build_dir is already configured; ignoring extra cmake arguments: $*" >&2
fi

cmake --build "$build_dir" -j "$jobs"
