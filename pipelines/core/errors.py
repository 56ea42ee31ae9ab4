"""The project's own error types: every expected failure is one of these, with a clear message."""

from __future__ import annotations

import re
from pathlib import Path

# The ``user:password`` before an ``@`` in an address, with or without its scheme (libraries echo the
# address without it): a whole run of characters that cannot surround an address part, just before an
# ``@``. The look-behind lets only the start of such a run begin a match, so a long run is scanned once
# (a pattern free to start anywhere in it rescanned it from each position: quadratic in its length).
_BEFORE_AT = re.compile(r"(?<![^\s/@'\"])[^\s/@'\"]+(?=@)")


def _hide_secret(match: re.Match) -> str:
    user, colon, secret = match.group().partition(":")
    return f"{user}:***" if colon and secret else match.group()


def redact_credentials(text: str, *secrets: str | None) -> str:
    """``tcp://user:secret@host`` -> ``tcp://user:***@host`` in any text shown to a user or logged;
    each of ``secrets`` is also replaced wherever it appears. Linear in the length of ``text``."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return _BEFORE_AT.sub(_hide_secret, text)


class PipelineError(Exception):
    """Base class for errors the command line reports as a message instead of a traceback."""


class FormatError(PipelineError):
    """A data file does not match the TpuGraphs format; names the file and the problem."""

    def __init__(self, path: Path | str, problem: str):
        self.path = Path(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")

    def __reduce__(self):  # so the error survives the trip back from a worker process
        return type(self), (self.path, self.problem)


class ConfigError(PipelineError):
    """A configuration value, override or command-line argument is invalid."""


class SubmissionError(PipelineError):
    """A submission file is malformed; carries every violation found."""

    def __init__(self, path: Path | str, violations: list[str]):
        self.path = Path(path)
        self.violations = list(violations)
        shown = "\n  ".join(self.violations[:50])
        more = f"\n  ... and {len(self.violations) - 50} more" if len(self.violations) > 50 else ""
        super().__init__(f"{self.path}: {len(self.violations)} problem(s):\n  {shown}{more}")

    def __reduce__(self):
        return type(self), (self.path, self.violations)
