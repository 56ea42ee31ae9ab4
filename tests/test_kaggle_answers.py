"""``submissions sync`` and ``submit`` against hostile answers and records (issue 78, item 4): Kaggle's
answer is checked for its shape, non-finite scores are dropped, records are strict JSON, and an upload
happens only once its record can be written (and, for a file, once it was validated or asked unvalidated).

The Kaggle API is a small fake passed as ``api_factory``; run folders are hand-built on the tiny world."""

from __future__ import annotations

import hashlib
import json
import shutil
import types
from datetime import datetime, timezone
from pathlib import Path

import pytest

from pipelines.core.errors import ConfigError, PipelineError
from pipelines.outputs.kaggle_io import submit_file, submit_run
from pipelines.outputs.leaderboard import sync_leaderboard
from pipelines.outputs.runs_table import LEADERBOARD_RECORD, SUBMITTED_RECORD

RUN = "20261201T000000Z-aaaaaaaa"


class Api:
    """What the kaggle package's KaggleApi offers here: pages of submissions, an upload that is recorded."""

    def __init__(self, pages: list = ()) -> None:
        self.pages, self.uploads = list(pages), []

    def competition_submissions(self, competition, page_number=1, page_size=100, **_):
        return self.pages[page_number - 1] if page_number <= len(self.pages) else []

    def competition_submit(self, file_name, message, competition, quiet=False):
        self.uploads.append((file_name, message))
        return types.SimpleNamespace(message="Successfully submitted")


def item(description: str, score, ref: int = 1):
    return types.SimpleNamespace(ref=ref, date=datetime(2026, 12, 1, 12, tzinfo=timezone.utc), description=description,
                                 file_name="submission.csv", public_score=score, private_score=None,
                                 status="COMPLETE", error_description=None)


@pytest.fixture
def run_dir(tiny_world: Path, tmp_path: Path) -> Path:
    """A published run folder whose submission is the world's sample submission (valid)."""
    folder = tmp_path / "subs" / RUN
    folder.mkdir(parents=True)
    shutil.copy(tiny_world / "sample_submission.csv", folder / "submission.csv")
    digest = hashlib.sha256((folder / "submission.csv").read_bytes()).hexdigest()
    (folder / "manifest.json").write_text(json.dumps({
        "run_id": RUN, "stages": {}, "data_root": str(tiny_world), "work_dir": str(tmp_path / "work"),
        "submission": {"file": "submission.csv", "rows": 1, "sha256": digest, "validated_against": str(tiny_world)}}))
    return folder


def strict_json(path: Path):
    def refuse(constant):
        raise ValueError(f"{path}: {constant} is not JSON")
    return json.loads(path.read_text(), parse_constant=refuse)


# ----------------------------------------------------------------------------- submissions sync


@pytest.mark.parametrize("page", [7, "20261201T000000Z-aaaaaaaa CV 0.5", {"description": "x"}, b"abc"])
def test_sync_refuses_an_answer_that_is_not_a_list_of_submissions(run_dir, page):
    api = Api([page])
    with pytest.raises(PipelineError, match="not a list of submissions"):
        sync_leaderboard(run_dir.parent, api_factory=lambda: api)
    assert not (run_dir / LEADERBOARD_RECORD).exists()


def test_sync_skips_entries_that_are_not_submissions_with_a_warning(run_dir, caplog):
    api = Api([[item(f"{RUN} CV 0.5", "0.7"), 42, "text", None]])
    result = sync_leaderboard(run_dir.parent, api_factory=lambda: api)
    assert result.fetched == 1 and "not a submission" in caplog.text
    assert strict_json(run_dir / LEADERBOARD_RECORD)["submissions"][0]["public_score"] == 0.7


@pytest.mark.parametrize("score", ["nan", "inf", "-Infinity", float("nan"), float("inf")])
def test_sync_drops_non_finite_scores_with_a_warning_and_writes_strict_json(run_dir, caplog, score):
    api = Api([[item(f"{RUN} CV 0.5", score)]])
    sync_leaderboard(run_dir.parent, api_factory=lambda: api)
    record = strict_json(run_dir / LEADERBOARD_RECORD)
    assert record["submissions"][0]["public_score"] is None
    assert "not a finite number" in caplog.text


# ----------------------------------------------------------------------------- submit


@pytest.mark.parametrize("record", ["{ garbled", json.dumps([{"message": "x"}]), json.dumps({"submissions": 5})])
def test_submit_checks_its_record_before_uploading(run_dir, record):
    (run_dir / SUBMITTED_RECORD).write_text(record)
    api = Api()
    with pytest.raises(PipelineError, match=SUBMITTED_RECORD):
        submit_run(RUN, submissions_dir=run_dir.parent, api_factory=lambda: api, allow_synthetic=True)
    assert api.uploads == [] and (run_dir / SUBMITTED_RECORD).read_text() == record


def test_submit_checks_the_record_can_be_written_before_uploading(run_dir):
    (run_dir / SUBMITTED_RECORD).mkdir()  # a directory in its place: replacing it would fail after the upload
    api = Api()
    with pytest.raises(PipelineError, match=SUBMITTED_RECORD):
        submit_run(RUN, submissions_dir=run_dir.parent, api_factory=lambda: api, allow_synthetic=True)
    assert api.uploads == []


def test_submit_records_after_a_good_upload(run_dir):
    api = Api()
    submit_run(RUN, submissions_dir=run_dir.parent, api_factory=lambda: api, allow_synthetic=True)
    submit_run(RUN, submissions_dir=run_dir.parent, api_factory=lambda: api, allow_synthetic=True, message="again")
    assert len(api.uploads) == 2 and [e["message"] for e in strict_json(run_dir / SUBMITTED_RECORD)
                                      ["submissions"]][1:] == ["again"]


def test_submit_a_file_without_a_data_root_is_refused_unless_asked_unvalidated(run_dir, tiny_world):
    api = Api()
    with pytest.raises(ConfigError, match="--data-root"):
        submit_file(run_dir / "submission.csv", "msg", api_factory=lambda: api)
    assert api.uploads == []
    submit_file(run_dir / "submission.csv", "msg", api_factory=lambda: api, unvalidated=True)
    assert len(api.uploads) == 1
