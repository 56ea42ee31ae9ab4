"""SHA-256 of every file the data stages write, to show a code change left their outputs byte-identical.

Usage: python -m benchmarks.stage_hashes --root DATA_ROOT --work FRESH_DIR --out HASHES.json [--set k=v ...]
       python -m benchmarks.stage_hashes --compare BEFORE.json AFTER.json

Runs prune, features and node arrays of every collection of the root (``prepare.run_data_stages``, recomputed)
and records, per collection and stage, the hash of every output file (``manifest.json`` aside: it
holds keys and wall times) and the manifest's ``metrics``. Run it on the old and the new code with
the same root and config, then ``--compare``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Sequence


def stage_hashes(root: Path, work: Path, overrides: Sequence[str] = ()) -> dict[str, str]:
    from pipelines.collections import parse_collection
    from pipelines.config import load_config
    from pipelines.prepare import collection_refs, raw_data_key, run_data_stages
    from pipelines.tpugraphs import available_collections

    config = load_config(None, list(overrides))
    hashes: dict[str, str] = {}
    for collection in available_collections(root):
        c = parse_collection(collection.name)
        refs = collection_refs(root, c)
        stages = run_data_stages(config, c, work, refs, raw_data_key(root, refs), force=True, with_folds=False)
        for stage, output in stages.items():
            folder = Path(output.path)
            for path in sorted(folder.rglob("*")):
                if path.is_file() and path.name != "manifest.json":
                    hashes[f"{c.name}/{stage}/{path.relative_to(folder)}"] = hashlib.sha256(path.read_bytes()).hexdigest()
            hashes[f"{c.name}/{stage}/metrics"] = json.dumps(output.metrics, sort_keys=True)
    return hashes


def compare(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """The entries that differ or exist on one side only."""
    return sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path)
    parser.add_argument("--work", type=Path, help="a fresh folder (stages are recomputed into it)")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="config override k=v")
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"))
    args = parser.parse_args(argv)
    if args.compare:
        before, after = (json.loads(path.read_text()) for path in args.compare)
        differ = compare(before, after)
        print(f"{len(before)} vs {len(after)} entries; {len(differ)} differ" + "".join(f"\n  {k}" for k in differ))
        return 1 if differ else 0
    if not (args.root and args.work and args.out):
        parser.error("--root, --work and --out are required (or --compare BEFORE AFTER)")
    hashes = stage_hashes(args.root, args.work, args.overrides)
    args.out.write_text(json.dumps(hashes, indent=1, sort_keys=True))
    print(f"{len(hashes)} entries -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
