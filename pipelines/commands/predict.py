"""The `predict` command."""

from __future__ import annotations

import argparse
from pathlib import Path

from pipelines.core import paths
from pipelines.commands.common import command_parser, report_new_run


def add(sub: argparse._SubParsersAction) -> None:
    p = command_parser(sub, "predict", "rank the test graphs of a data root with a run's saved fold models and blend "
                                       "weights, without training; writes a validated submission in a new run folder",
                       "predict --run 20261122T120000Z-1a2b3c4d --data-root data/new-graphs")
    p.add_argument("--run", required=True, metavar="RUN_ID", help="a run-id under --submissions-dir")
    p.add_argument("--data-root", type=Path, required=True,
                   help="data root in the Kaggle layout whose test graphs are ranked (train/valid may be absent)")
    p.add_argument("--work-dir", type=Path, default=None,
                   help="where the run's stages are; the new data's stages go there too (default: as recorded)")
    p.add_argument("--submissions-dir", type=Path, default=paths.SUBMISSIONS_DIR)
    p.add_argument("--split", choices=("test", "valid"), default="test",
                   help="rank this split (valid: for `score`, only for runs whose fold models held it out, "
                        "folds.holdout_valid = true)")
    p.add_argument("--threads", type=int, default=0,
                   help="threads per model when predicting (default 0: those the run's fold jobs used, which "
                        "reproduces its scores to the last bit)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from pipelines.flows.predict import predict_run

    result = predict_run(args.run, args.data_root, submissions_dir=args.submissions_dir, work_dir=args.work_dir,
                         split=args.split, num_threads=max(0, args.threads))
    report_new_run(result.run_id, args.submissions_dir)
    print(result.submission)
    return 0

