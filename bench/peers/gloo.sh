#!/usr/bin/env bash
# Builds .run/peers/gloo_all_reduce (bench/peers/gloo_all_reduce.cc) against
# Debian's libgloo-dev, installing the package when it is missing (root).
# Gloo is a peer to measure against, never a dependency of Capstan: only
# this script links it. Prints the binary's path; idempotent.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
out=$repo/.run/peers/gloo_all_reduce
if [[ ! -f /usr/include/gloo/allreduce_ring_chunked.h ]]; then
  if [[ $(id -u) -ne 0 ]]; then
    echo "bench/peers/gloo.sh: libgloo-dev is not installed; run: sudo apt-get install libgloo-dev" >&2
    exit 1
  fi
  apt-get install -y libgloo-dev >/dev/null || { apt-get update >/dev/null && apt-get install -y libgloo-dev >/dev/null; }
fi
if [[ ! -x $out || $here/gloo_all_reduce.cc -nt $out ]]; then
  mkdir -p "$(dirname "$out")"
  g++ -std=c++17 -O2 -o "$out" "$here/gloo_all_reduce.cc" -lgloo -pthread
fi
echo "$out"
