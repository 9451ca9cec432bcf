#!/usr/bin/env bash
# TLS on RPC with real certificates (issue 12):
#   1. a ps-server with tls_cert/tls_key serves a client that trusts its CA,
#      and refuses a plain-TCP client and one that trusts another CA;
#   2. mutual TLS (tls_verify_clients): a client without a certificate is
#      refused, one with a certificate from the CA is served;
#   3. daemons talk TLS to each other: a data dispatcher and a data worker,
#      both with TLS, register and serve; the worker's heartbeats go over TLS.
#
# Usage: tests/scripts/tls_test.sh SOURCE_DIR BIN_DIR   (run by CTest)
set -euo pipefail

src=$(cd "$1" && pwd)
bin_dir=$(cd "$2" && pwd)
dir=$(mktemp -d "${TMPDIR:-/tmp}/capstan-tls.XXXXXX")
pids=()
# shellcheck disable=SC2317  # run by the EXIT trap
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done
  rm -rf "$dir"
}
trap cleanup EXIT

passed=0
failed=0
check() {  # description, command...
  local what=$1
  shift
  if "$@" >"$dir/out" 2>&1; then
    echo "PASS: $what"
    passed=$((passed + 1))
  else
    echo "FAIL: $what"
    sed 's/^/  | /' "$dir/out"
    failed=$((failed + 1))
  fi
}
refused() { ! "$@"; }

bash "$src/scripts/make-test-ca.sh" "$dir/ca" >/dev/null
bash "$src/scripts/make-test-ca.sh" "$dir/other" >/dev/null
echo secret-token >"$dir/token"

# Starts a daemon and sets `addr` to its RPC address. Not for $(...): the
# daemon's pid must reach `pids` in this shell, for cleanup.
start() {  # name, program, flags...
  local name=$1 program=$2
  shift 2
  "$bin_dir/$program" --port 0 --http-port 0 --port-file "$dir/$name.port" --token-file "$dir/token" "$@" \
    >"$dir/$name.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 100); do
    grep -q '^pid:' "$dir/$name.port" 2>/dev/null && break
    kill -0 "${pids[-1]}" 2>/dev/null || break
    sleep 0.1
  done
  local port
  port=$(sed -n 's/^rpc_port: //p' "$dir/$name.port" 2>/dev/null)
  if [[ -z $port ]]; then
    echo "FAIL: $name did not start"; cat "$dir/$name.log"; exit 1
  fi
  addr="127.0.0.1:$port"
}

ca=$dir/ca
ctl=("$bin_dir/capstanctl" --timeout-ms 3000)
export CAPSTAN_TOKEN=secret-token

# 1. Server TLS.
start ps ps-server --tls-cert "$ca/server.pem" --tls-key "$ca/server.key"
ps=$addr
check "the ps-server says it serves TLS" grep -q "token required; TLS" "$dir/ps.log"
check "a client trusting the CA is served" env CAPSTAN_TLS_CA="$ca/ca.pem" "${ctl[@]}" health "$ps"
check "a plain-TCP client is refused" refused "${ctl[@]}" health "$ps"
check "a client trusting another CA is refused" \
  refused env CAPSTAN_TLS_CA="$dir/other/ca.pem" "${ctl[@]}" health "$ps"
check "an unreadable CAPSTAN_TLS_CA is an error naming the file" \
  bash -c "CAPSTAN_TLS_CA='$dir/missing.pem' '$bin_dir/capstanctl' --timeout-ms 2000 health $ps 2>&1 | grep -q 'cannot read $dir/missing.pem'"

# 2. Mutual TLS.
start mps ps-server --tls-cert "$ca/server.pem" --tls-key "$ca/server.key" --tls-ca "$ca/ca.pem" \
  --tls-verify-clients true
mps=$addr
check "mutual TLS: a client without a certificate is refused" \
  refused env CAPSTAN_TLS_CA="$ca/ca.pem" "${ctl[@]}" health "$mps"
check "mutual TLS: a client certificate from another CA is refused" \
  refused env CAPSTAN_TLS_CA="$ca/ca.pem" CAPSTAN_TLS_CERT="$dir/other/client.pem" \
  CAPSTAN_TLS_KEY="$dir/other/client.key" "${ctl[@]}" health "$mps"
check "mutual TLS: a client with a certificate from the CA is served" \
  env CAPSTAN_TLS_CA="$ca/ca.pem" CAPSTAN_TLS_CERT="$ca/client.pem" CAPSTAN_TLS_KEY="$ca/client.key" \
  "${ctl[@]}" health "$mps"

# 3. Daemon to daemon (mutual TLS both ways).
tls_flags=(--tls-cert "$ca/server.pem" --tls-key "$ca/server.key" --tls-ca "$ca/ca.pem" --tls-verify-clients true)
start dispatcher data-dispatcher "${tls_flags[@]}"
dispatcher=$addr
start worker data-worker "${tls_flags[@]}" --dispatcher "$dispatcher"
worker=$addr
listed() {
  CAPSTAN_TLS_CA="$ca/ca.pem" CAPSTAN_TLS_CERT="$ca/client.pem" CAPSTAN_TLS_KEY="$ca/client.key" \
    "${ctl[@]}" data workers "$dispatcher" 2>/dev/null | grep -q "$worker"
}
registered=1
for _ in $(seq 20); do listed && registered=0 && break; sleep 0.2; done
check "a data worker registers with its dispatcher over mutual TLS" test "$registered" = 0
check "a bad tls_key exits 2 naming the file" \
  bash -c "'$bin_dir/ps-server' --port 0 --tls-cert '$ca/server.pem' --tls-key '$ca/ca.pem' 2>&1; test \$? = 2" 
check "tls_cert without tls_key exits 2" \
  bash -c "'$bin_dir/ps-server' --port 0 --tls-cert '$ca/server.pem' 2>&1 | grep -q 'tls_cert and tls_key go together'"

echo "tls_test: $passed passed, $failed failed"
if (( failed > 0 )); then
  for log in "$dir"/*.log; do echo "--- $log"; tail -5 "$log"; done
  exit 1
fi
