"""Progress lines for long loops, logged (INFO, ``pipelines.core.progress``) like every other message.

A line says ``<label> i/N files (rate, ETA)``, at most one every ``every_s`` seconds, and a last
one when the loop ends if it logged any (a loop shorter than ``every_s`` stays silent: the stage's
"done in Xs" says enough). So a plain log (a file, CI, ``nohup``) gets one line per meaningful
step instead of a redrawn bar, and a terminal gets the same lines. Standard library only.
"""

from __future__ import annotations

import logging
import time
from typing import Callable

from pipelines.core.logs import with_tag

logger = logging.getLogger(__name__)

PROGRESS_EVERY_S = 10.0  # at most one progress line per loop this often


def format_duration(seconds: float) -> str:
    """``42s``, ``3m05s``, ``2h07m``."""
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds // 60 % 60:02d}m"


class Progress:
    """Counts items of a loop of known length and logs throttled ``i/N`` lines with an ETA."""

    def __init__(self, label: str, total: int, *, unit: str = "files",
                 every_s: float = PROGRESS_EVERY_S, clock: Callable[[], float] = time.monotonic):
        self.label, self.total, self.unit = label, int(total), unit
        self.every_s, self.clock = every_s, clock
        self.done = 0
        self.started = clock()
        self.last_logged: float | None = None

    def step(self, count: int = 1) -> None:
        self.done += count
        now = self.clock()
        last = self.done >= self.total
        since = now - (self.started if self.last_logged is None else self.last_logged)
        if (last and self.last_logged is None) or (not last and since < self.every_s):
            return
        self.last_logged = now
        elapsed = now - self.started
        text = f"{self.label} {self.done}/{self.total} {self.unit}"
        if elapsed > 0 and self.done:
            rate = self.done / elapsed
            text += f" ({rate:.1f}/s" + (f", ETA {format_duration((self.total - self.done) / rate)})" if not last
                                         else f", {format_duration(elapsed)})")
        logger.info(with_tag(text))
