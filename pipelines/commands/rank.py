"""The `rank` command."""

from __future__ import annotations

import argparse
from pathlib import Path

from pipelines.core import paths
from pipelines.core.errors import ConfigError
from pipelines.commands.common import command_parser


def add(sub: argparse._SubParsersAction) -> None:
    p = command_parser(sub, "rank",
                       "rank candidate layout (and fusion tile) configurations of your own HLO program with a run's "
                       "saved models: one recommended layout per configurable node (as HLO writes it), its "
                       "predicted gain over the module's own layouts with the spread over fold models, and the "
                       "top configs per collection, ties as ties; needs the hlo extra",
                       "rank --run 20261122T120000Z-1a2b3c4d dumps/module_0001.jit_step.before_optimizations.txt --configs 500")
    p.add_argument("program", type=Path, metavar="PROGRAM", help="a .pb (HloModuleProto or HloProto) or HLO text file")
    p.add_argument("--run", required=True, metavar="RUN_ID", help="a run-id under --submissions-dir")
    p.add_argument("--out", type=Path, default=None,
                   help="folder for rank.json, rank.txt and the data root built (default: ranks/<stem>-<run>)")
    p.add_argument("--configs", type=int, default=1000,
                   help="candidate layout configs per search, default and random (default 1000)")
    p.add_argument("--tile-configs", type=int, default=100, help="candidate tile configs per fusion (default 100)")
    p.add_argument("--top", type=int, default=5, help="configs shown per graph (default 5)")
    p.add_argument("--source", choices=("xla", "nlp"), default="xla",
                   help="whose layout models rank the program: layout:xla:* (default) or layout:nlp:*")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--work-dir", type=Path, default=None,
                   help="where the run's stages are; the new data's stages go there too (default: as recorded)")
    p.add_argument("--submissions-dir", type=Path, default=paths.SUBMISSIONS_DIR)
    p.add_argument("--threads", type=int, default=0, help="threads per model when predicting (0: as the run)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from pipelines.flows.rank import format_ranking, rank_program

    if args.configs < 1 or args.top < 1 or args.tile_configs < 1:
        raise ConfigError("--configs, --tile-configs and --top must be at least 1")
    report, out = rank_program(args.run, args.program, out_dir=args.out, configs=args.configs,
                               tile_configs=args.tile_configs, top=args.top, seed=args.seed, source=args.source,
                               submissions_dir=args.submissions_dir, work_dir=args.work_dir,
                               num_threads=max(0, args.threads))
    print(format_ranking(report), end="")
    print(out / "rank.json")
    return 0

