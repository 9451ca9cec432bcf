#!/usr/bin/env bash
# Installs, from Debian packages, what a fresh Debian 12 machine lacks to build
# and test Capstan. Idempotent and quiet: when everything is already installed
# it prints nothing and exits 0. Installing needs root (run it with sudo).
#
# Usage: scripts/setup.sh [--test]
#   --test  also what the tests use beyond the build: Docker and compose
#           (scripts/container-test.sh), debootstrap (a Debian 12 base image
#           without a registry), promtool (metrics format), systemd-analyze
#           (unit files), Chromium (the status page, headless)
set -euo pipefail

packages=(
  build-essential        # g++, make, libc headers
  cmake
  ninja-build
  pkg-config
  capnproto              # capnp compiler
  libcapnp-dev
  libboost-dev
  libboost-program-options-dev
  libspdlog-dev          # pulls in libfmt-dev
  libyaml-cpp-dev
  nlohmann-json3-dev     # JSON: safetensors headers, checkpoint manifests
  libeigen3-dev          # model math in the examples (census Wide & Deep)
  libtorch-dev           # LibTorch models: torch/ (libcapstan_torch.so)
  libopenblas0-openmp    #   its matrix products: without it libblas.so.3 is the
                         #   reference BLAS (the census model 0.57x -> 0.66x of Eigen)
  catch2
  zlib1g-dev
  libzstd-dev            # tf.data service compression on the wire (zstd)
  libprotobuf-dev
  protobuf-compiler
  curl                   # health checks in scripts and tests
  procps                 # pgrep, ps
  python3                # scripts/check-thread-safety.sh reads compile_commands.json
  python3-dev            # the Python bindings (python/): headers
  pybind11-dev           #   and pybind11
  python3-numpy          #   their arrays, and their tests (pytest)
  python3-pytest
  libdlpack-dev          #   DLPack (capstan.Array to torch, JAX, numpy; no copy)
  python3-venv           #   a fresh environment for the wheel (python/make_wheel.py)
  patchelf               #   the wheel's module finds libcapstan.so beside it ($ORIGIN)
  clang                  # scripts/check-thread-safety.sh: -Wthread-safety
  ccache                 # rebuilds reuse objects (used when present)
  openssl                # scripts/make-test-ca.sh (TLS tests)
  iptables               # network-fault test: queues packets to packet_delay
  libnetfilter-queue-dev # tests/tools/packet_delay (delay and loss without netem)
)

if [[ ${1:-} == --test ]]; then
  # python3-torch: capstan.torch's tests run real PyTorch (Debian's, for /usr/bin/python3).
  packages+=(docker.io docker-compose debootstrap prometheus systemd chromium python3-torch)
fi

missing=()
for pkg in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
  if [[ "$status" != "install ok installed" ]]; then
    missing+=("$pkg")
  fi
done

if [[ ${#missing[@]} -eq 0 ]]; then
  exit 0
fi

if [[ $(id -u) -ne 0 ]]; then
  echo "setup.sh: missing Debian packages: ${missing[*]}" >&2
  echo "setup.sh: installing them needs root; run: sudo $0" >&2
  echo "setup.sh: (or: sudo apt-get install --no-install-recommends ${missing[*]})" >&2
  exit 1
fi

echo "setup.sh: installing ${missing[*]}"
if ! apt-get update -qq; then
  echo "setup.sh: 'apt-get update' failed; check the network and /etc/apt/sources.list*" >&2
  exit 1
fi
if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"; then
  echo "setup.sh: 'apt-get install' failed for: ${missing[*]}" >&2
  exit 1
fi
echo "setup.sh: done"
