"""How well do the GNN's fold models rank the graphs they trained on, against the graphs held out from them?

Usage: python -m benchmarks.in_sample_fit ROOT [ROOT ...] [--seed S] [--worlds WORLD ...] [--out FILE]

ROOT is an ``evaluation_worlds --root`` folder (or any folder with a stage cache ``work/``). For every
layout GNN training stage of seed S in it, each fold model scores every graph of the collection's
folds (its companions' graphs left out): Kendall tau-b of its costs against the measured runtimes, on
the graphs it trained on ("own": the other folds) and on its held-out fold (which also chose its
early-stopping epoch). If "own" sits far under the measured runtimes' noise ceiling, the fits cannot
express (or do not reach, in their budget) what orders even their own graphs, whatever carries to new
ones; if "own" sits far above "held out", they do not generalise from their programs to others.

With ``--worlds`` (the synthetic worlds the stages were run on, whose hidden labels score the test
graphs) also the stage's test predictions: each fold model alone ("test, one model") and the fold
models' mean score, as the pipeline averages them ("test, their mean"): what averaging fold models
adds, against what a single model carries to unseen programs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from benchmarks.common import emit, markdown_table, parse_roots
from pipelines.core.metric import kendall_tau_b

if TYPE_CHECKING:
    from pipelines.core.engine import StageOutput


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


def taus_on_test(costs: Mapping[int, Sequence[np.ndarray]], runtimes: Sequence[np.ndarray]) -> dict[str, float]:
    """Mean tau-b over the test graphs of each fold model ``k``'s ``costs[k][g]`` alone ("test_one",
    pooled over the models) and of the fold models' mean cost ("test_mean"; pure; NaN taus left out)."""
    one = [kendall_tau_b(per_graph[g], runtime) for per_graph in costs.values() for g, runtime in enumerate(runtimes)]
    mean = [kendall_tau_b(np.mean([per_graph[g] for per_graph in costs.values()], axis=0), runtime)
            for g, runtime in enumerate(runtimes)] if costs else []
    return {name: float(np.nanmean(values)) if values else float("nan")
            for name, values in (("test_one", one), ("test_mean", mean))}


def stage_world(work: Path, node_arrays_key: str, collection: str, worlds: Sequence[Path]) -> Path:
    """Which of ``worlds`` a training stage's graphs came from: the one whose raw files key its prune stage
    (worlds over the same programs share graph names, so a name alone cannot tell)."""
    from pipelines.core.collection import parse_collection
    from pipelines.core.engine import load_stage
    from pipelines.flows.prepare import collection_refs, raw_data_key

    prune_key = load_stage(work, "node_arrays", node_arrays_key).manifest["inputs"]["prune"]
    data_key = load_stage(work, "prune", prune_key).manifest["inputs"]["data"]
    target = parse_collection(collection)
    held = [world for world in worlds if raw_data_key(world, collection_refs(world, target)) == data_key]
    if len(held) != 1:
        which = "none" if not held else f"{len(held)} ({', '.join(map(str, held))})"
        raise SystemExit(f"{work}: {which} of --worlds hold the {collection} files of node_arrays stage {node_arrays_key}")
    return held[0]


def stage_test_taus(stage: StageOutput, collection: str, seed: int, world: Path) -> dict[str, float]:
    """:func:`taus_on_test` of one training stage's test predictions of ``seed``, scored by ``world``'s hidden labels."""
    import polars as pl

    from pipelines.core.collection import parse_collection
    from pipelines.synth.world import read_labels
    from pipelines.training.fit import PREDICTIONS_FILE

    target = parse_collection(collection)
    rows = (pl.read_parquet(stage.file(PREDICTIONS_FILE))
            .filter((pl.col("split") == "test") & (pl.col("seed") == seed)).sort("graph", "fold", "config_index"))
    costs: dict[int, list[np.ndarray]] = {}
    runtimes = []
    for (graph,), part in rows.partition_by("graph", as_dict=True, maintain_order=True).items():
        runtime = read_labels(world, target, "test", graph).runtime
        runtimes.append(runtime)
        for (fold,), model in part.partition_by("fold", as_dict=True, maintain_order=True).items():
            cost = np.full(runtime.shape, np.nan)
            cost[model["config_index"].to_numpy()] = model["score"].to_numpy()
            costs.setdefault(fold, []).append(cost)
    return taus_on_test(costs, runtimes)


def stage_fit(stage: StageOutput, seed: int) -> tuple[str, int, dict[str, float]] | None:
    """(collection, graphs, fold_taus) of one GNN training stage's fold models of ``seed``; None if it has none."""
    from pipelines.core.engine import load_stage
    from pipelines.data.folds import read_folds
    from pipelines.data.node_arrays import read_graph_arrays
    from pipelines.models.gnn.ranker import GNNRanker

    collection, work = stage.manifest["metrics"]["collection"], stage.path.parent.parent
    models = [m for m in stage.manifest["metrics"]["models"] if m["seed"] == seed]
    if not collection.startswith("layout:") or not models:
        return None
    folds = read_folds(load_stage(work, "folds", stage.manifest["inputs"]["folds"]))
    arrays = load_stage(work, "node_arrays", stage.manifest["inputs"]["node_arrays"])
    graphs = [read_graph_arrays(arrays, split, graph) for graph, split in zip(folds["graph"], folds["split"])]
    bounds = np.cumsum([g.num_configs for g in graphs])[:-1]
    costs = {m["fold"]: np.split(GNNRanker.load(stage.path / "models", f"gnn-f{m['fold']}-s{seed}").predict(graphs), bounds)
             for m in models}
    return collection, len(graphs), fold_taus(costs, [g.target for g in graphs], folds["fold"].to_list())


def main(argv: Sequence[str] | None = None) -> int:
    def more(parser) -> None:
        parser.add_argument("--seed", type=int, default=0, help="the training seed whose fold models are scored (default 0)")
        parser.add_argument("--worlds", type=Path, nargs="+", default=[],
                            help="synthetic worlds whose hidden labels score the stages' test predictions")

    args = parse_roots(__doc__, argv, more)
    names = {"own": "tau own", "held_out": "tau held out"}
    if args.worlds:
        names |= {"test_one": "tau test, one model", "test_mean": "tau test, their mean"}
    from pipelines.core.engine import load_stage

    rows, taus = [], []
    for root in args.roots:
        for path in sorted((root / "work").glob("train-gnn/*/manifest.json")):
            stage = load_stage(root / "work", "train-gnn", path.parent.name)
            fit = stage_fit(stage, args.seed)
            if fit is not None:
                collection, graphs, stage_taus = fit
                if args.worlds:
                    world = stage_world(root / "work", stage.manifest["inputs"]["node_arrays"], collection, args.worlds)
                    stage_taus |= stage_test_taus(stage, collection, args.seed, world)
                taus.append(stage_taus)
                rows.append([str(root), stage.key, collection, graphs, *(f"{stage_taus[n]:.3f}" for n in names)])
    if not rows:
        raise SystemExit(f"no layout GNN training stage of seed {args.seed} under {', '.join(map(str, args.roots))}")
    means = ", ".join(f"{names[n].removeprefix('tau ')} {np.mean([t[n] for t in taus]):.3f}" for n in names)
    lines = [f"# GNN fold models on their own graphs and on their held-out fold (seed {args.seed})", "",
             *markdown_table(["root", "stage", "collection", "graphs", *names.values()], rows), "",
             f"Mean over {len(rows)} stages: {means}."]
    emit(lines, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
