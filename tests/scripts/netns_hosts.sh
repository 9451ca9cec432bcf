# shellcheck shell=bash disable=SC2154  # bin_dir, tag, subnet and hosts: set by the test that sources this
# Sourced by the network-namespace tests: hosts as network namespaces, each
# with one veth link on a bridge, daemons started on them, everything removed
# on exit. Set before sourcing:
#   bin_dir  the daemons' directory
#   tag      a prefix unique to this run (several runs may overlap)
#   subnet   the hosts' /24 without its last byte: host k is $subnet.(k+1)
#   hosts    the hosts' names (h0 h1 ...)
# It makes dir (a temporary directory) and pids (the daemons started), and
# defines skip, netns_hosts_up, start and address. Exits 77 (SKIP) without
# root or network namespaces.
dir=$(mktemp -d "${TMPDIR:-/tmp}/capstan-netns.XXXXXX")
pids=()
daemon_flags=()  # given to every daemon start() starts

# shellcheck disable=SC2317  # run by the EXIT trap
cleanup() {
  for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  for h in "${hosts[@]}"; do ip netns del "$tag$h" 2>/dev/null || true; done
  ip link del "${tag}br" 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT

skip() {
  echo "SKIP: $1"
  exit 77
}
[[ $(id -u) == 0 ]] || skip "network namespaces need root"
command -v ip >/dev/null || skip "the ip command (iproute2) is missing"
ip netns add "${tag}probe" 2>/dev/null || skip "cannot create network namespaces here"
ip netns del "${tag}probe"

# The bridge and one namespace per host; host k's link is ${tag}v$k inside
# it and ${tag}p$k on the bridge.
netns_hosts_up() {
  ip link add "${tag}br" type bridge
  ip link set "${tag}br" up
  local k h
  for k in "${!hosts[@]}"; do
    h=${hosts[$k]}
    ip netns add "$tag$h"
    ip link add "${tag}v$k" type veth peer name "${tag}p$k"
    ip link set "${tag}v$k" netns "$tag$h"
    ip link set "${tag}p$k" master "${tag}br"
    ip link set "${tag}p$k" up
    ip -n "$tag$h" addr add "$subnet.$((k + 1))/24" dev "${tag}v$k"
    ip -n "$tag$h" link set "${tag}v$k" up
    ip -n "$tag$h" link set lo up
  done
}

# start HOST_INDEX NAME PROGRAM FLAGS...: a daemon on that host, once it listens.
start() {
  local k=$1 name=$2 prog=$3
  shift 3
  ip netns exec "$tag${hosts[$k]}" "$bin_dir/$prog" --host "$subnet.$((k + 1))" --http-port 0 \
    --port-file "$dir/$name.port" "${daemon_flags[@]}" "$@" >"$dir/$name.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 100); do
    grep -q '^pid:' "$dir/$name.port" 2>/dev/null && return 0
    sleep 0.1
  done
  echo "FAIL: $name did not start"; cat "$dir/$name.log"; exit 1
}
address() { sed -n 's/^address: //p' "$dir/$1.port"; }
