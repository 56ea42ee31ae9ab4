"""The interim main job of ``make demo``: synthetic world -> baseline submissions -> validation -> score.

Writes ``submissions/<run-id>/baseline_{valid,test}.csv`` plus a ``manifest.json`` (provenance and
scores) into a fresh run folder; nothing is ever overwritten. The last line printed is the path of
the test submission. A later ``run`` command replaces this body with the full pipeline.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from pipelines.errors import PipelineError

DEFAULT_SUBMISSIONS_DIR = Path("submissions")


def new_run_id(config: dict[str, Any], now_ns: int) -> str:
    """``<UTC timestamp>-<8 hex>``; the hash covers the config, the exact time and the process id."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now_ns / 1e9))
    digest = hashlib.sha256(json.dumps([config, now_ns, os.getpid()], sort_keys=True).encode()).hexdigest()
    return f"{stamp}-{digest[:8]}"


def _make_run_dir(parent: Path, run_id: str) -> Path:
    parent.mkdir(parents=True, exist_ok=True)
    run_dir = parent / run_id
    try:
        run_dir.mkdir()  # exclusive: an existing run folder is never reused
    except FileExistsError:
        raise PipelineError(f"{run_dir}: run folder already exists; refusing to overwrite it") from None
    return run_dir


def _write_json_atomic(path: Path, payload: dict[str, Any]) -> None:
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(payload, handle, indent=2, sort_keys=True)
            handle.write("\n")
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise


def run_demo(data_root: Path | str, scale: str = "small", seed: int = 0, *,
             submissions_dir: Path | str = DEFAULT_SUBMISSIONS_DIR) -> int:
    """Generate (or reuse) the synthetic world, write, validate and score the baseline submissions."""
    from pipelines.baseline import baseline_rows
    from pipelines.submission import score_submission, validate_submission, write_submission
    from pipelines.synth import generate_world

    started = time.perf_counter()
    data_root = Path(data_root)
    print(generate_world(data_root, scale=scale, seed=seed))
    config = {"data_root": str(data_root), "scale": scale, "seed": seed, "model": "baseline"}
    run_id = new_run_id(config, time.time_ns())
    run_dir = _make_run_dir(Path(submissions_dir), run_id)

    paths: dict[str, Path] = {}
    for split in ("valid", "test"):
        path = write_submission(run_dir / f"baseline_{split}.csv", baseline_rows(data_root, split))
        rows = validate_submission(path, data_root, split=split)
        print(f"{split}: {path} ({rows} rows, valid)")
        paths[split] = path

    report = score_submission(paths["valid"], data_root, split="valid")
    print(f"\nbaseline (non-learned) on the valid split of {data_root}:")
    print(report.to_text())
    combined = report.combined
    _write_json_atomic(run_dir / "manifest.json", {
        "stage": "demo-baseline",
        "run_id": run_id,
        "config": config,
        "submissions": {split: path.name for split, path in paths.items()},
        "valid_scores": combined.collection_scores,
        "valid_combined": combined.value,
        "valid_combined_complete": combined.complete,
        "wall_s": round(time.perf_counter() - started, 3),
        "versions": {"python": platform.python_version(), "numpy": np.__version__},
    })
    print(paths["test"])
    return 0
