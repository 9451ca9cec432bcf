#!/usr/bin/env bash
# Python's `safetensors` package reads a Capstan checkpoint of a LibTorch
# module, under the module's parameter names. The torch cluster test
# "A checkpoint of a module trained on the parameter servers loads into a
# plain module, ..." trains a small module on two parameter servers (its
# embedding split in two shards), saves a checkpoint into
# CAPSTAN_TORCH_CHECKPOINT_OUT and writes expected.txt: each parameter of
# the plain module capstan::torch::load_checkpoint filled, by name, with its
# values. Python then opens every safetensors file with safetensors'
# safe_open (numpy), joins each variable's shards in the manifest's row
# order, and must find exactly those names and values.
#
# Usage: tests/scripts/safetensors_read_test.sh BUILD_DIR TORCH_CLUSTER_TESTS
#   (run by CTest as safetensors_reads_torch_checkpoint)
#
# safetensors comes from a virtual environment made once, on the first run,
# in BUILD_DIR/safetensors-venv (`pip install safetensors numpy`: PyPI, or
# the index pip is configured for). CAPSTAN_SAFETENSORS_PYTHON=/path/to/python
# uses an interpreter that already has both instead (machines without a
# package index).
set -euo pipefail

if [[ $# -ne 2 ]]; then
  echo "usage: $0 BUILD_DIR TORCH_CLUSTER_TESTS" >&2
  exit 2
fi
build_dir=$(cd "$1" && pwd)
cluster_tests=$2
. "$(dirname "$0")/../../scripts/pypi_venv.sh"

fail() {
  echo "FAIL: $*"
  echo "safetensors_read_test: 0 passed, 1 failed"
  exit 1
}

python=$(pypi_test_python "$build_dir" safetensors "safetensors, numpy" "${CAPSTAN_SAFETENSORS_PYTHON:-}" CAPSTAN_SAFETENSORS_PYTHON safetensors numpy) ||
  fail "no python with safetensors, numpy (above)"

work=$(mktemp -d "${TMPDIR:-/tmp}/capstan-safetensors-test.XXXXXX")
trap 'rm -rf "$work"' EXIT

# (A Catch test spec splits at commas: the name up to its comma, and '*'.)
CAPSTAN_TORCH_CHECKPOINT_OUT=$work/checkpoints "$cluster_tests" \
  "A checkpoint of a module trained on the parameter servers loads into a plain module*" \
  >"$work/cluster.log" 2>&1 || { tail -n 40 "$work/cluster.log"; fail "the torch cluster test failed (log above)"; }
grep -q "in 1 test case" "$work/cluster.log" || { cat "$work/cluster.log"; fail "the torch cluster test did not run one test case"; }
checkpoint=$(ls -d "$work"/checkpoints/ckpt-* 2>/dev/null | head -n 1 || true)
[[ -n $checkpoint && -f $work/checkpoints/expected.txt ]] || fail "the cluster test left no checkpoint and expected.txt"

"$python" - "$checkpoint" "$work/checkpoints/expected.txt" <<'PY' || fail "safetensors does not read the checkpoint as the module's parameters (above)"
import json
import os
import sys

import numpy
import safetensors
from safetensors import safe_open
from safetensors.numpy import load_file

checkpoint, expected_path = sys.argv[1], sys.argv[2]
errors = []


def check(ok, what):
    if not ok:
        errors.append(what)


expected = {}
with open(expected_path) as f:
    for line in f:
        fields = line.split()
        expected[fields[0]] = numpy.array([float(x) for x in fields[1:]], dtype=numpy.float32)
check(sorted(expected) == ["tower/embedding.weight", "tower/head.bias", "tower/head.weight"],
      "expected.txt names %r" % sorted(expected))

with open(os.path.join(checkpoint, "manifest.json")) as f:
    manifest = json.load(f)
files = {}
for entry in manifest["files"]:
    path = os.path.join(checkpoint, entry["name"])
    files[entry["name"]] = safe_open(path, framework="numpy")
    load_file(path)  # the whole file at once, too

variables = {v["name"]: v for v in manifest["variables"]}
for name, values in sorted(expected.items()):
    variable = variables.get(name)
    check(variable is not None, "the manifest has no variable %s" % name)
    if variable is None:
        continue
    shards = variable["shards"]
    if len(shards) == 1:
        check(shards[0]["name"] == name, "%s is whole but stored as %r" % (name, shards[0]["name"]))
    else:
        check([s["name"] for s in shards] == ["%s/part_%d" % (name, i) for i in range(len(shards))],
              "%s's shards are named %r" % (name, [s["name"] for s in shards]))
    pieces = []
    for shard in shards:
        handle = files[shard["file"]]
        check(shard["name"] in handle.keys(), "%s holds no tensor %s" % (shard["file"], shard["name"]))
        pieces.append(handle.get_tensor(shard["name"]))
    whole = numpy.concatenate(pieces, axis=0)
    check(list(whole.shape) == variable["shape"], "%s: shape %r, the manifest says %r" % (name, whole.shape, variable["shape"]))
    check(whole.dtype == numpy.float32, "%s: dtype %s" % (name, whole.dtype))
    check(numpy.array_equal(whole.reshape(-1), values),
          "%s: safetensors read %r, the loaded module holds %r" % (name, whole.reshape(-1), values))
    print("%s: %s %s in %d shard(s): %s" % (name, whole.dtype, list(whole.shape), len(shards),
                                           ", ".join(s["name"] + " in " + s["file"] for s in shards)))
check(any(len(variables[n]["shards"]) > 1 for n in expected if n in variables), "no variable was partitioned")

print("safetensors %s read %d file(s)" % (safetensors.__version__, len(files)))
for error in errors:
    print("FAIL: " + error)
sys.exit(1 if errors else 0)
PY
echo "PASS: Python's safetensors reads the checkpoint's files: every parameter of the module by its name, shards joined, values equal"
echo "safetensors_read_test: 1 passed, 0 failed"
