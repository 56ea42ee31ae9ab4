"""The `score` command."""

from __future__ import annotations

import argparse
from pathlib import Path

from pipelines.core.errors import ConfigError, PipelineError
from pipelines.commands.common import command_parser


def add(sub: argparse._SubParsersAction) -> None:
    p = command_parser(sub, "score",
                       "score a submission written for a labelled split (e.g. valid; `predict --split valid` writes "
                       "one)",
                       "score --data-root data/synthetic-small --split valid submissions/PREDICT_RUN_ID/submission.csv")
    p.add_argument("--data-root", type=Path, required=True)
    p.add_argument("--split", default="valid", choices=("train", "valid"))
    p.add_argument("file", type=Path, nargs="?", metavar="FILE", help="the submission CSV")
    p.add_argument("--submission", dest="submission_option", type=Path, default=None,
                   help=argparse.SUPPRESS)  # the older spelling, still read
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from pipelines.core.errors import SubmissionError
    from pipelines.data.submission import score_submission

    if (args.file is None) == (args.submission_option is None):
        raise ConfigError("score takes one submission FILE (as validate-submission and submit do)")
    args.submission = args.file if args.file is not None else args.submission_option
    try:
        report = score_submission(args.submission, args.data_root, split=args.split)
    except SubmissionError as exc:
        unknown = [v for v in exc.violations if "unknown ID" in v]
        if unknown and len(unknown) * 2 >= len([v for v in exc.violations if "missing" not in v]):
            raise PipelineError(
                f"{args.submission}: {len(unknown)} of its IDs are not graphs of the {args.split} split of "
                f"{args.data_root}: it ranks another split. The test submissions `run` writes cannot be scored (the "
                "test split has no runtimes); for a valid-split submission of a run trained with "
                "folds.holdout_valid = true: predict --run RUN_ID --split valid --data-root DIR; the cross-validation "
                "scores of every run: runs list") from None
        raise
    print(report.to_text())
    return 0

