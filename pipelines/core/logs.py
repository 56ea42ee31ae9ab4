"""Messages of the pipeline through the standard :mod:`logging` module.

Every module logs to its own ``logging.getLogger(__name__)``, under the ``pipelines`` logger. The
command line calls :func:`setup_logging` once: INFO lines (progress, stage cached/computed/done,
where a submission went) are printed to stdout as the plain message, as ``print`` did before, and
warnings keep their ``warning:`` text. Used as a library (tests, notebooks), nothing is set up: INFO
lines are dropped and warnings reach stderr through logging's last-resort handler; ``caplog`` sees
them all.

Messages logged while a collection's data stages run carry its name (``tile:xla [prune] cached
...``) through :func:`tagged`, a context rather than a parameter threaded through every call.

Worker processes (joblib's loky, Dask) have no handler: what a fold job logs there (a GNN's epoch
lines) is dropped on purpose, as before; the parent logs each finished job instead.
"""

from __future__ import annotations

import contextvars
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager

ROOT = "pipelines"
_TAG: contextvars.ContextVar[str] = contextvars.ContextVar("pipelines_log_tag", default="")


class _ConsoleHandler(logging.Handler):
    """Plain messages to the *current* ``sys.stdout`` (looked up per message, so a redirected or
    captured stdout receives them)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            stream = sys.stdout
            stream.write(self.format(record) + "\n")
            stream.flush()
        except Exception:  # noqa: BLE001 - logging's own contract: report, never raise
            self.handleError(record)


def setup_logging(verbosity: int = 0) -> None:
    """Print the ``pipelines`` loggers' messages as plain lines on stdout: INFO and above
    (``verbosity`` 0), DEBUG too (> 0) or warnings and errors only (< 0). Calling it again replaces
    the handler of the previous call."""
    logger = logging.getLogger(ROOT)
    for handler in [h for h in logger.handlers if isinstance(h, _ConsoleHandler)]:
        logger.removeHandler(handler)
    handler = _ConsoleHandler()
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG if verbosity > 0 else logging.INFO if verbosity == 0 else logging.WARNING)


@contextmanager
def console_logging(verbosity: int = 0) -> Iterator[None]:
    """:func:`setup_logging` for the length of the block, then the logging state as it was (so a
    command run in-process, e.g. ``cli.main`` from a test, leaves no handler behind)."""
    logger = logging.getLogger(ROOT)
    handlers, level = list(logger.handlers), logger.level
    setup_logging(verbosity)
    try:
        yield
    finally:
        logger.handlers[:] = handlers
        logger.setLevel(level)


@contextmanager
def tagged(tag: str) -> Iterator[None]:
    """Within the block, :func:`with_tag` prefixes messages with ``tag`` (e.g. a collection name)."""
    token = _TAG.set(tag)
    try:
        yield
    finally:
        _TAG.reset(token)


def with_tag(message: str) -> str:
    """``message`` prefixed by the tag of the enclosing :func:`tagged` block, if any."""
    tag = _TAG.get()
    return f"{tag} {message}" if tag else message



@contextmanager
def silenced(*names: str, level: int = logging.WARNING) -> Iterator[None]:
    """Within the block, the named loggers drop messages below ``level`` (e.g. the per-stage lines of
    a loop that logs one summary line per step itself)."""
    loggers = [logging.getLogger(name) for name in names]
    before = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(level)
    try:
        yield
    finally:
        for logger, old in zip(loggers, before):
            logger.setLevel(old)
