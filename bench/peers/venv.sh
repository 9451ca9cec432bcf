#!/usr/bin/env bash
# Makes bench/peers/.venv with TensorFlow (CPU) from PyPI, for the peer
# benchmarks in this directory. Never a dependency of Capstan itself: only
# these scripts import it. Idempotent.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
if [[ ! -x "$here/.venv/bin/python" ]]; then
  python3 -m venv "$here/.venv"
fi
if ! "$here/.venv/bin/python" -c "import tensorflow" 2>/dev/null; then
  "$here/.venv/bin/pip" install --quiet --upgrade pip
  "$here/.venv/bin/pip" install --quiet "tensorflow-cpu"
fi
"$here/.venv/bin/python" -c "import tensorflow as tf; print('bench/peers/.venv: TensorFlow', tf.__version__)"
