#!/usr/bin/env bash
# A daemon that runs out of file descriptors keeps accepting once they are
# free again (issue 12's connection flood): a ps-server limited to 40 file
# descriptors gets 100 idle TCP connections, which are then closed; a client
# must be served again within a second or two, not time out forever.
#
# Usage: tests/scripts/accept_flood_test.sh BIN_DIR   (run by CTest)
set -euo pipefail

bin_dir=$(cd "$1" && pwd)
# shellcheck source=tests/scripts/one_daemon.sh
. "$(dirname "$0")/one_daemon.sh" accept-flood

result() {
  echo "$1: $2"
  if [[ $1 == PASS ]]; then echo "accept_flood_test: 1 passed, 0 failed"; exit 0; fi
  echo "--- ps-server log"; cat "$dir/ps.log" || true
  echo "accept_flood_test: 0 passed, 1 failed"
  exit 1
}

bash -c "ulimit -n 40; exec '$bin_dir/ps-server' --port 0 --http-port 0 --port-file '$dir/ports'" >"$dir/ps.log" 2>&1 &
pid=$!
port=$(rpc_port_of "$dir/ports")
[[ -n $port ]] || result FAIL "the ps-server did not start"

# 100 idle connections (more than the daemon can hold), held, then closed.
python3 - "$port" <<'PY'
import socket, sys, time
port = int(sys.argv[1])
held = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(100)]
time.sleep(1.0)
for s in held:
    s.close()
PY
start=$(date +%s%N)
for attempt in $(seq 20); do
  if "$bin_dir/capstanctl" health "127.0.0.1:$port" >"$dir/health.out" 2>&1; then
    took=$(( ($(date +%s%N) - start) / 1000000 ))
    result PASS "served again ${took} ms after 100 connections to a daemon limited to 40 descriptors closed"
  fi
  sleep 0.1
done
cat "$dir/health.out"
result FAIL "the ps-server stopped accepting after the flood"
