"""The attack replay (benchmarks/attack.py) judges exit codes by the command line's documented contract."""

from __future__ import annotations

import pytest

from benchmarks.attack import Outcome, judge, run_cli
from pipelines.cli import EXIT_CODES_HELP

pytestmark = pytest.mark.slow  # end-to-end: left out of make test-quick


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
    # gc said "removed 2 stage folder(s)" with exit 0, and a run's trained stages were among them
    assert judge("reject", outcome(0), "data lost: 1 gone, e.g. work/train-gbdt/x") == "data lost"
    assert judge("reject", outcome(2, "error: x"), "data lost: 1 gone") == "data lost"


def test_a_real_data_error_from_the_command_line_is_judged_clean(tmp_path):
    """One live case, end to end: a missing data root exits 1 with an ``error:`` line, judged clean."""
    (tmp_path / "sub.csv").write_text("ID,TopConfigs\n")
    got = run_cli(["validate-submission", "--data-root", str(tmp_path / "absent"), str(tmp_path / "sub.csv")],
                  tmp_path, 60)
    assert judge("reject", got, None) == "rejected cleanly", (got.rc, got.stderr)


def test_the_fast_part_of_the_replay_stays_clean(tmp_path):
    """The quick cases of ``python -m benchmarks.attack`` (``--fast``: issue 71's cheap ones, every class but
    the GNN-file and race cases, which the full replay runs; issue 78's that need no training), end to end: no
    traceback, no wrong acceptance, no data lost, no planted code run, no raw data changed, no case whose input
    could not be built. ~45 s."""
    import json

    from benchmarks.attack import build_cases, is_bad, main

    fast = [case for case in build_cases(tmp_path / "bombs") if case.fast]
    assert len(fast) >= 15 and {c.item for c in fast} >= {"71.2", "71.3", "71.4", "71.5", "71.7"}
    issue78 = [c.item for c in fast if c.item.startswith("78.")]  # issue 78's classes, >= 2 quick cases each
    assert all(issue78.count(item) >= 2 for item in ("78.1", "78.2", "78.4", "78.5", "78.6", "78.L"))
    code = main(["--fast", "--out", str(tmp_path / "out"), "--scratch", str(tmp_path / "scratch")])
    rows = json.loads((tmp_path / "out" / "attack.json").read_text())
    assert len(rows) == len(fast)
    bad = [(r["case"], r["verdict"], r.get("problem")) for r in rows if is_bad(r)]
    assert code == 0 and not bad, bad
    assert not any(r.get("code_executed") or r.get("raw_data_changed") for r in rows)
