"""SHA-256 of every file the data stages write, to show a code change left their outputs byte-identical.

Usage: python -m benchmarks.stage_hashes --root DATA_ROOT --work FRESH_DIR --out HASHES.json [--set k=v ...]
       python -m benchmarks.stage_hashes --compare BEFORE.json AFTER.json

Runs prune, features and node arrays of every collection of the root (``prepare.run_data_stages``, recomputed)
and records, per collection and stage, the hash of every output file (``manifest.json`` aside: it
holds keys and wall times) and the manifest's ``metrics``; for the features stage also the content of
what its reader (``read_feature_rows``) returns for each graph and for all graphs at once (``rows/...``
entries: equal where the tables read back are equal, however they are stored). Run it on the old and
the new code with the same root and config, then ``--compare``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any, Sequence


def stage_hashes(root: Path, work: Path, overrides: Sequence[str] = ()) -> dict[str, str]:
    from pipelines.core.collection import parse_collection
    from pipelines.config.settings import load_config
    from pipelines.flows.prepare import collection_refs, raw_data_key, run_data_stages
    from pipelines.data.root import DataRoot

    config = load_config(None, list(overrides))
    hashes: dict[str, str] = {}
    for collection in DataRoot(root).collections():
        c = parse_collection(collection.name)
        refs = collection_refs(root, c)
        stages = run_data_stages(config, c, work, refs, raw_data_key(root, refs), force=True, with_folds=False)
        for stage, output in stages.items():
            folder = Path(output.path)
            for path in sorted(folder.rglob("*")):
                if path.is_file() and path.name != "manifest.json":
                    hashes[f"{c.name}/{stage}/{path.relative_to(folder)}"] = hashlib.sha256(path.read_bytes()).hexdigest()
            hashes[f"{c.name}/{stage}/metrics"] = json.dumps(output.metrics, sort_keys=True)
        hashes.update(feature_row_digests(c.name, stages))
    return hashes


def feature_row_digests(collection: str, stages: dict[str, Any]) -> dict[str, str]:
    """Digest of the rows ``read_feature_rows`` gives for each graph, and for all graphs at once (a
    seeded sample of 5 configs each)."""
    from pipelines.data.features import read_feature_rows
    from pipelines.data.prune import read_graph_table

    graphs = list(read_graph_table(stages["prune"]).select("graph", "split").iter_rows())
    out = {f"{collection}/features/rows/{split}/{stem}": table_digest(read_feature_rows(stages["features"], [(stem, split)]))
           for stem, split in graphs}
    out[f"{collection}/features/rows/all"] = table_digest(read_feature_rows(stages["features"], graphs, 5, seed=3))
    return out


def table_digest(table: Any) -> str:
    """SHA-256 of a polars table's column names, dtypes and values (not of how it was stored)."""
    digest = hashlib.sha256(f"{table.shape}".encode())
    for series in table.get_columns():
        digest.update(f"{series.name}:{series.dtype}\n".encode())
        if series.dtype.is_numeric():
            digest.update(series.to_numpy().tobytes())
        else:
            digest.update("\0".join(str(v) for v in series.to_list()).encode())
    return digest.hexdigest()


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
    parser.add_argument("--show", type=int, default=50, help="differing entries listed by name (the rest are counted)")
    args = parser.parse_args(argv)
    if args.compare:
        before, after = (json.loads(path.read_text()) for path in args.compare)
        differ = compare(before, after)
        print(f"{len(before)} vs {len(after)} entries; {len(differ)} differ" + "".join(f"\n  {k}" for k in differ[:args.show]))
        if len(differ) > args.show:
            groups: dict[str, int] = {}
            for key in differ:
                parts = key.split("/")
                group = "/".join(parts[:3] if parts[2] == "rows" else parts[:2])
                groups[group] = groups.get(group, 0) + 1
            print("differing entries per collection/stage:" + "".join(f"\n  {g}: {n}" for g, n in sorted(groups.items())))
        return 1 if differ else 0
    if not (args.root and args.work and args.out):
        parser.error("--root, --work and --out are required (or --compare BEFORE AFTER)")
    hashes = stage_hashes(args.root, args.work, args.overrides)
    args.out.write_text(json.dumps(hashes, indent=1, sort_keys=True))
    print(f"{len(hashes)} entries -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
