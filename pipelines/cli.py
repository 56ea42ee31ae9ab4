"""Command line: ``python -m pipelines <command> ...`` (also the ``tpugraphs`` console script).

Each command has an ``_add_<name>`` function declaring its arguments and a ``_run_<name>`` handler.
Handlers import their modules lazily so ``--help`` and light commands stay fast (torch is heavy).
Expected failures raise :class:`PipelineError` and are printed as one clear message, exit code 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable

from pipelines.errors import PipelineError

Handler = Callable[[argparse.Namespace], int | None]


# ----------------------------------------------------------------------------- synth


def _add_synth(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("synth", help="write a synthetic dataset in the exact TpuGraphs on-disk format")
    p.add_argument("--out", type=Path, required=True, help="data root to create (Kaggle layout)")
    p.add_argument("--scale", choices=("tiny", "small", "full"), default="small")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--limit", type=int, default=None,
                   help="write at most this many files per collection and split (for benchmarks)")
    p.add_argument("--collections", default=None, help="comma-separated collection names (default: all)")
    p.add_argument("--jobs", type=int, default=1, help="parallel worker processes")
    p.set_defaults(handler=_run_synth)


def _run_synth(args: argparse.Namespace) -> int:
    from pipelines.synth import generate_world

    summary = generate_world(args.out, scale=args.scale, seed=args.seed, limit=args.limit,
                             collections=args.collections, jobs=args.jobs)
    print(summary)
    return 0


# ----------------------------------------------------------------------------- submissions


def _add_validate_submission(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("validate-submission", help="check a submission CSV against a data root's test files")
    p.add_argument("--data-root", type=Path, required=True)
    p.add_argument("--split", default="test", choices=("train", "valid", "test"))
    p.add_argument("file", type=Path)
    p.set_defaults(handler=_run_validate_submission)


def _run_validate_submission(args: argparse.Namespace) -> int:
    from pipelines.submission import validate_submission

    rows = validate_submission(args.file, args.data_root, split=args.split)
    print(f"{args.file}: valid submission with {rows} rows")
    return 0


def _add_score(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("score", help="score a submission written for a labelled split (e.g. valid)")
    p.add_argument("--data-root", type=Path, required=True)
    p.add_argument("--split", default="valid", choices=("train", "valid"))
    p.add_argument("--submission", type=Path, required=True)
    p.set_defaults(handler=_run_score)


def _run_score(args: argparse.Namespace) -> int:
    from pipelines.submission import score_submission

    report = score_submission(args.submission, args.data_root, split=args.split)
    print(report.to_text())
    return 0


# ----------------------------------------------------------------------------- demo


def _add_demo(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="the README's main job on the embedded synthetic world")
    p.add_argument("--data-root", type=Path, default=Path("data/synthetic-small"))
    p.add_argument("--scale", choices=("tiny", "small", "full"), default="small")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(handler=_run_demo)


def _run_demo(args: argparse.Namespace) -> int:
    from pipelines.demo import run_demo

    return run_demo(data_root=args.data_root, scale=args.scale, seed=args.seed)


# ----------------------------------------------------------------------------- entry point

_COMMANDS: tuple[Callable[[argparse._SubParsersAction], None], ...] = (
    _add_synth,
    _add_validate_submission,
    _add_score,
    _add_demo,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m pipelines", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for add in _COMMANDS:
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handler: Handler = args.handler
    try:
        return int(handler(args) or 0)
    except PipelineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
