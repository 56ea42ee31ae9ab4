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
import difflib
import errno
import re
import sys
from typing import Callable, Iterable, NoReturn

from pipelines.commands import COMMANDS
from pipelines.commands.common import EXIT_CODES_HELP, HelpFormatter, chatter, prog
from pipelines.core.errors import ConfigError, PipelineError, redact_credentials

_DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EROFS, getattr(errno, "EDQUOT", errno.ENOSPC)})

Handler = Callable[[argparse.Namespace], int | None]

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


def _version() -> str:
    from pipelines import __version__

    return f"pipelines {__version__} (Python {sys.version.split()[0]})"


def closest(word: str, candidates: Iterable[str]) -> str | None:
    """The candidate ``word`` was most likely meant to be (difflib's closest, if close enough)."""
    found = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return found[0] if found else None


def option_hints(words: Iterable[str], options: Iterable[str]) -> str:
    """``"; did you mean --models?"`` for the ``--`` words that look like mistyped ``options``, or ""."""
    by_name = {o[2:]: o for o in options if o.startswith("--")}  # compared without the "--" all share

    def meant_by(word: str) -> str | None:
        found = closest(word.split("=", 1)[0][2:], by_name)
        return by_name[found] if found else None

    meant = {word: meant_by(word) for word in words
             if word.startswith("--") and word.split("=", 1)[0][2:] not in by_name}
    hints = [f"{option} (for {word})" if len(meant) > 1 else option for word, option in meant.items() if option]
    return f"; did you mean {', '.join(hints)}?" if hints else ""


class SuggestingParser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors say what was probably meant: the closest choice for a mistyped
    command, action or option value, the closest option for a mistyped one (also when a required option
    is reported missing because it was mistyped). Its commands' parsers are of this class too."""

    _INVALID_CHOICE = re.compile(r"invalid choice: '([^']*)' \(choose from (.*)\)$")

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        self._given = list(sys.argv[1:] if args is None else args)  # for error()'s hints
        return super().parse_known_args(args, namespace)

    def options(self) -> list[str]:
        return [o for action in self._actions for o in action.option_strings]

    def error(self, message: str) -> NoReturn:
        match = self._INVALID_CHOICE.search(message)
        if match:
            meant = closest(match.group(1), re.findall(r"'([^']*)'", match.group(2)))
            message += f"; did you mean {meant!r}?" if meant else ""
        elif message.startswith("the following arguments are required"):
            message += option_hints(getattr(self, "_given", []), self.options())
        super().error(message)


def unknown_options_error(parser: SuggestingParser, args: argparse.Namespace, extras: list[str]) -> NoReturn:
    """The usage error for arguments no parser took, from the parser of the command they followed,
    with the option each mistyped one was probably meant to be (the command's options or the program's)."""
    chain = [parser]
    for dest in ("command", "action"):  # `runs list --wide`: the action's own parser
        for action in chain[-1]._actions:
            if isinstance(action, argparse._SubParsersAction) and getattr(args, dest, None) in action.choices:
                chain.append(action.choices[getattr(args, dest)])
    options = [o for command in chain for o in command.options()]
    chain[-1].error(f"unrecognized arguments: {' '.join(extras)}" + option_hints(extras, options))


def build_parser() -> argparse.ArgumentParser:
    parser = SuggestingParser(
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

    parser = build_parser()
    args, extras = parser.parse_known_args(argv)
    if extras:
        unknown_options_error(parser, args, extras)
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
