"""The project's own error types: every expected failure is one of these, with a clear message."""

from __future__ import annotations

import re
from pathlib import Path

# user:password@ in an address, with or without its scheme (libraries echo the address without it)
_URL_CREDENTIALS = re.compile(r"(?P<user>(?:[A-Za-z][A-Za-z0-9+.-]*://)?[^\s/@:'\"]*):(?P<secret>[^\s/@'\"]+)@")


def redact_credentials(text: str, *secrets: str | None) -> str:
    """``tcp://user:secret@host`` -> ``tcp://user:***@host`` in any text shown to a user or logged;
    each of ``secrets`` is also replaced wherever it appears."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return _URL_CREDENTIALS.sub(lambda m: f"{m['user']}:***@", text)


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
