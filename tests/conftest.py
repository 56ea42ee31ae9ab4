"""Fixtures shared by several test files."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The ``tiny`` synthetic world (all five collections, Kaggle layout), generated once per session.

    Treat it as read-only raw data: tests write into their own work and submission folders.
    """
    from pipelines.synth import generate_world

    root = tmp_path_factory.mktemp("tiny-world") / "data"
    generate_world(root, scale="tiny", seed=0)
    return root
