"""The compiler's default as a tile anchor, measured on worlds that name each graph's default.

For each (run, world) pair: the run's tile test rows as published, the same rows under each anchor
rule (:mod:`pipelines.training.anchor`; ``always``: the default replaces the fifth pick whenever it is
not among the five; ``unless-confident``: unless every fold model leaves it out of its own five), and
the default alone (what keeping the compiler's choice scores). Scores are the competition's
tile metric on the world's hidden labels, per world and over all graphs, with how many rows the anchor
changed and how many of those it made better or worse.

    python -m benchmarks.default_anchor RUN_ID:WORLD [RUN_ID:WORLD ...] [--submissions-dir DIR] [--out FILE]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from benchmarks.common import emit, markdown_table
from pipelines.core.collection import TILE_XLA
from pipelines.core.metric import tile_score
from pipelines.core.engine import load_stage
from pipelines.data.root import DataRoot
from pipelines.data.submission import read_submission
from pipelines.flows.evaluate import truth_of
from pipelines.outputs.run_folders import read_run_manifest, resolve_run_id
from pipelines.synth.world import read_labels
from pipelines.training.anchor import anchor_row, default_votes
from pipelines.training.fit import load_predictions


def tile_rows(run_id: str, world: Path, submissions_dir: Path) -> list[dict[str, Any]]:
    """One row per tile test graph with a known default: its scores under each rule."""
    run_id = resolve_run_id(submissions_dir, run_id)
    manifest = read_run_manifest(submissions_dir, run_id)
    published = read_submission(submissions_dir / run_id / "submission.csv")
    defaults = DataRoot(world).defaults().get(TILE_XLA.name, {})
    stages = manifest["stages"][TILE_XLA.name]
    weights = manifest["ensemble_weights"][TILE_XLA.name]
    frames = []
    for model, ref in stages["train"].items():
        output = load_stage(Path(ref.get("work_dir") or manifest["work_dir"]), ref["stage"], ref["key"])
        frames.append(load_predictions(output).filter(pl.col("split") == "test").with_columns(pl.lit(model).alias("model")))
    voters = [m for m, w in weights.items() if w > 0]
    votes = default_votes(pl.concat(frames).filter(pl.col("model").is_in(voters)), defaults)
    out = []
    for ref in DataRoot(world).graphs(TILE_XLA, "test"):
        if ref.stem not in defaults:
            continue
        labels = read_labels(world, TILE_XLA, "test", ref.stem)
        truth = truth_of(TILE_XLA, labels.runtime, labels.normalizer)
        row, default = published[TILE_XLA.submission_id(ref.stem)], defaults[ref.stem]
        confident, always = anchor_row(row, default, votes.get(ref.stem)), anchor_row(row, default, None)
        out.append({"world": world.name, "graph": ref.stem, "configs": int(len(truth)),
                    "published": tile_score(row, truth), "unless_confident": tile_score(confident, truth),
                    "always": tile_score(always, truth), "default_alone": tile_score([default], truth),
                    "changed_unless_confident": confident != row, "changed_always": always != row})
    return out


def report(rows: list[dict[str, Any]]) -> list[str]:
    frame = pl.DataFrame(rows)
    lines = ["# The compiler's default as a tile anchor", ""]
    table = []
    for name, part in [*sorted(frame.partition_by("world", as_dict=True).items()), (("all",), frame)]:
        cells = [name[0], part.height, f"{part['published'].mean():.4f}", f"{part['default_alone'].mean():.4f}"]
        for rule in ("always", "unless_confident"):
            gain = (part[rule] - part["published"]).to_numpy()
            cells += [f"{part[rule].mean():.4f}", f"{int(part[f'changed_{rule}'].sum())} / {int((gain > 0).sum())} / "
                      f"{int((gain < 0).sum())}"]
        table.append(cells)
    lines += markdown_table(["world", "graphs", "published", "default alone", "always", "changed / better / worse",
                             "unless-confident", "changed / better / worse"], table)
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("pairs", nargs="+", metavar="RUN_ID:WORLD")
    parser.add_argument("--submissions-dir", type=Path, default=Path("submissions"))
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    rows = []
    for pair in args.pairs:
        run_id, _, world = pair.partition(":")
        rows += tile_rows(run_id, Path(world), args.submissions_dir)
    if not rows:
        print("no tile test graph with a known default in these worlds", file=sys.stderr)
        return 1
    emit(report(rows), args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
