"""``make bench``: data stages vs the I/O floor, training and prediction, on full-scale synthetic data.

Usage: python -m benchmarks.run [--limit N] [--tile-limit N] [--models gbdt,gnn] [--no-largest] [--nice N]
                                [--fit-jobs 2]

Worlds (built once under benchmarks/worlds/, gitignored; a complete one is reused):
* ``full-limit<N>``: the ``full`` scale with the first N files per collection and split (layout
  graphs of the real sizes: up to ~44k nodes and 100k configs);
* ``full-tile-limit<N>``: the first N tile files per split (tile files are small, so more of them);
* ``full-largest-graph``: one layout graph of the largest real size (100,040 x 121 x 18 configs),
  for the peak memory of the data stages on the worst file.

Defaults come from the environment where set: BENCH_LIMIT (layout, default 2), BENCH_TILE_LIMIT
(default 500), BENCH_MODELS (default gbdt,gnn), BENCH_GNN_EPOCHS (default 0: the base config as is, early
stopping included; N: N epochs without it, scaled to BENCH_GNN_EXPECTED_EPOCHS, default the base config's 20), BENCH_LARGEST (1/0,
default 1), BENCH_NICE (default 10), BENCH_JOBS (worker counts of the data stages, default 1,2),
BENCH_FIT_JOBS (fits measured at once, default 1; 2: two on one thread each, the way a run's fold jobs
share 2 cores, the targets checked on the sums / 2, see ``benchmarks/training.py``),
BENCH_DEVICE (devices of the GNN fit and throughput rows, default cpu; ``cpu,cuda`` compares them),
BENCH_PRECISION (gnn.precision of the throughput rows, default fp32; ``fp32,bf16`` compares them).
Every figure is extrapolated to the real file counts (tile 5709/676/844; layout xla:default 61/7/8,
xla:random 69/7/8, nlp:default 198/20/17, nlp:random 207/20/17) linearly in the number of files.

With the GNN among the models, its training throughput and peak memory on the largest pruned layout
graph are measured too (``benchmarks/gnn_throughput.py``).

Expected duration on 2 idle cores with the defaults: ~8 min to build the worlds the first time,
then ~10 min of data stages and ~25-40 min of training (the GNN at the base config dominates).
The table goes to benchmarks/results/<UTC date>-<host>.md (``-2``, ``-3``... where that file exists), with
the machine description, and is printed; the file is rewritten after each measurement, marked partial
until the end, so a run stopped by a time limit keeps what it measured.
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Sequence

from benchmarks import data_stages, gnn_throughput, training
from benchmarks.common import RESULTS, WORLDS, build_big_world, build_world, machine
from pipelines.core.atomic import write_text_atomic
from pipelines.core.machine import available_cores

LAYOUT = ("layout:xla:default", "layout:xla:random", "layout:nlp:default", "layout:nlp:random")
TILE = "tile:xla"
LARGEST_LABEL = "largest real-size layout file"


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return default if value in (None, "") else int(value)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=_env_int("BENCH_LIMIT", 2),
                        help="layout files per collection and split (env BENCH_LIMIT)")
    parser.add_argument("--tile-limit", type=int, default=_env_int("BENCH_TILE_LIMIT", 500),
                        help="tile files per split (env BENCH_TILE_LIMIT)")
    parser.add_argument("--models", default=os.environ.get("BENCH_MODELS", "gbdt,gnn"),
                        help="models to train, comma-separated (env BENCH_MODELS); empty: none")
    parser.add_argument("--gnn-epochs", type=int, default=_env_int("BENCH_GNN_EPOCHS", 0),
                        help="GNN epochs actually run without early stopping, fit time scaled to "
                             "--gnn-expected-epochs (env BENCH_GNN_EPOCHS; 0: run the base config as is, "
                             "early stopping included)")
    parser.add_argument("--gnn-expected-epochs", type=float,
                        default=float(os.environ.get("BENCH_GNN_EXPECTED_EPOCHS") or 0) or None,
                        help="epochs a --gnn-epochs run is scaled to (env BENCH_GNN_EXPECTED_EPOCHS; default: the "
                             "base config's epochs, an upper bound)")
    parser.add_argument("--no-largest", dest="largest", action="store_false",
                        default=bool(_env_int("BENCH_LARGEST", 1)),
                        help="skip the largest-file memory check (env BENCH_LARGEST=0)")
    parser.add_argument("--nice", type=int, default=_env_int("BENCH_NICE", 10),
                        help="niceness of the measured processes (the machine may be shared)")
    parser.add_argument("--jobs", default=os.environ.get("BENCH_JOBS", "1,2"),
                        help="worker counts (run.n_jobs) the data stages are measured with (env BENCH_JOBS)")
    parser.add_argument("--fit-jobs", type=int, choices=(1, 2), default=_env_int("BENCH_FIT_JOBS", 1),
                        help="fits measured at once (env BENCH_FIT_JOBS; 2: one thread each, as a run's fold jobs "
                             "share 2 cores; the targets are then checked on the sums / 2)")
    parser.add_argument("--device", default=os.environ.get("BENCH_DEVICE", "cpu"),
                        help="gnn.device of the GNN throughput rows: cpu, cuda or auto (env BENCH_DEVICE)")
    parser.add_argument("--precision", default=os.environ.get("BENCH_PRECISION", "fp32"),
                        help="gnn.precision values of the GNN throughput rows (env BENCH_PRECISION)")
    parser.add_argument("--collections", default=",".join((TILE, *LAYOUT)))
    parser.add_argument("--out", type=Path, default=RESULTS)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> Path:
    args = parse_args(argv)
    started = time.perf_counter()
    host = machine()
    collections = [c for c in args.collections.split(",") if c]
    models = [m for m in args.models.split(",") if m]
    print(f"benchmark worlds under {WORLDS} (layout limit {args.limit}, tile limit {args.tile_limit})")
    roots = {}
    if TILE in collections:
        roots[TILE] = build_world(TILE, args.tile_limit, jobs=available_cores())
    if any(c in LAYOUT for c in collections):
        layout_root = build_world("all", args.limit, jobs=available_cores())
        roots.update({c: layout_root for c in collections if c in LAYOUT})
    work = WORLDS / "work"
    path = unused_path(args.out, f"{datetime.now(timezone.utc):%Y-%m-%d}-{host.host}")
    stage_rows, fit_rows, throughput_rows, startup = [], [], [], {}

    def write(done: str | None) -> None:
        """The table so far, rewritten after each measurement: a benchmark stopped by a time limit (a
        lent GPU, a batch queue) keeps what it measured. ``done``: the last part measured, while partial."""
        write_text_atomic(path, report(host, args, stage_rows, fit_rows, throughput_rows,
                                       time.perf_counter() - started, startup, partial=done))

    print("data stages (each in a fresh process):")
    for collection in collections:
        stage_rows += data_stages.measure_collection(roots[collection], collection, work, nice=args.nice,
                                                     jobs=[int(j) for j in args.jobs.split(",")])
    # the pool's start-up, so the 2-worker verdict can count it once per stage (see data_stages.targets)
    startup = {j: data_stages.pool_startup(j, args.nice) for j in {int(j) for j in args.jobs.split(",")} if j > 1}
    if args.largest:
        big = build_big_world()
        stage_rows += data_stages.measure_collection(big, "layout:xla:default", work / "largest", nice=args.nice,
                                                     label=LARGEST_LABEL)
    write("the data stages")

    if models:
        print("training, one fold and one seed, then prediction of every test graph:")
        for model in models:
            for device in (args.device.split(",") if model == "gnn" else ["cpu"]):
                def labelled(row: training.FitRow, model=model, device=device) -> training.FitRow:
                    return row if device == "cpu" else replace(row, model=f"{model} ({device})")

                def measured(row: training.FitRow, model=model, device=device) -> None:
                    fit_rows.append(labelled(row))
                    write(f"{model} ({device}) on {row.collection}")

                first = len(fit_rows)
                rows = training.measure_folds([(model, c) for c in collections], args.fit_jobs, root=roots,
                                              work=work, nice=args.nice, gnn_epochs=args.gnn_epochs or None,
                                              device=device, gnn_expected_epochs=args.gnn_expected_epochs,
                                              on_row=measured)
                fit_rows[first:] = [labelled(row) for row in rows]  # the collections' order, not the finishing one

    if "gnn" in models and any(c in LAYOUT for c in collections):
        def measured(rows: list[list]) -> None:
            throughput_rows[:] = rows
            write(f"GNN throughput row {len(rows)}")

        gnn_throughput.measure_throughput(work, nice=args.nice, devices=args.device.split(","),
                                          precisions=args.precision.split(","), on_row=measured)
    write(None)
    print()
    print(path.read_text(encoding="utf-8"))
    print(f"written to {path}")
    return path


def unused_path(folder: Path, stem: str) -> Path:
    """``folder/stem.md``, or ``stem-2.md``, ``stem-3.md``... if taken: a second run on the same day and
    host must not replace a results file that may be committed."""
    folder.mkdir(parents=True, exist_ok=True)
    path, n = folder / f"{stem}.md", 1
    while path.exists():
        n += 1
        path = folder / f"{stem}-{n}.md"
    return path


def report(host, args: argparse.Namespace, stage_rows: list, fit_rows: list, throughput_rows: list,
           wall_s: float, startup: dict | None = None, partial: str | None = None) -> str:
    now = datetime.now(timezone.utc).isoformat(timespec="minutes")
    lines = [f"# Benchmark {now}", "",
             *([f"**Partial: measured up to {partial}; the run has not finished (or was stopped).**", ""]
               if partial else []),
             "## Machine", "", *host.describe(),
             f"- benchmark wall time {wall_s / 60:.1f} min; measured processes ran at nice {args.nice}", "",
             "## Data", "",
             f"Synthetic `full` scale: the first {args.limit} layout files per collection and split "
             f"(`benchmarks/worlds/full-limit{args.limit}`), the first {args.tile_limit} tile files per split "
             f"(`full-tile-limit{args.tile_limit}`)"
             + (", and one layout graph of the largest real size (`full-largest-graph`)" if args.largest else "")
             + ". Extrapolated columns scale the sample's mean time per file linearly to the real file counts; "
               "the first files in stem order are not a random sample of sizes, so treat them as estimates.", "",
             "## Data stages vs bare decompression", "",
             "`floor` = `np.load` of every array of every file (what any reader must pay); `x floor` = stage time "
             "over the floor on the same files. Each row is its own fresh process (peak RSS = ru_maxrss).", "",
             *data_stages.table(stage_rows), "", *data_stages.startup_lines(startup or {}),
             *data_stages.targets(stage_rows, startup), ""]
    if fit_rows:
        threads = f"{training.threads_per_job(args.fit_jobs)} thread(s)" + (
            f" each, {args.fit_jobs} fits at once" if args.fit_jobs > 1 else "")
        lines += [f"## Training (one fold, one seed, {threads}) and prediction of every test graph", "",
                  "Fit = loading the training data + `fit` on the train graphs, early stopping on the valid graphs "
                  "(base config; a plain split: the sample has too few program families for grouped folds), "
                  "extrapolated to the real train graphs (one fold model of the 5-fold CV trains on 4/5 of "
                  "train+valid: about as many). The GNN "
                  + (f"ran {args.gnn_epochs} epoch(s) without early stopping, its time scaled by `epochs scale` to "
                     f"{args.gnn_expected_epochs or 'the base config'}'s epochs"
                     if args.gnn_epochs else "ran the base config as is, early stopping included")
                  + "; its training steps are extrapolated to the train graphs of a real fold model (4/5 of "
                  "train+valid) and its early-stopping validation to the held-out ones (1/5). Predict = every "
                  "test graph of the sample, extrapolated to the real test graphs.", "", *training.table(fit_rows), "",
                  *training.targets(fit_rows, args.fit_jobs), ""]
    if throughput_rows:
        lines += ["## GNN throughput on the largest pruned layout graph (base config, 2 threads)", "",
                  "Train: optimiser steps of K sampled configs; predict: 1000 configs scored in memory-bounded "
                  "chunks. `copies 2` joins two copies of the graph into one (twice the real maximum of "
                  "configurable nodes). Each row is its own fresh process.", "",
                  *gnn_throughput.table(throughput_rows), ""]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
