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


# How often make_folder makes a folder again that concurrent runs keep removing before giving up.
MAKE_FOLDER_TRIES = 5


def make_folder(path: str | os.PathLike[str]) -> None:
    """``mkdir -p path`` where another process may remove ``path`` meanwhile (a run that finished a shared
    stage removes its folder of partial results): the folder is made again, as it would have been had it
    gone before the call. pathlib's ``mkdir(exist_ok=True)`` instead raises FileExistsError when the folder
    existed at its ``mkdir`` and was gone at its check. A file in the folder's place still raises."""
    path = Path(path)
    for _ in range(MAKE_FOLDER_TRIES):
        try:
            path.mkdir(parents=True, exist_ok=True)
            return
        except FileExistsError:
            if path.exists():  # a file (or a link to one) in its place: the caller's error
                raise
    path.mkdir(parents=True, exist_ok=True)  # still racing: let this last try's error out


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
