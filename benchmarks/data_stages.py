"""Prune, features and node arrays against the I/O floor (``np.load`` of every array of every file).

Usage: python -m benchmarks.data_stages --root DATA_ROOT [--collections ...] [--work DIR] [--jobs 1,2]
                                         [--tile-root TILE_ROOT]

Per collection, stage and worker count (``run.n_jobs``): wall time, peak RSS of a fresh process
doing only that stage (and of its largest worker process), files/s and configs/s, and the wall time
extrapolated to the real number of files (linearly in the file count, from the sample's mean time
per file). The floor reads the same files in one process of the same kind; CPU time counts the
workers too. With several workers a stage is timed on a started pool (a run starts it once): the
verdicts add the pool's measured start once per stage and collection.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from benchmarks.common import REAL_FILES, markdown_table, measure, real_total, verdict

STAGES = ("floor", "prune", "features", "node_arrays")
TARGET_RATIO = 1.5  # prune + features within 1.5x bare decompression
TARGET_PEAK_MB = 4096

_FLOOR = """
import numpy as np
from pipelines.core.collection import parse_collection
from pipelines.flows.prepare import collection_refs
refs = collection_refs({root!r}, parse_collection({collection!r}))
paths = [r.path for items in refs.values() for r in items]
decompressed = 0
t0, c0 = time.perf_counter(), time.process_time()
for path in paths:
    with np.load(path) as archive:
        for key in archive.files:
            decompressed += archive[key].nbytes
result = {{"wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0, "files": len(paths),
          "decompressed_mb": decompressed / 2**20}}
"""

_STAGE = """
from pipelines.flows import prepare as p
from pipelines.core.stages import RawFiles
from pipelines.data.features import FEATURES, seeded_rng
from pipelines.core.parallel import map_in_order
from pipelines.data.node_arrays import NODE_ARRAYS
from pipelines.data.prune import PRUNE
from pipelines.flows.dag import data_stage_call
from pipelines.core.collection import parse_collection
from pipelines.config.settings import load_config
config = load_config(None, {overrides!r} + ["run.n_jobs={jobs}"])
collection = parse_collection({collection!r})
refs = p.collection_refs({root!r}, collection)
key = p.raw_data_key({root!r}, refs)
work, stage = __import__("pathlib").Path({work!r}), {stage!r}
{start_pool}
t0, c0 = time.perf_counter(), time.process_time()
raw = RawFiles(refs, key)
prune = PRUNE.run(data_stage_call(PRUNE, config, collection, work, raw, {{}}, stage == "prune"))
if stage != "prune":
    t0, c0 = time.perf_counter(), time.process_time()  # prune is cached: only this stage is timed
if stage in ("features", "node_arrays"):
    timed = FEATURES if stage == "features" else NODE_ARRAYS
    timed.run(data_stage_call(timed, config, collection, work, raw, {{"prune": prune}}, True))
wall, cpu = time.perf_counter() - t0, time.process_time() - c0
# stop the worker processes, so their CPU time and peak RSS show in RUSAGE_CHILDREN
if config.run.n_jobs > 1:
    from joblib.externals.loky import get_reusable_executor
    get_reusable_executor().shutdown(wait=True)
children = resource.getrusage(resource.RUSAGE_CHILDREN)
graphs = read_graph_table(prune)
result = {{"wall_s": wall, "cpu_s": cpu + children.ru_utime + children.ru_stime, "files": graphs.height,
           "configs": int(graphs["configs_before"].sum()), "worker_peak_rss_mb": children.ru_maxrss / 1024}}
"""

# What a stage with N worker processes spends before its first job: loky starts the workers and
# each imports numpy, polars and the stage's modules (unpickling the job's function). The pool
# outlives the stage (joblib's reusable executor), so a run pays this once, not per stage or file:
# the stage measurements start a warm pool, and the extrapolation adds this once per stage and
# collection (more than a run pays).
_START_POOL = "list(map_in_order(seeded_rng, [(0, str(i)) for i in range(2 * {jobs})], {jobs}))"
_POOL_STARTUP = """
from pipelines.data.features import seeded_rng
from pipelines.core.parallel import map_in_order
t0, c0 = time.perf_counter(), time.process_time()
{start_pool}
wall = time.perf_counter() - t0
from joblib.externals.loky import get_reusable_executor
get_reusable_executor().shutdown(wait=True)
children = resource.getrusage(resource.RUSAGE_CHILDREN)
result = {{"wall_s": wall, "cpu_s": time.process_time() - c0 + children.ru_utime + children.ru_stime}}
"""


def start_pool(jobs: int) -> str:
    """Code that starts ``jobs`` worker processes (two trivial jobs each); none for one job. Stage
    measurements run it before their clock starts, :func:`pool_startup` times it."""
    return _START_POOL.format(jobs=jobs) if jobs > 1 else ""


@dataclass(frozen=True)
class PoolStartup:
    wall_s: float
    cpu_s: float  # this process and its workers


def pool_startup(jobs: int, nice: int = 0) -> PoolStartup:
    """Wall and CPU seconds to start ``jobs`` worker processes and run two trivial jobs on each
    (zero for one job: no pool)."""
    if jobs <= 1:
        return PoolStartup(0.0, 0.0)
    result = measure(_POOL_STARTUP.format(start_pool=start_pool(jobs)), nice=nice)
    return PoolStartup(float(result["wall_s"]), float(result["cpu_s"]))


@dataclass(frozen=True)
class StageRow:
    collection: str
    stage: str
    files: int
    configs: int
    wall_s: float
    cpu_s: float  # CPU time of the process and its workers: less inflated than wall by a shared machine
    peak_rss_mb: float
    jobs: int = 1  # run.n_jobs (worker processes; 1 = in the measured process)
    worker_peak_rss_mb: float = 0.0  # largest worker process (0 with one job)

    @property
    def files_per_s(self) -> float:
        return self.files / self.wall_s if self.wall_s > 0 else float("inf")

    @property
    def configs_per_s(self) -> float:
        return self.configs / self.wall_s if self.wall_s > 0 else float("inf")

    def extrapolated_s(self) -> float | None:
        """Wall time for the real file count of the collection (None for the one-file stress root)."""
        if self.collection not in REAL_FILES:
            return None
        return self.wall_s / max(self.files, 1) * real_total(self.collection)


def measure_collection(root: Path, collection: str, work: Path, *, overrides: Sequence[str] = (),
                       label: str | None = None, nice: int = 0, jobs: Sequence[int] = (1,),
                       log=print) -> list[StageRow]:
    """The floor and each data stage of one collection of ``root`` with each worker count of ``jobs``,
    each in a fresh process."""
    rows: list[StageRow] = []
    configs = 0
    runs = [("floor", 1)] + [(stage, n) for n in jobs for stage in STAGES[1:]]
    for stage, n in runs:
        if stage == "floor":
            body = _FLOOR.format(root=str(root), collection=collection)
        else:
            body = _STAGE.format(root=str(root), collection=collection, work=str(work), stage=stage,
                                 overrides=list(overrides), jobs=n, start_pool=start_pool(n))
        result = measure(body, nice=nice)
        configs = result.get("configs", configs)
        rows.append(StageRow(label or collection, stage, int(result["files"]), configs, float(result["wall_s"]),
                             float(result["cpu_s"]), float(result["peak_rss_mb"]), n,
                             float(result.get("worker_peak_rss_mb", 0.0))))
        log(f"  {label or collection:<22} {stage:<12} x{n} {result['wall_s']:8.2f}s  peak {result['peak_rss_mb']:7.0f} MB"
            f" (workers {result.get('worker_peak_rss_mb', 0.0):.0f} MB)")
    floor = rows[0]
    rows[0] = StageRow(floor.collection, floor.stage, floor.files, configs, floor.wall_s, floor.cpu_s,
                       floor.peak_rss_mb)
    return rows


def table(rows: list[StageRow]) -> list[str]:
    header = ["collection", "stage", "jobs", "files", "configs", "wall s", "cpu s", "peak RSS MB", "worker peak MB",
              "files/s", "configs/s", "x floor (wall)", "x floor (cpu)", "real files", "extrapolated s"]
    floors = {r.collection: r for r in rows if r.stage == "floor"}
    out = []
    for r in rows:
        extra, floor = r.extrapolated_s(), floors.get(r.collection)
        out.append([r.collection, r.stage, r.jobs, r.files, r.configs, r.wall_s, r.cpu_s, r.peak_rss_mb,
                    r.worker_peak_rss_mb or "-", r.files_per_s,
                    r.configs_per_s, r.wall_s / floor.wall_s if floor and floor.wall_s else "-",
                    r.cpu_s / floor.cpu_s if floor and floor.cpu_s else "-",
                    real_total(r.collection) if r.collection in REAL_FILES else "-",
                    "-" if extra is None else extra])
    return markdown_table(header, out)


def targets(rows: list[StageRow], startup: dict[int, PoolStartup] | None = None) -> list[str]:
    """Verdicts per worker count: prune+features of the whole (extrapolated) data vs the floor (one
    process decompressing every file), and peak memory (the largest process, driver or worker).
    ``startup`` (per worker count, :func:`pool_startup`) is the pool's start, counted once per stage
    and collection: the stage rows were timed on a warm pool (wall), but their workers' CPU includes
    their start."""
    startup = startup or {}

    def total(stages: tuple[str, ...], jobs: int, cpu: bool = False) -> float:
        pool = startup.get(jobs, PoolStartup(0.0, 0.0))
        sum_s = 0.0
        for r in rows:
            if r.stage not in stages or r.collection not in REAL_FILES or (r.jobs != jobs and r.stage != "floor"):
                continue
            fixed = 0.0 if r.stage == "floor" else (pool.cpu_s if cpu else pool.wall_s)
            measured = max(r.cpu_s - fixed, 0.0) if cpu else r.wall_s
            sum_s += measured / max(r.files, 1) * real_total(r.collection) + fixed
        return sum_s

    lines = []
    for jobs in sorted({r.jobs for r in rows if r.stage != "floor"}):
        floor = total(("floor",), jobs)
        if floor > 0:
            work = total(("prune", "features"), jobs)
            pool = startup.get(jobs)
            counted = f", the pool's start ({pool.wall_s:.2f} s) once per stage and collection" if pool else ""
            lines.append(verdict(f"prune+features with {jobs} worker(s) / bare decompression in one process, whole "
                                 f"real-scale data (extrapolated: {work / 60:.1f} min vs {floor / 60:.1f} min wall"
                                 f"{counted})", work / floor, TARGET_RATIO, "x"))
            cpu_ratio = total(("prune", "features"), jobs, cpu=True) / max(total(("floor",), jobs, cpu=True), 1e-9)
            lines.append(f"- (CPU time of all processes, {jobs} worker(s), over the floor's: {cpu_ratio:.2f}x; "
                         "parallelism cannot lower it)")
        big = {r.stage: r for r in rows if r.collection not in REAL_FILES and (r.jobs == jobs or r.stage == "floor")}
        if {"floor", "prune", "features"} <= set(big):
            lines.append(f"- largest real-size file alone ({jobs} worker(s)): prune+features = "
                         f"{(big['prune'].wall_s + big['features'].wall_s) / big['floor'].wall_s:.2f}x the floor (wall), "
                         f"{(big['prune'].cpu_s + big['features'].cpu_s) / max(big['floor'].cpu_s, 1e-9):.2f}x (cpu)")
    measured = [r for r in rows if r.stage != "floor"]
    if measured:
        where = max(measured, key=lambda r: max(r.peak_rss_mb, r.worker_peak_rss_mb))
        lines.append(verdict(f"peak resident memory of one data-stage process ({where.collection} {where.stage}, "
                             f"{where.jobs} worker(s))", max(where.peak_rss_mb, where.worker_peak_rss_mb),
                             TARGET_PEAK_MB, "MB"))
    return lines


def startup_lines(startup: dict[int, PoolStartup]) -> list[str]:
    return [f"pool start-up with {j} workers: {pool.wall_s:.2f} s wall, {pool.cpu_s:.2f} s CPU"
            for j, pool in startup.items()]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--collections", default=",".join(REAL_FILES))
    parser.add_argument("--work", type=Path, default=Path("/tmp/bench-work"))
    parser.add_argument("--jobs", default="1,2", help="comma-separated worker counts (run.n_jobs) to measure")
    parser.add_argument("--nice", type=int, default=0)
    parser.add_argument("--tile-root", type=Path, help="measure tile:xla on this root instead (a world with many "
                        "tile files: a few files' figures are mostly process and pool start-up, which the "
                        "extrapolation to 7,229 files would multiply)")
    args = parser.parse_args(argv)
    jobs = [int(j) for j in args.jobs.split(",")]
    rows = [row for c in args.collections.split(",")
            for row in measure_collection(args.tile_root if c == "tile:xla" and args.tile_root else args.root, c,
                                          args.work, jobs=jobs, nice=args.nice)]
    startup = {j: pool_startup(j, args.nice) for j in jobs if j > 1}
    print("\n".join(table(rows) + [""] + startup_lines(startup) + targets(rows, startup)))


if __name__ == "__main__":
    main()
