"""The `prepare` command."""

from __future__ import annotations

import argparse
from pathlib import Path

from pipelines.core import paths
from pipelines.commands.common import config_options, command_parser


def add(sub: argparse._SubParsersAction) -> None:
    p = command_parser(sub, "prepare", "prune graphs, build feature tables, GNN arrays and folds (cached stages)",
                              "prepare --data-root data/kaggle --collections tile:xla")
    p.add_argument("--data-root", type=Path, required=True)
    p.add_argument("--work-dir", type=Path, default=paths.WORK_DIR)
    config_options(p)
    p.add_argument("--collections", default=None, help="comma-separated collection names (default: all present)")
    p.add_argument("--force", action="store_true", help="recompute even when a cached output exists")
    p.add_argument("--scheduler", default=None, metavar="ADDRESS",
                   help="Dask scheduler address for the per-file jobs (workers must share this filesystem); "
                        "default: run.scheduler of the config ('local': run.n_jobs local processes)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from pipelines.core.collection import parse_collections
    from pipelines.config.settings import load_config
    from pipelines.core.parallel import fan_out
    from pipelines.flows.prepare import prepare

    config = load_config(args.config, args.overrides)
    collections = None if args.collections is None else list(parse_collections(args.collections))
    with fan_out(args.scheduler if args.scheduler is not None else config.run.scheduler):
        prepared = prepare(config, args.data_root, args.work_dir, collections, force=args.force)
    for name, item in prepared.items():
        for stage, output in item.stages.items():
            state = "cached" if item.cached.get(stage) else "computed"
            print(f"{name:<20} {stage:<12} {output.key}  {state:<8}  {output.path}")
    return 0

