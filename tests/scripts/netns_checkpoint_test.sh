#!/usr/bin/env bash
# Checkpoints without a funnel, across hosts (issue 34): each host is a
# network namespace whose one link (a veth pair on a bridge) is rate-limited
# with tbf; they share the file system, as the hosts of a real cluster share
# the checkpoint directory.
#
#   h0 10.78.0.1  coordinator, the program (checkpoint_program), 2 Mbit/s
#   h1 10.78.0.2  ps-server 0, 200 Mbit/s
#   h2 10.78.0.3  ps-server 1, 200 Mbit/s
#
# The program makes a 64 MiB variable with Adam (192 MiB with its slots) on
# the two servers by an initializer, saves a checkpoint and restores it. At
# 2 Mbit/s the model would take more than ten minutes to cross the
# coordinator's link; the test counts the bytes that did (both directions)
# and expects control traffic only (under 1 MiB), and finds each server's
# file in the checkpoint.
#
# Needs root, network namespaces and tbf; prints SKIP and exits 77 where
# they are missing. Usage: netns_checkpoint_test.sh BIN_DIR PROGRAM
set -euo pipefail

bin_dir=$(cd "$1" && pwd)
program=$2
tag=k$$  # unique names: several runs may overlap
subnet=10.78.0
hosts=(h0 h1 h2)
# shellcheck source=tests/scripts/netns_hosts.sh
source "$(dirname "${BASH_SOURCE[0]}")/netns_hosts.sh"
command -v tc >/dev/null || skip "the tc command (iproute2) is missing"
ip netns add "${tag}probe"
if ! ip netns exec "${tag}probe" tc qdisc add dev lo root tbf rate 1mbit burst 32kbit latency 400ms 2>/dev/null; then
  ip netns del "${tag}probe"
  skip "the kernel has no tbf queueing discipline"
fi
ip netns del "${tag}probe"

rates=(2mbit 200mbit 200mbit)
netns_hosts_up
for k in "${!hosts[@]}"; do
  # Both directions: out of the host, and out of the bridge into it.
  ip netns exec "$tag${hosts[$k]}" tc qdisc add dev "${tag}v$k" root tbf rate "${rates[$k]}" burst 64kbit latency 2s
  tc qdisc add dev "${tag}p$k" root tbf rate "${rates[$k]}" burst 64kbit latency 2s
done
# Bytes through host 0's link so far, both directions.
coordinator_link_bytes() {
  local rx tx
  rx=$(ip netns exec "$tag"h0 cat "/sys/class/net/${tag}v0/statistics/rx_bytes")
  tx=$(ip netns exec "$tag"h0 cat "/sys/class/net/${tag}v0/statistics/tx_bytes")
  echo $((rx + tx))
}

start 1 ps0 ps-server --port 7100 --task-index 0
start 2 ps1 ps-server --port 7101 --task-index 1
start 0 coordinator coordinator --port 7000 --ps "$(address ps0),$(address ps1)"

failed=0
pass() { echo "PASS: $1"; }
fail() { echo "FAIL: $1"; failed=$((failed + 1)); }

before=$(coordinator_link_bytes)
rc=0
ip netns exec "$tag"h0 timeout 240 "$program" --coordinator "$(address coordinator)" --mib 64 \
  --dir "$dir/checkpoints" >"$dir/program.out" 2>&1 || rc=$?
after=$(coordinator_link_bytes)
crossed=$((after - before))
cat "$dir/program.out"
if [[ $rc == 0 ]] && grep -q '^restored step 1 ' "$dir/program.out"; then
  pass "a 64 MiB variable with Adam slots made, saved and restored across namespaces"
else
  fail "checkpoint_program exited $rc"; tail -20 "$dir/coordinator.log"
fi
if ((crossed < 1048576)); then
  pass "the coordinator's link carried $crossed bytes for a 192 MiB save and restore: control only"
else
  fail "the coordinator's link carried $crossed bytes (expected under 1 MiB: the shards go from each server to the disk)"
fi
for task in 0 1; do
  file=$(ls -d "$dir"/checkpoints/ckpt-1/ps-$task.safetensors 2>/dev/null || true)
  size=$(stat -c %s "$file" 2>/dev/null || echo 0)
  # Half the variable and its two Adam slots: 96 MiB.
  if ((size > 96 * 1048576)); then
    pass "ps-server $task wrote its own file, $size bytes"
  else
    fail "ps-server $task's file ps-$task.safetensors has $size bytes (expected over 96 MiB)"
  fi
done
if "$bin_dir/capstanctl" checkpoint inspect "$dir/checkpoints" >"$dir/inspect.out" 2>&1 &&
  grep -q ballast "$dir/inspect.out"; then
  pass "capstanctl checkpoint inspect reads it"
else
  fail "capstanctl checkpoint inspect failed"; cat "$dir/inspect.out"
fi
echo "$failed check(s) failed"
((failed == 0))
