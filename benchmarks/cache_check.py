"""What verifying the cache costs: a fully cached ``run`` (every output's SHA-256 checked before reuse,
every test file probed) against computing its stages, on one world, in one session.

Usage: python -m benchmarks.cache_check --root WORLD --scratch DIR [--models random] [--config cpu] [--reuses 3]

1. ``run`` on an empty work dir (computes every stage), timed;
2. the same ``run`` again ``--reuses`` times (every stage cached: each output's size and SHA-256 checked
   against its manifest, the test files probed), timed;
3. the same rerun with the content check a lookup of the recorded hashes (the outputs not read through),
   ``--reuses`` times: the difference to 2. is the check in place;
4. in this process: SHA-256 of every stage output file the run's stages list (what the check reads),
   and the data-root check with and without the test-file probe, timed.

The models default to ``random``: its training is nearly free, so the stages computed are the data
stages, whose outputs are most of the bytes the check reads; a real model's training only adds compute
(and a few MB of models), so the ratio measured is an upper bound of the check's share.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def timed_run(args: list[str]) -> tuple[float, str]:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pipelines", *args], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"run failed ({done.returncode}): {done.stderr[-2000:]}")
    return wall, done.stdout + done.stderr


# A cached run whose content check is a table lookup (the hashes the manifests record): what reuse costs
# without reading the outputs through, so the difference to a plain reuse is the check itself.
_NO_HASH = """
import json, sys
from pathlib import Path
import pipelines.core.engine as engine
work = Path(sys.argv[1])
recorded = {}
for manifest in work.glob("*/*/manifest.json"):
    for item in json.loads(manifest.read_text()).get("outputs", []):
        recorded[str(manifest.parent / item["path"])] = item["sha256"]
engine.file_sha256 = lambda path: recorded[str(path)]
from pipelines.cli import main
sys.exit(main(sys.argv[2:]))
"""


def timed_without_hash(work: Path, args: list[str]) -> float:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", _NO_HASH, str(work), *args], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    if done.returncode != 0 or "computing" in done.stdout + done.stderr:
        raise SystemExit(f"the lookup-only rerun failed or computed: {done.stderr[-2000:]}")
    return time.perf_counter() - started


def output_files(work: Path) -> list[Path]:
    """Every output file the complete stage folders of ``work`` list in their manifests."""
    files = []
    for manifest in sorted(work.glob("*/*/manifest.json")):
        if manifest.parent.name.startswith("."):
            continue
        record = json.loads(manifest.read_text())
        files += [manifest.parent / item["path"] for item in record.get("outputs", [])]
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--scratch", type=Path, required=True, help="an empty folder for the work dir and runs")
    parser.add_argument("--models", default="random")
    parser.add_argument("--config", default="cpu")
    parser.add_argument("--reuses", type=int, default=3)
    args = parser.parse_args(argv)

    from pipelines.core.collection import ALL_COLLECTIONS
    from pipelines.core.engine import file_sha256
    from pipelines.data.submission import read_sample_ids, test_file_problems

    work, subs = args.scratch / "work", args.scratch / "subs"
    run = ["run", "--data-root", str(args.root), "--work-dir", str(work), "--submissions-dir", str(subs),
           "--models", args.models, "--config", args.config]
    compute_s, _ = timed_run(run)
    reuse_s = []
    for _ in range(args.reuses):
        wall, log = timed_run(run)
        if "computing" in log:
            raise SystemExit("the rerun computed a stage: not a fully cached run")
        reuse_s.append(wall)
    no_hash_s = [timed_without_hash(work, run) for _ in range(args.reuses)]
    files = output_files(work)
    size = sum(f.stat().st_size for f in files)
    started = time.perf_counter()
    for path in files:
        file_sha256(path)
    hash_s = time.perf_counter() - started
    ids = read_sample_ids(args.root)
    started = time.perf_counter()
    test_file_problems(args.root, ALL_COLLECTIONS, ids, probe=False)
    stat_s = time.perf_counter() - started
    started = time.perf_counter()
    test_file_problems(args.root, ALL_COLLECTIONS, ids, probe=True)
    probe_s = time.perf_counter() - started
    stage_s = sum(float(json.loads(m.read_text()).get("wall_time_s") or 0) for m in work.glob("*/*/manifest.json"))
    result = {"root": str(args.root), "models": args.models, "config": args.config, "compute_s": round(compute_s, 2),
              "stage_wall_s_sum": round(stage_s, 2), "reuse_s": [round(s, 2) for s in reuse_s],
              "reuse_median_s": round(statistics.median(reuse_s), 2),
              "ratio_reuse_to_compute": round(statistics.median(reuse_s) / compute_s, 4),
              "reuse_lookup_only_s": [round(s, 2) for s in no_hash_s],
              "reuse_lookup_only_median_s": round(statistics.median(no_hash_s), 2),
              "output_files": len(files), "output_bytes": size, "sha256_all_outputs_s": round(hash_s, 2),
              "ratio_hash_to_compute": round(hash_s / compute_s, 4), "test_files_stat_s": round(stat_s, 3),
              "test_files_probe_s": round(probe_s, 3)}
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
