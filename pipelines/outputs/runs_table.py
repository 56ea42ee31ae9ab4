"""``runs list`` and ``runs compare A B``: the leaderboard of the runs under a submissions folder.

Everything comes from each run folder's ``manifest.json`` (and ``submitted.json``, the record
``submit RUN_ID`` keeps): no stage output, no parquet, no heavy import, so listing hundreds of
runs takes a fraction of a second. Only the standard library, the engine and the run-folder helpers
(``pipelines.outputs.run_folders``) are imported here.

:func:`run_summary` (manifest -> one row), :func:`format_runs` and :func:`compare_runs` are pure;
:func:`load_runs` is the I/O shell.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Iterable, Mapping

from pipelines.core.engine import flatten
from pipelines.core.errors import PipelineError
from pipelines.outputs.run_folders import RUN_MANIFEST

SUBMITTED_RECORD = "submitted.json"  # written by ``submit RUN_ID`` (see pipelines.outputs.kaggle_io.submit_run)
# Column labels of the five collections, in the competition's order.
COLLECTION_LABELS = {
    "tile:xla": "tile",
    "layout:xla:default": "xla:def",
    "layout:xla:random": "xla:rnd",
    "layout:nlp:default": "nlp:def",
    "layout:nlp:random": "nlp:rnd",
}
SORT_KEYS = ("date", "score", "wall", "id")


# ----------------------------------------------------------------------------- pure parts


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and \
        math.isfinite(value) else None


def run_summary(run_id: str, manifest: Mapping[str, Any], submitted: list[dict] | None = None) -> dict[str, Any]:
    """One leaderboard row of a run manifest: ensemble CV score per collection and combined."""
    config = manifest.get("config") or {}
    if manifest.get("kind") == "ensemble":
        sources = config.get("source_runs") or {}
        seeds = sorted({s for c in sources.values() for s in ((c or {}).get("run") or {}).get("seeds", [])})
    else:
        seeds = list((config.get("run") or {}).get("seeds") or [])
    per_collection = {name: _number(((scores or {}).get("blend") or {}).get("ensemble"))
                      for name, scores in (manifest.get("cv_scores") or {}).items()}
    combined = (manifest.get("combined_oof") or {}).get("ensemble") or {}
    return {
        "run_id": run_id,
        "kind": manifest.get("kind", "run"),
        "created": manifest.get("created") or "",
        "data_root": manifest.get("data_root") or "",
        "models": list(manifest.get("models") or []),
        "collections": per_collection,
        "combined": _number(combined.get("value")),
        "complete": bool(combined.get("complete")),
        "seeds": seeds,
        "folds": (config.get("folds") or {}).get("k"),
        "wall_s": _number(manifest.get("wall_time_s")),
        "source": manifest.get("source_run") or ",".join(manifest.get("source_runs") or []),
        "submitted": list(submitted or []),
    }


def sort_runs(rows: list[dict[str, Any]], by: str = "date", reverse: bool | None = None) -> list[dict[str, Any]]:
    """Rows ordered by ``by`` (date / id: oldest first; score: best first; wall: fastest first);
    runs without a score go last."""
    if by not in SORT_KEYS:
        raise PipelineError(f"runs list: cannot sort by {by!r}; choose one of {', '.join(SORT_KEYS)}")
    if by == "score":
        key = (lambda r: (r["combined"] is None, -(r["combined"] or 0.0), r["run_id"]))
    elif by == "wall":
        key = (lambda r: (r["wall_s"] is None, r["wall_s"] or 0.0, r["run_id"]))
    elif by == "date":
        key = (lambda r: (r["created"], r["run_id"]))
    else:
        key = (lambda r: r["run_id"])
    ordered = sorted(rows, key=key)
    return ordered[::-1] if reverse else ordered


def _cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def _wall(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.0f}s"
    return f"{seconds / 60:.1f}m" if seconds < 3600 else f"{seconds / 3600:.1f}h"


def _short_root(path: str, width: int = 28) -> str:
    return path if len(path) <= width else "..." + path[-(width - 3):]


def _submitted(row: dict[str, Any]) -> str:
    if not row["submitted"]:
        return "no"
    last = row["submitted"][-1]
    return f"{(last.get('submitted_at') or '?')[:16].replace('T', ' ')} ({len(row['submitted'])}x)" \
        if len(row["submitted"]) > 1 else (last.get("submitted_at") or "yes")[:16].replace("T", " ")


def format_runs(rows: list[dict[str, Any]]) -> str:
    """The leaderboard as a text table: one line per run."""
    if not rows:
        return "no runs"
    header = ["RUN", "CREATED", "KIND", "DATA ROOT", "MODELS", *COLLECTION_LABELS.values(), "COMBINED", "SEEDS",
              "FOLDS", "WALL", "SUBMITTED"]
    table = [header]
    for r in rows:
        combined = _cell(r["combined"]) + ("" if r["complete"] or r["combined"] is None else "*")
        table.append([r["run_id"], r["created"][:16].replace("T", " "), r["kind"], _short_root(r["data_root"]),
                      ",".join(r["models"]) or "-", *[_cell(r["collections"].get(c)) for c in COLLECTION_LABELS],
                      combined, ",".join(map(str, r["seeds"])) or "-", str(r["folds"] or "-"), _wall(r["wall_s"]),
                      _submitted(r)])
    widths = [max(len(line[i]) for line in table) for i in range(len(header))]
    numeric = set(range(5, 5 + len(COLLECTION_LABELS) + 1)) | {len(header) - 2}
    lines = ["  ".join(cell.rjust(w) if i in numeric else cell.ljust(w) for i, (cell, w) in
                       enumerate(zip(line, widths))).rstrip() for line in table]
    notes = ["scores: out-of-fold CV of the ensemble (tile: top-5 slowdown score, layout: Kendall tau); "
             "COMBINED: their mean"]
    if any(not r["complete"] and r["combined"] is not None for r in rows):
        notes.append("*: not all five collections, the mean of those present")
    if any(r["kind"] == "predict" for r in rows):
        notes.append("predict runs show the CV of the run whose models they used")
    return "\n".join(lines + notes)


def _model_scores(manifest: Mapping[str, Any]) -> dict[tuple[str, str], dict[str, float | None]]:
    """(collection, model) -> {"cv": mean over seeds, "std": std over seeds, "blend": seed-averaged}."""
    out: dict[tuple[str, str], dict[str, float | None]] = {}
    for cname, scores in (manifest.get("cv_scores") or {}).items():
        blend = (scores or {}).get("blend") or {}
        for model, m in ((scores or {}).get("training") or {}).items():
            out[(cname, model)] = {"cv": _number(m.get("oof_score")), "std": _number(m.get("oof_score_std")),
                                   "blend": _number(blend.get(model))}
        out[(cname, "ensemble")] = {"cv": _number(blend.get("ensemble")), "std": None,
                                    "blend": _number(blend.get("ensemble"))}
    return out


def config_difference(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """``(dotted key, value in a, value in b)`` for every config value that differs (absent: None)."""
    fa, fb = flatten(a or {}), flatten(b or {})
    missing = object()
    diff = []
    for key in sorted(set(fa) | set(fb)):
        va, vb = fa.get(key, missing), fb.get(key, missing)
        if json.dumps(va, sort_keys=True, default=str) != json.dumps(vb, sort_keys=True, default=str):
            diff.append((key, None if va is missing else va, None if vb is missing else vb))
    return diff


def compare_runs(a_id: str, a: Mapping[str, Any], b_id: str, b: Mapping[str, Any]) -> str:
    """Side by side: CV score per collection and model (A, B, B - A), combined, then the config diff."""
    sa, sb = _model_scores(a), _model_scores(b)
    collections = list(dict.fromkeys([c for c, _ in sa] + [c for c, _ in sb]))
    lines = [f"A = {a_id} ({a.get('kind', 'run')}, {a.get('created', '?')}, data root {a.get('data_root')})",
             f"B = {b_id} ({b.get('kind', 'run')}, {b.get('created', '?')}, data root {b.get('data_root')})", ""]
    header = f"{'collection':<20} {'model':<28} {'A mean +- std':>18} {'B mean +- std':>18} {'B - A':>8}"
    lines.append(header)

    def both(value: dict | None) -> str:
        if not value or value["cv"] is None:
            return "-"
        return f"{value['cv']:.4f}" + (f" +- {value['std']:.4f}" if value["std"] is not None else "")

    for cname in collections:
        models = list(dict.fromkeys([m for c, m in sa if c == cname and m != "ensemble"]
                                    + [m for c, m in sb if c == cname and m != "ensemble"])) + ["ensemble"]
        for model in models:
            va, vb = sa.get((cname, model)), sb.get((cname, model))
            delta = (vb["cv"] - va["cv"]) if va and vb and va["cv"] is not None and vb["cv"] is not None else None
            lines.append(f"{cname:<20} {model:<28} {both(va):>18} {both(vb):>18} "
                         f"{'-' if delta is None else f'{delta:+.4f}':>8}")
    ca, cb = (a.get("combined_oof") or {}), (b.get("combined_oof") or {})
    for model in dict.fromkeys([*ca, *cb]):
        va, vb = _number((ca.get(model) or {}).get("value")), _number((cb.get(model) or {}).get("value"))
        delta = vb - va if va is not None and vb is not None else None
        lines.append(f"{'combined':<20} {model:<28} {_cell(va):>18} {_cell(vb):>18} "
                     f"{'-' if delta is None else f'{delta:+.4f}':>8}")
    lines.append("")
    diff = config_difference(a.get("config") or {}, b.get("config") or {})
    if a.get("models") != b.get("models"):
        diff.insert(0, ("models", a.get("models"), b.get("models")))
    if a.get("data_root") != b.get("data_root"):
        diff.insert(0, ("data_root", a.get("data_root"), b.get("data_root")))
    if not diff:
        lines.append("config: identical")
    else:
        lines.append(f"config differences ({len(diff)}):")
        width = max(len(k) for k, _, _ in diff)
        for key, va, vb in diff:
            lines.append(f"  {key:<{width}}  A {json.dumps(va, default=str)}  B {json.dumps(vb, default=str)}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- I/O shell


def read_manifest(run_dir: Path) -> dict[str, Any] | None:
    """A run folder's manifest, or None when it has none or it is not a run manifest."""
    try:
        with open(run_dir / RUN_MANIFEST, encoding="utf-8") as handle:
            manifest = json.load(handle)
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) and isinstance(manifest.get("stages"), dict) else None


def read_submitted(run_dir: Path) -> list[dict]:
    """The ``submit`` record of a run folder (empty when it was never submitted)."""
    try:
        with open(run_dir / SUBMITTED_RECORD, encoding="utf-8") as handle:
            record = json.load(handle)
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as exc:
        raise PipelineError(f"{run_dir / SUBMITTED_RECORD}: unreadable submission record ({exc})") from None
    return [r for r in record.get("submissions", []) if isinstance(r, dict)] if isinstance(record, dict) else []


def load_runs(submissions_dir: Path | str) -> list[dict[str, Any]]:
    """A summary row per run folder under ``submissions_dir`` (folders without a manifest are skipped)."""
    submissions_dir = Path(submissions_dir)
    if not submissions_dir.is_dir():
        raise PipelineError(f"{submissions_dir}: no such submissions folder (runs are written there by `run`)")
    rows = []
    with os.scandir(submissions_dir) as entries:
        for entry in entries:
            if not entry.is_dir() or entry.name.startswith("."):
                continue
            manifest = read_manifest(Path(entry.path))
            if manifest is not None:
                rows.append(run_summary(entry.name, manifest, read_submitted(Path(entry.path))))
    return rows


def filter_runs(rows: Iterable[dict[str, Any]], *, submitted_only: bool = False,
                data_root: str | None = None) -> list[dict[str, Any]]:
    out = [r for r in rows if not submitted_only or r["submitted"]]
    if data_root is not None:
        wanted = str(Path(data_root).resolve())
        out = [r for r in out if r["data_root"] == wanted]
    return out
