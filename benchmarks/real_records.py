"""A run's ranking of the only real TPU measurements we have, next to the baselines that need no model.

The dataset repository's own tuning records (``../shared/real_tpu``: one 3-D U-Net training step with
measured layout configs, 15 fused kernels with measured tile configs) go through ``records`` into a data
root of test graphs (the layout graph in all four layout collections), the run's saved models rank them
(``predict``), and the rankings are scored on the measured runtimes:

- tile: the competition's top-5 score over the 15 kernels and over the kernels with more than five
  configs (where a pick can miss), for the run, the compiler's default first (the default, then the
  run's picks), and the run's picks with the default in place of the fifth (always anchored);
- layout: Kendall tau for the run, the default config first (then the run's order), and the best
  heuristic of ``evaluate``.

One graph and 15 kernels: a smoke test of the whole path from records to ranking, printed, never tuned
on (docs/transfer-protocol.md).

    python -m benchmarks.real_records --run RUN_ID [--submissions-dir DIR] [--work-dir DIR] [--out FILE]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

from benchmarks.common import emit, markdown_table
from pipelines.core.collection import ALL_COLLECTIONS, TILE_XLA
from pipelines.data.root import DataRoot
from pipelines.data.submission import read_submission
from pipelines.flows.evaluate import CEILING, FLOOR, SUBMISSION, evaluate_rows
from pipelines.flows.predict import predict_run
from pipelines.flows.records import records_to_data_root
from pipelines.training.anchor import anchor_row

REAL = Path(__file__).resolve().parents[1] / ".." / "shared" / "real_tpu"
RECORD_FILES = ("module_tuning_data_layout.pb", "op_tuning_data.pb")
DEFAULT_FIRST, DEFAULT_IN_FIVE = "default_first", "default_in_five"
TILE_MIN_CONFIGS = 6  # kernels with more configs than one submission names


def real_records_root(out: Path, records: Path = REAL) -> DataRoot:
    """The records as a data root of test graphs, every layout collection holding the layout graph."""
    records_to_data_root([records / name for name in RECORD_FILES], out, split="test", layout_collection="all")
    return DataRoot(out)


def baseline_rows(published: dict[str, list[int]], defaults: dict[str, dict[str, int]]) -> dict[str, dict]:
    """The rows of the model-free baselines that start from the compiler's default."""
    first, in_five = {}, {}
    for collection in ALL_COLLECTIONS:
        for stem, default in defaults.get(collection.name, {}).items():
            sid = collection.submission_id(stem)
            if sid not in published:
                continue
            row = published[sid]
            first[sid] = [default, *[i for i in row if i != default]][:len(row)]
            in_five[sid] = anchor_row(row, default, None) if collection.is_tile else row
    return {DEFAULT_FIRST: first, DEFAULT_IN_FIVE: in_five}


def report(run_id: str, evaluation, root: DataRoot) -> list[str]:
    tile_counts = {ref.stem: n for ref in root.graphs(TILE_XLA, "test")
                   for n in [int(np.load(ref.path)["config_runtime"].shape[0])]}
    entries = [SUBMISSION, DEFAULT_FIRST, DEFAULT_IN_FIVE, FLOOR, CEILING]
    rows = []
    for collection in ALL_COLLECTIONS:
        cells = [evaluation.collection_scores(e).get(collection.name) for e in entries]
        rows.append([collection.name, *(f"{c:.4f}" if c is not None else "-" for c in cells),
                     evaluation.floor_by_collection[collection.name]])
    many = [stem for stem, n in tile_counts.items() if n >= TILE_MIN_CONFIGS]
    cells = []
    for entry in entries:
        frame = evaluation.reports[entry].per_graph
        part = frame.filter((frame["collection"] == TILE_XLA.name) & frame["graph"].is_in(many))
        cells.append(f"{part['score'].mean():.4f}")
    rows.append([f"tile:xla, {len(many)} kernels > 5 configs", *cells, evaluation.floor_by_collection[TILE_XLA.name]])
    return [f"# Run {run_id} on the real TPU records", "",
            *markdown_table(["collection", "run", "default first", "default in five", "best heuristic",
                             "ceiling (measured order)", "heuristic"], rows), "",
            "Layout: one graph (the same in every layout collection). Tile: 15 kernels. Smoke test, not a figure "
            "to choose on."]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", required=True, metavar="RUN_ID")
    parser.add_argument("--submissions-dir", type=Path, default=Path("submissions"))
    parser.add_argument("--work-dir", type=Path, default=None)
    parser.add_argument("--records", type=Path, default=REAL, help="folder of the two record files")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="real-records-") as scratch:
        root = real_records_root(Path(scratch) / "root", args.records)
        predicted = predict_run(args.run, root.path, submissions_dir=args.submissions_dir, work_dir=args.work_dir)
        published = read_submission(predicted.submission)
        rows = {SUBMISSION: published, **baseline_rows(published, root.defaults())}
        evaluation = evaluate_rows(root.path, rows)
        emit(report(args.run, evaluation, root), args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
