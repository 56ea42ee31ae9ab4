"""The `download` command."""

from __future__ import annotations

import argparse
from pathlib import Path

from pipelines.commands.common import command_parser


def add(sub: argparse._SubParsersAction) -> None:
    p = command_parser(sub, "download", "download the competition data from Kaggle into a data root",
                              "download --data-root data/kaggle")
    p.add_argument("--data-root", type=Path, required=True,
                   help="folder to receive npz_all/ and sample_submission.csv (other files in it are left alone)")
    p.add_argument("--force", action="store_true", help="download again even if the data root is complete")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from pipelines.outputs.kaggle_io import download_competition_data

    print(download_competition_data(args.data_root, force=args.force).describe())
    return 0

