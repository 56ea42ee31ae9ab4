"""Fingerprint of GNN predictions on the ``tiny`` world, to check that a code change is exact on CPU.

Usage: python -m benchmarks.gnn_bitwise [--world DIR] [--work DIR] [--set k=v ...]

Fits one GNN per collection (every collection of the world, a short schedule, seed 0) on the
train split with early stopping on the valid split, predicts the test split and prints one
SHA-256 per collection over the float64 prediction bytes and the per-epoch losses. Run it with
two versions of the code (e.g. ``git stash`` / an archive of main) on the same machine: equal
hashes mean the change did not move a single bit of the results.
"""

from __future__ import annotations

import argparse
import hashlib
import tempfile
from pathlib import Path

import numpy as np

SHORT = ["folds.k=2", "gnn.epochs=3", "gnn.hidden=16", "gnn.opcode_dim=8", "gnn.progress=false", "gnn.num_threads=1",
         "gnn.patience=2", "gnn.configs_per_graph=8"]


def fingerprints(world: Path, work: Path, overrides: list[str]) -> dict[str, str]:
    from pipelines.config.settings import load_config, resolve_for_collection, config_to_dict
    from pipelines.models.gnn import GNNRanker
    from pipelines.flows.prepare import prepare

    config = load_config("base", SHORT + overrides)
    prepared = prepare(config, world, work)
    out = {}
    for name, item in prepared.items():
        settings = config_to_dict(resolve_for_collection(config.gnn, item.collection))
        settings.pop("collections", None)
        train = [item.load_graph_arrays(g) for g in item.graphs("train")]
        valid = [item.load_graph_arrays(g) for g in item.graphs("valid")]
        test = [item.load_graph_arrays(g) for g in item.graphs("test")]
        ranker = GNNRanker(settings, collection=item.collection).fit(train, valid, seed=0)
        # the graphs' costs one after another, then the per-epoch losses: which of the two moved, if any
        predictions = np.ascontiguousarray(ranker.predict(test), dtype=np.float64).tobytes()
        losses = np.array([h["loss"] for h in ranker.history_], dtype=np.float64).tobytes()
        out[name] = (f"{hashlib.sha256(predictions + losses).hexdigest()[:16]} "
                     f"(predictions {hashlib.sha256(predictions).hexdigest()[:8]}, "
                     f"losses {hashlib.sha256(losses).hexdigest()[:8]})")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=Path, default=None, help="a world in the Kaggle layout (default: tiny, generated)")
    parser.add_argument("--work", type=Path, default=None, help="stage cache (default: a temporary folder)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="K=V")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        world = args.world
        if world is None:
            from pipelines.synth import generate_world

            world = Path(tmp) / "tiny"
            generate_world(world, scale="tiny", seed=0)
        for name, digest in fingerprints(world, args.work or Path(tmp) / "work", args.overrides).items():
            print(f"{name} {digest}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
