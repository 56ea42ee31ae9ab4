"""Fixtures shared by several test files."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

import pipelines  # noqa: F401  (first: it sets the OpenMP wait policy before any test imports torch)


@pytest.fixture(scope="session")
def tiny_world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The ``tiny`` synthetic world (all five collections, Kaggle layout), generated once per session.

    Treat it as read-only raw data: tests write into their own work and submission folders.
    """
    from pipelines.synth import generate_world

    root = tmp_path_factory.mktemp("tiny-world") / "data"
    generate_world(root, scale="tiny", seed=0)
    return root


@contextmanager
def logged_messages() -> Iterator[list[str]]:
    """The messages the pipeline logs (INFO and up) within the block, as the command line prints
    them; for module-scoped fixtures, where ``caplog`` is not available."""
    lines: list[str] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: lines.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger("pipelines")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield lines
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
