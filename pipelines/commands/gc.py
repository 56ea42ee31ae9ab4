"""The `gc` command."""

from __future__ import annotations

import argparse
from pathlib import Path

from pipelines.core import paths
from pipelines.commands.common import command_parser


def add(sub: argparse._SubParsersAction) -> None:
    p = command_parser(sub, "gc",
                       "list (or, with --delete, remove) the cached stage outputs that no run references, with their "
                       "sizes; a dry run by default",
                       "gc --work-dir data/work --submissions-dir submissions --delete")
    p.add_argument("--work-dir", type=Path, default=paths.WORK_DIR)
    p.add_argument("--submissions-dir", type=Path, action="append", default=None,
                   help="run folders whose manifests keep their stages (repeatable; default: submissions)")
    p.add_argument("--delete", action="store_true",
                   help="remove them (default: only list them); refused, saying why, where the work dir holds or links "
                        "to raw data or run folders, a manifest cannot be read, or runs published elsewhere use its "
                        "stages")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from pipelines.outputs.cache_gc import collect, format_garbage

    dirs = args.submissions_dir or [paths.SUBMISSIONS_DIR]
    missing = [d for d in dirs if not Path(d).is_dir()]
    if missing and not args.delete:  # (with --delete, collect refuses a missing folder)
        print(f"note: no run folders at {', '.join(map(str, missing))}: no run keeps a stage there")
    print(format_garbage(collect(args.work_dir, dirs, delete=args.delete), deleted=args.delete))
    return 0

