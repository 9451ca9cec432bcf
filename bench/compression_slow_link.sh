#!/usr/bin/env bash
# Runs compression_bench with its data worker behind a rate-limited link:
# a network namespace joined by a veth pair whose two ends are shaped to
# RATE by a token bucket (tc tbf; tc's units: 1gbit, 100mbit, ...; netem
# would do, but container kernels often lack it). Needs root (ip netns,
# tc). Removes the namespace and the link on exit.
#
# Usage: bench/compression_slow_link.sh RATE [compression_bench flags...]
#   e.g. bench/compression_slow_link.sh 1gbit --epochs 5 --rounds 3
set -euo pipefail
rate=${1:?usage: $0 RATE [compression_bench flags...]}
shift
bin=${CAPSTAN_BIN_DIR:-$(cd "$(dirname "$0")/.." && pwd)/build/bin}
ns=capstan-slow-$$
outer=cnm$$a
inner=cnm$$b
cleanup() {
  ip netns del "$ns" 2>/dev/null || true
  ip link del "$outer" 2>/dev/null || true
}
trap cleanup EXIT
ip netns add "$ns"
ip link add "$outer" type veth peer name "$inner"
ip link set "$inner" netns "$ns"
ip addr add 10.213.0.1/24 dev "$outer"
ip link set "$outer" up
ip netns exec "$ns" ip addr add 10.213.0.2/24 dev "$inner"
ip netns exec "$ns" ip link set "$inner" up
ip netns exec "$ns" ip link set lo up
shape="tbf rate $rate burst 1mb latency 50ms"
tc qdisc add dev "$outer" root $shape
ip netns exec "$ns" tc qdisc add dev "$inner" root $shape
echo "link: veth shaped to $rate each way (tc $shape)"
"$bin/compression_bench" --netns "$ns" --host 10.213.0.1 --worker-host 10.213.0.2 "$@"
