"""The `submissions` command."""

from __future__ import annotations

import argparse
from pathlib import Path

from pipelines.core import paths
from pipelines.commands.common import action_parser, command_parser


def add(sub: argparse._SubParsersAction) -> None:
    p = command_parser(sub, "submissions",
                       "Kaggle's side of the submissions: `sync` fetches the public scores of earlier uploads and "
                       "files them with their runs (runs list shows them beside the CV)",
                       "submissions sync")
    actions = p.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True
    sync = action_parser(actions, "sync", "fetch this account's submissions and their scores from Kaggle",
                         "submissions sync")
    sync.add_argument("--submissions-dir", type=Path, default=paths.SUBMISSIONS_DIR)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from pipelines.outputs.leaderboard import sync_leaderboard

    print(sync_leaderboard(args.submissions_dir).describe())
    return 0

