"""benchmarks/run.py never replaces a results file it did not write in this run."""
from benchmarks.run import unused_path


def test_a_second_run_on_the_same_day_gets_its_own_file(tmp_path):
    out = tmp_path / "results"
    first = unused_path(out, "2026-11-26-host")
    assert first == out / "2026-11-26-host.md" and out.is_dir()
    first.write_text("committed result")
    second = unused_path(out, "2026-11-26-host")
    assert second == out / "2026-11-26-host-2.md"
    second.write_text("x")
    assert unused_path(out, "2026-11-26-host") == out / "2026-11-26-host-3.md"
    assert first.read_text() == "committed result"
