"""The example: numpy logistic regression on the census data, read through
the data service (it starts its own dispatcher and data worker)."""

import os
import pathlib
import subprocess
import sys

from conftest import BIN_DIR, LIB_DIR

EXAMPLE = pathlib.Path(__file__).resolve().parents[1] / "examples" / "census_numpy.py"


def test_census_numpy_example_reaches_its_target():
    result = subprocess.run([sys.executable, str(EXAMPLE), "--bin-dir", str(BIN_DIR),
                             "--module", str(LIB_DIR / "libcensus_module.so")],
                            capture_output=True, text=True, timeout=240, env=dict(os.environ))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "read through the data service" in result.stdout
    assert "PASS" in result.stdout
