"""The `synth` command."""

from __future__ import annotations

import argparse
from pathlib import Path

from pipelines.commands.common import command_parser, seed
from pipelines.core.errors import ConfigError


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
    p.add_argument("--programs", choices=PROGRAM_SOURCES, default="synthetic",
                   help="where the programs come from: synthetic (pipelines/synth/programs.py) or lowered (public "
                        "model code lowered by jax, the optional 'lowered' extra; docs/lowered.md)")
    p.add_argument("--lowered-cache", type=Path, default=None,
                   help="with --programs lowered: the folder of lowered modules (default: data/lowered)")
    p.set_defaults(handler=run)


PROGRAM_SOURCES = ("synthetic", "lowered")
# options of the synthetic programs' worlds that a lowered world does not take
_SYNTHETIC_ONLY = (("variant", 0, "--variant"), ("recurrent", None, "--recurrent"), ("limit", None, "--limit"))


def run(args: argparse.Namespace) -> int:
    from pipelines.synth import generate_world

    if args.programs == "lowered":
        return run_lowered(args)
    if args.lowered_cache is not None:
        raise ConfigError("--lowered-cache applies to --programs lowered only")
    summary = generate_world(args.out, scale=args.scale, seed=args.seed, limit=args.limit,
                             collections=args.collections, jobs=args.jobs, variant=args.variant,
                             family=args.family, recurrent=args.recurrent)
    print(summary)
    return 0



def run_lowered(args: argparse.Namespace) -> int:
    from pipelines.synth.lowered import cache, generate_lowered_world

    given = [flag for name, default, flag in _SYNTHETIC_ONLY if getattr(args, name) != default]
    if given:
        raise ConfigError(f"{', '.join(given)}: not for --programs lowered (its programs are the catalogue's, "
                          "its constants the family's)")
    print(generate_lowered_world(args.out, scale=args.scale, seed=args.seed, family=args.family,
                                 collections=args.collections, jobs=args.jobs,
                                 cache_dir=args.lowered_cache or cache.DEFAULT_CACHE))
    return 0
