#!/usr/bin/env bash
# libcapstan.so never links LibTorch: a program that does not use torch does
# not load it (issue 33; capstan_torch is a library of its own). Reads the
# library's dynamic section (its NEEDED entries) and what the dynamic loader
# resolves for it, all of its dependencies' dependencies included. When
# given libcapstan_torch.so, checks that the same reading finds torch there,
# so that an empty answer for libcapstan.so means something.
#
# Usage: core_links_no_torch_test.sh LIBCAPSTAN [LIBCAPSTAN_TORCH]
#   (run by CTest as libcapstan_links_no_torch)
set -euo pipefail

fail() { echo "FAIL: $*"; echo "0 passed, 1 failed"; exit 1; }

if [[ $# -ne 1 && $# -ne 2 ]]; then
  echo "usage: $0 LIBCAPSTAN [LIBCAPSTAN_TORCH]" >&2
  exit 2
fi
lib=$1
torch_lib=${2:-}
torch_names='lib(torch|torch_cpu|torch_cuda|torch_global_deps|c10|c10_cuda)\.so'

[[ -f $lib ]] || fail "no library at $lib"
needed=$(readelf -d "$lib" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
[[ -n $needed ]] || fail "readelf -d $lib lists no NEEDED entry: cannot tell what it links"
echo "$lib needs: $(tr '\n' ' ' <<< "$needed")"
if grep -E "^$torch_names" <<< "$needed"; then fail "$lib links LibTorch directly (above)"; fi
resolved=$(ldd "$lib") || fail "ldd $lib"
if grep -E "$torch_names" <<< "$resolved"; then fail "$lib loads LibTorch through a dependency (above)"; fi

if [[ -n $torch_lib ]]; then
  [[ -f $torch_lib ]] || fail "no library at $torch_lib"
  readelf -d "$torch_lib" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | grep -qE "^$torch_names" ||
    fail "readelf finds no LibTorch among $torch_lib's NEEDED entries: the check above would miss it too"
  echo "$torch_lib needs LibTorch, as it should"
fi
echo "PASS: libcapstan.so neither needs nor loads LibTorch"
echo "1 passed, 0 failed"
