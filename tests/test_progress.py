"""Throttled progress lines: silent for short loops, one line per interval with an ETA, a closing line."""

from __future__ import annotations

import logging

from pipelines.core.logs import tagged
from pipelines.core.progress import Progress, format_duration


def test_progress_logs_at_most_once_per_interval_with_an_eta_and_a_closing_line(caplog):
    caplog.set_level(logging.INFO, logger="pipelines")
    now = [0.0]
    progress = Progress("[prune]", 4, every_s=10, clock=lambda: now[0])
    with tagged("tile:xla"):  # the collection whose stage runs
        for t in (2.0, 11.0, 12.0, 40.0):
            now[0] = t
            progress.step()
    assert caplog.messages == ["tile:xla [prune] 2/4 files (0.2/s, ETA 11s)", "tile:xla [prune] 4/4 files (0.1/s, 40s)"]


def test_a_short_loop_stays_silent(caplog):
    caplog.set_level(logging.INFO, logger="pipelines")
    progress = Progress("[features]", 3, every_s=10, clock=lambda: 1.0)
    for _ in range(3):
        progress.step()
    assert caplog.messages == []


def test_format_duration():
    assert [format_duration(s) for s in (5, 65, 7300)] == ["5s", "1m05s", "2h01m"]
