"""How much does early stopping on the held-out fold inflate the models' held-out (OOF) scores?

Usage: python -m benchmarks.early_stopping ROOT [ROOT ...] [--out FILE]

ROOT is an ``evaluation_worlds --root`` folder (or any folder with a stage cache ``work/``). Each fold
model keeps the best epoch (GNN: ``valid`` in its history, the collection's metric on up to
``eval_max_configs`` configs per graph) or boosting iteration (GBDT: ``stopping_curve_``, on layout
pair accuracy or, with the pairwise objective, its binary log-loss; top-5 on tile) by its score on
the held-out fold, the same graphs its OOF
predictions are then scored on, so the OOF score is partly selected on itself. Here, per fold model,
that best score is compared with the score at the epoch the other folds (same seed) would have
chosen: the argmax of their mean held-out curve, a choice made without this fold's graphs. The
difference estimates the inflation (it also holds where this fold's own curve truly peaks
elsewhere, so it is an upper estimate); ``best - last`` is the same against training to the last
epoch every fold model of the seed ran. Figures are in each curve's own metric (pair accuracy:
Kendall tau moves about twice as much; log-loss has no tau equivalent).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from benchmarks.common import emit, markdown_table, parse_roots


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
        epochs = min(len(c) for (f, s), c in curves.items() if s == seed)
        others = [np.asarray(c, dtype=np.float64)[:epochs] for (f, s), c in curves.items() if s == seed and f != fold]
        own = np.asarray(curve, dtype=np.float64)
        if not others or epochs == 0:
            raise ValueError(f"fold {fold} seed {seed}: no other fold of its seed to choose an epoch")
        stacked = np.stack(others)
        scored = (~np.isnan(stacked)).sum(axis=0)  # an epoch no other fold scored is never chosen
        mean = np.where(scored > 0, np.nansum(stacked, axis=0) / np.maximum(scored, 1), -np.inf)
        chosen = int(np.argmax(mean))
        out.append(FoldInflation(fold, seed, float(np.nanmax(own)), float(own[chosen]), float(own[epochs - 1])))
    return out


def stage_curves(stage_dir: Path) -> tuple[str, dict[tuple[int, int], list[float]]] | None:
    """The early-stopping metric's name and its per-epoch (or per-iteration) held-out values, higher
    better, of every fold model of a finished GNN or GBDT training stage; None for a GBDT stage saved
    before its curves were kept."""
    manifest = json.loads((stage_dir / "manifest.json").read_text(encoding="utf-8"))
    metric, curves = manifest["metrics"]["metric"], {}
    for model in manifest["metrics"]["models"]:
        key = (int(model["fold"]), int(model["seed"]))
        if manifest["metrics"]["model"] == "gnn":
            from pipelines.models.gnn.ranker import GNNRanker

            path = stage_dir / model["files"][0]
            curves[key] = [float(h["valid"]) for h in GNNRanker.load(path.parent, path.stem).history_]
        else:  # GBDT: its sidecar holds the curve; the booster need not be read
            (sidecar,) = [f for f in model["files"] if f.endswith(".json")]
            curve = json.loads((stage_dir / sidecar).read_text(encoding="utf-8")).get("stopping_curve")
            if curve is None:
                return None
            metric = curve["metric"]
            curves[key] = [v if curve["higher_better"] else -v for v in curve["values"]]
    return metric, curves


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_roots(__doc__, argv)
    rows, skipped = [], []
    for root in args.roots:
        for path in sorted([*(root / "work").glob("train-gnn/*/manifest.json"),
                            *(root / "work").glob("train-gbdt/*/manifest.json")]):
            metrics = json.loads(path.read_text(encoding="utf-8")).get("metrics")
            if metrics is None:
                continue  # an unfinished stage
            found = stage_curves(path.parent)
            if found is None:
                skipped.append(str(path.parent))
                continue
            metric, curves = found
            folds = fold_inflations(curves)
            values = np.array([f.inflation for f in folds])
            rows.append([root.name, metrics["collection"], metrics["model"], metric, str(len(folds)),
                         f"{np.mean([f.best for f in folds]):.4f}", f"{values.mean():+.4f}",
                         f"{values.std(ddof=1) / np.sqrt(values.size):.4f}",
                         f"{np.mean([f.best - f.at_last for f in folds]):+.4f}"])
    if not rows:
        raise SystemExit("no finished training stage with early-stopping curves under "
                         + ", ".join(str(r / "work") for r in args.roots))
    rows.sort(key=lambda r: (r[0], r[1], r[2]))
    lines = [*markdown_table(["root", "collection", "model", "stopping metric", "fold models", "held-out best",
                              "best - other folds' epoch", "its se", "best - last"], rows)]
    if skipped:
        lines += ["", f"{len(skipped)} GBDT stage(s) saved before their curves were kept: " + ", ".join(skipped)]
    emit(lines, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
