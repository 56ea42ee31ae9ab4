"""The `ensemble` command."""

from __future__ import annotations

import argparse
from pathlib import Path

from pipelines.core import paths
from pipelines.commands.common import command_parser, report_new_run


def add(sub: argparse._SubParsersAction) -> None:
    p = command_parser(sub, "ensemble", "re-blend the saved predictions of earlier runs into a new submission "
                                        "(no training); prints the submission path last",
                       "ensemble --runs RUN_A RUN_B --method rank")
    p.add_argument("--runs", nargs="+", required=True, metavar="RUN_ID", help="run-ids under --submissions-dir")
    p.add_argument("--method", choices=("minmax", "rank"), default=None,
                   help="per-graph normalisation (default: the first run's)")
    p.add_argument("--min-gain-se", type=float, default=None,
                   help="keep the fitted blend only if its OOF gain over the best single model exceeds this "
                        "many standard errors, else that model alone (default: the first run's; 0: always)")
    p.add_argument("--gain-at", choices=("oof", "test-runs"), default=None,
                   help="test the blend's gain as measured on OOF, or as expected at the test's averaged runs "
                        "(default: the first run's)")
    p.add_argument("--models", default=None,
                   help="comma-separated models to keep (gbdt keeps gbdt@<run-id> of every run; default: all)")
    p.add_argument("--work-dir", type=Path, default=None, help="where the runs' stages are (default: as recorded)")
    p.add_argument("--data-root", type=Path, default=None, help="data root to validate against (default: as recorded)")
    p.add_argument("--submissions-dir", type=Path, default=paths.SUBMISSIONS_DIR)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from pipelines.flows.run import ensemble_runs, parse_models

    result = ensemble_runs(args.runs, submissions_dir=args.submissions_dir, work_dir=args.work_dir,
                           data_root=args.data_root, method=args.method, min_gain_se=args.min_gain_se,
                           gain_at=args.gain_at,
                           models=parse_models(args.models))
    report_new_run(result.run_id, args.submissions_dir)
    print(result.describe())
    print(result.submission)
    return 0

