#!/usr/bin/env bash
# Installs Capstan into a temporary prefix, builds examples/sdk_consumer as an
# outside project with find_package(Capstan CONFIG), and runs it against an
# installed ps-server.
#
# Usage: install_test.sh REPO_ROOT BUILD_DIR
set -euo pipefail

repo=$1
build=$2
tmp=$(mktemp -d)
ps_pid=
cleanup() {
  if [[ -n $ps_pid ]]; then kill -9 "$ps_pid" 2>/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT

fail() { echo "FAIL: $*"; echo "0 passed, 1 failed"; exit 1; }

cmake --install "$build" --prefix "$tmp/prefix" > "$tmp/install.log" || { cat "$tmp/install.log"; fail "cmake --install"; }
for f in include/capstan/tensor.h include/capstan/client.h lib/cmake/Capstan/CapstanConfig.cmake bin/ps-server bin/capstanctl; do
  [[ -e $tmp/prefix/$f ]] || fail "installed tree lacks $f"
done
# The public headers must not drag Cap'n Proto or KJ into user code.
if grep -rlE '#include <(capnp|kj)/' "$tmp/prefix/include"; then fail "public headers include capnp/kj"; fi

# libcapstan.so exports the public API and nothing else (no capnp, kj,
# protobuf, standard-library or internal capstan::wire/rpc/data symbols).
lib=$(ls "$tmp"/prefix/lib*/libcapstan.so.* 2>/dev/null | head -1)
[[ -n $lib ]] || fail "installed tree lacks libcapstan.so"
exported=$(nm -DC --defined-only "$lib" | cut -d' ' -f3-)
count=$(wc -l <<< "$exported")
(( count > 50 )) || fail "libcapstan.so exports only $count symbols: the public API is missing"
strays=$(grep -vE '^((typeinfo|typeinfo name|vtable|VTT|guard variable) for )?capstan::' <<< "$exported" || true)
[[ -z $strays ]] || fail "libcapstan.so exports symbols outside namespace capstan: $(head -5 <<< "$strays")"
internal=$(grep -E 'capstan::(wire|rpc|journal|checkpoint|placement|tfexample|tfevent)::' <<< "$exported" || true)
[[ -z $internal ]] || fail "libcapstan.so exports internal symbols: $(head -5 <<< "$internal")"
echo "libcapstan.so exports $count symbols, all in the public API"

generator=()
command -v ninja > /dev/null && generator=(-G Ninja)
# The consumers build from copies under $tmp, through ccache where it is
# installed, with paths relative to $tmp in its keys: the torch consumer's
# one file takes ~30 s to compile, and every run's $tmp has another name.
# (A hit needs the same preprocessed source: headers that changed compile.)
cp -r "$repo/examples/sdk_consumer" "$repo/examples/torch_consumer" "$tmp/"
if command -v ccache > /dev/null; then
  generator+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  export CCACHE_BASEDIR=$tmp CCACHE_NOHASHDIR=true
fi
cmake -S "$tmp/sdk_consumer" -B "$tmp/sdk_consumer/build" "${generator[@]}" \
  -DCMAKE_PREFIX_PATH="$tmp/prefix" > "$tmp/configure.log" 2>&1 || { cat "$tmp/configure.log"; fail "configure consumer"; }
cmake --build "$tmp/sdk_consumer/build" > "$tmp/build.log" 2>&1 || { cat "$tmp/build.log"; fail "build consumer"; }

offline=$("$tmp/sdk_consumer/build/sdk_consumer") || fail "sdk_consumer offline run"
grep -q 'float32\[3, 2\] {1, 1.5, 2, 2.5, 3, 3.5}' <<< "$offline" || fail "unexpected output: $offline"

"$tmp/prefix/bin/ps-server" --port 0 --http-port 0 --port-file "$tmp/ps.port" > "$tmp/ps.log" 2>&1 &
ps_pid=$!
for _ in $(seq 100); do [[ -s $tmp/ps.port ]] && break; sleep 0.1; done
[[ -s $tmp/ps.port ]] || { cat "$tmp/ps.log"; fail "installed ps-server did not start"; }
address=$(awk '/^address:/ {print $2}' "$tmp/ps.port")
online=$("$tmp/sdk_consumer/build/sdk_consumer" "$address") || { echo "$online"; fail "sdk_consumer against $address"; }
grep -q 'daemon: ps version' <<< "$online" || fail "unexpected output: $online"
grep -q 'echo: identical' <<< "$online" || fail "unexpected output: $online"
echo "$online"

# find_package(Capstan COMPONENTS torch) -> Capstan::torch, when this build
# has LibTorch models (CAPSTAN_TORCH, on by default).
if [[ -e $build/lib/libcapstan_torch.so ]]; then
  [[ -e $tmp/prefix/lib/cmake/Capstan/CapstanTorchTargets.cmake ]] || fail "installed tree lacks CapstanTorchTargets.cmake"
  cmake -S "$tmp/torch_consumer" -B "$tmp/torch_consumer/build" "${generator[@]}" \
    -DCMAKE_PREFIX_PATH="$tmp/prefix" > "$tmp/configure-torch.log" 2>&1 || { cat "$tmp/configure-torch.log"; fail "configure torch_consumer"; }
  cmake --build "$tmp/torch_consumer/build" > "$tmp/build-torch.log" 2>&1 || { cat "$tmp/build-torch.log"; fail "build torch_consumer"; }
  torch_out=$("$tmp/torch_consumer/build/torch_consumer") || { echo "$torch_out"; fail "torch_consumer run"; }
  echo "$torch_out"
  grep -q 'capstan after torch: float32\[2, 3\] {2, 4, 6, 8, 10, 12}' <<< "$torch_out" || fail "unexpected output: $torch_out"
  grep -q 'torch to capstan: float32\[3\] {10, 14, 18}' <<< "$torch_out" || fail "unexpected output: $torch_out"
  grep -q 'variable embedding.weight \[100, 8\] (embedding)' <<< "$torch_out" || fail "unexpected output: $torch_out"
fi
echo "1 passed, 0 failed"
