"""Reading a stage output's files: a file that cannot be parsed is a FormatError naming it.

The engine checks every output against the size and SHA-256 its manifest recorded before the output
is reused or loaded (:mod:`pipelines.core.engine`), so a file altered after it was written is never
served. What remains is a file that was written unreadable (a writer cut short before the hash was
taken, a manifest edited to match): then the parser's own exception (a polars ``ComputeError``, a
``zipfile.BadZipFile``) would surface as a traceback that names no file. These readers turn it into
an error naming the file and the stage folder to delete.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipelines.core.errors import FormatError

MANIFEST = "manifest.json"  # the engine's name (not imported: the engine is for the command line's start-up)


def stage_folder(path: Path) -> Path | None:
    """The stage output folder holding ``path`` (the nearest parent with a manifest), if any."""
    for parent in Path(path).parents:
        if (parent / MANIFEST).is_file():
            return parent
    return None


def unreadable(path: Path | str, what: str, exc: BaseException) -> FormatError:
    """The error for a stage output file ``path`` that its parser refused with ``exc``."""
    path = Path(path)
    folder = stage_folder(path)
    remedy = (f"; its stage output {folder} was written damaged: delete that folder (or rerun with --force) "
              "to compute it again") if folder is not None else ""
    detail = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
    return FormatError(path, f"unreadable {what} ({type(exc).__name__}{': ' + detail if detail else ''}){remedy}")


def _polars_errors() -> tuple[type[BaseException], ...]:
    import polars as pl

    errors: list[type[BaseException]] = [pl.exceptions.PolarsError, OSError]
    panic = getattr(pl.exceptions, "PanicException", None)  # a Rust panic is a BaseException
    if isinstance(panic, type):
        errors.append(panic)
    return tuple(errors)


def read_parquet(path: Path | str, what: str = "stage output table", **kwargs: Any) -> Any:
    """``polars.read_parquet(path)``; an unreadable file is a FormatError naming it."""
    import polars as pl

    try:
        return pl.read_parquet(path, **kwargs)
    except _polars_errors() as exc:
        raise unreadable(path, what, exc) from None


def npz_errors() -> tuple[type[BaseException], ...]:
    """What ``numpy.load`` of an npz (and reading its members) raises on a damaged file."""
    import zipfile
    import zlib

    return (OSError, KeyError, ValueError, EOFError, zipfile.BadZipFile, zlib.error)
