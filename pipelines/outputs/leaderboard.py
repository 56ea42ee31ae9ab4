"""``submissions sync``: fetch the competition's scores of earlier uploads and file them with the runs.

Kaggle lists this account's submissions (``KaggleApi.competition_submissions``: description, date,
file name, status, public and private score). Each is matched to the run that uploaded it: the
description equals a message that run's ``submitted.json`` records (``submit`` wrote it; the nearest
upload time breaks a tie between runs that used one message), or it starts with a run-id under the
submissions folder. A matched run gains ``leaderboard.json`` (every Kaggle submission of it, the
time of the sync); ``runs list`` shows its public score beside its CV. Unmatched submissions (made
by hand, or from another machine) are reported, never filed.

:func:`match_submissions` is pure; :func:`sync_leaderboard` is the I/O shell (the kaggle package
through :func:`pipelines.outputs.kaggle_io.kaggle_api`, or a test's ``api_factory``).
"""

from __future__ import annotations

import enum
import json
import logging
import math
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from pipelines.core import paths
from pipelines.core.atomic import write_text_atomic
from pipelines.core.errors import PipelineError
from pipelines.outputs.kaggle_io import COMPETITION, explain_kaggle_error, kaggle_api
from pipelines.outputs.runs_table import LEADERBOARD_RECORD, read_manifest, read_submitted

logger = logging.getLogger(__name__)

PAGE_SIZE = 100
MAX_PAGES = 50


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, datetime):
        return (value if value.tzinfo else value.replace(tzinfo=timezone.utc)).isoformat(timespec="seconds")
    text = str(value).strip()
    return text or None


def _score(value: Any, what: str) -> float | None:
    """A score as a finite float, or None (absent, not a number, or NaN/infinite: warned about, since
    JSON has no such value and a run's public score must be a real one)."""
    if value is None or isinstance(value, bool):
        return None
    try:
        score = float(value) if not isinstance(value, str) or value.strip() else None
    except (TypeError, ValueError, OverflowError):
        return None
    if score is not None and not math.isfinite(score):
        logger.warning(f"warning: {what}: Kaggle's score {value!r} is not a finite number; dropped")
        return None
    return score


def submission_record(item: Any) -> dict[str, Any]:
    """One Kaggle submission (an ``ApiSubmission`` or anything with its attributes) as plain JSON."""
    def get(name: str) -> Any:
        return item.get(name) if isinstance(item, Mapping) else getattr(item, name, None)

    status = _text(get("status")) or ""
    description = _text(get("description")) or ""
    what = f"submission {description!r}"
    return {"ref": _text(get("ref")), "date": _text(get("date")), "description": description,
            "file_name": _text(get("file_name")), "status": status.removeprefix("SubmissionStatus.").lower(),
            "public_score": _score(get("public_score"), what), "private_score": _score(get("private_score"), what),
            "error": _text(get("error_description"))}


def _is_submission(item: Any) -> bool:
    """An ``ApiSubmission`` (or a mapping of its fields): what a page of Kaggle's answer must hold."""
    if isinstance(item, Mapping):
        return True
    if isinstance(item, (str, bytes, int, float, bool, list, tuple)) or item is None:
        return False
    return any(hasattr(item, name) for name in ("description", "ref", "public_score"))


def _seconds(text: str | None) -> float | None:
    try:
        moment = datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    except (TypeError, ValueError):
        return None
    return (moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)).timestamp()


def match_submissions(kaggle: Sequence[Mapping[str, Any]], uploads: Mapping[str, Sequence[Mapping[str, Any]]]
                      ) -> tuple[dict[str, list[dict[str, Any]]], list[dict[str, Any]]]:
    """Kaggle's submissions by the run that made them (``uploads``: run-id -> its ``submitted.json``
    entries), and those no run claims. See the module docstring for the rule."""
    by_message: dict[str, list[tuple[str, float | None]]] = {}
    for run_id, entries in uploads.items():
        for entry in entries:
            by_message.setdefault(str(entry.get("message") or ""), []).append(
                (run_id, _seconds(entry.get("submitted_at"))))
    matched: dict[str, list[dict[str, Any]]] = {}
    unmatched = []
    for item in kaggle:
        candidates = by_message.get(item["description"]) or []
        run_id = None
        if candidates:
            when = _seconds(item.get("date"))
            run_id = min(candidates, key=lambda c: abs((c[1] or 0) - (when or 0)) if when and c[1] else 0)[0]
        else:
            run_id = next((r for r in uploads if item["description"].startswith(r)), None)
        if run_id is None:
            unmatched.append(item)
        else:
            matched.setdefault(run_id, []).append(item)
    return matched, unmatched


@dataclass(frozen=True)
class SyncResult:
    fetched: int
    matched: dict[str, list[dict[str, Any]]]
    unmatched: list[dict[str, Any]]

    def describe(self) -> str:
        lines = [f"{self.fetched} Kaggle submission(s) fetched; {sum(map(len, self.matched.values()))} filed with "
                 f"{len(self.matched)} run(s)"]
        for run_id, items in sorted(self.matched.items()):
            for item in items:
                score = "-" if item["public_score"] is None else f"{item['public_score']:.4f}"
                lines.append(f"  {run_id}  public {score}  {item['status'] or '?'}  {item['date'] or '?'}")
        for item in self.unmatched:
            lines.append(f"  not from a run here: {item['description']!r} ({item['date'] or '?'})")
        return "\n".join(lines)


def fetch_submissions(api: Any) -> list[dict[str, Any]]:
    """Every submission of this account to the competition, page by page."""
    out: list[dict[str, Any]] = []
    for page in range(1, MAX_PAGES + 1):
        try:
            items = api.competition_submissions(COMPETITION, page_number=page, page_size=PAGE_SIZE)
        except Exception as exc:
            raise explain_kaggle_error(exc, f"listing the submissions to {COMPETITION}") from None
        if items is None:
            items = []
        if not isinstance(items, (list, tuple)):
            shown = repr(items)
            raise PipelineError(f"Kaggle's answer to listing the submissions to {COMPETITION} (page {page}) is not a "
                                f"list of submissions: got {type(items).__name__} "
                                f"{shown if len(shown) <= 60 else shown[:57] + '...'}; nothing was filed (is the "
                                "kaggle package up to date?)")
        for index, entry in enumerate(items):
            if _is_submission(entry):
                out.append(submission_record(entry))
            elif entry is not None:
                logger.warning(f"warning: entry {index} of page {page} of Kaggle's answer is not a submission (got "
                               f"{type(entry).__name__} {repr(entry)[:40]}); skipped")
        if len(items) < PAGE_SIZE:
            break
    return out


def sync_leaderboard(submissions_dir: Path | str = paths.SUBMISSIONS_DIR, *,
                     api_factory: Callable[[], Any] | None = None) -> SyncResult:
    """Fetch the scores of this account's submissions and write each run's ``leaderboard.json``."""
    submissions_dir = Path(submissions_dir)
    if not submissions_dir.is_dir():
        raise PipelineError(f"{submissions_dir}: no such submissions folder")
    uploads = {}
    for entry in sorted(submissions_dir.iterdir()):
        if entry.is_dir() and not entry.name.startswith(".") and read_manifest(entry) is not None:
            uploads[entry.name] = read_submitted(entry)
    api = (api_factory or kaggle_api)()
    fetched = fetch_submissions(api)
    matched, unmatched = match_submissions(fetched, uploads)
    synced = datetime.now(timezone.utc).isoformat(timespec="seconds")
    for run_id, items in matched.items():
        record = {"run_id": run_id, "competition": COMPETITION, "synced_at": synced, "submissions": items}
        # strict JSON (no NaN/Infinity): scores were checked finite above, so this only fails on a bug
        write_text_atomic(submissions_dir / run_id / LEADERBOARD_RECORD,
                          json.dumps(record, sort_keys=True, indent=2, allow_nan=False) + "\n")
    return SyncResult(len(fetched), matched, unmatched)
