"""How well do the GNN's fold models rank the graphs they trained on, against the graphs held out from them?

Usage: python -m benchmarks.in_sample_fit ROOT [ROOT ...] [--seed S] [--out FILE]

ROOT is an ``evaluation_worlds --root`` folder (or any folder with a stage cache ``work/``). For every
layout GNN training stage of seed S in it, each fold model scores every graph of the collection's
folds (its companions' graphs left out): Kendall tau-b of its costs against the measured runtimes, on
the graphs it trained on ("own": train and early-stopping graphs alike are in other folds) and on its
held-out fold. If "own" sits far under the measured runtimes' noise ceiling, the fits cannot express
(or do not reach, in their budget) what orders even their own graphs, whatever carries to new ones.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from benchmarks.common import emit, markdown_table, parse_roots
from pipelines.core.metric import kendall_tau_b


def fold_taus(costs: Mapping[int, Sequence[np.ndarray]], runtimes: Sequence[np.ndarray],
              folds: Sequence[int]) -> dict[str, float]:
    """Mean tau-b of each fold model ``k``'s ``costs[k][g]`` against ``runtimes[g]`` over the graphs of the
    other folds ("own") and of fold ``k`` ("held_out"), pooled over the fold models (pure; NaN taus of
    constant runtimes left out, and holdout graphs, fold -1, which no fold model trained on)."""
    taus: dict[str, list[float]] = {"own": [], "held_out": []}
    for k, per_graph in costs.items():
        for cost, runtime, fold in zip(per_graph, runtimes, folds):
            if fold >= 0:
                taus["held_out" if fold == k else "own"].append(kendall_tau_b(cost, runtime))
    return {name: float(np.nanmean(values)) if values else float("nan") for name, values in taus.items()}


def stage_fit(stage_dir: Path, seed: int) -> tuple[str, int, dict[str, float]] | None:
    """(collection, graphs, fold_taus) of one GNN training stage's fold models of ``seed``; None if it has none."""
    from pipelines.core.engine import load_stage
    from pipelines.data.folds import read_folds
    from pipelines.data.node_arrays import read_graph_arrays
    from pipelines.models.gnn.ranker import GNNRanker

    manifest = json.loads((stage_dir / "manifest.json").read_text(encoding="utf-8"))
    collection, work = manifest["metrics"]["collection"], stage_dir.parent.parent
    models = [m for m in manifest["metrics"]["models"] if m["seed"] == seed]
    if not collection.startswith("layout:") or not models:
        return None
    folds = read_folds(load_stage(work, "folds", manifest["inputs"]["folds"]))
    arrays = load_stage(work, "node_arrays", manifest["inputs"]["node_arrays"])
    graphs = [read_graph_arrays(arrays, split, graph) for graph, split in zip(folds["graph"], folds["split"])]
    bounds = np.cumsum([g.num_configs for g in graphs])[:-1]
    costs = {m["fold"]: np.split(GNNRanker.load(stage_dir / "models", f"gnn-f{m['fold']}-s{seed}").predict(graphs), bounds)
             for m in models}
    return collection, len(graphs), fold_taus(costs, [g.target for g in graphs], folds["fold"].to_list())


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_roots(__doc__, argv, lambda parser: parser.add_argument(
        "--seed", type=int, default=0, help="the training seed whose fold models are scored (default 0)"))
    rows, taus = [], []
    for root in args.roots:
        for path in sorted((root / "work").glob("train-gnn/*/manifest.json")):
            fit = stage_fit(path.parent, args.seed)
            if fit is not None:
                collection, graphs, stage_taus = fit
                taus.append(stage_taus)
                rows.append([str(root), path.parent.name, collection, graphs, f"{stage_taus['own']:.3f}",
                             f"{stage_taus['held_out']:.3f}"])
    if not rows:
        raise SystemExit(f"no layout GNN training stage of seed {args.seed} under {', '.join(map(str, args.roots))}")
    own, held = (np.mean([t[name] for t in taus]) for name in ("own", "held_out"))
    lines = [f"# GNN fold models on their own graphs and on their held-out fold (seed {args.seed})", "",
             *markdown_table(["root", "stage", "collection", "graphs", "tau own", "tau held out"], rows), "",
             f"Mean over {len(rows)} stages: own {own:.3f}, held out {held:.3f}."]
    emit(lines, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
