#!/usr/bin/env bash
# A stranger without the cluster token cannot make a daemon allocate, hold
# descriptors for long, or stop serving (issue 12, before login):
#   1. memory: 8 connections each sending a 64 MiB message before logging in
#      are closed after the pre-login budget; the ps-server's RSS stays flat;
#   2. idle: a connection that never logs in is closed after
#      login_deadline_ms;
#   3. caps: 300 idle connections from one host against
#      max_pre_login_per_host 100: each one past the cap makes the daemon close
#      the oldest waiting one at once, and the port serves a client within a
#      second of the flood ending.
#
# Usage: tests/scripts/pre_login_test.sh BIN_DIR   (run by CTest)
set -euo pipefail

bin_dir=$(cd "$1" && pwd)
# shellcheck source=tests/scripts/one_daemon.sh
. "$(dirname "$0")/one_daemon.sh" pre-login

failures=0
fail() {
  echo "FAIL: $1"
  failures=$((failures + 1))
}

"$bin_dir/ps-server" --port 0 --http-port 0 --port-file "$dir/ports" --token-file <(echo secret-token) \
  --login-deadline-ms 1500 --max-pre-login-per-host 100 >"$dir/ps.log" 2>&1 &
pid=$!
port=$(rpc_port_of "$dir/ports")
[[ -n $port ]] || { cat "$dir/ps.log"; echo "pre_login_test: the ps-server did not start"; exit 1; }

python3 - "$port" "$pid" <<'PY' || failures=$((failures + 1))
import socket, struct, sys, time, threading

port, pid = int(sys.argv[1]), int(sys.argv[2])
failed = 0

def check(ok, what):
    global failed
    print(("PASS: " if ok else "FAIL: ") + what)
    if not ok:
        failed += 1

def rss_mib():
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return -1

def closed_by_peer(s, within):
    """True when the server closes `s` within `within` seconds."""
    s.settimeout(within)
    try:
        return s.recv(1) == b""
    except socket.timeout:
        return False
    except OSError:
        return True

# 1. 64 MiB messages before login.
before = rss_mib()
words = (64 << 20) // 8
header = struct.pack("<II", 0, words)  # one segment of 64 MiB
sent = [0] * 8
def flood(k):
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    try:
        s.sendall(header)
        chunk = b"\0" * (1 << 20)
        for _ in range(64):
            s.sendall(chunk)
            sent[k] += len(chunk)
    except OSError:
        pass
    finally:
        s.close()
threads = [threading.Thread(target=flood, args=(k,)) for k in range(8)]
t0 = time.time()
for t in threads: t.start()
for t in threads: t.join(30)
after = rss_mib()
print(f"memory: RSS {before:.0f} MiB before, {after:.0f} MiB after 8 x 64 MiB sent before login; "
      f"each connection got through at most {max(sent) >> 20} MiB before it was closed ({time.time() - t0:.1f} s)")
check(after - before < 48, f"RSS grew by {after - before:.0f} MiB (< 48)")
check(max(sent) < (64 << 20), "every 64 MiB message was cut off")

# 2. An idle connection is closed after the login deadline (1.5 s).
s = socket.create_connection(("127.0.0.1", port), timeout=5)
t0 = time.time()
closed = closed_by_peer(s, 5)
took = time.time() - t0
s.close()
print(f"idle: closed after {took:.2f} s (login_deadline_ms 1500)")
check(closed and 1.0 <= took <= 4.0, "an idle connection is closed at the login deadline")

# 3. 300 idle connections from one host; the cap is 100.
held = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(300)]
time.sleep(0.3)
refused = sum(1 for c in held if closed_by_peer(c, 0.01))
print(f"caps: {refused} of 300 idle connections closed at once (max_pre_login_per_host 100)")
check(refused >= 190, "past the per-host cap the oldest waiting connections are closed as new ones come")
for c in held:
    c.close()
print(f"ENDED {time.time()}")
sys.exit(1 if failed else 0)
PY

# After the flood: a client with the token is served at once.
start=$(date +%s%N)
served=0
for _ in $(seq 20); do
  if CAPSTAN_TOKEN=secret-token "$bin_dir/capstanctl" health "127.0.0.1:$port" >"$dir/health.out" 2>&1; then
    served=1
    break
  fi
  sleep 0.05
done
took=$(( ($(date +%s%N) - start) / 1000000 ))
if [[ $served == 1 && $took -lt 1000 ]]; then
  echo "PASS: served ${took} ms after the flood ended"
else
  cat "$dir/health.out"
  fail "not served within a second of the flood ending (${took} ms)"
fi
kill -0 "$pid" 2>/dev/null || fail "the ps-server died"

if (( failures > 0 )); then
  echo "--- ps-server log"; tail -20 "$dir/ps.log"
  echo "pre_login_test: $failures failed"
  exit 1
fi
echo "pre_login_test: all passed"
