# Sourced by shell tests that run one daemon against a scratch directory:
#   . "$(dirname "$0")/one_daemon.sh" NAME
# sets $dir (removed on exit), kills the daemon whose pid the test puts in
# $pid on exit, and defines rpc_port_of PORT_FILE: the daemon's RPC port
# once it listens (empty if it never does within 10 s).
dir=$(mktemp -d "${TMPDIR:-/tmp}/capstan-$1.XXXXXX")
pid=
# shellcheck disable=SC2317  # run by the EXIT trap
cleanup() {
  if [[ -n $pid ]]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
  rm -rf "$dir"
}
trap cleanup EXIT

rpc_port_of() {
  for _ in $(seq 100); do
    [[ -s $1 ]] && grep -q '^pid:' "$1" && break
    sleep 0.1
  done
  sed -n 's/^rpc_port: //p' "$1" 2>/dev/null || true
}
