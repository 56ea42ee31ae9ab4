"""The `validate-submission` command."""

from __future__ import annotations

import argparse
from pathlib import Path

from pipelines.commands.common import command_parser


def add(sub: argparse._SubParsersAction) -> None:
    p = command_parser(sub, "validate-submission", "check a submission CSV against a data root's test files",
                              "validate-submission --data-root data/kaggle submissions/RUN_ID/submission.csv")
    p.add_argument("--data-root", type=Path, required=True)
    p.add_argument("--split", default="test", choices=("train", "valid", "test"))
    p.add_argument("file", type=Path, metavar="FILE", help="the submission CSV")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from pipelines.data.submission import validate_submission

    rows = validate_submission(args.file, args.data_root, split=args.split)
    print(f"{args.file}: valid submission with {rows} rows")
    return 0

