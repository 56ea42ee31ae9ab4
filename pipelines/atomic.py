"""Helpers for atomic file writes (temporary file + rename)."""

from __future__ import annotations

import os


def chmod_like_new_file(path: str | os.PathLike[str]) -> None:
    """mkstemp creates 0600 files; give the final file the permissions a plain open() would."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)
