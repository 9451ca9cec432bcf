# shellcheck shell=bash
# Sourced by shell tests that run a cluster with scripts/local-cluster.sh:
#   . "$(dirname "$0")/local_cluster.sh" REPO_ROOT BIN_DIR
# sets $repo_root and $bin_dir (absolute), $script (local-cluster.sh) and
# $run_dir (the cluster's run directory, named after the test; on exit the
# cluster goes down and the directory is removed, the test's exit status
# kept), keeps the script's own settings from leaking in from the caller's
# environment, and defines show_logs (the last lines of every daemon's log)
# and result pass|fail MESSAGE (prints the verdict, the logs after a
# failure, and the count line; exits 0 or 1).
repo_root=$(cd "$1" && pwd)
bin_dir=$(cd "$2" && pwd)
test_name=$(basename "$0" .sh)
script=$repo_root/scripts/local-cluster.sh

unset CAPSTAN_RUN_DIR CAPSTAN_BIN_DIR TF_CONFIG

run_dir=$(mktemp -d "${TMPDIR:-/tmp}/capstan-$test_name.XXXXXX")
# shellcheck disable=SC2317  # run by the EXIT trap
cleanup() {
  local status=$?
  bash "$script" down --run-dir "$run_dir" --bin-dir "$bin_dir" >/dev/null 2>&1 || true
  rm -rf "$run_dir"
  exit "$status"
}
trap cleanup EXIT

show_logs() {
  local log
  for log in "$run_dir"/logs/*.log; do
    [[ -e "$log" ]] || continue
    echo "--- $log (last lines)"
    tail -n 15 "$log"
  done
}

# shellcheck disable=SC2317  # not every test that sources this calls it
result() {
  if [[ $1 == pass ]]; then
    echo "PASS: $2"
    echo "$test_name: 1 passed, 0 failed"
    exit 0
  fi
  echo "FAIL: $2"
  show_logs
  echo "$test_name: 0 passed, 1 failed"
  exit 1
}
