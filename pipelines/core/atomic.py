"""Helpers for atomic file writes (temporary file + rename)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def chmod_like_new_file(path: str | os.PathLike[str]) -> None:
    """mkstemp creates 0600 files; give the final file the permissions a plain open() would."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)


def write_text_atomic(path: str | os.PathLike[str], text: str, encoding: str = "utf-8") -> None:
    """Write ``text`` to ``path`` through a unique temporary file in the same folder and ``os.replace``,
    so readers see the old or the new file, never a partial one (callers decide whether replacing is allowed)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding=encoding, newline="") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        chmod_like_new_file(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
