#!/usr/bin/env bash
# Fails when a process started from BUILD_DIR/bin outlived the tests: every
# integration test must stop what it started. Waits a few seconds for daemons
# that are still shutting down, then names and kills the rest.
#
# Usage: scripts/check-leftovers.sh BUILD_DIR
set -euo pipefail

bin=$(cd "${1:?usage: check-leftovers.sh BUILD_DIR}" && pwd)/bin

leftovers() {
  local exe
  for proc in /proc/[0-9]*; do
    exe=$(readlink "$proc/exe" 2>/dev/null) || continue
    if [[ $exe == "$bin"/* ]]; then echo "${proc#/proc/}"; fi
  done
}

for _ in $(seq 50); do
  pids=$(leftovers)
  [[ -z $pids ]] && exit 0
  sleep 0.1
done
echo "check-leftovers.sh: processes from $bin outlived the tests (a test did not stop what it started):"
for pid in $pids; do
  echo "  $pid: $(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | cut -c1-300)"
  kill -9 "$pid" 2>/dev/null || true
done
exit 1
