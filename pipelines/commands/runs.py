"""The `runs` command."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pipelines.core import paths
from pipelines.core.errors import ConfigError
from pipelines.commands.common import action_parser, command_parser


def add(sub: argparse._SubParsersAction) -> None:
    p = command_parser(sub, "runs",
                       "list the runs with their CV (and public LB) scores, compare two with a paired test, remove "
                       "one, or log one to MLflow",
                       "runs list --sort score      # or: runs compare RUN_A RUN_B")
    actions = p.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True
    listing = action_parser(actions, "list",
                            "one line per run: date, data root, models, CV per collection and combined, seeds, wall "
                            "time, submitted",
                            "runs list --sort score --limit 10")
    listing.add_argument("--sort", choices=("date", "score", "lb", "wall", "id"), default="date",
                         help="date/id: oldest first; score (CV), lb (public leaderboard): best first; wall: fastest "
                              "first")
    listing.add_argument("--reverse", action="store_true", help="reverse the order")
    listing.add_argument("--limit", type=int, default=None, metavar="N", help="show the first N rows only")
    listing.add_argument("--submitted", action="store_true", help="only runs that were submitted to Kaggle")
    listing.add_argument("--data-root", default=None, help="only runs on this data root")
    listing.add_argument("--submissions-dir", type=Path, default=paths.SUBMISSIONS_DIR)
    listing.add_argument("--all", action="store_true",
                         help="a row per run folder (default: one per distinct result; a cached rerun is counted "
                              "in SAME)")
    listing.add_argument("--wide", action="store_true",
                         help="every column (data root, seeds, folds, wall time, submitted, config difference from "
                              "base, note); default: the columns that fit in 100 characters")
    listing.add_argument("--work-dir", type=Path, default=None,
                         help="also list the train stages no run used and the tune studies of this work dir")
    listing.set_defaults(handler=list_runs)
    compare = action_parser(actions, "compare", "CV scores per collection and model side by side, a paired test of "
                                                "the difference per collection, and the config difference",
                            "runs compare 1a2b3c4d 9f8e7d6c")
    compare.add_argument("run_a", metavar="RUN_A", help="a run-id, a unique prefix of it or of its hex part, or a name")
    compare.add_argument("run_b", metavar="RUN_B")
    compare.add_argument("--submissions-dir", type=Path, default=paths.SUBMISSIONS_DIR)
    compare.add_argument("--no-test", action="store_true",
                         help="manifests only: skip the paired tests (they read per-graph scores from the stages)")
    compare.set_defaults(handler=compare_runs)
    remove = action_parser(actions, "rm", "delete a run folder (its stages stay); asks first; a submitted run "
                                          "only with --force", "runs rm 1a2b3c4d")
    remove.add_argument("run_id", metavar="RUN_ID")
    remove.add_argument("--submissions-dir", type=Path, default=paths.SUBMISSIONS_DIR)
    remove.add_argument("-y", "--yes", action="store_true", help="do not ask")
    remove.add_argument("--force", action="store_true", help="also remove a run that was submitted to Kaggle")
    remove.set_defaults(handler=remove_run)
    track = action_parser(actions, "track", "log a published run to a local MLflow store", "runs track 1a2b3c4d")
    track.add_argument("run_id", metavar="RUN_ID")
    track.add_argument("--submissions-dir", type=Path, default=paths.SUBMISSIONS_DIR)
    track.add_argument("--uri", default=None, metavar="URI",
                       help="MLflow tracking URI (default: sqlite:///SUBMISSIONS_DIR/mlflow.db)")
    track.set_defaults(handler=track_run)


def list_runs(args: argparse.Namespace) -> int:
    from pipelines.outputs import runs_table as runs

    if args.limit is not None and args.limit < 1:
        raise ConfigError(f"--limit must be at least 1, got {args.limit}")
    rows = runs.load_runs(args.submissions_dir)
    if args.work_dir is not None:
        manifests = [m for m in (runs.read_manifest(Path(args.submissions_dir) / r["run_id"]) for r in rows) if m]
        rows += runs.load_work_results(args.work_dir, rows, manifests)
    rows = runs.collapse_reruns(rows, keep_all=args.all)
    rows = runs.filter_runs(rows, submitted_only=args.submitted, data_root=args.data_root)
    rows = runs.sort_runs(rows, args.sort, args.reverse)
    print(runs.format_runs(rows[:args.limit] if args.limit else rows, wide=args.wide))
    return 0


def compare_runs(args: argparse.Namespace) -> int:
    from pipelines.outputs import graph_scores as gs
    from pipelines.outputs import runs_table as runs
    from pipelines.outputs.run_folders import read_run_manifest, resolve_run_id

    a_id, b_id = resolve_run_id(args.submissions_dir, args.run_a), resolve_run_id(args.submissions_dir, args.run_b)
    a_id, a, note_a = runs.compared_run(args.submissions_dir, a_id, read_run_manifest(args.submissions_dir, a_id))
    b_id, b, note_b = runs.compared_run(args.submissions_dir, b_id, read_run_manifest(args.submissions_dir, b_id))
    notes = [f"{side}: {note}" for side, note in (("A", note_a), ("B", note_b)) if note]
    print(runs.compare_runs(a_id, a, b_id, b, differences=args.no_test, notes=notes))
    if not args.no_test:
        scores_a, missing_a = gs.graph_scores_of_run(a)
        scores_b, missing_b = gs.graph_scores_of_run(b)
        tests = gs.compare_scores(scores_a, scores_b, gs.seed_scores(a), gs.seed_scores(b),
                                  identical=gs.identical_stages(a, b))
        print()
        print(gs.format_tests(tests, [f"A {m}" for m in missing_a] + [f"B {m}" for m in missing_b]))
    return 0


def remove_run(args: argparse.Namespace) -> int:
    from pipelines.outputs.run_folders import check_removable, remove_run_folder, resolve_run_id

    run_id = resolve_run_id(args.submissions_dir, args.run_id)
    check_removable(args.submissions_dir, run_id)
    if not args.yes:
        if not sys.stdin.isatty():
            raise ConfigError(f"runs rm {run_id}: not asking on a non-interactive input; pass --yes")
        answer = input(f"remove run folder {Path(args.submissions_dir) / run_id}? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            print("kept")
            return 0
    print(f"removed {remove_run_folder(args.submissions_dir, run_id, force=args.force)}")
    return 0


def track_run(args: argparse.Namespace) -> int:
    from pipelines.outputs.tracking import track_run as track

    record = track(args.run_id, submissions_dir=args.submissions_dir, uri=args.uri)
    print(f"{record['uri']} experiment {record['experiment']} run {record['mlflow_run_id']}")
    return 0
