"""How a multi-threaded process fares when other work holds the cores, under each OpenMP wait policy.

Usage: python -m benchmarks.openmp_wait [--work DIR] [--threads 2] [--load N] [--reps 2] [--out FILE]

torch's CPU kernels and LightGBM run on GNU OpenMP (libgomp), whose waiting threads spin ~300,000
iterations before they sleep. ``import pipelines`` sets ``OMP_WAIT_POLICY=PASSIVE`` unless the user set
a policy (``pipelines/__init__.py``); this measures why, and what it costs:

* workloads: a LightGBM fit (``--rounds`` boosting rounds on 50,000 x 60 synthetic rows), and GNN
  training steps and scoring on the largest layout graph under ``--work`` (``benchmarks.gnn_throughput``'s
  measurement; skipped when there are no node arrays there), each in a fresh process with ``--threads``
  OpenMP threads (and one thread, for reference);
* policies: libgomp's default (``GOMP_SPINCOUNT=300000``, set explicitly so the package keeps it) and
  passive (``OMP_WAIT_POLICY=PASSIVE``, the package's default);
* conditions: idle, and loaded: ``--load`` busy-looping processes (default: one per usable core) stand in
  for the other work of a shared machine (a CI runner, a second job).

Wall seconds are the mean over ``--reps`` runs (their range in brackets). Run it on an otherwise idle
machine: the "idle" rows are only as idle as the machine is.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator, Sequence

from benchmarks.common import WORLDS, machine, markdown_table, measure

LIBGOMP_DEFAULT = "libgomp default (spin 300000)"
POLICIES: dict[str, dict[str, str | None]] = {
    LIBGOMP_DEFAULT: {"OMP_WAIT_POLICY": None, "GOMP_SPINCOUNT": "300000"},
    "passive (the package's default)": {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": None},
}

_GBDT_BODY = """
import time
import numpy as np
import lightgbm as lgb
rng = np.random.default_rng(0)
x = rng.normal(size=(50000, 60))
y = x[:, 0] + 0.5 * x[:, 1] ** 2 + rng.normal(size=50000)
data = lgb.Dataset(x, y, params={{"verbose": -1}}).construct()
started, cpu_started = time.perf_counter(), time.process_time()
lgb.train({{"objective": "regression", "num_threads": {threads}, "verbose": -1}}, data, {rounds})
result = {{"seconds": time.perf_counter() - started, "cpu_seconds": time.process_time() - cpu_started}}
"""


@contextmanager
def busy_cores(count: int) -> Iterator[None]:
    """``count`` processes that spin on a core each until the block ends."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
        for spinner in spinners:
            spinner.wait()


def workloads(work: Path, threads: int, rounds: int, steps: int, eval_configs: int,
              log=print) -> list[tuple[str, int, str]]:
    """(name, threads, measured code) of every workload, at ``threads`` and at one thread."""
    from benchmarks.gnn_throughput import largest_layout_graph, measured_code

    counts = sorted({1, threads})
    found = list(work.glob("node_arrays/*/*/*.npz"))
    items = [(f"LightGBM fit, {rounds} rounds", n, _GBDT_BODY.format(threads=n, rounds=rounds)) for n in counts]
    if not found:
        log(f"no node arrays under {work}/node_arrays: GNN workloads skipped (run `make bench` first)")
        return items
    path, collection = largest_layout_graph(work)
    log(f"GNN workloads on {path} ({collection})")
    for n in counts:
        items.append((f"GNN {steps} training steps", n, measured_code(path, collection, "train", steps=steps,
                                                                      threads=n)))
        items.append((f"GNN scoring {eval_configs} configs", n,
                      measured_code(path, collection, "predict", eval_configs=eval_configs, threads=n)))
    return items


def run(work: Path, *, threads: int, load: int, reps: int, rounds: int, steps: int, eval_configs: int,
        log=print) -> list[list]:
    rows = []
    for name, count, code in workloads(work, threads, rounds, steps, eval_configs, log):
        policies = POLICIES if count > 1 else {LIBGOMP_DEFAULT: POLICIES[LIBGOMP_DEFAULT]}  # one thread never waits
        for policy, env in policies.items():
            seconds = {}
            for condition, spinners in (("idle", 0), ("loaded", load)):
                with busy_cores(spinners):
                    runs = [measure(code, env_changes=env)["seconds"] for _ in range(reps)]
                seconds[condition] = runs
                log(f"  {name}, {count} thread(s), {policy}, {condition}: "
                    + ", ".join(f"{s:.2f}" for s in runs) + " s")
            idle, loaded = statistics.mean(seconds["idle"]), statistics.mean(seconds["loaded"])
            rows.append([name, count, policy if count > 1 else "(one thread: no waiting)",
                         f"{idle:.2f} ({min(seconds['idle']):.2f}-{max(seconds['idle']):.2f})",
                         f"{loaded:.2f} ({min(seconds['loaded']):.2f}-{max(seconds['loaded']):.2f})",
                         f"{loaded / idle:.1f}x"])
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    from pipelines.core.machine import available_cores

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=WORLDS / "work", help="a work dir with layout node arrays")
    parser.add_argument("--threads", type=int, default=2, help="OpenMP threads of the multi-threaded runs")
    parser.add_argument("--load", type=int, default=None, help="busy processes of the loaded runs (default: cores)")
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=50, help="LightGBM boosting rounds")
    parser.add_argument("--steps", type=int, default=3, help="GNN training steps (after one warm-up step)")
    parser.add_argument("--eval-configs", type=int, default=50, help="configs the GNN scores")
    parser.add_argument("--out", type=Path, default=None, help="results file (default: print only)")
    args = parser.parse_args(argv)
    load = available_cores() if args.load is None else args.load
    host = machine()
    rows = run(args.work, threads=args.threads, load=load, reps=args.reps, rounds=args.rounds, steps=args.steps,
               eval_configs=args.eval_configs)
    lines = [f"### OpenMP wait policies {datetime.now(timezone.utc):%Y-%m-%dT%H:%M}+00:00", "", *host.describe(), "",
             f"Command: `python -m benchmarks.openmp_wait {' '.join(sys.argv[1:] if argv is None else argv)}`", "",
             f"Wall seconds of the measured span, mean over {args.reps} runs (range); loaded: {load} busy-looping "
             "processes beside it.", "",
             *markdown_table(["workload", "threads", "OpenMP wait policy", "idle s", "loaded s", "loaded / idle"],
                             rows)]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out is not None:
        from pipelines.core.atomic import write_text_atomic

        if args.out.exists():
            raise SystemExit(f"{args.out} exists; pass another --out")
        write_text_atomic(args.out, text)
        print(args.out)


if __name__ == "__main__":
    main()
