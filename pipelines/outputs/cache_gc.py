"""Sizes of stage outputs and garbage collection of the stage cache (``status``, ``gc``).

A stage output is kept while something references it: a run folder's manifest (its ``stages`` index:
data, training and ensemble stages, companions included; predict and re-blend runs too) or, through
its manifest's ``inputs``, a stage that is kept. Everything else under the work dir (complete outputs
no run uses, incomplete folders, folders of interrupted stages) is garbage; a stage being computed
(its work folder locked) is never touched. Keys are content fingerprints, so a key referenced by
a run recorded elsewhere keeps the same key here too (the safe side).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pipelines.core.engine import TRASH_PREFIX, list_stages
from pipelines.outputs.run_folders import RUN_MANIFEST

_KEY = re.compile(r"[0-9a-f]{16,64}")


def folder_size(path: Path | str) -> int:
    """Bytes of the files under ``path`` (links not followed, each file once)."""
    total, seen = 0, set()
    for folder, _, files in os.walk(path):
        for name in files:
            try:
                info = os.lstat(os.path.join(folder, name))
            except OSError:
                continue
            if (info.st_dev, info.st_ino) not in seen:
                seen.add((info.st_dev, info.st_ino))
                total += info.st_size
    return total


def format_size(size: int) -> str:
    """``812 B``, ``3.4 kB``, ``12.0 MB``, ``1.2 GB`` (powers of 1000)."""
    value = float(size)
    for unit in ("B", "kB", "MB", "GB"):
        if value < 1000 or unit == "GB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} TB"  # pragma: no cover


def _keys_in(value: Any) -> Iterable[str]:
    if isinstance(value, str):
        if _KEY.fullmatch(value):
            yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _keys_in(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _keys_in(item)


def run_references(submissions_dirs: Iterable[Path | str]) -> set[str]:
    """Every stage key named by the ``stages`` index of a run manifest under ``submissions_dirs``."""
    keys: set[str] = set()
    for folder in submissions_dirs:
        folder = Path(folder)
        if not folder.is_dir():
            continue
        for manifest in sorted(folder.glob(f"*/{RUN_MANIFEST}")):
            try:
                data = json.loads(manifest.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            if isinstance(data, dict):
                keys.update(_keys_in(data.get("stages")))
    return keys


def garbage(rows: list[dict], referenced: set[str]) -> list[dict]:
    """The ``list_stages`` rows to remove: every folder that is not running and whose key is neither
    referenced nor an input (transitively) of a referenced complete stage."""
    kept = set(referenced)
    complete = [r for r in rows if r["complete"]]
    while True:
        more = {k for r in complete if r["key"] in kept for k in _keys_in(r["inputs"])} - kept
        if not more:
            break
        kept |= more
    return [r for r in rows if r["state"] != "running" and not (r["complete"] and r["key"] in kept)]


def collect(work_dir: Path | str, submissions_dirs: Iterable[Path | str], *, delete: bool = False) -> list[dict]:
    """The garbage of ``work_dir`` (rows of ``list_stages`` with ``size`` in bytes), removed when ``delete``:
    each folder is first renamed out of the cache's names (so no reader sees a half-deleted output)."""
    rows = garbage(list_stages(Path(work_dir)), run_references(submissions_dirs))
    for row in rows:
        path = Path(row["path"])
        row["size"] = folder_size(path)
        if delete:
            trash = path.parent / f"{TRASH_PREFIX}gc-{row['key']}-{os.urandom(4).hex()}"
            try:
                os.rename(path, trash)
            except OSError:
                continue
            shutil.rmtree(trash, ignore_errors=True)
    return rows


def format_garbage(rows: list[dict], *, deleted: bool) -> str:
    """The table ``gc`` prints: stage, key, state, size, then the total and what to do next."""
    if not rows:
        return "nothing to collect: every stage output is referenced by a run (or by a stage a run uses)"
    lines = [f"{'STAGE':<14} {'KEY':<18} {'STATE':<12} {'SIZE':>10}"]
    lines += [f"{r['stage']:<14} {r['key']:<18} {r['state']:<12} {format_size(r['size']):>10}" for r in rows]
    total = format_size(sum(r["size"] for r in rows))
    if deleted:
        lines.append(f"removed {len(rows)} stage folder(s), {total}")
    else:
        lines.append(f"{len(rows)} stage folder(s) no run references, {total} (dry run: nothing removed; "
                     "add --delete to remove them)")
    return "\n".join(lines)
