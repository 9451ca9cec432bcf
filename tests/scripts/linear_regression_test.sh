#!/usr/bin/env bash
# Runs the linear regression example (examples/linear_regression) on a local
# cluster started with scripts/local-cluster.sh --module, and checks that it
# trains: all five epochs report a loss and the last is below the first.
#
# Usage: tests/scripts/linear_regression_test.sh REPO_ROOT BIN_DIR MODULE PROGRAM
#   (run by CTest as examples_linear_regression)
set -euo pipefail

if [[ $# -ne 4 ]]; then
  echo "usage: $0 REPO_ROOT BIN_DIR MODULE PROGRAM" >&2
  exit 2
fi
# shellcheck source=tests/scripts/local_cluster.sh
. "$(dirname "$0")/local_cluster.sh" "$1" "$2"
module=$3
program=$4

if ! bash "$script" up --run-dir "$run_dir" --bin-dir "$bin_dir" --ps 2 --workers 2 --data-workers 0 \
  --module "$module"; then
  result fail "local-cluster.sh up --module $module failed"
fi
# shellcheck disable=SC1091  # written by local-cluster.sh
. "$run_dir/cluster.env"

output_file=$run_dir/linear_regression.out
rc=0
timeout 120 "$program" --coordinator "$COORDINATOR" --min-workers 2 >"$output_file" 2>&1 || rc=$?
cat "$output_file"
if [[ $rc -ne 0 ]]; then
  result fail "linear_regression exited with status $rc"
fi

mapfile -t losses < <(sed -n 's/^epoch \([0-9]*\): loss \([0-9.eE+-]*\)$/\2/p' "$output_file")
if [[ ${#losses[@]} -ne 5 ]]; then
  result fail "expected 5 'epoch N: loss X' lines, got ${#losses[@]}"
fi
if awk -v first="${losses[0]}" -v last="${losses[4]}" 'BEGIN { exit !(last < first) }'; then
  result pass "the loss falls from ${losses[0]} (epoch 1) to ${losses[4]} (epoch 5)"
fi
result fail "the loss did not fall: ${losses[0]} after epoch 1, ${losses[4]} after epoch 5"
