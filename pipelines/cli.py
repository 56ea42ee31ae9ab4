"""Command line: ``python -m pipelines <command> ...`` (also the ``tpugraphs`` console script).

The entry point only: it builds the parser from the command modules (:mod:`pipelines.commands`, one
per command), calls the chosen command's handler and maps errors to exit codes. Expected failures
raise :class:`PipelineError` and are printed as one clear message.

Exit codes: 0 success; 1 data or pipeline error (a bad or missing file, a failed stage, Kaggle
refused, a full disk); 2 usage error (unknown command or option, a bad argument or config value);
130 interrupted (Ctrl-C, or SIGTERM).
"""

from __future__ import annotations

import argparse
import errno
import sys
from typing import Callable

from pipelines.commands import COMMANDS
from pipelines.commands.common import EXIT_CODES_HELP, HelpFormatter, chatter, prog
from pipelines.core.errors import ConfigError, PipelineError, redact_credentials

_DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EROFS, getattr(errno, "EDQUOT", errno.ENOSPC)})

Handler = Callable[[argparse.Namespace], int | None]

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


def _version() -> str:
    from pipelines import __version__

    return f"pipelines {__version__} (Python {sys.version.split()[0]})"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog(), description="TpuGraphs runtime-ranking pipelines: data, training, ensembling, submissions.",
        epilog=f"example:\n  {prog()} -q run --data-root data/kaggle\n\n'{prog()} COMMAND --help' shows a "
               f"command's options and an example.\n\n{EXIT_CODES_HELP}",
        formatter_class=HelpFormatter)
    parser.add_argument("--version", action="version", version=_version())
    chatter(parser, 0)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for command in COMMANDS:
        command.add(sub)
    for command in _subparsers(parser):
        command.formatter_class = HelpFormatter  # `runs list` and `runs compare` too
        for action in command._actions:  # an option without help text still shows its default
            if action.help is None and action.option_strings and action.nargs != 0:
                action.help = "(default: %(default)s)" if action.default is not None else "(default: none)"
    return parser


def _subparsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """Every command parser under ``parser`` (``runs list`` too), depth first."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in dict.fromkeys(action.choices.values()):
                found += [child, *_subparsers(child)]
    return found


def main(argv: list[str] | None = None) -> int:
    from pipelines.core.logs import console_logging
    from pipelines.core.parallel import terminate_as_interrupt

    args = build_parser().parse_args(argv)
    handler: Handler = args.handler
    try:
        with console_logging(getattr(args, "verbosity", 0)), terminate_as_interrupt():
            return int(handler(args) or 0)
    except ConfigError as exc:  # a bad argument or config value: the caller's usage
        print(redact_credentials(f"error: {exc}"), file=sys.stderr)
        return EXIT_USAGE
    except PipelineError as exc:
        print(redact_credentials(f"error: {exc}"), file=sys.stderr)
        return EXIT_ERROR
    except OSError as exc:
        # A file system refusal outside the checked places (a full disk, a path that is a file, a
        # folder that cannot be created): one message naming the path(s), not a traceback.
        where = " -> ".join(str(f) for f in (exc.filename, exc.filename2) if f) or "output"
        action = "cannot write" if exc.errno in _DISK_ERRNOS else "file system error"
        print(redact_credentials(f"error: {where}: {action}: {exc.strerror or exc}"), file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        # finished stages (and a training stage's finished fold jobs) are kept: the same command resumes
        print("interrupted: rerun the same command to resume (finished stages are cached and reused)",
              file=sys.stderr)
        return EXIT_INTERRUPTED
