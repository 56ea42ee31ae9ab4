"""The attack replay (benchmarks/attack.py) judges exit codes by the command line's documented contract."""

from __future__ import annotations

import pytest

from benchmarks.attack import Outcome, judge, run_cli
from pipelines.cli import EXIT_CODES_HELP


def outcome(rc, stderr="", stdout="", timed_out=False):
    return Outcome(rc, stdout, stderr, 0.1, 10.0, timed_out)


@pytest.mark.parametrize("rc", [1, 2])
def test_a_data_error_and_a_usage_error_are_both_clean_rejections(rc):
    assert "1 data" in EXIT_CODES_HELP and "2 usage" in EXIT_CODES_HELP  # the contract judged against
    assert judge("reject", outcome(rc, "error: x.npz: bad"), None) == "rejected cleanly"


def test_what_is_not_a_clean_rejection():
    assert judge("reject", outcome(0), None) == "accepted wrongly"
    assert judge("reject", outcome(1, "error: x"), "the CSV changed") == "accepted wrongly"
    assert judge("reject", outcome(3, "error: x"), None) == "accepted wrongly"
    assert judge("reject", outcome(1, "Traceback (most recent call last):\n"), None) == "traceback"
    assert judge("accept", outcome(None, timed_out=True), None) == "timeout"
    assert judge("accept", outcome(0), None) == "accepted as intended"


def test_a_real_data_error_from_the_command_line_is_judged_clean(tmp_path):
    """One live case, end to end: a missing data root exits 1 with an ``error:`` line, judged clean."""
    (tmp_path / "sub.csv").write_text("ID,TopConfigs\n")
    got = run_cli(["validate-submission", "--data-root", str(tmp_path / "absent"), str(tmp_path / "sub.csv")],
                  tmp_path, 60)
    assert judge("reject", got, None) == "rejected cleanly", (got.rc, got.stderr)
