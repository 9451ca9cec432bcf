#!/usr/bin/env bash
# Makes bench/peers/.venv with TensorFlow (CPU) from PyPI, for the peer
# benchmarks in this directory. Never a dependency of Capstan itself: only
# these scripts import it. Idempotent; a failed download is tried again
# (scripts/pypi_venv.sh).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../../scripts/pypi_venv.sh"
if ! "$here/.venv/bin/python" -c "import tensorflow" 2>/dev/null; then
  if ! make_pypi_venv "$here/.venv" "$here/.venv.log" tensorflow-cpu; then
    tail -n 20 "$here/.venv.log"
    echo "bench/peers/venv.sh: pip install tensorflow-cpu failed three times (log above)" >&2
    exit 1
  fi
fi
"$here/.venv/bin/python" -c "import tensorflow as tf; print('bench/peers/.venv: TensorFlow', tf.__version__)"
