"""Downloading the competition data and submitting predictions through the ``kaggle`` package.

The ``kaggle`` package is imported lazily, and only after this module has found credentials itself:
importing it authenticates at import time, prints help and creates a config folder, and its own
failures are ``SystemExit`` or bare ``requests`` errors. Every failure here (no credentials,
rejected credentials, rules not accepted, no network, a corrupt archive) is a :class:`PipelineError`
with a message that says what to do.

A download goes through ``DIR/.download/`` (the package resumes a partial file from there), is
extracted member by member into a temporary folder inside ``DIR``, checked, and only then moved into
place (``npz_all/`` and ``sample_submission.csv``). ``DIR/.kaggle-complete.json`` is written last;
with it and the expected folders present, a later download is skipped. Nothing else in ``DIR`` is
touched.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import logging
import os
import shutil
import socket
import stat
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Iterator, Mapping, Protocol

from pipelines.core import paths
from pipelines.core.collection import ALL_COLLECTIONS, SPLITS
from pipelines.core.errors import ConfigError, FormatError, PipelineError
from pipelines.data.root import KAGGLE_NPZ, SAMPLE_SUBMISSION, DataRoot

logger = logging.getLogger(__name__)

COMPETITION = "predict-ai-model-runtime"
RULES_URL = f"https://www.kaggle.com/competitions/{COMPETITION}/rules"
TOKEN_URL = "https://www.kaggle.com/settings"
MARKER_NAME = ".kaggle-complete.json"
DOWNLOAD_DIR_NAME = ".download"
EXTRACT_PREFIX = ".kaggle-extract-"
DATA_ENTRIES = (KAGGLE_NPZ[0], SAMPLE_SUBMISSION)  # what the archive puts into the data root
ZIP_NAME = f"{COMPETITION}.zip"  # the name the kaggle package gives the competition archive
PARTIAL_SUFFIX = ".kaggle-partial"  # the kaggle package's marker of an unfinished download
UPLOAD_FAILED_MESSAGE = "Could not submit to competition"  # KaggleApi.COMPETITION_SUBMIT_UPLOAD_FAILED_MESSAGE
_COPY_CHUNK = 1 << 20
_MAX_DETAIL = 400


class KaggleApiLike(Protocol):
    """The two methods of ``kaggle.api.kaggle_api_extended.KaggleApi`` this module calls."""

    def competition_download_files(self, competition: str, path: str | None = None, force: bool = False,
                                   quiet: bool = True) -> None: ...

    def competition_submit(self, file_name: str, message: str, competition: str, quiet: bool = False) -> Any: ...


# ----------------------------------------------------------------------------- credentials


def _kaggle_config_dir(environ: Mapping[str, str], home: Path) -> Path:
    """Where the kaggle package looks for kaggle.json (same rule as ``KaggleApi.config_dir``)."""
    if environ.get("KAGGLE_CONFIG_DIR"):
        return Path(environ["KAGGLE_CONFIG_DIR"])
    legacy = home / ".kaggle"
    if sys.platform.startswith("linux") and not legacy.exists():
        return Path(environ.get("XDG_CONFIG_HOME") or home / ".config") / "kaggle"
    return legacy


def supports_access_tokens() -> bool:
    """Whether the installed kaggle package reads KAGGLE_API_TOKEN / ~/.kaggle/access_token (1.8 and later)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        parts = version("kaggle").split(".")[:2]
        return tuple(int("".join(ch for ch in p if ch.isdigit()) or 0) for p in parts) >= (1, 8)
    except PackageNotFoundError:
        return False


def find_credentials(environ: Mapping[str, str], home: Path, *, tokens: bool = True) -> tuple[str | None, list[str]]:
    """Look for Kaggle credentials the way the kaggle package does, without importing it.

    Returns ``(source, absent)``: a description of where credentials were found (never the secret
    itself) or None, and one line per place that was looked at and found lacking. ``tokens`` says
    whether the installed package accepts the newer single API tokens. An unreadable kaggle.json is
    a PipelineError naming the file.
    """
    absent: list[str] = []
    config = _kaggle_config_dir(environ, home) / "kaggle.json"
    from_file: dict[str, Any] = {}
    if config.is_file():
        try:
            from_file = json.loads(config.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise PipelineError(f"{config}: cannot read Kaggle credentials ({exc}); it must be the kaggle.json "
                                f"downloaded from {TOKEN_URL}, holding \"username\" and \"key\"") from None
        if not isinstance(from_file, dict):
            raise PipelineError(f"{config}: expected a JSON object with \"username\" and \"key\"")
    username = environ.get("KAGGLE_USERNAME") or from_file.get("username")
    key = environ.get("KAGGLE_KEY") or from_file.get("key")
    if username and key:
        place = "environment variables" if environ.get("KAGGLE_USERNAME") and environ.get("KAGGLE_KEY") else str(config)
        return f"username and key ({place})", absent
    if config.is_file():
        lacking = " and ".join(name for name, value in (("username", username), ("key", key)) if not value)
        absent.append(f"{config} exists but has no {lacking}")
    else:
        absent.append(f"{config} does not exist")
    set_vars = [name for name in ("KAGGLE_USERNAME", "KAGGLE_KEY") if environ.get(name)]
    if set_vars:
        missing = [name for name in ("KAGGLE_USERNAME", "KAGGLE_KEY") if not environ.get(name)]
        absent.append(f"{set_vars[0]} is set but {missing[0]} is not")
    else:
        absent.append("KAGGLE_USERNAME and KAGGLE_KEY are not set")
    if tokens:
        if environ.get("KAGGLE_API_TOKEN"):
            return "API token (KAGGLE_API_TOKEN)", absent
        absent.append("KAGGLE_API_TOKEN is not set")
        for name in ("access_token", "access_token.txt"):
            if (home / ".kaggle" / name).is_file():
                return f"API token ({home / '.kaggle' / name})", absent
        absent.append(f"{home / '.kaggle' / 'access_token'} does not exist")
        oauth = home / ".kaggle" / "credentials.json"  # written by `kaggle auth login`
        if oauth.is_file():
            return f"OAuth login ({oauth})", absent
    return None, absent


def missing_credentials_message(absent: list[str], *, tokens: bool) -> str:
    token_way = ("\n  - or export KAGGLE_API_TOKEN=<token> (a single API token from the same page)" if tokens else "")
    return (
        "no Kaggle credentials found:\n    " + "\n    ".join(absent) + "\n"
        f"To provide them, create an API token on {TOKEN_URL} (section 'API', 'Create New Token'), then:\n"
        "  - save the downloaded kaggle.json as ~/.kaggle/kaggle.json and run: chmod 600 ~/.kaggle/kaggle.json\n"
        "  - or export KAGGLE_USERNAME=<your user name> and KAGGLE_KEY=<the key in kaggle.json>"
        f"{token_way}\n"
        f"Also accept the competition rules, with the same account, at {RULES_URL}"
    )


def require_credentials(environ: Mapping[str, str] | None = None, home: Path | None = None) -> str:
    """Where the credentials are; a PipelineError saying what is missing and how to add it otherwise."""
    environ = os.environ if environ is None else environ
    home = Path(os.path.expanduser("~")) if home is None else home
    tokens = supports_access_tokens()
    source, absent = find_credentials(environ, home, tokens=tokens)
    if source is None:
        raise PipelineError(missing_credentials_message(absent, tokens=tokens))
    return source


def kaggle_api() -> KaggleApiLike:
    """An authenticated ``KaggleApi``: credentials are checked first, then the package is imported."""
    source = require_credentials()
    captured = io.StringIO()
    try:
        # Importing kaggle authenticates once at import time and prints help on failure: keep its
        # output for the error message instead of the user's terminal.
        with contextlib.redirect_stdout(captured):
            from kaggle.api.kaggle_api_extended import KaggleApi

            api = KaggleApi()
            api.authenticate()
    except SystemExit:  # KaggleApi.authenticate() calls exit(1) when it finds no usable credentials
        said = " ".join(captured.getvalue().split())[:_MAX_DETAIL]
        raise PipelineError(f"the kaggle package did not accept the credentials from {source}"
                            + (f" (it said: {said})" if said else "") + f"; create a new API token on {TOKEN_URL}"
                            ) from None
    except ImportError as exc:
        raise PipelineError(f"cannot import the kaggle package ({_detail(exc)}); install the project's "
                            "dependencies (make install, or pip install kaggle six)") from None
    except Exception as exc:  # e.g. a network error while checking an API token
        raise explain_kaggle_error(exc, "loading the kaggle package and authenticating") from None
    if captured.getvalue().strip():  # e.g. its warning about a kaggle.json readable by others
        print(captured.getvalue().rstrip(), file=sys.stderr)
    return api


# ----------------------------------------------------------------------------- errors


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """The exception, then its causes and contexts (requests wraps urllib3, which wraps socket)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _http_status(exc: BaseException) -> int | None:
    """The HTTP status of an error answer (requests' ``response``, or ``status`` of older clients)."""
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    if isinstance(status, int) and status < 400:
        # kagglesdk also raises for an error code inside the JSON body of a 200 answer.
        with contextlib.suppress(Exception):
            code = response.json().get("code")
            status = code if isinstance(code, int) else status
    if not isinstance(status, int):
        status = getattr(exc, "status", None)
    return status if isinstance(status, int) else None


def _is_network_error(exc: BaseException) -> bool:
    if isinstance(exc, (ConnectionError, TimeoutError, socket.gaierror, socket.herror)):
        return True
    return any(cls.__module__.split(".")[0] in ("requests", "urllib3", "http") for cls in type(exc).__mro__)


def explain_kaggle_error(exc: BaseException, action: str, network_hint: str = "") -> PipelineError:
    """Turn an exception raised by the kaggle package into a PipelineError that says what to do.

    HTTP answers are told apart by status (401 credentials, 403 rules not accepted, 404, ...), then
    network failures (DNS, refused or reset connections, timeouts), then local file errors.
    """
    for link in _chain(exc):
        status = _http_status(link)
        if status == 401:
            return PipelineError(f"Kaggle rejected the credentials (HTTP 401 Unauthorized) while {action}: the API "
                                 f"token is wrong or expired; create a new one on {TOKEN_URL} and replace "
                                 "~/.kaggle/kaggle.json (or KAGGLE_USERNAME/KAGGLE_KEY)")
        if status == 403:
            return PipelineError(f"Kaggle refused access (HTTP 403 Forbidden) while {action}: accept the competition "
                                 f"rules at {RULES_URL} with the account of these credentials (the account may also "
                                 "need a verified phone number)")
        if status == 404:
            return PipelineError(f"Kaggle found no such resource (HTTP 404 Not Found) while {action}: check the "
                                 f"competition name {COMPETITION!r}; joining it at {RULES_URL} may be required")
        if status == 429:
            return PipelineError(f"Kaggle is rate-limiting requests (HTTP 429) while {action}; wait and try again")
        if (status is not None and status >= 400) or getattr(link, "response", None) is not None:
            return PipelineError(f"Kaggle answered with an error (HTTP {status}) while {action}: {_detail(link)}")
    for link in _chain(exc):
        if _is_network_error(link):
            return PipelineError(f"could not reach Kaggle while {action} (network error: {_detail(link)}); check "
                                 "the internet connection and proxy settings (HTTPS_PROXY), and that api.kaggle.com "
                                 f"resolves{network_hint}")
    if isinstance(exc, OSError):
        return PipelineError(f"file system error while {action}: {_detail(exc)}")
    return PipelineError(f"the kaggle package failed while {action}: {_detail(exc)}")


def _detail(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or "no details"
    text = text if len(text) <= _MAX_DETAIL else text[:_MAX_DETAIL] + "..."
    return f"{type(exc).__name__}: {text}"


# ----------------------------------------------------------------------------- data root state


def expected_directories() -> list[PurePosixPath]:
    """The split folders every complete download holds, relative to the data root."""
    return [PurePosixPath(*KAGGLE_NPZ, *c.relative_dir.parts, split) for c in ALL_COLLECTIONS for split in SPLITS]


def _count_files(root: Path) -> int:
    return sum(len(files) for _, _, files in os.walk(root))


def _structure_problem(root: Path) -> str | None:
    """What is missing for ``root`` to hold the whole competition data (None when nothing is)."""
    if not DataRoot(root).sample_submission.is_file():
        return "sample_submission.csv is missing"
    for directory in expected_directories():
        if not root.joinpath(*directory.parts).is_dir():
            return f"{directory} is missing"
    return None


def completion_problem(data_root: Path) -> str | None:
    """Why ``data_root`` is not a complete download (None when it is: marker and data agree)."""
    marker = data_root / MARKER_NAME
    if not marker.is_file():
        return f"no {MARKER_NAME}"
    try:
        recorded = json.loads(marker.read_text(encoding="utf-8"))
        files = int(recorded["files"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"{MARKER_NAME} is unreadable ({exc})"
    problem = _structure_problem(data_root)
    if problem:
        return problem
    present = _count_files(data_root / KAGGLE_NPZ[0]) + 1  # + sample_submission.csv
    if present != files:
        return f"{present} data files present but {MARKER_NAME} records {files}"
    return None


# ----------------------------------------------------------------------------- extraction


def safe_member_path(name: str) -> PurePosixPath:
    """The relative path of an archive member; absolute paths, '..' and drive letters are refused."""
    path = PurePosixPath(name.replace("\\", "/"))
    if not name or path.is_absolute() or ".." in path.parts or (path.parts and ":" in path.parts[0]):
        raise ValueError(f"unsafe member name {name!r} (absolute or leaving the extraction folder)")
    return path


def _extract_archive(archive: zipfile.ZipFile, zip_path: Path, staging: Path) -> int:
    """Extract the data entries of ``archive`` into ``staging`` member by member; returns the file count."""
    members = []
    for info in archive.infolist():
        try:
            path = safe_member_path(info.filename)
        except ValueError as exc:
            raise FormatError(zip_path, f"refusing to extract: {exc}") from None
        if stat.S_ISLNK(info.external_attr >> 16):
            raise FormatError(zip_path, f"refusing to extract: member {info.filename!r} is a symbolic link")
        if path.parts and path.parts[0] in DATA_ENTRIES:  # anything else in the archive is not ours to place
            members.append((info, path))
    needed = sum(info.file_size for info, _ in members)
    free = shutil.disk_usage(staging).free
    if needed > free:
        raise PipelineError(f"not enough disk space to extract {zip_path}: {needed / 1e9:.1f} GB needed, "
                            f"{free / 1e9:.1f} GB free under {staging.parent}")
    files = 0
    for info, path in members:
        target = staging.joinpath(*path.parts)
        if info.is_dir():
            target.mkdir(parents=True, exist_ok=True)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        # zipfile checks each member's CRC when it is read to the end (BadZipFile on mismatch).
        with archive.open(info) as source, open(target, "wb") as sink:
            shutil.copyfileobj(source, sink, _COPY_CHUNK)
        files += 1
    return files


def install_archive(zip_path: Path, data_root: Path) -> int:
    """Verify and extract the competition zip, then move its entries into ``data_root``.

    Extraction goes to a temporary folder inside ``data_root`` (same file system, so the final moves
    are renames); existing ``npz_all``/``sample_submission.csv`` are replaced only once the new ones
    are complete, and the completion marker is removed first (rewritten by the caller). Returns the
    number of data files installed.
    """
    staging = Path(tempfile.mkdtemp(prefix=EXTRACT_PREFIX, dir=data_root))
    try:
        try:
            with zipfile.ZipFile(zip_path) as archive:
                files = _extract_archive(archive, zip_path, staging)
        except (zipfile.BadZipFile, EOFError, zipfile.LargeZipFile, NotImplementedError) as exc:
            raise FormatError(zip_path, f"not a valid zip archive, corrupt or incomplete download ({exc})") from None
        problem = _structure_problem(staging)
        if problem:
            raise FormatError(zip_path, f"the archive is not the {COMPETITION} data: {problem}")
        (data_root / MARKER_NAME).unlink(missing_ok=True)
        replaced = staging / ".replaced"
        replaced.mkdir()
        for name in DATA_ENTRIES:
            target = data_root / name
            old = target.exists() or target.is_symlink()
            if old:
                os.replace(target, replaced / name)
            try:
                os.replace(staging / name, target)
            except OSError:
                if old:  # put the previous data back rather than leave the root without it
                    os.replace(replaced / name, target)
                raise
        return files
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _write_json_atomic(path: Path, payload: dict[str, Any]) -> None:
    temporary = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    temporary.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    os.replace(temporary, path)


@contextlib.contextmanager
def _download_lock(download_dir: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``download_dir`` so two downloads into one data root cannot interleave.

    On the way out the folder is removed once it holds nothing but the lock, so only a resumable
    partial archive is ever left behind.
    """
    import fcntl

    download_dir.mkdir(exist_ok=True)
    lock = download_dir / "lock"
    with open(lock, "w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise PipelineError(f"another download into {download_dir.parent} is running") from None
        try:
            yield
        finally:
            with contextlib.suppress(OSError):
                lock.unlink()
                download_dir.rmdir()


# ----------------------------------------------------------------------------- commands


@dataclass(frozen=True)
class DownloadResult:
    data_root: Path
    skipped: bool
    files: int
    zip_bytes: int

    def describe(self) -> str:
        if self.skipped:
            return (f"{self.data_root}: the {COMPETITION} data is already complete ({self.files} files); "
                    "nothing downloaded (--force downloads it again)")
        return (f"{self.data_root}: installed npz_all/ and sample_submission.csv ({self.files} files from a "
                f"{self.zip_bytes / 1e6:.1f} MB archive)")


def download_competition_data(
    data_root: Path | str,
    *,
    force: bool = False,
    api_factory: Callable[[], KaggleApiLike] | None = None,
) -> DownloadResult:
    """Download and install the competition data into ``data_root`` unless it is already complete."""
    data_root = Path(data_root)
    if data_root.exists() and not data_root.is_dir():
        raise ConfigError(f"{data_root}: --data-root must be a folder")
    problem = completion_problem(data_root)
    if problem is None and not force:
        recorded = json.loads((data_root / MARKER_NAME).read_text(encoding="utf-8"))
        return DownloadResult(data_root, True, int(recorded["files"]), int(recorded.get("zip_bytes", 0)))
    if not force and data_root.exists():
        logger.info(f"{data_root}: not a complete download ({problem}); downloading")
    api = (api_factory or kaggle_api)()  # checks credentials before anything is created
    created = not data_root.exists()
    data_root.mkdir(parents=True, exist_ok=True)
    try:
        files, zip_bytes = _download_and_install(api, data_root, data_root / DOWNLOAD_DIR_NAME, force)
    except BaseException:
        if created:  # a failed first download leaves no empty data root behind
            with contextlib.suppress(OSError):
                data_root.rmdir()
        raise
    return DownloadResult(data_root, False, files, zip_bytes)


def _download_and_install(api: KaggleApiLike, data_root: Path, download_dir: Path, force: bool) -> tuple[int, int]:
    """Download (or resume) the archive into ``download_dir``, install it, write the marker last."""
    zip_path = download_dir / ZIP_NAME
    with _download_lock(download_dir):
        for stale in data_root.glob(f"{EXTRACT_PREFIX}*"):  # left by a killed run; ours by name, and locked
            shutil.rmtree(stale, ignore_errors=True)
        if force:
            for leftover in (zip_path, zip_path.with_name(zip_path.name + PARTIAL_SUFFIX)):
                leftover.unlink(missing_ok=True)
        try:
            # The package resumes a partial file it left in download_dir, or skips a complete one.
            api.competition_download_files(COMPETITION, path=str(download_dir), force=force, quiet=False)
        except Exception as exc:
            raise explain_kaggle_error(exc, f"downloading the {COMPETITION} data",
                                       "; a partly downloaded archive is kept and resumed on the next run") from None
        if zip_path.with_name(zip_path.name + PARTIAL_SUFFIX).exists() or not zip_path.is_file():
            found = sorted(p.name for p in download_dir.iterdir() if p.name != "lock")
            raise PipelineError(f"the download did not finish: expected {zip_path} "
                                f"(found: {', '.join(found) or 'nothing'}); run the command again to resume it")
        zip_bytes = zip_path.stat().st_size
        try:
            files = install_archive(zip_path, data_root)
        except FormatError:
            # A bad archive would be "resumed" forever: remove it so the next run downloads it afresh.
            zip_path.unlink(missing_ok=True)
            raise
        _write_json_atomic(data_root / MARKER_NAME, {
            "competition": COMPETITION,
            "files": files,
            "zip_bytes": zip_bytes,
            "entries": list(DATA_ENTRIES),
            "completed_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        })
        zip_path.unlink()
    return files, zip_bytes


def _result_message(result: Any) -> str:
    message = getattr(result, "message", None)
    return str(message) if message else str(result)


def synthetic_refusal(what: str, data_root: Path | str) -> PipelineError:
    return PipelineError(f"{what} was made on a synthetic world ({data_root} holds the synth marker): its "
                         "predictions rank made-up graphs, and Kaggle would score it as noise; refusing to upload "
                         "(--allow-synthetic uploads it anyway)")


def submit_file(
    file: Path | str,
    message: str,
    *,
    data_root: Path | str | None = None,
    api_factory: Callable[[], KaggleApiLike] | None = None,
    allow_synthetic: bool = False,
    unvalidated: bool = False,
) -> str:
    """Upload a submission CSV, validated against ``data_root``'s test files first; without a
    ``data_root`` only when ``unvalidated`` is asked for (a ConfigError otherwise: an unchecked file
    costs one of the day's uploads). A ``data_root`` that is a synthetic world is refused unless
    ``allow_synthetic``."""
    from pipelines.outputs.run_folders import world_origin

    file = Path(file)
    if not file.is_file():
        raise ConfigError(f"{file}: no such submission file")
    if not message.strip():
        raise ConfigError("a submission needs a non-empty message (-m)")
    if data_root is None and not unvalidated:
        raise ConfigError(f"{file}: not validated: pass --data-root DIR to check it against the test files before "
                          "the upload (or --no-validate to upload it unchecked)")
    if data_root is not None and world_origin(data_root)["synthetic"] and not allow_synthetic:
        raise synthetic_refusal(str(file), data_root)
    api = (api_factory or kaggle_api)()  # credentials first: validation reads every test graph
    if data_root is not None:
        from pipelines.data.submission import validate_submission

        rows = validate_submission(file, Path(data_root), split="test")
        logger.info(f"{file}: valid submission with {rows} rows")
    else:
        logger.warning(f"warning: {file}: not validated (pass --data-root to check it against the test files first)")
    try:
        result = api.competition_submit(str(file), message, COMPETITION)
    except Exception as exc:
        raise explain_kaggle_error(exc, f"submitting {file}") from None
    text = _result_message(result)
    if text.strip() == UPLOAD_FAILED_MESSAGE:
        raise PipelineError(f"Kaggle did not accept the upload of {file} ({text}); see the messages above")
    return text


def _checked_record(path: Path) -> list[dict]:
    """The entries of a run's ``submitted.json`` (none when absent), checked before an upload: a record
    that is not ``{"submissions": [{...}, ...]}``, or a run folder where it cannot be rewritten, is a
    PipelineError naming it, so nothing is uploaded that could not be recorded."""
    entries: list[dict] = []
    if path.exists() or path.is_symlink():
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise PipelineError(f"{path}: unreadable submission record ({exc}); nothing was uploaded: restore it "
                                "or move it aside, then submit again") from None
        entries = record.get("submissions") if isinstance(record, dict) else None
        if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
            raise PipelineError(f"{path}: not a submission record (expected {{\"submissions\": [...]}}); nothing was "
                                "uploaded: restore it or move it aside, then submit again")
    try:
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.name}.", suffix=".probe"):
            pass
        if path.is_dir():
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR))
    except OSError as exc:
        raise PipelineError(f"{path}: the submission record cannot be written ({exc.strerror or exc}); nothing was "
                            "uploaded") from None
    return entries


def submit_run(
    run_id: str,
    *,
    submissions_dir: Path | str = paths.SUBMISSIONS_DIR,
    message: str | None = None,
    data_root: Path | str | None = None,
    api_factory: Callable[[], KaggleApiLike] | None = None,
    allow_synthetic: bool = False,
) -> str:
    """Upload the submission of run ``run_id`` and record what was sent in its run folder.

    A run made on a synthetic world (its manifest's ``data_world``, or for older runs the marker in
    the data root it recorded) is refused unless ``allow_synthetic``.

    The CSV must still be the one the run published (its SHA-256 is in the run manifest); it is
    validated against ``data_root``, by default the data root the run recorded. The message
    defaults to the run-id and its combined CV score. After a successful upload the record
    ``<run>/submitted.json`` gains one entry (time, message, file hash, data root, Kaggle's answer),
    which ``runs list`` shows.
    """
    from pipelines.core.engine import file_sha256, write_json_atomic
    from pipelines.outputs.run_folders import SUBMISSION_FILE, read_run_manifest, resolve_run_id, world_origin
    from pipelines.outputs.runs_table import SUBMITTED_RECORD, run_summary

    run_id = resolve_run_id(submissions_dir, run_id)  # a unique prefix or a run's name works too
    run_dir = Path(submissions_dir) / run_id
    manifest = read_run_manifest(submissions_dir, run_id)
    recorded_root = manifest.get("data_root") or ""
    world = manifest.get("data_world") or (world_origin(recorded_root) if recorded_root else {})
    if world.get("synthetic") and not allow_synthetic:
        raise synthetic_refusal(f"run {run_id}", recorded_root)
    recorded = manifest.get("submission") or {}
    file = run_dir / recorded.get("file", SUBMISSION_FILE)
    if not file.is_file():
        raise PipelineError(f"{file}: run {run_id} has no submission file")
    digest = file_sha256(file)
    if recorded.get("sha256") and digest != recorded["sha256"]:
        raise PipelineError(f"{file}: changed since run {run_id} published it (SHA-256 differs from its manifest); "
                            "refusing to upload it as this run")
    root = Path(data_root) if data_root is not None else Path(manifest.get("data_root") or "")
    if not str(root) or not root.is_dir():
        raise PipelineError(f"run {run_id}: its data root {str(root) or '(none recorded)'} is not there to validate "
                            "against; pass --data-root")
    previous = _checked_record(run_dir / SUBMITTED_RECORD)  # before the upload: what is sent must be recorded
    if message is None:
        summary = run_summary(run_id, manifest)
        score = "-" if summary["combined"] is None else f"{summary['combined']:.4f}"
        message = f"{run_id} CV {score}" + ("" if summary["complete"] else " (incomplete)")
    answer = submit_file(file, message, data_root=root, api_factory=api_factory, allow_synthetic=allow_synthetic)
    entry = {"submitted_at": datetime.now(timezone.utc).isoformat(timespec="seconds"), "message": message,
             "competition": COMPETITION, "file": file.name, "sha256": digest,
             "validated_against": str(root.resolve()), "kaggle_response": answer}
    write_json_atomic(run_dir / SUBMITTED_RECORD, {"run_id": run_id, "submissions": [*previous, entry]})
    return answer
