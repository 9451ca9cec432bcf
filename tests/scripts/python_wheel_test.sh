#!/usr/bin/env bash
# The wheel (issue 38): python/make_wheel.py packs the build's package, pip
# installs it into a fresh virtual environment (with the system's site
# packages for numpy and torch: nothing is downloaded), and a program run
# outside the source tree imports it from there and uses it: a pipeline, a
# data service of the build's daemons, DLPack into torch, capstan.torch.
#
# Usage: python_wheel_test.sh REPO_ROOT BUILD_DIR PYTHON
set -euo pipefail

if [[ $# -ne 3 ]]; then
  echo "usage: $0 REPO_ROOT BUILD_DIR PYTHON" >&2
  exit 2
fi
repo_root=$1 build_dir=$2 python=$3
work=$(mktemp -d "${TMPDIR:-/tmp}/capstan-wheel.XXXXXX")
trap 'rm -rf "$work"' EXIT

wheel=$("$python" "$repo_root/python/make_wheel.py" --build-dir "$build_dir" --out-dir "$work/dist")
[[ -f $wheel ]] || { echo "FAIL: make_wheel.py printed '$wheel', not a wheel"; exit 1; }
"$python" -m venv --system-site-packages "$work/venv"
"$work/venv/bin/pip" install --no-index --quiet "$wheel"

cd "$work"  # outside the source tree: nothing but the venv provides capstan
cat >"$work/smoke.py" <<'PY'
import pathlib, sys
import numpy as np
import torch
import capstan, capstan.local, capstan.torch
from capstan.data import Dataset

venv = pathlib.Path(sys.argv[1]).resolve()
where = pathlib.Path(capstan.__file__).resolve()
assert venv in where.parents, f"capstan came from {where}, not the virtual environment {venv}"
assert (where.parent / "libcapstan.so.0").is_file()
batches = [b.tolist() for (b,) in Dataset.range(6).batch(3)]
assert batches == [[0, 1, 2], [3, 4, 5]], batches
with capstan.local.DataService(sys.argv[2]) as dispatcher:
    read = capstan.data.service.distribute(Dataset.range(100).batch(10), dispatcher)
    arrays = [a for (a,) in read]
assert sorted(int(v) for a in arrays for v in a) == list(range(100))
t = torch.from_dlpack(arrays[0])
assert t.data_ptr() == arrays[0].__array_interface__["data"][0]
loader = torch.utils.data.DataLoader(capstan.torch.IterableDataset(Dataset.range(4)), batch_size=None)
assert [int(x) for (x,) in loader] == [0, 1, 2, 3]
print(f"the wheel's capstan {capstan.__version__} from {where.parent}: pipeline, data service, DLPack, torch: ok")
PY
"$work/venv/bin/python" "$work/smoke.py" "$work/venv" "$build_dir/bin"
echo "PASS: $(basename "$wheel") installs into a fresh virtual environment and works outside the source tree"
