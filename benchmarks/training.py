"""Training (one fold, one seed) and prediction of every test graph, per model and collection.

Usage: python -m benchmarks.training --root DATA_ROOT [--collections ...] [--models gbdt,gnn] [--work DIR]

Each (model, collection) runs in a fresh process on 2 threads: the data stages (cached, not timed),
then one model is fitted on the train graphs with early stopping on the valid graphs (timed: loading
its data and ``fit``; like one fold of the CV, whose fold models train on 4/5 of train+valid, about
as many graphs), then every test graph is predicted (timed). A benchmark sample has too few program
families for grouped folds, hence the plain split. Times are extrapolated linearly in the number of
graphs to the real data: the fit to the real train graphs, the prediction to the real test graphs. ``--gnn-epochs N`` trains the GNN for N epochs (no early
stopping) and scales its fit time by (base config epochs) / N: an upper bound, since early stopping
may end the real run sooner.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from benchmarks.common import REAL_FILES, markdown_table, measure, verdict

TARGET_FIT_S = 3600.0  # all five collections of one model
TARGET_PREDICT_S = 120.0  # every test graph of every collection, per model

_FOLD = """
from pathlib import Path
import polars as pl
from pipelines import prepare as p
from pipelines.collections import parse_collection
from pipelines.config import load_config
from pipelines.models.registry import get_adapter
from pipelines.train import PREDICT_BATCH_GRAPHS, _predict_graphs
config = load_config(None, {overrides!r})
collection = parse_collection({collection!r})
root, work, quiet = {root!r}, Path({work!r}), lambda message: None
refs = p.collection_refs(root, collection)
key = p.raw_data_key(root, refs)
prune, _ = p.run_prune(config, collection, work, refs, key, False, quiet)
stages = {{"prune": prune}}
if {model!r} == "gnn":
    graphs = pl.read_parquet(prune.file(p.GRAPHS_TABLE))
    stages["node_arrays"], _ = p.run_node_arrays(collection, work, graphs, prune, False, quiet)
else:
    stages["features"], _ = p.run_features(config, collection, work, refs, key, prune, False, quiet)
prepared = p.Prepared(collection, stages)  # no folds stage: the sample is split train / valid / test
adapter = get_adapter({model!r})
settings = adapter.settings(config, collection)
train_graphs, held_out, test_graphs = prepared.graphs("train"), prepared.graphs("valid"), prepared.graphs("test")
t0, c0 = time.perf_counter(), time.process_time()
ranker = adapter.make(settings, collection, num_threads={threads})
train = adapter.load(prepared, train_graphs, settings=settings, fit=True, seed=0)
valid = adapter.load(prepared, held_out, settings=settings, fit=True, seed=0)
ranker = ranker.fit(train, valid, seed=0)
fit_s, fit_cpu_s = time.perf_counter() - t0, time.process_time() - c0
del train, valid
t0, c0 = time.perf_counter(), time.process_time()
predicted = _predict_graphs(adapter, ranker, prepared, test_graphs, settings=settings,
                            batch=PREDICT_BATCH_GRAPHS[collection.kind], seed=0)
predict_s, predict_cpu_s = time.perf_counter() - t0, time.process_time() - c0
table = prepared.graph_table
nodes = table.filter(table["graph"].is_in(train_graphs))["nodes_after"]
result = {{"fit_s": fit_s, "fit_cpu_s": fit_cpu_s, "predict_s": predict_s, "predict_cpu_s": predict_cpu_s, "train_graphs": len(train_graphs),
           "test_graphs": len(test_graphs), "test_configs": int(sum(len(c) for _, _, c in predicted)),
           "train_mean_nodes": float(nodes.mean())}}
"""


@dataclass(frozen=True)
class FitRow:
    model: str
    collection: str
    train_graphs: int
    train_mean_nodes: float
    fit_s: float
    fit_cpu_s: float
    fit_scale: float  # GNN epochs of the base config / epochs run (1.0 when the config ran as is)
    test_graphs: int
    test_configs: int
    predict_s: float
    predict_cpu_s: float
    peak_rss_mb: float

    def real_train_graphs(self) -> int:
        return REAL_FILES[self.collection][0]

    def fit_extrapolated_s(self) -> float:
        return self.fit_s * self.fit_scale / max(self.train_graphs, 1) * self.real_train_graphs()

    def predict_extrapolated_s(self) -> float:
        return self.predict_s / max(self.test_graphs, 1) * REAL_FILES[self.collection][2]


def measure_fold(root: Path, collection: str, model: str, work: Path, *, overrides: Sequence[str] = (),
                 gnn_epochs: int | None = None, threads: int = 2, nice: int = 0, log=print) -> FitRow:
    from pipelines.config import load_config

    overrides, scale = list(overrides), 1.0
    if model == "gnn" and gnn_epochs:
        base_epochs = load_config(None, overrides).gnn.epochs
        overrides += [f"gnn.epochs={gnn_epochs}", "gnn.patience=0"]
        scale = base_epochs / gnn_epochs
    body = _FOLD.format(root=str(root), collection=collection, model=model, work=str(work), threads=threads,
                        overrides=overrides)
    r = measure(body, nice=nice)
    row = FitRow(model, collection, int(r["train_graphs"]), float(r["train_mean_nodes"]), float(r["fit_s"]),
                 float(r["fit_cpu_s"]), scale, int(r["test_graphs"]), int(r["test_configs"]), float(r["predict_s"]),
                 float(r["predict_cpu_s"]), float(r["peak_rss_mb"]))
    log(f"  {model:<5} {collection:<22} fit {row.fit_s:8.1f}s on {row.train_graphs} graphs, predict "
        f"{row.predict_s:6.1f}s for {row.test_graphs} test graphs, peak {row.peak_rss_mb:6.0f} MB")
    return row


def table(rows: list[FitRow]) -> list[str]:
    header = ["model", "collection", "train graphs", "mean nodes", "fit s", "fit cpu s", "epochs scale",
              "graphs/s (fit)", "real train graphs", "fit extrapolated s", "test graphs", "predict s",
              "predict cpu s", "configs/s (predict)", "predict extrapolated s", "peak RSS MB"]
    out = [[r.model, r.collection, r.train_graphs, r.train_mean_nodes, r.fit_s, r.fit_cpu_s, r.fit_scale,
            r.train_graphs / r.fit_s, r.real_train_graphs(), r.fit_extrapolated_s(), r.test_graphs, r.predict_s,
            r.predict_cpu_s, r.test_configs / r.predict_s if r.predict_s > 0 else "-", r.predict_extrapolated_s(),
            r.peak_rss_mb]
           for r in rows]
    return markdown_table(header, out)


def targets(rows: list[FitRow]) -> list[str]:
    lines = []
    for model in dict.fromkeys(r.model for r in rows):
        mine = [r for r in rows if r.model == model]
        covered = f"{len(mine)} of {len(REAL_FILES)} collections"
        lines.append(verdict(f"{model} training, one fold and seed, {covered} (extrapolated)",
                             sum(r.fit_extrapolated_s() for r in mine) / 60, TARGET_FIT_S / 60, "min"))
        lines.append(verdict(f"{model} prediction of every test graph, {covered} (extrapolated)",
                             sum(r.predict_extrapolated_s() for r in mine), TARGET_PREDICT_S, "s"))
    return lines


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--collections", default=",".join(REAL_FILES))
    parser.add_argument("--models", default="gbdt,gnn")
    parser.add_argument("--work", type=Path, default=Path("/tmp/bench-work"))
    parser.add_argument("--gnn-epochs", type=int, default=None, help="train the GNN this many epochs, scale up")
    args = parser.parse_args(argv)
    rows = [measure_fold(args.root, c, m, args.work, gnn_epochs=args.gnn_epochs) for m in args.models.split(",")
            for c in args.collections.split(",")]
    print("\n".join(table(rows) + [""] + targets(rows)))


if __name__ == "__main__":
    main()
