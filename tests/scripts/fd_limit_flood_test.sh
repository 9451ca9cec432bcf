#!/usr/bin/env bash
# Strangers cannot take every descriptor (issue 37): a ps-server under
# `ulimit -n 64` derives its pre-login caps from that limit (16 waiting
# connections, 8 per host) and logs them; while 100 idle connections without
# the token stay open and a stranger keeps opening more (50/s), all from the
# same host as the client:
#   - a client with the token connects, logs in and gets an answer
#     (capstanctl health), each of 5 times;
#   - /healthz on the HTTP port answers 200, though 100 idle connections
#     to that port are open too;
#   - the daemon holds well under its 64 descriptors and does not spin.
#
# Usage: tests/scripts/fd_limit_flood_test.sh BIN_DIR   (run by CTest)
set -euo pipefail

bin_dir=$(cd "$1" && pwd)
# shellcheck source=tests/scripts/one_daemon.sh
. "$(dirname "$0")/one_daemon.sh" fd-limit-flood

echo secret-token >"$dir/token"
# The default login deadline (10 s) keeps the flood's connections open for
# the whole test.
bash -c "ulimit -n 64; exec '$bin_dir/ps-server' --port 0 --http-port 0 --port-file '$dir/ports' \
  --token-file '$dir/token'" >"$dir/ps.log" 2>&1 &
pid=$!
port=$(rpc_port_of "$dir/ports")
[[ -n $port ]] || { cat "$dir/ps.log"; echo "fd_limit_flood_test: the ps-server did not start"; exit 1; }
http_port=$(sed -n 's/^http_port: //p' "$dir/ports")

failures=0
if grep -q "connections waiting to log in: at most 16, 8 per host (lowered from" "$dir/ps.log"; then
  echo "PASS: the caps derived from ulimit -n 64 are logged"
else
  echo "FAIL: no log line 'connections waiting to log in: at most 16, 8 per host (lowered from ...'"
  failures=$((failures + 1))
fi

CAPSTAN_TOKEN=secret-token python3 - "$port" "$http_port" "$pid" "$bin_dir/capstanctl" <<'PY' || failures=$((failures + 1))
import os, socket, subprocess, sys, threading, time, urllib.request

port, http_port, pid, capstanctl = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
failed = 0

def check(ok, what):
    global failed
    print(("PASS: " if ok else "FAIL: ") + what, flush=True)
    if not ok:
        failed += 1

def cpu_seconds():
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

def descriptors():
    return len(os.listdir(f"/proc/{pid}/fd"))

held = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(100)]
# And idle connections to the HTTP port: it keeps an eighth of the limit (8).
held += [socket.create_connection(("127.0.0.1", http_port), timeout=5) for _ in range(100)]
stop = threading.Event()
def keep_flooding():
    while not stop.is_set():
        try:
            held.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        except OSError:
            pass
        time.sleep(0.02)
flooder = threading.Thread(target=keep_flooding)
flooder.start()
time.sleep(0.5)
try:
    cpu_before, t0 = cpu_seconds(), time.time()
    most = descriptors()
    served = 0
    for attempt in range(5):
        started = time.time()
        try:
            run = subprocess.run([capstanctl, "health", f"127.0.0.1:{port}"], capture_output=True, text=True,
                                 timeout=8)
            ok = run.returncode == 0 and "ps" in run.stdout
            if not ok:
                print(run.stdout + run.stderr)
        except subprocess.TimeoutExpired:
            ok = False
        print(f"client with the token: {'served' if ok else 'NOT served'} in {time.time() - started:.2f} s")
        served += ok
        most = max(most, descriptors())
    check(served == 5, f"a client with the token logs in and calls during the flood ({served} of 5)")

    started = time.time()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/healthz", timeout=5) as reply:
            status = reply.status
    except Exception as e:  # noqa: BLE001 - any failure is the finding
        status = repr(e)
    check(status == 200, f"/healthz answers during the flood ({status}, {time.time() - started:.2f} s)")

    time.sleep(max(0.0, 2.0 - (time.time() - t0)))
    most = max(most, descriptors())
    busy = (cpu_seconds() - cpu_before) / (time.time() - t0)
    print(f"flood: {len(held)} connections opened; the daemon held at most {most} descriptors "
          f"and used {busy:.2f} cores")
    check(most <= 56, f"the daemon kept descriptors free under ulimit -n 64 (at most {most} open)")
    check(busy < 0.5, f"the daemon does not spin during the flood ({busy:.2f} cores)")
    check(stop.is_set() is False and len(held) > 100, "the flood was still going on")
finally:
    stop.set()
    flooder.join()
    for s in held:
        s.close()
sys.exit(1 if failed else 0)
PY
kill -0 "$pid" 2>/dev/null || { echo "FAIL: the ps-server died"; failures=$((failures + 1)); }

if (( failures > 0 )); then
  echo "--- ps-server log"; tail -20 "$dir/ps.log"
  echo "fd_limit_flood_test: $failures failed"
  exit 1
fi
echo "fd_limit_flood_test: all passed"
