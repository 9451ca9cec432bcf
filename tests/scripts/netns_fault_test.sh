#!/usr/bin/env bash
# Real network faults (issue 12): a cluster across network namespaces joined
# by veth pairs on a bridge, with links cut and slowed under training.
#
#   h0 10.77.0.1  coordinator, the training program (linear_regression)
#   h1 10.77.0.2  ps-server
#   h2 10.77.0.3  worker-server 0
#   h3 10.77.0.4  worker-server 1
#
#   1. a worker partitioned (its link down, no RST: packets vanish) during
#      training: the coordinator drops it after the ping timeout, its
#      closures run on the other worker, training completes; when the link
#      comes back the worker registers again;
#   2. the PS partitioned: the workers' links to it break after
#      link_timeout_ms (3 s here), so the program fails with UNAVAILABLE
#      instead of waiting out its 60 s call timeouts; after the link comes
#      back, training runs again;
#   3. a slow, lossy link to a worker (30 +- 10 ms delay, 2% loss; netem
#      where the kernel has it, else tests/tools/packet_delay behind an
#      iptables NFQUEUE rule): training completes.
#
# Needs root and network namespaces; prints SKIP and exits 77 where they
# cannot be created. Usage: netns_fault_test.sh BIN_DIR MODULE PROGRAM
set -euo pipefail

bin_dir=$(cd "$1" && pwd)
module=$2
program=$3
tag=c$$  # unique names: several runs may overlap
subnet=10.77.0
hosts=(h0 h1 h2 h3)
# shellcheck source=tests/scripts/netns_hosts.sh
source "$(dirname "${BASH_SOURCE[0]}")/netns_hosts.sh"
netns_hosts_up
link() { ip link set "${tag}p$1" "$2"; }  # host index, up|down
daemon_flags=(--link-timeout-ms 3000)

start 1 ps ps-server --port 7100
ps=$(address ps)
start 0 coordinator coordinator --port 7000 --ps "$ps" --worker-ping-interval-ms 200 --worker-ping-timeout-ms 1000
coordinator=$(address coordinator)
start 2 worker0 worker-server --port 7200 --task-index 0 --coordinator "$coordinator" --module "$module"
start 3 worker1 worker-server --port 7201 --task-index 1 --coordinator "$coordinator" --module "$module"

passed=0
failed=0
pass() { echo "PASS: $1"; passed=$((passed + 1)); }
fail() { echo "FAIL: $1"; failed=$((failed + 1)); }

# train OUT EPOCHS STEPS [TIMEOUT]: the program on h0; its exit status.
train() {
  local out=$1 epochs=$2 steps=$3 limit=${4:-120}
  local rc=0
  ip netns exec "$tag"h0 timeout "$limit" "$program" --coordinator "$coordinator" --min-workers 2 \
    --epochs "$epochs" --steps-per-epoch "$steps" >"$dir/$out" 2>&1 || rc=$?
  return "$rc"
}
finished() { grep -q '^final loss' "$dir/$1"; }

# 1. A worker partitioned mid-training.
train t1 4 4000 &
trainer=$!
sleep 1.5
link 3 down
t0=$(date +%s%N)
sleep 4
link 3 up
rc=0
wait "$trainer" || rc=$?
if [[ $rc == 0 ]] && finished t1; then
  pass "training completes while worker 1 is partitioned for 4 s"
else
  fail "training with worker 1 partitioned exited $rc"; tail -5 "$dir/t1"
fi
if grep -q "lost" "$dir/coordinator.log"; then
  pass "the coordinator dropped the partitioned worker ($(grep -m1 "lost" "$dir/coordinator.log" | cut -c1-160))"
else
  fail "the coordinator never dropped the partitioned worker"
fi
rejoined=1
for _ in $(seq 50); do
  if [[ $(grep -c "joined" "$dir/coordinator.log" || true) -ge 3 ]]; then rejoined=0; break; fi
  sleep 0.2
done
if [[ $rejoined == 0 ]] && train t1b 1 200 60 && finished t1b; then
  pass "the healed worker registers again and training with 2 workers runs ($(( ($(date +%s%N) - t0) / 1000000 )) ms after the cut)"
else
  fail "the healed worker did not come back"; grep -i "joined\|lost" "$dir/coordinator.log" | tail -5
fi

# 2. The PS partitioned mid-training: UNAVAILABLE, not a hang; recovery
# after healing.
train t2 4 4000 180 &
trainer=$!
sleep 1.5
link 1 down
start_ms=$(date +%s%N)
rc=0
wait "$trainer" || rc=$?
took=$(( ($(date +%s%N) - start_ms) / 1000000 ))
link 1 up
if [[ $rc != 0 && $rc != 124 && $took -lt 20000 ]] && grep -q "UNAVAILABLE" "$dir/t2"; then
  pass "with the PS partitioned mid-training the program fails ${took} ms after the cut: $(grep -m1 "UNAVAILABLE" "$dir/t2" | cut -c1-200)"
else
  fail "with the PS partitioned the program exited $rc after ${took} ms (0: it never noticed, 124: it hung)"; tail -5 "$dir/t2"
fi
# The coordinator reconnects on its own; the first runs may still see
# UNAVAILABLE at once while it does.
healed_ms=$(date +%s%N)
recovered=1
for _ in $(seq 60); do
  if train t2b 1 200 90 && finished t2b; then recovered=0; break; fi
  sleep 0.5
done
back=$(( ($(date +%s%N) - healed_ms) / 1000000 ))
if [[ $recovered == 0 ]]; then
  pass "after the PS link comes back, training runs again (${back} ms after healing)"
else
  fail "training after the PS came back"; tail -5 "$dir/t2b"
fi

# 3. A slow, lossy link to worker 1: 30 +- 10 ms delay and 2% loss on what
# it receives. With netem where the kernel has it; else with packet_delay,
# which an iptables NFQUEUE rule in worker 1's namespace hands every packet
# arriving on its link (--queue-bypass: if packet_delay is not there yet,
# packets pass).
delay_ms=30 jitter_ms=10 loss_percent=2
impairment="$delay_ms ms +- $jitter_ms ms delay, $loss_percent% loss"
if tc qdisc add dev "${tag}p3" root netem delay "${delay_ms}ms" "${jitter_ms}ms" loss "$loss_percent%" 2>/dev/null; then
  shaping="netem: $impairment"
elif [[ -x $bin_dir/packet_delay ]] && command -v iptables >/dev/null; then
  ip netns exec "${tag}h3" "$bin_dir/packet_delay" --queue 7 --delay-ms "$delay_ms" --jitter-ms "$jitter_ms" \
    --loss-percent "$loss_percent" --seed 1 2>"$dir/packet_delay.log" &
  delay_pid=$!
  pids+=("$delay_pid")
  sleep 0.3
  kill -0 "$delay_pid" 2>/dev/null || { cat "$dir/packet_delay.log"; fail "packet_delay did not start"; }
  ip netns exec "${tag}h3" iptables -A INPUT -i "${tag}v3" -j NFQUEUE --queue-num 7 --queue-bypass
  shaping="packet_delay (no netem in this kernel): $impairment"
else
  tc qdisc add dev "${tag}p3" root tbf rate 2mbit burst 16kbit latency 100ms
  shaping="tbf 2 Mbit/s (no netem in this kernel, no iptables or packet_delay: no delay or loss emulated)"
fi
start_ms=$(date +%s%N)
if train t3 2 300 180 && finished t3; then
  pass "training completes over a slowed link ($shaping) in $(( ($(date +%s%N) - start_ms) / 1000000 )) ms"
else
  fail "training over a slowed link ($shaping)"; tail -5 "$dir/t3"
fi
if [[ -n ${delay_pid:-} ]]; then
  kill -TERM "$delay_pid"
  wait "$delay_pid" || true
  grep -h "packets delayed" "$dir/packet_delay.log" || true
fi

echo "netns_fault_test: $passed passed, $failed failed"
if (( failed > 0 )); then
  for log in "$dir"/*.log; do echo "--- $log"; tail -8 "$log"; done
  exit 1
fi
