"""How much does early stopping on the held-out fold inflate the GNN's held-out (OOF) score?

Usage: python -m benchmarks.early_stopping ROOT [ROOT ...] [--out FILE]

ROOT is an ``evaluation_worlds --root`` folder (or any folder with a stage cache ``work/``). Each fold
model of the GNN keeps the best epoch by its score on the held-out fold (``valid`` in its history),
the same graphs its OOF predictions are then scored on, so the OOF score is partly selected on
itself. Here, per fold model, that best epoch's held-out score is compared with the score of the
epoch the other folds (same seed) would have chosen: the argmax of their mean held-out curve, a
choice made without this fold's graphs. The difference is an estimate of the inflation (it also
holds what this fold's own curve really peaks differently, so it is an upper estimate); ``best -
last`` is the same against simply training to the last epoch every fold ran.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from benchmarks.common import markdown_table
from pipelines.atomic import write_text_atomic


@dataclass(frozen=True)
class FoldInflation:
    fold: int
    seed: int
    best: float  # the best epoch's held-out score (what the fold model keeps)
    at_others_choice: float  # its held-out score at the epoch the other folds of its seed choose
    at_last: float  # at the last epoch every fold model of its seed ran

    @property
    def inflation(self) -> float:
        return self.best - self.at_others_choice


def fold_inflations(curves: Mapping[tuple[int, int], Sequence[float]]) -> list[FoldInflation]:
    """Per fold model ``(fold, seed) -> held-out score per epoch`` (NaN: not scored that epoch), the
    :class:`FoldInflation` of early stopping on its own held-out fold; curves are compared over the
    epochs every fold model of the seed ran (pure)."""
    out = []
    for (fold, seed), curve in sorted(curves.items()):
        same_seed = [np.asarray(c, dtype=np.float64) for (f, s), c in curves.items() if s == seed]
        epochs = min(len(c) for c in same_seed)
        others = [np.asarray(c, dtype=np.float64)[:epochs] for (f, s), c in curves.items() if s == seed and f != fold]
        own = np.asarray(curve, dtype=np.float64)
        if not others or epochs == 0:
            raise ValueError(f"fold {fold} seed {seed}: no other fold of its seed to choose an epoch")
        chosen = int(np.nanargmax(np.nanmean(np.stack(others), axis=0)))
        out.append(FoldInflation(fold, seed, float(np.nanmax(own)), float(own[chosen]), float(own[epochs - 1])))
    return out


def gnn_curves(stage_dir: Path) -> dict[tuple[int, int], list[float]]:
    """The held-out score per epoch of every fold model of a finished GNN training stage."""
    from pipelines.models.gnn.ranker import GNNRanker

    manifest = json.loads((stage_dir / "manifest.json").read_text(encoding="utf-8"))
    curves = {}
    for model in manifest["metrics"]["models"]:
        (file,) = model["files"]
        path = stage_dir / file
        ranker = GNNRanker.load(path.parent, path.stem)
        curves[(int(model["fold"]), int(model["seed"]))] = [float(h["valid"]) for h in ranker.history_]
    return curves


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("roots", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, default=None, help="also write the table to this file")
    args = parser.parse_args(argv)
    rows, inflations = [], []
    for root in args.roots:
        for path in sorted((root / "work" / "train-gnn").glob("*/manifest.json")):
            if "metrics" not in json.loads(path.read_text(encoding="utf-8")):
                continue  # an unfinished stage
            collection = json.loads(path.read_text(encoding="utf-8"))["metrics"]["collection"]
            folds = fold_inflations(gnn_curves(path.parent))
            inflations += [f.inflation for f in folds]
            values = np.array([f.inflation for f in folds])
            rows.append([root.name, collection, str(len(folds)), f"{np.mean([f.best for f in folds]):.4f}",
                         f"{values.mean():+.4f}", f"{values.std(ddof=1) / np.sqrt(values.size):.4f}",
                         f"{np.mean([f.best - f.at_last for f in folds]):+.4f}"])
    if not rows:
        raise SystemExit("no finished GNN training stage under " + ", ".join(str(r / "work" / "train-gnn") for r in args.roots))
    lines = [*markdown_table(["root", "collection", "fold models", "held-out best", "best - other folds' epoch",
                              "its se", "best - last"], rows), "",
             f"mean over {len(inflations)} fold models: best - other folds' epoch {np.mean(inflations):+.4f}"]
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if args.out:
        write_text_atomic(args.out, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
