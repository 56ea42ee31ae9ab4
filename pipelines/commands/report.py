"""The `report` command."""

from __future__ import annotations

import argparse
from pathlib import Path

from pipelines.core import paths
from pipelines.commands.common import command_parser


def add(sub: argparse._SubParsersAction) -> None:
    p = command_parser(sub, "report", "write a self-contained HTML report of a run (scores, worst graphs, "
                                      "importances, ensemble weights)",
                       "report 20261122T120000Z-1a2b3c4d --out report.html")
    p.add_argument("run_id", metavar="RUN_ID", help="a run-id under --submissions-dir")
    p.add_argument("--submissions-dir", type=Path, default=paths.SUBMISSIONS_DIR)
    p.add_argument("--work-dir", type=Path, default=None, help="where the run's stage outputs are "
                                                               "(default: the work dir its manifest records)")
    p.add_argument("--out", type=Path, default=None, help="output file (default: SUBMISSIONS/RUN_ID/report.html)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from pipelines.reports.report import write_report

    print(write_report(args.run_id, submissions_dir=args.submissions_dir, out=args.out, work_dir=args.work_dir))
    return 0

