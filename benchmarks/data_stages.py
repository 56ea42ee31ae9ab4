"""Prune, features and node arrays against the I/O floor (``np.load`` of every array of every file).

Usage: python -m benchmarks.data_stages --root DATA_ROOT [--collections ...] [--work DIR]

Per collection and stage: wall time, peak RSS of a fresh process doing only that stage, files/s and
configs/s, and the wall time extrapolated to the real number of files (linearly in the file count,
from the sample's mean time per file). The floor reads the same files in the same kind of process.
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
from pipelines.collections import parse_collection
from pipelines.prepare import collection_refs
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
import polars as pl
from pipelines import prepare as p
from pipelines.collections import parse_collection
from pipelines.config import load_config
config = load_config(None, {overrides!r})
collection = parse_collection({collection!r})
refs = p.collection_refs({root!r}, collection)
key = p.raw_data_key({root!r}, refs)
work, stage = __import__("pathlib").Path({work!r}), {stage!r}
quiet = lambda message: None
t0, c0 = time.perf_counter(), time.process_time()
prune, _ = p.run_prune(config, collection, work, refs, key, stage == "prune", quiet)
if stage != "prune":
    t0, c0 = time.perf_counter(), time.process_time()  # prune is cached: only this stage is timed
if stage == "features":
    p.run_features(config, collection, work, refs, key, prune, True, quiet)
elif stage == "node_arrays":
    p.run_node_arrays(collection, work, pl.read_parquet(prune.file(p.GRAPHS_TABLE)), prune, True, quiet)
wall, cpu = time.perf_counter() - t0, time.process_time() - c0
graphs = pl.read_parquet(prune.file(p.GRAPHS_TABLE))
result = {{"wall_s": wall, "cpu_s": cpu, "files": graphs.height, "configs": int(graphs["configs_before"].sum())}}
"""


@dataclass(frozen=True)
class StageRow:
    collection: str
    stage: str
    files: int
    configs: int
    wall_s: float
    cpu_s: float  # CPU time of the process over the same span: less inflated than wall by a shared machine
    peak_rss_mb: float

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
                       label: str | None = None, nice: int = 0, log=print) -> list[StageRow]:
    """The floor and each data stage of one collection of ``root``, each in a fresh process."""
    rows: list[StageRow] = []
    configs = 0
    for stage in STAGES:
        if stage == "floor":
            body = _FLOOR.format(root=str(root), collection=collection)
        else:
            body = _STAGE.format(root=str(root), collection=collection, work=str(work), stage=stage,
                                 overrides=list(overrides))
        result = measure(body, nice=nice)
        configs = result.get("configs", configs)
        rows.append(StageRow(label or collection, stage, int(result["files"]), configs, float(result["wall_s"]),
                             float(result["cpu_s"]), float(result["peak_rss_mb"])))
        log(f"  {label or collection:<22} {stage:<12} {result['wall_s']:8.2f}s  peak {result['peak_rss_mb']:7.0f} MB")
    floor = rows[0]
    rows[0] = StageRow(floor.collection, floor.stage, floor.files, configs, floor.wall_s, floor.cpu_s,
                       floor.peak_rss_mb)
    return rows


def table(rows: list[StageRow]) -> list[str]:
    header = ["collection", "stage", "files", "configs", "wall s", "cpu s", "peak RSS MB", "files/s", "configs/s",
              "x floor (wall)", "x floor (cpu)", "real files", "extrapolated s"]
    floors = {r.collection: r for r in rows if r.stage == "floor"}
    out = []
    for r in rows:
        extra, floor = r.extrapolated_s(), floors.get(r.collection)
        out.append([r.collection, r.stage, r.files, r.configs, r.wall_s, r.cpu_s, r.peak_rss_mb, r.files_per_s,
                    r.configs_per_s, r.wall_s / floor.wall_s if floor and floor.wall_s else "-",
                    r.cpu_s / floor.cpu_s if floor and floor.cpu_s else "-",
                    real_total(r.collection) if r.collection in REAL_FILES else "-",
                    "-" if extra is None else extra])
    return markdown_table(header, out)


def targets(rows: list[StageRow]) -> list[str]:
    """Verdicts: prune+features of the whole (extrapolated) data vs the floor, and peak memory."""
    def total(stages: tuple[str, ...], cpu: bool = False) -> float:
        return sum((r.extrapolated_s() or 0.0) * (r.cpu_s / r.wall_s if cpu and r.wall_s else 1.0)
                   for r in rows if r.stage in stages)

    lines = []
    floor = total(("floor",))
    if floor > 0:
        ratio = total(("prune", "features")) / floor
        lines.append(verdict("prune+features / bare decompression, whole real-scale data (extrapolated: "
                             f"{total(('prune', 'features')) / 60:.1f} min vs {floor / 60:.1f} min wall)",
                             ratio, TARGET_RATIO, "x"))
        cpu_ratio = total(("prune", "features"), cpu=True) / max(total(("floor",), cpu=True), 1e-9)
        lines.append(f"- (the same ratio in CPU time, less sensitive to other load on the machine: {cpu_ratio:.2f}x)")
    big = [r for r in rows if r.collection not in REAL_FILES and r.stage in ("floor", "prune", "features")]
    if len(big) == 3:
        lines.append(f"- largest real-size file alone: prune+features = {(big[1].wall_s + big[2].wall_s) / big[0].wall_s:.2f}x"
                     f" the floor (wall), {(big[1].cpu_s + big[2].cpu_s) / max(big[0].cpu_s, 1e-9):.2f}x (cpu)")
    peak = max(r.peak_rss_mb for r in rows if r.stage != "floor")
    where = max((r for r in rows if r.stage != "floor"), key=lambda r: r.peak_rss_mb)
    lines.append(verdict(f"peak resident memory of a data stage ({where.collection} {where.stage})",
                         peak, TARGET_PEAK_MB, "MB"))
    return lines


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--collections", default=",".join(REAL_FILES))
    parser.add_argument("--work", type=Path, default=Path("/tmp/bench-work"))
    args = parser.parse_args(argv)
    rows = [row for c in args.collections.split(",") for row in measure_collection(args.root, c, args.work)]
    print("\n".join(table(rows) + [""] + targets(rows)))


if __name__ == "__main__":
    main()
