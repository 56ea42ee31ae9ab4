"""Default locations, relative to the working directory (the repository root for `make` targets).

Every command-line option, notebook setting and function default that names one of these folders
takes it from here, so moving one is a one-line change.
"""

from __future__ import annotations

from pathlib import Path

WORK_DIR = Path("data/work")  # cached stage outputs (data/README.md)
SUBMISSIONS_DIR = Path("submissions")  # one folder per run
DEMO_DATA_ROOT = Path("data/synthetic-small")  # the synthetic world `make demo` and the notebooks use


def synthetic_world(scale: str) -> Path:
    """Where `demo --scale SCALE` generates (or reuses) its synthetic world."""
    return DEMO_DATA_ROOT.with_name(f"synthetic-{scale}")
