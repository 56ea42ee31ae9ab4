"""The `status` command."""

from __future__ import annotations

import argparse
from pathlib import Path

from pipelines.core import paths
from pipelines.commands.common import config_options, command_parser, prog


def add(sub: argparse._SubParsersAction) -> None:
    p = command_parser(sub, "status", "list cached stage outputs (complete, incomplete, running, interrupted); with "
                                      "--explain, the stage DAG: each stage's inputs, code roots, settings and key",
                       "status --stage train-gbdt\n  "
                       f"{prog()} status --explain --data-root data/synthetic-small --config demo --collections tile:xla")
    p.add_argument("--work-dir", type=Path, default=paths.WORK_DIR)
    p.add_argument("--stage", action="append", default=[],
                   help="show only this stage (repeatable; default: every stage)")
    p.add_argument("--submissions-dir", type=Path, default=paths.SUBMISSIONS_DIR,
                   help="also clean interrupted publishes here and list incomplete run folders")
    p.add_argument("--explain", action="store_true",
                   help="print the stage DAG instead: per stage and collection its inputs, code roots, the settings "
                        "in its key with their values, and its key where the raw files (--data-root) and the "
                        "outputs of its inputs in the work dir allow")
    p.add_argument("--data-root", type=Path, default=None,
                   help="with --explain: the data root whose raw files key the stages (default: none, no keys)")
    config_options(p, prefix="with --explain: ")
    p.add_argument("--models", default=None,
                   help="with --explain: comma-separated models (default: the config's ensemble.models)")
    p.add_argument("--collections", default=None, metavar="NAMES",
                   help="with --explain: comma-separated collections (default: those with a train directory "
                        "under --data-root, else all five)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from pipelines.core.engine import format_status, list_stages
    from pipelines.outputs.run_folders import tidy_submissions

    if args.explain:
        return _explain(args)
    for item in tidy_submissions(args.submissions_dir):
        print(f"incomplete run folder {item['path']} (no manifest.json: publishing was interrupted; "
              f"not a validated run; holds {', '.join(item['files'])})")
    from pipelines.outputs.cache_gc import folder_size, format_size

    rows = [r for r in list_stages(args.work_dir) if not args.stage or r["stage"] in args.stage]
    if not rows:
        print(f"no stage outputs under {args.work_dir}")
        return 0
    sizes = [folder_size(r["path"]) for r in rows]
    lines = format_status(rows).splitlines()  # a header, then one line per row
    shown = ["SIZE", *(format_size(size) for size in sizes)]
    width = max(len(text) for text in shown)
    print("\n".join(f"{text:>{width}}  {line}" for text, line in zip(shown, lines)))
    print(f"{len(rows)} stage folder(s), {format_size(sum(sizes))} under {args.work_dir}")
    return 0


def _explain(args: argparse.Namespace) -> int:
    from pipelines.config.settings import load_config
    from pipelines.core.collection import parse_collections
    from pipelines.flows.explain import explain_pipeline
    from pipelines.flows.run import checked_models, parse_models

    config = load_config(args.config, args.overrides)
    collections = None if args.collections is None else list(parse_collections(args.collections))
    print(explain_pipeline(config, work_dir=args.work_dir, models=checked_models(config, parse_models(args.models)),
                           data_root=args.data_root, collections=collections, only=args.stage))
    return 0

