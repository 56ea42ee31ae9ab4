"""Training (one fold, one seed) and prediction of every test graph, per model and collection.

Usage: python -m benchmarks.training --root DATA_ROOT [--collections ...] [--models gbdt,gnn] [--work DIR]
                                    [--config NAME] [--set K=V ...] [--jobs 2]

Each (model, collection) runs in a fresh process on 2 threads (``--jobs 2``: two at once on 1 thread
each, the way a run's fold jobs share 2 cores; see below): the data stages (cached, not timed),
then one model is fitted on the train graphs with early stopping on the valid graphs (timed: loading
its data and ``fit``; like one fold of the CV, whose fold models train on 4/5 of train+valid, about
as many graphs), then every test graph is predicted (timed). A benchmark sample has too few program
families for grouped folds, hence the plain split. Times are extrapolated linearly in the number of
graphs to the real data: the fit to the real train graphs, the prediction to the real test graphs.

The GNN's fit is extrapolated in parts, because its training and its early-stopping validation
scale with different graph counts: per epoch, the training steps scale with the train graphs of a
real fold model (4/5 of train+valid) and the validation with its held-out graphs (1/5), and the
epoch count with what early stopping runs; loading and preparing the graphs scale with all of them,
and the rest of the fit (building the model, starting a GPU: seconds, most of a fit on a sample
this small) is paid once. The graphs of ``gnn.extra_train_collections`` (xla:random also trains on
nlp:random's) join the training set as in a run, loaded before the clock starts (their preparation
inside the fit counts as paid once); a pass visits at most ``gnn.extra_train_share`` times as many of
them as own graphs, so their steps scale with the own graphs.

``--gnn-epochs 0`` runs the config (``--config``, default base) as it is, early stopping included:
the sample's own stopping epoch. ``--gnn-epochs N`` trains N epochs without early stopping and scales
to ``--gnn-expected-epochs`` (default: the config's epochs, an upper bound; pass the epochs early
stopping ran on a larger world, e.g. the ``small`` world's mean ``epochs_run``, for an estimate).
``--device cuda`` trains the GNN on the GPU.

``--jobs 2`` measures the fits two at a time, each on one thread, as ``train`` and ``run`` use two
cores (their fold jobs run one thread each, two at once, across collections in a run). Each fit is
slower than alone on two threads, but a second thread speeds one fit up far less than twice (on the
small nlp graphs not at all), so two one-thread fits get more done: one fold and seed of every
collection takes the sum of the fits / 2 of the machine's time, what a run on 2 cores spends per fold
and seed (the target is checked on it). The default (``--jobs 1``) is the time of one fit alone.

The extrapolation takes the sample's graphs to be as large as the real ones on average; the table gives
the sample's mean raw nodes (train and valid graphs) over the real data's (layout), and a NOTE line
flags a sample more than ``SIZE_TOLERANCE`` off: the one-graph sample's xla graphs are ~2x the real
mean, so its minutes are an upper estimate; 8 graphs per split come within a few percent.

Before and after the measurements two reference kernels are timed on one thread (``common.machine_reference``:
a pass over 93 MB, a matrix product; the shapes that bound a GNN step on a CPU): their figures place the run's
machine state beside other runs' (the pass: 7 ms on one boot of the 2-core VM, 21-23 on a later one), and a
NOTE flags a machine whose speed moved by more than ``REFERENCE_TOLERANCE`` during the run. A steady reference
does not prove a steady machine (``machine_reference``): compare code versions by their steps in one process,
not by two runs of this benchmark. On a virtual machine the host may run other work on its cores: the share
of the machine's core time it took during the measurements (its steal) is printed (``common.cpu_clock``), with
a NOTE above ``STEAL_TOLERANCE``; each fit's own CPU time (in the table) leaves it out.
"""

from __future__ import annotations

import argparse
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

from benchmarks.common import (REAL_FILES, REAL_MEAN_NODES, SIZE_TOLERANCE, cpu_clock, machine_reference,
                               markdown_table, measure, reference_lines, steal_lines, verdict)

TARGET_FIT_S = 3600.0  # all five collections of one model
TARGET_PREDICT_S = 120.0  # every test graph of every collection, per model
CORES = 2  # the machine the targets are set for

_FOLD = """
from pathlib import Path
from pipelines.flows import prepare as p
from pipelines.core.stages import RawFiles
from pipelines.data.features import FEATURES
from pipelines.data.node_arrays import NODE_ARRAYS
from pipelines.data.prune import PRUNE
from pipelines.flows.dag import data_stage_call
from pipelines.core.collection import parse_collection
from pipelines.config.settings import load_config
from pipelines.config.registry import get_adapter
from pipelines.training.fit import PREDICT_BATCH_GRAPHS, _predict_graphs
config = load_config({config!r}, {overrides!r})
root, work = {root!r}, Path({work!r})
def prepare_collection(collection):
    refs = p.collection_refs(root, collection)
    raw = RawFiles(refs, p.raw_data_key(root, refs))
    stages = {{"prune": PRUNE.run(data_stage_call(PRUNE, config, collection, work, raw, {{}}))}}
    stage = NODE_ARRAYS if {model!r} == "gnn" else FEATURES
    stages[stage.name] = stage.run(data_stage_call(stage, config, collection, work, raw, stages))
    return p.Prepared(collection, stages)  # no folds stage: the sample is split train / valid / test
collection = parse_collection({collection!r})
prepared = prepare_collection(collection)
adapter = get_adapter({model!r})
settings = adapter.settings(config, collection)
train_graphs, held_out, test_graphs = prepared.graphs("train"), prepared.graphs("valid"), prepared.graphs("test")
# graphs of other collections that join the training set (gnn.extra_train_collections), loaded before the
# clock starts: a pass visits at most as many of them as own graphs, so their steps scale with the own ones
companions = []
for name in settings.get("extra_train_collections") or []:
    other = prepare_collection(parse_collection(name))
    companions += adapter.load(other, other.graphs("train") + other.graphs("valid"), settings=settings, fit=True, seed=0)
t0, c0 = time.perf_counter(), time.process_time()
ranker = adapter.make(settings, collection, num_threads={threads})
train = adapter.load(prepared, train_graphs, settings=settings, fit=True, seed=0)
valid = adapter.load(prepared, held_out, settings=settings, fit=True, seed=0)
load_s = time.perf_counter() - t0
ranker = ranker.fit(train + companions if companions else train, valid, seed=0)  # GBDT: a frame, no companions
fit_s, fit_cpu_s = time.perf_counter() - t0, time.process_time() - c0
history = getattr(ranker, "history_", None) or []
epochs_s = sum(h["seconds"] for h in history)
valid_s = sum(h.get("valid_seconds", 0.0) for h in history)
prepare_s = 0.0
if history:  # the GNN prepares each graph inside fit: timed again here, outside the measured fit
    from pipelines.models.gnn.batch import prepare_for
    t1 = time.perf_counter()
    for g in train + valid:
        prepare_for(g, ranker.config)
    prepare_s = time.perf_counter() - t1
companion_graphs = len(companions)
del train, valid, companions
t0, c0 = time.perf_counter(), time.process_time()
predicted = _predict_graphs(adapter, ranker, prepared, test_graphs, settings=settings,
                            batch=PREDICT_BATCH_GRAPHS[collection.kind], seed=0)
predict_s, predict_cpu_s = time.perf_counter() - t0, time.process_time() - c0
table = prepared.graph_table
nodes = table.filter(table["graph"].is_in(train_graphs))["nodes_after"]
sample_raw_nodes = float(table.filter(table["graph"].is_in(train_graphs + held_out))["nodes_before"].mean())
result = {{"fit_s": fit_s, "fit_cpu_s": fit_cpu_s, "predict_s": predict_s, "predict_cpu_s": predict_cpu_s, "train_graphs": len(train_graphs),
           "test_graphs": len(test_graphs), "test_configs": int(sum(len(c) for _, _, c in predicted)),
           "train_mean_nodes": float(nodes.mean()), "valid_graphs": len(held_out), "epochs_run": len(history),
           "epochs_s": epochs_s, "valid_s": valid_s, "load_s": load_s, "prepare_s": prepare_s,
           "companion_graphs": companion_graphs, "sample_raw_nodes": sample_raw_nodes}}
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
    valid_graphs: int = 0
    epochs_run: int = 0  # GNN: epochs the sample ran (0: not a GNN)
    epochs_s: float = 0.0  # GNN: seconds of those epochs, training steps and validation
    valid_s: float = 0.0  # GNN: ... of which early-stopping validation
    load_s: float = 0.0  # loading the train and valid graphs (part of fit_s)
    prepare_s: float = 0.0  # GNN: preparing those graphs for the model (inside fit, timed again outside)
    companion_graphs: int = 0  # GNN: graphs of gnn.extra_train_collections in the training set
    sample_raw_nodes: float = 0.0  # mean raw (unpruned) nodes of the train and valid graphs

    def size_ratio(self) -> float | None:
        """The sample's mean raw graph size over the real data's (layout), else None."""
        real = REAL_MEAN_NODES.get(self.collection)
        return self.sample_raw_nodes / real if real and self.sample_raw_nodes else None

    def real_train_graphs(self) -> int:
        return REAL_FILES[self.collection][0]

    def real_fold_graphs(self) -> tuple[float, float]:
        """Train and held-out graphs of one real fold model of the 5-fold CV."""
        labelled = REAL_FILES[self.collection][0] + REAL_FILES[self.collection][1]
        return 0.8 * labelled, 0.2 * labelled

    def fit_extrapolated_s(self) -> float:
        if not self.epochs_run:  # one pass over the data (GBDT): linear in the train graphs
            return self.fit_s * self.fit_scale / max(self.train_graphs, 1) * self.real_train_graphs()
        real_train, real_valid = self.real_fold_graphs()
        per_graph = min(self.load_s + self.prepare_s, self.fit_s - self.epochs_s)  # loading, preparing
        steps = (self.epochs_s - self.valid_s) / max(self.train_graphs, 1) * real_train
        validation = self.valid_s / max(self.valid_graphs, 1) * real_valid
        return (per_graph / max(self.train_graphs + self.valid_graphs, 1) * (real_train + real_valid)
                + self.fixed_s() + self.fit_scale * (steps + validation))

    def fixed_s(self) -> float:
        """GNN: the part of the fit paid once whatever the graph count (building the model, starting the
        device); 0 for a one-pass model."""
        return max(0.0, self.fit_s - self.epochs_s - self.load_s - self.prepare_s) if self.epochs_run else 0.0

    def predict_extrapolated_s(self) -> float:
        return self.predict_s / max(self.test_graphs, 1) * REAL_FILES[self.collection][2]


def measure_fold(root: Path, collection: str, model: str, work: Path, *, config: str | None = None,
                 overrides: Sequence[str] = (), gnn_epochs: int | None = None,
                 gnn_expected_epochs: float | None = None, device: str = "cpu", threads: int = 2, nice: int = 0,
                 log=print) -> FitRow:
    from pipelines.config.settings import load_config

    overrides, scale = list(overrides), 1.0
    if model == "gnn":
        overrides += [f'gnn.device="{device}"']
    if model == "gnn" and gnn_epochs:
        expected = gnn_expected_epochs or load_config(config, overrides).gnn.epochs
        overrides += [f"gnn.epochs={gnn_epochs}", "gnn.patience=0"]
        scale = expected / gnn_epochs
    body = _FOLD.format(root=str(root), collection=collection, model=model, work=str(work), threads=threads,
                        config=config, overrides=overrides)
    r = measure(body, nice=nice)
    row = FitRow(model, collection, int(r["train_graphs"]), float(r["train_mean_nodes"]), float(r["fit_s"]),
                 float(r["fit_cpu_s"]), scale, int(r["test_graphs"]), int(r["test_configs"]), float(r["predict_s"]),
                 float(r["predict_cpu_s"]), float(r["peak_rss_mb"]), int(r["valid_graphs"]), int(r["epochs_run"]),
                 float(r["epochs_s"]), float(r["valid_s"]), float(r["load_s"]), float(r["prepare_s"]),
                 int(r["companion_graphs"]), float(r["sample_raw_nodes"]))
    log(f"  {model:<5} {collection:<22} fit {row.fit_s:8.1f}s on {row.train_graphs} graphs, predict "
        f"{row.predict_s:6.1f}s for {row.test_graphs} test graphs, peak {row.peak_rss_mb:6.0f} MB")
    return row


def table(rows: list[FitRow]) -> list[str]:
    header = ["model", "collection", "train graphs", "valid graphs", "mean nodes", "fit s", "fit cpu s",
              "companion graphs", "epochs run", "of which validation s", "once per fit s", "epochs scale",
              "graphs/s (fit)", "real train graphs", "fit extrapolated s", "test graphs", "predict s", "predict cpu s", "configs/s (predict)",
              "predict extrapolated s", "peak RSS MB", "raw nodes / real mean"]
    out = [[r.model, r.collection, r.train_graphs, r.valid_graphs, r.train_mean_nodes, r.fit_s, r.fit_cpu_s,
            r.companion_graphs, r.epochs_run or "-", *([r.valid_s, r.fixed_s()] if r.epochs_run else ["-", "-"]),
            r.fit_scale,
            r.train_graphs / r.fit_s, r.real_train_graphs(), r.fit_extrapolated_s(), r.test_graphs, r.predict_s,
            r.predict_cpu_s, r.test_configs / r.predict_s if r.predict_s > 0 else "-", r.predict_extrapolated_s(),
            r.peak_rss_mb, "-" if r.size_ratio() is None else r.size_ratio()]
           for r in rows]
    return markdown_table(header, out)


def targets(rows: list[FitRow], jobs: int = 1) -> list[str]:
    """Verdicts per model; with ``jobs`` fits measured at once, the machine's time is their sum / ``jobs``."""
    lines = []
    for model in dict.fromkeys(r.model for r in rows):
        mine = [r for r in rows if r.model == model]
        covered = f"{len(mine)} of {len(REAL_FILES)} collections"
        if jobs > 1:
            covered += f", {jobs} at once on {threads_per_job(jobs)} thread(s) each (sum / {jobs})"
        lines.append(verdict(f"{model} training, one fold and seed, {covered} (extrapolated)",
                             sum(r.fit_extrapolated_s() for r in mine) / 60 / jobs, TARGET_FIT_S / 60, "min"))
        lines.append(verdict(f"{model} prediction of every test graph, {covered} (extrapolated)",
                             sum(r.predict_extrapolated_s() for r in mine) / jobs, TARGET_PREDICT_S, "s"))
        off = [f"{r.collection} {r.size_ratio():.2f}x" for r in mine
               if r.size_ratio() is not None and not 1 / SIZE_TOLERANCE <= r.size_ratio() <= SIZE_TOLERANCE]
        if off:
            lines.append(f"- NOTE {model}: the sample's graphs are not the real data's mean size ({', '.join(off)} "
                         "in raw nodes): its times scale with that; a sample of more graphs per split is closer")
    return lines


def threads_per_job(jobs: int) -> int:
    """Threads of each measured fit when ``jobs`` run at once: the cores shared out, as a run does."""
    return max(1, CORES // jobs)


def measure_folds(tasks: Sequence[tuple[str, str]], jobs: int = 1, *, root: Path | Mapping[str, Path],
                  on_row: Callable[[FitRow], None] | None = None, **options) -> list[FitRow]:
    """``measure_fold`` of each (model, collection), ``jobs`` at a time on ``threads_per_job`` threads each;
    rows in the order of ``tasks``. ``root``: one data root, or one per collection (``make bench`` keeps
    tile and layout samples apart). ``on_row`` sees each row as it is measured, on the calling thread."""
    def one(task: tuple[str, str]) -> FitRow:
        model, collection = task
        data = root[collection] if isinstance(root, Mapping) else root
        return measure_fold(root=data, collection=collection, model=model, threads=threads_per_job(jobs), **options)

    with ThreadPoolExecutor(max(1, jobs)) as pool:  # each measurement is its own process
        futures = [pool.submit(one, task) for task in tasks]
        for future in as_completed(futures):
            if on_row is not None:
                on_row(future.result())
        return [future.result() for future in futures]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--collections", default=",".join(REAL_FILES))
    parser.add_argument("--models", default="gbdt,gnn")
    parser.add_argument("--work", type=Path, default=Path("/tmp/bench-work"))
    parser.add_argument("--gnn-epochs", type=int, default=None,
                        help="train the GNN this many epochs without early stopping, then scale (0/unset: base config)")
    parser.add_argument("--gnn-expected-epochs", type=float, default=None,
                        help="epochs --gnn-epochs is scaled to (default: the config's epochs, an upper bound)")
    parser.add_argument("--device", default="cpu", help="gnn.device: cpu, cuda or auto")
    parser.add_argument("--nice", type=int, default=0)
    parser.add_argument("--config", default=None, help="run config measured (default: base), e.g. cpu")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="K=V",
                        help="config override, e.g. gnn.passes_per_epoch=1 (repeatable)")
    parser.add_argument("--jobs", type=int, choices=(1, 2), default=1,
                        help="fits measured at once (2: one thread each, as a run's fold jobs share 2 cores; the "
                             "totals are the sums / 2)")
    args = parser.parse_args(argv)
    tasks = [(m, c) for m in args.models.split(",") for c in args.collections.split(",")]
    before, clock = machine_reference(), cpu_clock()
    rows = measure_folds(tasks, args.jobs, root=args.root, work=args.work, config=args.config,
                         overrides=args.overrides, gnn_epochs=args.gnn_epochs,
                         gnn_expected_epochs=args.gnn_expected_epochs, device=args.device, nice=args.nice)
    steal = steal_lines(clock, cpu_clock())
    lines = table(rows) + [""] + targets(rows, args.jobs) + reference_lines(before, machine_reference()) + steal
    print("\n".join(lines))


if __name__ == "__main__":
    main()
