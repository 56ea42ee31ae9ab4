"""The `featurize` command."""

from __future__ import annotations

import argparse
from pathlib import Path

from pipelines.commands.common import command_parser


def add(sub: argparse._SubParsersAction) -> None:
    p = command_parser(sub, "featurize",
                       "turn an XLA HLO program (a serialized HloModuleProto .pb, or HLO text .txt/.hlo) into "
                       "TpuGraphs graphs: OUT/<stem>.npz (layout, with candidate configs) and, where the module has "
                       "fusions, OUT/<stem>-tiles/*.npz (tile); needs the hlo extra",
                       "featurize dumps/module_0001.jit_step.before_optimizations.hlo.pb --out data/mine --configs 1000")
    p.add_argument("program", type=Path, metavar="PROGRAM", help="a .pb (HloModuleProto or HloProto) or HLO text file")
    p.add_argument("--out", type=Path, required=True, help="folder for <stem>.npz, <stem>.json and <stem>-tiles/")
    p.add_argument("--configs", type=int, default=1000, help="candidate layout configs to write (default 1000)")
    p.add_argument("--search", choices=("random", "default"), default="random",
                   help="how the candidates are drawn: as the random or as the default collections' search")
    p.add_argument("--tile-configs", type=int, default=100, help="candidate tile configs per fusion (default 100)")
    p.add_argument("--no-tiles", action="store_true", help="write no tile graphs")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from pipelines.hlo import featurize_program

    result = featurize_program(args.program, args.out, configs=args.configs, search=args.search, seed=args.seed,
                               tiles=not args.no_tiles, tile_configs_per_fusion=args.tile_configs)
    s = result.summary
    print(f"{args.program}: {s['nodes']} nodes, {s['edges']} edges, {s['configurable_nodes']} configurable, "
          f"{s['fusions']} fusion(s)")
    for path in [result.layout_path, *result.tile_paths, result.sidecar]:
        if path is not None:
            print(path)
    return 0

