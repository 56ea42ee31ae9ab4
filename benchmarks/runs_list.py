"""Wall time of ``runs list`` over many runs (target: under 1 s for 100 runs).

Usage: python -m benchmarks.runs_list RUN_DIR [--runs 100] [--repeats 5]

Copies the manifest of one real run folder (``submissions/<run-id>``) into ``--runs`` new run folders
of a temporary submissions folder (each with its own run-id, date and score), then times the whole
command in a fresh interpreter (``python -m pipelines runs list --sort score``, start-up included)
and the in-process part (read every manifest, sort, format). Prints the median of ``--repeats``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def make_runs(source: Path, target: Path, count: int) -> None:
    manifest = json.loads((source / "manifest.json").read_text(encoding="utf-8"))
    for i in range(count):
        run_id = f"2026{1 + i // 28 % 12:02d}{1 + i % 28:02d}T000000Z-{i:08x}"
        manifest["run_id"] = run_id
        manifest["created"] = f"2026-{1 + i // 28 % 12:02d}-{1 + i % 28:02d}T00:00:00+00:00"
        manifest.setdefault("combined_oof", {}).setdefault("ensemble", {})["value"] = 0.5 + (i * 7919 % 100) / 1000
        manifest.setdefault("submission", {})["sha256"] = f"{i:064x}"  # distinct results (else one row: reruns)
        (target / run_id).mkdir(parents=True)
        (target / run_id / "manifest.json").write_text(json.dumps(manifest, indent=2), encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path, help="a run folder holding manifest.json")
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    from pipelines.outputs import runs_table as runs

    with tempfile.TemporaryDirectory() as tmp:
        subs = Path(tmp) / "submissions"
        make_runs(args.run_dir, subs, args.runs)
        command = [sys.executable, "-m", "pipelines", "runs", "list", "--sort", "score", "--submissions-dir", str(subs)]
        whole, inside = [], []
        for _ in range(args.repeats):
            started = time.perf_counter()
            done = subprocess.run(command, capture_output=True, text=True, check=True)
            whole.append(time.perf_counter() - started)
            started = time.perf_counter()
            runs.format_runs(runs.sort_runs(runs.load_runs(subs), "score"))
            inside.append(time.perf_counter() - started)
        listed = len(done.stdout.splitlines()) - 2  # header and the notes line
    print(f"runs list over {args.runs} runs ({listed} listed): whole command {statistics.median(whole):.3f} s "
          f"(median of {args.repeats}, interpreter start-up included), reading+sorting+formatting "
          f"{statistics.median(inside) * 1000:.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
