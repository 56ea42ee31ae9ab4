"""What every command module shares: its parser's shape (help formatter, example, exit codes, the
``--verbose``/``--quiet`` switches), the option groups several commands take, and the run report a
publishing command draws."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

EXIT_CODES_HELP = ("exit codes: 0 success, 1 data or pipeline error, 2 usage error (bad option, argument or config "
                   "value), 130 interrupted")


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions and epilogs as written; every option that takes a value shows its default, unless
    its help already says it in words ("default: ...")."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text or not action.option_strings or action.nargs == 0 or action.required \
                or action.default is argparse.SUPPRESS:
            return text
        shown = "none" if action.default in (None, [], "") else "%(default)s"
        return f"{text} (default: {shown})".lstrip()


def chatter(parser: argparse.ArgumentParser, default: object) -> None:
    """The ``--verbose``/``--quiet`` switches: on the main parser (default 0) and on every command (no
    default of its own, so a switch before the command is not reset after it)."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("-v", "--verbose", dest="verbosity", action="store_const", const=1, default=default,
                       help="also print debug messages (e.g. GNN epochs of fold jobs run in this process)")
    group.add_argument("-q", "--quiet", dest="verbosity", action="store_const", const=-1, default=default,
                       help="print warnings, errors and the command's result only, no progress")


def prog() -> str:
    """``tpugraphs`` when called through the console script, else ``python -m pipelines``."""
    name = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    return name if name and not name.endswith((".py", "__main__.py")) and name not in ("-c", "-m") \
        and "pytest" not in name else "python -m pipelines"


def command_parser(sub: argparse._SubParsersAction, name: str, help_text: str, example: str) -> argparse.ArgumentParser:
    """A subcommand parser whose --help ends with one example (``PROG`` is how it was called), with
    the ``--verbose``/``--quiet`` switches of every command."""
    parser = sub.add_parser(name, help=help_text, description=help_text[:1].upper() + help_text[1:] + ".",
                            epilog=f"example:\n  {prog()} {example}\n\n{EXIT_CODES_HELP}",
                            formatter_class=HelpFormatter)
    chatter(parser, argparse.SUPPRESS)
    return parser


def action_parser(actions: argparse._SubParsersAction, name: str, help_text: str,
                  example: str) -> argparse.ArgumentParser:
    """An action of a command with actions (``runs list``), its --help ending with one example."""
    return actions.add_parser(name, help=help_text, epilog=f"example:\n  {prog()} {example}\n\n{EXIT_CODES_HELP}")


def seed(text: str) -> int:
    """A ``--seed`` value: an integer in [0, 2^32), as numpy and LightGBM take."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if not 0 <= value < 2**32:
        raise argparse.ArgumentTypeError(f"must lie in [0, 2^32), got {text}")
    return value


def config_options(parser: argparse.ArgumentParser, *, config_help: str | None = None, prefix: str = "") -> None:
    """``--config NAME|FILE`` and the repeatable ``--set SECTION.KEY=VALUE``; ``prefix`` heads both
    helps where they only apply with another option (``with --explain: ``)."""
    parser.add_argument("--config", default=None,
                        help=config_help or f"{prefix}config name (e.g. quick) or TOML file (default: base)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help=f"{prefix}override one config value (repeatable; default: none)")


def announce_config(given: str | None, default: str, why: str = "") -> str:
    """Log the ``config:`` line a command that trains starts with (which config, and why that one), and
    return the config's name or path: ``given`` (``--config``) if set, else ``default``."""
    import logging

    if given is not None:
        logging.getLogger("pipelines.commands").info(f"config: {given} (--config)")
        return given
    logging.getLogger("pipelines.commands").info(f"config: {default} (no --config given{'; ' + why if why else ''})")
    return default


def report_new_run(run_id: str, submissions_dir: Path) -> None:
    """Every command that publishes a run draws its report.html (the flows only write run outputs)."""
    from pipelines.reports.report import write_run_report

    write_run_report(run_id, submissions_dir)
