"""The `demo` command."""

from __future__ import annotations

import argparse
from pathlib import Path

from pipelines.core import paths
from pipelines.commands.common import announce_config, config_options, command_parser, report_new_run, seed


def add(sub: argparse._SubParsersAction) -> None:
    p = command_parser(sub, "demo", "the README's main job on the embedded synthetic world",
                              "demo --scale tiny")
    p.add_argument("--data-root", type=Path, default=None,
                   help="where the synthetic world is generated or reused (default: data/synthetic-SCALE)")
    p.add_argument("--scale", choices=("tiny", "small", "full"), default="small")
    p.add_argument("--seed", type=seed, default=0)
    p.add_argument("--work-dir", type=Path, default=paths.WORK_DIR)
    p.add_argument("--submissions-dir", type=Path, default=paths.SUBMISSIONS_DIR)
    config_options(p, config_help="config name or TOML file (default: demo; smoke with --scale tiny, whose world "
                                  "is too small for demo's 5 folds)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from pipelines.flows.demo import demo_config, demo_summary, run_demo

    config = announce_config(args.config, *demo_config(args.scale))
    data_root = args.data_root if args.data_root is not None else paths.synthetic_world(args.scale)
    result = run_demo(data_root=data_root, scale=args.scale, seed=args.seed, work_dir=args.work_dir,
                      submissions_dir=args.submissions_dir, config=config, overrides=args.overrides)
    report_new_run(result.run_id, args.submissions_dir)
    print(demo_summary(result, data_root, args.scale, args.seed, args.work_dir))
    print(result.submission)  # last: the command's result, printed (not logged) so --quiet keeps it
    return 0

