"""The `submit` command."""

from __future__ import annotations

import argparse
from pathlib import Path

from pipelines.core import paths
from pipelines.core.errors import ConfigError
from pipelines.commands.common import command_parser


def add(sub: argparse._SubParsersAction) -> None:
    p = command_parser(sub, "submit", "upload a run's submission (or a CSV file) to the Kaggle competition",
                              "submit 20261122T120000Z-1a2b3c4d        # or: submit FILE -m MESSAGE --data-root DIR")
    p.add_argument("target", metavar="RUN_ID|FILE",
                   help="a run-id under --submissions-dir or a run folder (validated against the data root the "
                        "run recorded; what was sent is recorded in the run folder), or a CSV file")
    p.add_argument("-m", "--message", default=None,
                   help="submission description shown on Kaggle (default for a run: RUN_ID CV <combined score>; "
                        "required for a file)")
    p.add_argument("--data-root", type=Path, default=None,
                   help="validate against this data root's test files (default for a run: the one it recorded)")
    p.add_argument("--submissions-dir", type=Path, default=paths.SUBMISSIONS_DIR)
    p.add_argument("--allow-synthetic", action="store_true",
                   help="upload even a run made on a synthetic world (refused otherwise: Kaggle would score noise)")
    p.add_argument("--no-validate", action="store_true",
                   help="upload a FILE without --data-root, unchecked (refused otherwise: an invalid file costs one "
                        "of the day's uploads)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from pipelines.outputs.kaggle_io import submit_file, submit_run

    target = Path(args.target)
    if target.is_file() or target.suffix == ".csv":
        if args.message is None:
            raise ConfigError("submitting a file needs a message: -m MESSAGE (a run-id gets a default one)")
        print(submit_file(target, args.message, data_root=args.data_root, allow_synthetic=args.allow_synthetic,
                          unvalidated=args.no_validate))
        return 0
    run_id, submissions_dir = args.target, args.submissions_dir
    if target.is_dir() and (target / "manifest.json").is_file():  # a run folder's path works too
        run_id, submissions_dir = target.name, target.parent
    print(submit_run(run_id, submissions_dir=submissions_dir, message=args.message, data_root=args.data_root,
                     allow_synthetic=args.allow_synthetic))
    return 0

