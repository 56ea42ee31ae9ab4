"""Importing the package makes GNU OpenMP threads wait passively (pipelines/__init__.py), unless the user chose.

Checked on what the OpenMP runtimes themselves report: libgomp prints its settings when it is
loaded with ``OMP_DISPLAY_ENV=VERBOSE``, one block per runtime (torch bundles its own libgomp;
LightGBM uses the system's). ``GOMP_SPINCOUNT = '0'`` is the passive policy, 300000 libgomp's default.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # end-to-end: left out of make test-quick

ROOT = Path(__file__).resolve().parent.parent
# torch through the GNN model module (as a fold job imports it), then lightgbm
IMPORTS = "import pipelines.models.gnn.model, lightgbm, torch; torch.ones(4).sum()"


def spin_counts(code: str, **env: str) -> list[str]:
    """GOMP_SPINCOUNT of every GNU OpenMP runtime loaded by a fresh process running ``code``."""
    clean = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    clean.update(OMP_DISPLAY_ENV="VERBOSE", PYTHONPATH=str(ROOT), **env)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=clean, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    counts = re.findall(r"GOMP_SPINCOUNT = '(\d+)'", done.stderr)
    if not counts:
        pytest.skip("no GNU OpenMP runtime reported its settings (another OpenMP implementation)")
    return counts


def test_importing_the_package_first_makes_every_openmp_runtime_wait_passively():
    assert set(spin_counts("import torch, lightgbm; torch.ones(4).sum()")) == {"300000"}  # libgomp's default
    counts = spin_counts(IMPORTS)
    assert len(counts) >= 2 and set(counts) == {"0"}  # torch's libgomp and LightGBM's


@pytest.mark.parametrize("env, expected", [({"OMP_WAIT_POLICY": "ACTIVE"}, None), ({"GOMP_SPINCOUNT": "1234"}, "1234")])
def test_a_users_own_wait_setting_is_kept(env, expected):
    counts = spin_counts(IMPORTS, **env)
    assert "0" not in counts
    if expected is not None:
        assert set(counts) == {expected}
