"""The `synth` command."""

from __future__ import annotations

import argparse
from pathlib import Path

from pipelines.commands.common import command_parser, seed


def add(sub: argparse._SubParsersAction) -> None:
    p = command_parser(sub, "synth", "write a synthetic dataset in the exact TpuGraphs on-disk format",
                              "synth --out data/synthetic-small --scale small --seed 0")
    p.add_argument("--out", type=Path, required=True, help="data root to create (Kaggle layout)")
    p.add_argument("--scale", choices=("tiny", "small", "medium", "full"), default="small")
    p.add_argument("--seed", type=seed, default=0)
    p.add_argument("--variant", type=int, default=0,
                   help="cost-model variant: 0 = the original constants, N >= 1 = constants drawn from "
                        "documented ranges (pipelines/synth/costmodel.py)")
    p.add_argument("--family", default="reference",
                   help="cost-model family, the rules the measured runtimes follow: reference (the default, "
                        "pipelines/synth/costmodel.py), mxu_strict, copy_fusion, packed_tiles, heldout "
                        "(pipelines/synth/families/)")
    p.add_argument("--recurrent", action=argparse.BooleanOptionalAction, default=None,
                   help="include the recurrent (LSTM while-loop) programs among the xla layout graphs "
                        "(default: yes for every family but reference, whose default worlds keep their bytes)")
    p.add_argument("--limit", type=int, default=None,
                   help="write at most this many files per collection and split (for benchmarks; default: all)")
    p.add_argument("--collections", default=None, help="comma-separated collection names (default: all)")
    p.add_argument("--jobs", type=int, default=1, help="parallel worker processes")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from pipelines.synth import generate_world

    summary = generate_world(args.out, scale=args.scale, seed=args.seed, limit=args.limit,
                             collections=args.collections, jobs=args.jobs, variant=args.variant,
                             family=args.family, recurrent=args.recurrent)
    print(summary)
    return 0

