"""Shared pieces of the benchmarks: the worlds they run on, fresh-process measurements, the machine.

Every measurement runs in its own Python process, so its peak resident set size (``ru_maxrss``) is
its own and no cache of an earlier measurement is warm in it (the OS page cache is: files are read
once by the world builder, and every compared path reads the same files, so the comparison is fair).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

WORLDS = Path(__file__).resolve().parent / "worlds"
RESULTS = Path(__file__).resolve().parent / "results"

# Files of the real data per collection and split (train, valid, test): what figures extrapolate to.
REAL_FILES: dict[str, tuple[int, int, int]] = {
    "tile:xla": (5709, 676, 844),
    "layout:xla:default": (61, 7, 8),
    "layout:xla:random": (69, 7, 8),
    "layout:nlp:default": (198, 20, 17),
    "layout:nlp:random": (207, 20, 17),
}
# Mean raw nodes of the real layout graphs (../shared/TPUGRAPHS_FORMAT.md: xla:default ~12.9k, nlp ~5.9k; the
# random-search collections hold the same programs as the default ones). A sample's times scale with its
# graphs' sizes: the one-graph sample's xla graphs are twice these, a limit-8 sample's close to them.
REAL_MEAN_NODES: dict[str, float] = {"layout:xla:default": 12_900, "layout:xla:random": 12_900,
                                     "layout:nlp:default": 5_900, "layout:nlp:random": 5_900}
SIZE_TOLERANCE = 1.25  # a sample whose mean is more than this factor off the real mean is flagged
# The largest real layout file: 100,040 configs x 121 configurable nodes x 18 (float32 on disk: 0.87 GB).
BIG_CONFIGS, BIG_CONFIGURABLE, BIG_NODES = 100_040, 121, 44_000
BIG_STEM = "bench_largest_graph"

# The measured process prints one JSON line last; ``body`` sets ``result`` (a dict).
_WRAPPER = """
import json, resource, time
started = time.perf_counter()
{body}
result["wall_s"] = result.get("wall_s", time.perf_counter() - started)
result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print("BENCH-RESULT " + json.dumps(result))
"""


def real_total(collection: str) -> int:
    return sum(REAL_FILES[collection])


def measure(body: str, *, nice: int = 0, timeout_s: float | None = None,
            env_changes: Mapping[str, str | None] | None = None) -> dict[str, Any]:
    """Run ``body`` (Python code that fills a dict ``result``) in a fresh process; returns ``result``
    with ``wall_s`` (unless the body set it) and ``peak_rss_mb`` added. The process gets this one's
    environment with ``env_changes`` applied (a value of None removes the variable)."""
    code = _WRAPPER.format(body=body)
    command = [sys.executable, "-c", code]
    if nice:
        command = ["nice", "-n", str(nice), *command]
    env = dict(os.environ)
    for name, value in (env_changes or {}).items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout_s)
    lines = [line for line in done.stdout.splitlines() if line.startswith("BENCH-RESULT ")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"measurement failed (rc {done.returncode}):\n{done.stderr[-4000:]}")
    return json.loads(lines[-1][len("BENCH-RESULT "):])


# ----------------------------------------------------------------------------- worlds


def world_root(collections: str, limit: int) -> Path:
    """``full-limit<N>`` (every collection) or ``full-<collections>-limit<N>``."""
    if collections == "all":
        return WORLDS / f"full-limit{limit}"
    tag = collections.split(":")[0] if collections == "tile:xla" else collections.replace(":", "-").replace(",", "+")
    return WORLDS / f"full-{tag}-limit{limit}"


def build_world(collections: str, limit: int, *, jobs: int = 1, log=print) -> Path:
    """A ``full``-scale synthetic world of the first ``limit`` files per collection and split
    (generated once; a complete world is reused)."""
    from pipelines.synth import generate_world

    root = world_root(collections, limit)
    started = time.perf_counter()
    summary = generate_world(root, scale="full", seed=0, limit=limit,
                             collections=None if collections == "all" else collections, jobs=jobs)
    log(summary.splitlines()[0] if "nothing written" in summary else
        f"built {root} in {time.perf_counter() - started:.0f}s")
    return root


def build_big_world(*, log=print) -> Path:
    """A layout:xla:default root holding one train graph of the largest real size (44k nodes,
    100,040 configs x 121 configurable nodes; 0.87 GB of float32 configs), for peak memory.

    The synthetic generator's cost model would take long at this size, so the graph is made
    directly: a random tree of ops, and config values drawn with the skew of real ones (mostly -1),
    so that the archive compresses roughly like a real one.
    """
    from pipelines.data.tpugraphs import LayoutGraph, save_graph

    root = WORLDS / "full-largest-graph"
    split_dir = root / "npz_all" / "npz" / "layout" / "xla" / "default"
    target = split_dir / "train" / f"{BIG_STEM}.npz"
    if target.is_file():
        return root
    for split in ("train", "valid", "test"):
        (split_dir / split).mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    started = time.perf_counter()
    n, nc, c = BIG_NODES, BIG_CONFIGURABLE, BIG_CONFIGS
    node_feat = rng.random((n, 140), dtype=np.float32)
    parents = (np.arange(1, n) * rng.random(n - 1)).astype(np.int64)  # a random tree: every node reachable
    edge_index = np.column_stack([parents, np.arange(1, n)]).astype(np.int64)
    config_ids = np.sort(rng.choice(n, size=nc, replace=False)).astype(np.int64)
    values = np.arange(-1, 6, dtype=np.int8)
    skew = np.array([0.5, 0.15, 0.12, 0.1, 0.07, 0.04, 0.02])
    configs = np.empty((c, nc, 18), dtype=np.int8)
    for start in range(0, c, 10_000):
        rows = min(10_000, c - start)
        configs[start:start + rows] = rng.choice(values, size=(rows, nc, 18), p=skew)
    graph = LayoutGraph(stem=BIG_STEM, node_feat=node_feat,
                        node_opcode=rng.integers(0, 120, n, dtype=np.int64).astype(np.uint8),
                        edge_index=edge_index, node_config_ids=config_ids, node_config_feat=configs,
                        config_runtime=rng.integers(10**6, 10**9, c, dtype=np.int64),
                        node_splits=np.array([[n // 3, 2 * n // 3]], dtype=np.int64))
    save_graph(target, graph)
    log(f"built {target} ({target.stat().st_size / 2**20:.0f} MiB) in {time.perf_counter() - started:.0f}s")
    return root


# ----------------------------------------------------------------------------- the machine


@dataclass(frozen=True)
class Machine:
    host: str
    cpu: str
    cores: int
    memory_gib: float
    load_before: tuple[float, float, float]
    versions: dict[str, str | None]

    def describe(self) -> list[str]:
        libs = ", ".join(f"{k} {v}" for k, v in self.versions.items() if v)
        return [f"- host: {self.host}; CPU: {self.cpu}; {self.cores} cores usable; {self.memory_gib:.1f} GiB RAM",
                f"- load average when the benchmark started: {' / '.join(f'{x:.2f}' for x in self.load_before)} "
                "(1/5/15 min; above 0 means other work shared the cores and inflates the times)",
                f"- {platform.platform()}; {libs}"]


def machine() -> Machine:
    from pipelines.core.engine import library_versions
    from pipelines.core.machine import available_cores, meminfo_bytes

    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory = (meminfo_bytes("MemTotal") or 0) / 2**30
    return Machine(socket.gethostname(), cpu, available_cores(), memory, os.getloadavg(), library_versions())


# Two kernels that bound a GNN training step on a CPU, on the largest real-size xla graph's shapes (K = 32,
# H = 64): a pass over the per-config states (memory-bound) and the config deltas' matrix product.
_REFERENCE = """
import torch
torch.set_num_threads(1)
generator = torch.Generator().manual_seed(0)
states = torch.rand(11_332, 2048, generator=generator)  # 93 MB
deltas, weight = torch.rand(106_912, 64, generator=generator), torch.rand(64, 64, generator=generator)
def median_ms(kernel, repeats=25):
    kernel()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        kernel()
        times.append(time.perf_counter() - start)
    return sorted(times)[repeats // 2] * 1000
result = {"pass_ms": median_ms(lambda: states.amax(0)), "matmul_ms": median_ms(lambda: deltas @ weight)}
"""
# a reference kernel this much slower or faster after the measurements than before flags the run (an idle
# 2-core VM read its product 11.2-13.0 ms and its pass 22.1-23.2 in five fresh processes in a row)
REFERENCE_TOLERANCE = 1.2


@dataclass(frozen=True)
class Reference:
    """One thread's time (ms, median of 25, fresh process) of the two kernels of ``_REFERENCE``."""

    pass_ms: float
    matmul_ms: float


def machine_reference() -> Reference:
    """The reference kernels timed now: they place a reading's machine state beside other readings'.
    ``amax`` over those states took 7 ms on one boot of a 2-core VM and 17-23 on a later one, every GNN fit
    30-50% slower with it; within that later boot the fits slowed by a further 23% over 80 minutes while
    the kernels stayed within 12% (benchmarks/results/2026-11-29-vm-gnn-max-one-pass.md): a steady reference
    does not prove a steady machine."""
    result = measure(_REFERENCE)
    return Reference(result["pass_ms"], result["matmul_ms"])


def reference_lines(before: Reference, after: Reference) -> list[str]:
    """The reference kernels before -> after the measurements, and a NOTE when the machine's speed moved."""
    lines = [f"- machine reference (1 thread; before -> after the measurements): a pass over 93 MB (amax) "
             f"{before.pass_ms:.1f} -> {after.pass_ms:.1f} ms, a 106,912 x 64 by 64 x 64 product "
             f"{before.matmul_ms:.1f} -> {after.matmul_ms:.1f} ms"]
    ratios = [after.pass_ms / before.pass_ms, after.matmul_ms / before.matmul_ms]
    drift = max(max(ratios), 1 / min(ratios))
    if drift > REFERENCE_TOLERANCE:
        lines.append(f"- NOTE the machine's speed moved during the measurements (a reference kernel {drift:.2f}x "
                     "slower or faster at the end): a difference from another run of that size may be the machine's")
    return lines


@dataclass(frozen=True)
class CpuClock:
    """The machine's CPU time counters (seconds summed over its cores, ``/proc/stat``): all of it, and the
    ``steal``, time a virtual machine's cores were ready to run while its host ran something else."""

    total_s: float
    steal_s: float


def cpu_clock() -> CpuClock | None:
    """The counters now, or None where ``/proc/stat`` does not give them (not Linux)."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    if len(fields) < 9 or fields[0] != "cpu":
        return None
    # user nice system idle iowait irq softirq steal (guest time is counted within user)
    ticks = [int(value) for value in fields[1:9]]
    hertz = os.sysconf("SC_CLK_TCK")
    return CpuClock(sum(ticks) / hertz, ticks[7] / hertz)


# steal above this share of the machine's core time during the measurements flags the run (a 2-core VM, idle:
# 0.7% over 30 s; busy with two 1-thread processes: 10% over 30 s, 15-49% in vmstat's 2-s samples)
STEAL_TOLERANCE = 0.05


def steal_lines(before: CpuClock | None, after: CpuClock | None) -> list[str]:
    """The host's steal during the measurements, and a NOTE when the cores were taken for more than
    ``STEAL_TOLERANCE`` of the time: the figures are then those of fewer cores than counted (each fit's
    own CPU time, in the table, leaves steal out; its wall time does not)."""
    if before is None or after is None or after.total_s <= before.total_s:
        return []
    share = (after.steal_s - before.steal_s) / (after.total_s - before.total_s)
    lines = [f"- hypervisor steal during the measurements: {share:.1%} of the machine's core time"]
    if share > STEAL_TOLERANCE:
        lines.append(f"- NOTE the host took the virtual machine's cores {share:.0%} of the time: the wall times "
                     "are those of a machine with fewer cores than counted")
    return lines


# ----------------------------------------------------------------------------- tables


def markdown_table(header: list[str], rows: list[list[Any]]) -> list[str]:
    def cell(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"
        return str(value)

    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return lines


def verdict(name: str, measured: float, target: float, unit: str) -> str:
    """One line: met, or missed and by how much (measured / target)."""
    if measured <= target:
        return f"- MET {name}: {measured:.3g} {unit} (target <= {target:g} {unit})"
    return (f"- MISSED {name}: {measured:.3g} {unit} vs target {target:g} {unit}: "
            f"{measured / target:.2f}x the target ({measured - target:.3g} {unit} over)")


def parse_roots(doc: str, argv: Sequence[str] | None,
                more: Callable[[argparse.ArgumentParser], None] | None = None) -> argparse.Namespace:
    """The arguments of a benchmark over finished runs: ``ROOT [ROOT ...] [--out FILE]``, and whatever
    ``more`` adds to the parser."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("roots", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, default=None, help="also write the table to this file")
    if more is not None:
        more(parser)
    return parser.parse_args(argv)


def emit(lines: Sequence[str], out: Path | None) -> None:
    """Print a report and, with ``out``, write it there too (atomically)."""
    from pipelines.core.atomic import write_text_atomic

    text = "\n".join(lines) + "\n"
    print(text, end="")
    if out:
        write_text_atomic(out, text)
