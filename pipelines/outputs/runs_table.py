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
import logging
import math
import os
from pathlib import Path
from typing import Any, Iterable, Mapping

from pipelines.core.engine import fingerprint, flatten
from pipelines.core.errors import PipelineError
from pipelines.outputs.run_folders import RUN_MANIFEST, run_manifest_problem

logger = logging.getLogger(__name__)

SUBMITTED_RECORD = "submitted.json"  # written by ``submit RUN_ID`` (see pipelines.outputs.kaggle_io.submit_run)
LEADERBOARD_RECORD = "leaderboard.json"  # written by ``submissions sync`` (pipelines.outputs.leaderboard)
DIFFERS_WIDTH = 44  # the DIFFERS FROM BASE cell is cut there ("... +N")
NOT_DIFFERENCES = ("run.seeds",)  # shown in their own column
# Column labels of the five collections, in the competition's order.
COLLECTION_LABELS = {
    "tile:xla": "tile",
    "layout:xla:default": "xla:def",
    "layout:xla:random": "xla:rnd",
    "layout:nlp:default": "nlp:def",
    "layout:nlp:random": "nlp:rnd",
}
SORT_KEYS = ("date", "score", "lb", "wall", "id")
COMPACT_WIDTH = 100  # the default `runs list` fits a terminal this wide; --wide shows every column


# ----------------------------------------------------------------------------- pure parts


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and \
        math.isfinite(value) else None


def result_key(manifest: Mapping[str, Any]) -> str | None:
    """What identifies a run's result: its ensemble stage keys and the bytes of its submission. Two
    runs with the same key made the same predictions (a rerun served from the stage cache); None when
    the manifest lacks either part."""
    stages = manifest.get("stages") or {}
    keys = {c: (e or {}).get("ensemble") for c, e in stages.items()}
    digest = (manifest.get("submission") or {}).get("sha256")
    if not keys or not digest or not all(keys.values()):
        return None
    return fingerprint({"ensemble": keys, "submission": digest})


def public_score(record: list[dict] | None) -> tuple[float | None, str]:
    """The latest scored public leaderboard result of a run's ``leaderboard.json`` entries and a
    cell for it ("0.1234", "pending", "error", "-")."""
    entries = sorted(record or [], key=lambda e: str(e.get("date") or ""))
    for entry in reversed(entries):
        value = _number(entry.get("public_score"))
        if value is not None:
            return value, f"{value:.4f}"
    if entries:
        status = str(entries[-1].get("status") or "").lower()
        return None, "error" if "error" in status else "pending"
    return None, "-"


def differs_from_base(config: Mapping[str, Any], base: Mapping[str, Any] | None) -> list[str]:
    """``key=value`` for every config value of a run that differs from the base config's."""
    if not base or not config:
        return []
    return [f"{key}={json.dumps(vb, default=str, separators=(',', ':'))}"
            for key, _, vb in config_difference(base, config) if key not in NOT_DIFFERENCES]


def run_summary(run_id: str, manifest: Mapping[str, Any], submitted: list[dict] | None = None,
                leaderboard: list[dict] | None = None, base: Mapping[str, Any] | None = None) -> dict[str, Any]:
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
    kind = manifest.get("kind", "run")
    if kind == "ensemble":
        differs = [f"re-blend of {len(manifest.get('source_runs') or [])} run(s)"]
    else:
        differs = differs_from_base(config, base)
        base_models = list(((base or {}).get("ensemble") or {}).get("models") or [])
        models = list(manifest.get("models") or [])
        if base and models and models != base_models:  # run --models is not in the config
            differs.insert(0, f"models={','.join(models)}")
    lb_value, lb_cell = public_score(leaderboard)
    return {
        "run_id": run_id,
        "name": str(manifest.get("name") or ""),
        "note": str(manifest.get("note") or ""),
        "differs": differs,
        "result": result_key(manifest),
        "same_as": None,  # the run-id of the earlier run with the same result (see collapse_reruns)
        "reruns": [],  # the run-ids of later runs with the same result
        "synthetic": bool((manifest.get("data_world") or {}).get("synthetic")),
        "public_lb": lb_value,
        "public_lb_cell": lb_cell,
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
    """Rows ordered by ``by`` (date / id: oldest first; score, lb (public leaderboard): best first;
    wall: fastest first); runs without a score go last."""
    if by not in SORT_KEYS:
        raise PipelineError(f"runs list: cannot sort by {by!r}; choose one of {', '.join(SORT_KEYS)}")
    if by == "score":
        key = (lambda r: (r["combined"] is None, -(r["combined"] or 0.0), r["run_id"]))
    elif by == "lb":
        key = (lambda r: (r.get("public_lb") is None, -(r.get("public_lb") or 0.0), r["run_id"]))
    elif by == "wall":
        key = (lambda r: (r["wall_s"] is None, r["wall_s"] or 0.0, r["run_id"]))
    elif by == "date":
        key = (lambda r: (r["created"], r["run_id"]))
    else:
        key = (lambda r: r["run_id"])
    ordered = sorted(rows, key=key)
    return ordered[::-1] if reverse else ordered


def collapse_reruns(rows: list[dict[str, Any]], keep_all: bool = False) -> list[dict[str, Any]]:
    """One row per distinct result (:func:`result_key`): the earliest run of each, listing the later
    ones in ``reruns`` and carrying their submissions and leaderboard scores; with ``keep_all`` every
    row stays and the later ones name the earliest in ``same_as``."""
    first: dict[str, dict[str, Any]] = {}
    out = []
    for row in sorted(rows, key=lambda r: (r["created"], r["run_id"])):
        key = row["result"]
        if key is None or key not in first:
            if key is not None:
                first[key] = row
            out.append(row)
            continue
        origin = first[key]
        origin["reruns"].append(row["run_id"])
        if keep_all:
            row["same_as"] = origin["run_id"]
            out.append(row)
        else:
            origin["submitted"] = origin["submitted"] + row["submitted"]
            if origin["public_lb"] is None and row["public_lb"] is not None:
                origin["public_lb"], origin["public_lb_cell"] = row["public_lb"], row["public_lb_cell"]
    return out


def seeds_cell(seeds: list[Any]) -> str:
    """``1 (0)``, ``3 (0,1,2)``: how many seeds, then which (never a bare ``0``)."""
    if not seeds:
        return "-"
    return f"{len(seeds)} ({','.join(map(str, seeds))})"


def _differs_cell(differs: list[str], width: int = DIFFERS_WIDTH) -> str:
    if not differs:
        return "base"
    text, shown = "", 0
    for item in differs:
        candidate = item if not text else f"{text} {item}"
        rest = len(differs) - shown - 1
        if len(candidate) + (len(f" +{rest}") if rest else 0) > width and text:
            break
        text, shown = candidate, shown + 1
    rest = len(differs) - shown
    return text + (f" +{rest}" if rest else "")


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


def _compact_columns(rows: list[dict[str, Any]], width: int) -> tuple[list[tuple[str, list[str], bool]], list[str]]:
    """The columns of the compact table, ``(header, cells, numeric)`` in display order, and the headers of
    optional columns left out because they did not fit in ``width``. The run-id and the scores always show;
    then, while they fit and in this order of priority: KIND (when a row is not a plain run), PUBLIC LB
    (when a run has one), NAME (when a run has one) and MODELS; a name or models cell longer than the room
    left is cut (``~``), to no fewer than 4 characters."""
    scores = [(label, [_cell(r["collections"].get(c)) for r in rows], True) for c, label in COLLECTION_LABELS.items()]
    combined = [_cell(r["combined"]) + ("" if r["complete"] or r["combined"] is None else "*") for r in rows]
    fixed = [("RUN", [r["run_id"] for r in rows], False), *scores, ("COMBINED", combined, True)]
    optional = []  # (header, cells, numeric, may be cut)
    if any(r["kind"] != "run" for r in rows):
        optional.append(("KIND", [r["kind"] for r in rows], False, False))
    if any(r.get("public_lb_cell", "-") != "-" for r in rows):
        optional.append(("PUBLIC LB", [r.get("public_lb_cell", "-") for r in rows], True, False))
    if any(r.get("name") for r in rows):
        optional.append(("NAME", [r.get("name") or "-" for r in rows], False, True))
    optional.append(("MODELS", [",".join(r["models"]) or "-" for r in rows], False, True))

    def span(header: str, cells: list[str]) -> int:
        return max(len(header), *(len(c) for c in cells))

    used = sum(span(h, cells) for h, cells, _ in fixed) + 2 * (len(fixed) - 1)
    shown, left_out = {h: (h, cells, numeric) for h, cells, numeric in fixed}, []
    for header, cells, numeric, cut in optional:
        room = width - used - 2  # two spaces before the column
        if cut and max(4, len(header)) <= room < span(header, cells):
            cells = [c if len(c) <= room else c[:room - 1] + "~" for c in cells]
        if span(header, cells) > room:
            left_out.append(header)
            continue
        shown[header] = (header, cells, numeric)
        used += span(header, cells) + 2
    order = ["RUN", "KIND", "MODELS", *COLLECTION_LABELS.values(), "COMBINED", "PUBLIC LB", "NAME"]
    return [shown[h] for h in order if h in shown], left_out


def format_runs(rows: list[dict[str, Any]], wide: bool = False, width: int = COMPACT_WIDTH) -> str:
    """The leaderboard as a text table: one line per run. By default the columns that fit in ``width``
    (:func:`_compact_columns`); ``wide``: every column (data root, seeds, folds, wall time, submitted,
    the config's difference from base, the note)."""
    if not rows:
        return "no runs"
    if not wide:
        return _format_compact(rows, width)
    header = ["RUN", "CREATED", "KIND", "DATA ROOT", "MODELS", *COLLECTION_LABELS.values(), "COMBINED", "PUBLIC LB",
              "SEEDS", "FOLDS", "WALL", "SUBMITTED", "NAME", "DIFFERS FROM BASE", "SAME", "NOTE"]
    table = [header]
    for r in rows:
        combined = _cell(r["combined"]) + ("" if r["complete"] or r["combined"] is None else "*")
        root = _short_root(r["data_root"]) + (" (synth)" if r.get("synthetic") else "")
        same = f"= {r['same_as']}" if r.get("same_as") else (f"+{len(r['reruns'])} rerun(s)" if r.get("reruns")
                                                              else "")
        table.append([r["run_id"], r["created"][:16].replace("T", " "), r["kind"], root,
                      ",".join(r["models"]) or "-", *[_cell(r["collections"].get(c)) for c in COLLECTION_LABELS],
                      combined, r.get("public_lb_cell", "-"), seeds_cell(r["seeds"]), str(r["folds"] or "-"),
                      _wall(r["wall_s"]), _submitted(r), r.get("name") or "-", _differs_cell(r.get("differs") or []),
                      same, (r.get("note") or "")[:40]])
    widths = [max(len(line[i]) for line in table) for i in range(len(header))]
    numeric = set(range(5, 5 + len(COLLECTION_LABELS) + 2)) | {header.index("WALL")}
    lines = ["  ".join(cell.rjust(w) if i in numeric else cell.ljust(w) for i, (cell, w) in
                       enumerate(zip(line, widths))).rstrip() for line in table]
    notes = ["scores: out-of-fold CV of the ensemble (tile: top-5 slowdown score, layout: Kendall tau); "
             "COMBINED: their mean"]
    if any(not r["complete"] and r["combined"] is not None for r in rows):
        notes.append("*: not all five collections, the mean of those present")
    if any(r["kind"] == "predict" for r in rows):
        notes.append("predict runs show the CV of the run whose models they used")
    if any(r.get("reruns") or r.get("same_as") for r in rows):
        notes.append("SAME: runs with identical ensemble stages and submission bytes (a cached rerun) are one "
                     "result; --all lists each")
    if any(r["kind"] in ("train", "tune") for r in rows):
        notes.append("train: a training stage no listed run used (its OOF CV); tune: a study's best trial")
    if any(r.get("public_lb") is not None or r.get("public_lb_cell") == "pending" for r in rows):
        notes.append("PUBLIC LB: Kaggle's public score of the latest scored upload (submissions sync)")
    return "\n".join(lines + notes)


def _format_compact(rows: list[dict[str, Any]], width: int) -> str:
    import textwrap

    columns, left_out = _compact_columns(rows, width)
    widths = [max(len(header), *(len(c) for c in cells)) for header, cells, _ in columns]
    table = [[header for header, _, _ in columns], *([cells[i] for _, cells, _ in columns] for i in range(len(rows)))]
    lines = ["  ".join(cell.rjust(w) if numeric else cell.ljust(w)
                       for cell, w, (_, _, numeric) in zip(line, widths, columns)).rstrip() for line in table]
    notes = ["scores: ensemble out-of-fold CV (tile: top-5 slowdown, layout: Kendall tau); COMBINED: their mean"]
    if any(not r["complete"] and r["combined"] is not None for r in rows):
        notes.append("*: not all five collections, the mean of those present")
    if any(r["kind"] == "predict" for r in rows):
        notes.append("predict runs show the CV of the run whose models they used")
    if any(r.get("reruns") for r in rows):
        notes.append(f"{sum(len(r['reruns']) for r in rows)} cached rerun(s) of these results not listed (--all)")
    hidden = [*left_out, "DATA ROOT", "SEEDS", "FOLDS", "WALL", "SUBMITTED", "DIFFERS FROM BASE", "NOTE"]
    notes.append(f"--wide adds {', '.join(hidden)}")
    return "\n".join(lines + [line for note in notes for line in textwrap.wrap(note, width)])


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


def _model_sections() -> set[str]:
    from pipelines.config.registry import model_sections  # the config layer: dataclasses only, no torch

    return {name for name, _ in model_sections()}


def used_settings_difference(a: Mapping[str, Any], b: Mapping[str, Any]) -> tuple[list[tuple[str, Any, Any]], list[str]]:
    """The config difference of two run manifests over the settings both runs used: a model's section
    (``gnn.*``) counts only when both trained that model (when one did, ``models`` differ already).
    Returns the differences (``data_root`` and ``models`` first when they differ) and, per model section
    left out, a line saying how many of its settings differ and why they are not listed."""
    diff = config_difference(a.get("config") or {}, b.get("config") or {})
    trained_a = {str(m).split(":", 1)[0] for m in a.get("models") or []}
    trained_b = {str(m).split(":", 1)[0] for m in b.get("models") or []}
    sections, kept, left_out = _model_sections(), [], {}
    for key, va, vb in diff:
        section = key.split(".", 1)[0]
        if section in sections and not (section in trained_a and section in trained_b):
            left_out[section] = left_out.get(section, 0) + 1
        else:
            kept.append((key, va, vb))
    if a.get("models") != b.get("models"):
        kept.insert(0, ("models", a.get("models"), b.get("models")))
    if a.get("data_root") != b.get("data_root"):
        kept.insert(0, ("data_root", a.get("data_root"), b.get("data_root")))
    notes = []
    for section, count in left_out.items():
        who = ("neither run trains" if section not in trained_a | trained_b
               else f"only {'A' if section in trained_a else 'B'} trains")
        notes.append(f"{count} {section}.* setting(s) differ but are not listed: {who} {section}")
    return kept, notes


def compare_runs(a_id: str, a: Mapping[str, Any], b_id: str, b: Mapping[str, Any], *,
                 differences: bool = True, notes: Iterable[str] = ()) -> str:
    """Side by side: CV score per collection and model (A, B and, with ``differences``, B - A: left out
    when the paired tests follow, which carry the one figure per difference), combined, then the
    difference of the settings both runs used (:func:`used_settings_difference`). ``notes``: lines
    after the header (a predict run compared by its source run)."""
    sa, sb = _model_scores(a), _model_scores(b)
    collections = list(dict.fromkeys([c for c, _ in sa] + [c for c, _ in sb]))
    lines = [f"A = {a_id} ({a.get('kind', 'run')}, {a.get('created', '?')}, data root {a.get('data_root')})",
             f"B = {b_id} ({b.get('kind', 'run')}, {b.get('created', '?')}, data root {b.get('data_root')})",
             *notes, ""]
    header = f"{'collection':<20} {'model':<28} {'A mean +- std':>18} {'B mean +- std':>18}"
    lines.append(header + (f" {'B - A':>8}" if differences else ""))

    def both(value: dict | None) -> str:
        if not value or value["cv"] is None:
            return "-"
        return f"{value['cv']:.4f}" + (f" +- {value['std']:.4f}" if value["std"] is not None else "")

    def line(cname: str, model: str, va: str, vb: str, delta: float | None) -> str:
        text = f"{cname:<20} {model:<28} {va:>18} {vb:>18}"
        return text + (f" {'-' if delta is None else f'{delta:+.4f}':>8}" if differences else "")

    for cname in collections:
        models = list(dict.fromkeys([m for c, m in sa if c == cname and m != "ensemble"]
                                    + [m for c, m in sb if c == cname and m != "ensemble"])) + ["ensemble"]
        for model in models:
            va, vb = sa.get((cname, model)), sb.get((cname, model))
            delta = (vb["cv"] - va["cv"]) if va and vb and va["cv"] is not None and vb["cv"] is not None else None
            lines.append(line(cname, model, both(va), both(vb), delta))
    ca, cb = (a.get("combined_oof") or {}), (b.get("combined_oof") or {})
    for model in dict.fromkeys([*ca, *cb]):
        va, vb = _number((ca.get(model) or {}).get("value")), _number((cb.get(model) or {}).get("value"))
        delta = vb - va if va is not None and vb is not None else None
        lines.append(line("combined", model, _cell(va), _cell(vb), delta))
    if not differences:
        lines.append("(B - A, with its interval: the paired tests below)")
    lines.append("")
    diff, left_out = used_settings_difference(a, b)
    if not diff:
        lines.append("config: identical" + (" in the settings both runs used" if left_out else ""))
    else:
        lines.append(f"config differences ({len(diff)}):")
        width = max(len(k) for k, _, _ in diff)
        for key, va, vb in diff:
            lines.append(f"  {key:<{width}}  A {json.dumps(va, default=str)}  B {json.dumps(vb, default=str)}")
    lines += [f"  ({note})" for note in left_out]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- I/O shell


def compared_run(submissions_dir: Path | str, run_id: str, manifest: Mapping[str, Any]) -> tuple[str, Mapping[str, Any], str]:
    """The run whose scores stand for ``run_id`` in ``runs compare``, its manifest, and a note (or ""): a
    predict run ranked new graphs with another run's fold models and has no out-of-fold predictions of
    its own, so it is compared by that source run."""
    from pipelines.outputs.run_folders import read_run_manifest

    if manifest.get("kind") != "predict":
        return run_id, manifest, ""
    source = manifest.get("source_run")
    if not source:
        raise PipelineError(f"run {run_id} is a predict run that names no source run: it has no scores to compare")
    try:
        source_manifest = read_run_manifest(submissions_dir, source)
    except PipelineError as exc:
        raise PipelineError(f"run {run_id} is a predict run of {source}, whose scores it would be compared by: "
                            f"{exc}") from None
    return source, source_manifest, (f"{run_id} is a predict run (it ranked {manifest.get('data_root')} with the "
                                     f"fold models of {source}): compared by {source}'s scores")


def read_manifest(run_dir: Path) -> dict[str, Any] | None:
    """A run folder's manifest, or None when it has none. A manifest that is unreadable or no valid run
    manifest (edited by hand: other types, a list for an object) is None too, with a warning naming
    it, so one bad run is left out of a listing instead of breaking it for every run; a command that
    names that run refuses it (:func:`pipelines.outputs.run_folders.read_run_manifest`)."""
    path = run_dir / RUN_MANIFEST
    try:
        with open(path, encoding="utf-8") as handle:
            manifest = json.load(handle)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        problem: str | None = f"unreadable ({type(exc).__name__}: {exc})"
    else:
        problem = run_manifest_problem(manifest)
    if problem is not None:
        logger.warning(f"warning: {path}: not a valid run manifest ({problem}); run {run_dir.name} left out")
        return None
    return manifest


def read_leaderboard(run_dir: Path) -> list[dict]:
    """The Kaggle scores ``submissions sync`` fetched for a run folder (empty: never synced)."""
    try:
        with open(run_dir / LEADERBOARD_RECORD, encoding="utf-8") as handle:
            record = json.load(handle)
    except (OSError, ValueError):
        return []
    return [r for r in record.get("submissions", []) if isinstance(r, dict)] if isinstance(record, dict) else []


def base_config() -> dict[str, Any] | None:
    """The resolved ``base`` config, what DIFFERS FROM BASE compares with (None if it cannot load)."""
    try:
        from pipelines.config.settings import config_to_dict, load_config

        return config_to_dict(load_config(None))
    except Exception:  # a broken base.toml must not hide the runs
        return None


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
    base = base_config()
    with os.scandir(submissions_dir) as entries:
        for entry in entries:
            if not entry.is_dir() or entry.name.startswith("."):
                continue
            manifest = read_manifest(Path(entry.path))
            if manifest is not None:
                rows.append(run_summary(entry.name, manifest, _listed_submissions(Path(entry.path)),
                                        read_leaderboard(Path(entry.path)), base))
    return rows


def _listed_submissions(run_dir: Path) -> list[dict]:
    """A run folder's submissions for the table: one unreadable record is a warning and the run shows as
    submitted ("unreadable"), so the other runs are still listed and ``--submitted`` keeps it."""
    try:
        return read_submitted(run_dir)
    except PipelineError as exc:
        logger.warning(f"{exc}: the run is listed as submitted")
        return [{"submitted_at": "unreadable"}]


def _empty_row(run_id: str, kind: str, created: str, data_root: str, models: list[str]) -> dict[str, Any]:
    return {"run_id": run_id, "name": "", "note": "", "differs": [], "result": None, "same_as": None, "reruns": [],
            "synthetic": False, "public_lb": None, "public_lb_cell": "-", "kind": kind, "created": created or "",
            "data_root": data_root or "", "models": models, "collections": {}, "combined": None, "complete": False,
            "seeds": [], "folds": None, "wall_s": None, "source": "", "submitted": []}


def load_work_results(work_dir: Path | str, rows: Iterable[dict[str, Any]] = (),
                      manifests: Iterable[Mapping[str, Any]] = ()) -> list[dict[str, Any]]:
    """Rows of kind ``train`` (each complete training stage under ``work_dir`` that none of
    ``manifests`` names: a ``train`` command's result) and ``tune`` (each study record under
    ``work_dir/tune``), from their manifests alone."""
    work_dir = Path(work_dir)
    used = {(ref.get("stage"), ref.get("key")) for m in manifests for e in (m.get("stages") or {}).values()
            for ref in ((e or {}).get("train") or {}).values() if isinstance(ref, dict)}
    out = []
    for stage_dir in sorted(work_dir.glob("train-*")):
        for folder in sorted(p for p in stage_dir.iterdir() if p.is_dir() and not p.name.startswith(".")):
            if (stage_dir.name, folder.name) in used:
                continue
            try:
                manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            if not isinstance(manifest, dict) or manifest.get("status", "complete") != "complete":
                continue
            config, metrics = manifest.get("config") or {}, manifest.get("metrics") or {}
            row = _empty_row(f"{stage_dir.name}/{folder.name[:8]}", "train", str(manifest.get("finished") or ""),
                             "", [str(config.get("model") or stage_dir.name[len("train-"):])])
            row["collections"] = {str(config.get("collection")): _number(metrics.get("oof_score"))}
            row["seeds"] = list(config.get("seeds") or [])
            row["wall_s"] = _number(manifest.get("wall_time_s"))
            out.append(row)
    for path in sorted((work_dir / "tune").glob("*.toml.json")):
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if not isinstance(record, dict) or record.get("generator") != "pipelines.flows.tune":
            continue
        row = _empty_row(str(record.get("study_name") or path.stem), "tune", str(record.get("created") or ""),
                         str(record.get("data_root") or ""), [str(record.get("model") or "?")])
        row["collections"] = {str(record.get("collection")): _number(record.get("best_value"))}
        row["note"] = f"best of {record.get('trials_complete')} trials: {path.with_suffix('')}"
        out.append(row)
    return out


def filter_runs(rows: Iterable[dict[str, Any]], *, submitted_only: bool = False,
                data_root: str | None = None) -> list[dict[str, Any]]:
    out = [r for r in rows if not submitted_only or r["submitted"]]
    if data_root is not None:
        wanted = str(Path(data_root).resolve())
        out = [r for r in out if r["data_root"] == wanted]
    return out
