"""Kaggle download/submit without network or real credentials: a fake ``kaggle`` module stands in."""

import importlib.util
import json
import os
import socket
import subprocess
import sys
import types
import zipfile
from pathlib import Path

import pytest
import requests

from pipelines.cli import main
from pipelines.core.errors import PipelineError, SubmissionError
from pipelines.outputs.kaggle_io import (
    COMPETITION, MARKER_NAME, RULES_URL, expected_directories, find_credentials, safe_member_path,
)
from pipelines.data.root import DataRoot

REPO = Path(__file__).resolve().parents[1]
CREDENTIAL_VARS = ("KAGGLE_USERNAME", "KAGGLE_KEY", "KAGGLE_API_TOKEN", "KAGGLE_CONFIG_DIR", "XDG_CONFIG_HOME")
DATA_FILES = len(expected_directories()) + 1  # one file per split folder, plus sample_submission.csv


# ----------------------------------------------------------------------------- helpers


def build_zip(path: Path, *, version: str = "v1", extra: dict[str, bytes] | None = None,
              compression: int = zipfile.ZIP_DEFLATED) -> Path:
    """A miniature competition archive: one file per split folder and sample_submission.csv."""
    with zipfile.ZipFile(path, "w", compression) as archive:
        archive.writestr("sample_submission.csv", f"ID,TopConfigs\n{version}\n")
        archive.writestr("npz_all/npz/tile/xla/train/", b"")  # an explicit directory entry
        for directory in expected_directories():
            archive.writestr(f"{directory}/graph_{version}.npz", f"{version} bytes of {directory}".encode())
        for name, data in (extra or {}).items():
            archive.writestr(name, data)
    return path


def snapshot(root: Path) -> dict[str, bytes | None]:
    """Every path under ``root`` with its content (None for folders)."""
    if not root.exists():
        return {}
    return {str(p.relative_to(root)): (None if p.is_dir() else p.read_bytes()) for p in sorted(root.rglob("*"))}


def user_files(root: Path) -> dict[str, bytes | None]:
    """A data root holding things of the user's that a download must leave alone."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "notes.txt").write_text("my notes\n")
    (root / "runs").mkdir()
    (root / "runs" / "model.bin").write_bytes(b"\x00\x01")
    return snapshot(root)


def http_error(status: int) -> requests.HTTPError:
    response = requests.Response()
    response.status_code = status
    return requests.HTTPError(f"{status} Client Error", response=response)


class FakeKaggle:
    """Records calls; ``on_download(path, force)`` / ``on_submit()`` decide what each call does."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.on_download = lambda path, force: None
        self.on_submit = lambda: types.SimpleNamespace(message="Successfully submitted to Predict AI Model Runtime")
        self.listed: list = []  # what competition_submissions lists (ApiSubmission-like objects), newest first

    def module(self) -> types.ModuleType:
        fake = self

        class KaggleApi:
            def authenticate(self) -> None:
                fake.calls.append(("authenticate",))

            def competition_download_files(self, competition, path=None, force=False, quiet=True):
                fake.calls.append(("download", competition, path, force))
                fake.on_download(Path(path), force)

            def competition_submit(self, file_name, message, competition, quiet=False):
                fake.calls.append(("submit", file_name, message, competition))
                return fake.on_submit()

            def competition_submissions(self, competition, group=None, sort=None, page_number=-1, page_token="",
                                        page_size=20):
                fake.calls.append(("list", competition, page_number, page_size))
                start = (max(page_number, 1) - 1) * page_size
                return fake.listed[start:start + page_size]

        module = types.ModuleType("kaggle.api.kaggle_api_extended")
        module.KaggleApi = KaggleApi
        return module

    def downloads(self) -> list[tuple]:
        return [c for c in self.calls if c[0] == "download"]


@pytest.fixture
def no_credentials(monkeypatch, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    for name in CREDENTIAL_VARS:
        monkeypatch.delenv(name, raising=False)
    return home


@pytest.fixture
def fake(monkeypatch, no_credentials):
    monkeypatch.setenv("KAGGLE_USERNAME", "tester")
    monkeypatch.setenv("KAGGLE_KEY", "not-a-real-key")
    kaggle = FakeKaggle()
    api_module = types.ModuleType("kaggle.api")
    api_module.kaggle_api_extended = kaggle.module()
    top = types.ModuleType("kaggle")
    top.api = api_module
    monkeypatch.setitem(sys.modules, "kaggle", top)
    monkeypatch.setitem(sys.modules, "kaggle.api", api_module)
    monkeypatch.setitem(sys.modules, "kaggle.api.kaggle_api_extended", api_module.kaggle_api_extended)
    return kaggle


def serve(zip_source: Path):
    """An on_download that writes ``zip_source`` where the kaggle package would."""
    def on_download(path: Path, force: bool) -> None:
        path.mkdir(parents=True, exist_ok=True)
        (path / f"{COMPETITION}.zip").write_bytes(zip_source.read_bytes())
    return on_download


# ----------------------------------------------------------------------------- credentials


def test_missing_credentials_for_both_commands(no_credentials, tmp_path, capsys):
    kaggle_was_loaded = "kaggle" in sys.modules
    root = tmp_path / "data"
    assert main(["download", "--data-root", str(root)]) == 1
    err = capsys.readouterr().err
    for needed in ("no Kaggle credentials found", "KAGGLE_USERNAME and KAGGLE_KEY are not set", "kaggle.json",
                   "chmod 600 ~/.kaggle/kaggle.json", "https://www.kaggle.com/settings", RULES_URL):
        assert needed in err
    assert not root.exists()  # nothing created before the credentials check

    submission = tmp_path / "submission.csv"
    submission.write_text("ID,TopConfigs\n")
    assert main(["submit", str(submission), "-m", "first try", "--no-validate"]) == 1
    assert "no Kaggle credentials found" in capsys.readouterr().err
    if not kaggle_was_loaded:
        assert "kaggle" not in sys.modules  # the package is only imported once credentials exist


def test_find_credentials_sources(tmp_path):
    home = tmp_path / "home"
    (home / ".kaggle").mkdir(parents=True)
    assert find_credentials({}, home)[0] is None
    assert find_credentials({"KAGGLE_USERNAME": "u", "KAGGLE_KEY": "k"}, home)[0] == \
        "username and key (environment variables)"
    source, absent = find_credentials({"KAGGLE_USERNAME": "u"}, home)
    assert source is None and "KAGGLE_USERNAME is set but KAGGLE_KEY is not" in absent

    config = home / ".kaggle" / "kaggle.json"
    config.write_text(json.dumps({"username": "u", "key": "k"}))
    assert find_credentials({}, home)[0] == f"username and key ({config})"
    other = tmp_path / "elsewhere"
    other.mkdir()
    assert find_credentials({"KAGGLE_CONFIG_DIR": str(other)}, home)[0] is None  # kaggle.json looked up there
    config.write_text(json.dumps({"username": "u"}))
    source, absent = find_credentials({}, home, tokens=False)
    assert source is None and f"{config} exists but has no key" in absent
    config.write_text("{not json")
    with pytest.raises(PipelineError, match="kaggle.json: cannot read Kaggle credentials"):
        find_credentials({}, home)
    config.unlink()

    assert find_credentials({"KAGGLE_API_TOKEN": "t"}, home)[0] == "API token (KAGGLE_API_TOKEN)"
    assert find_credentials({"KAGGLE_API_TOKEN": "t"}, home, tokens=False)[0] is None
    (home / ".kaggle" / "access_token").write_text("t")
    assert "access_token" in find_credentials({}, home)[0]


# ----------------------------------------------------------------------------- download


def test_download_installs_writes_marker_then_skips(fake, tmp_path, capsys, monkeypatch):
    root = tmp_path / "data"
    before = user_files(root)
    fake.on_download = serve(build_zip(tmp_path / "v1.zip"))
    assert main(["download", "--data-root", str(root)]) == 0
    assert f"{DATA_FILES} files" in capsys.readouterr().out
    assert fake.downloads() == [("download", COMPETITION, str(root / ".download"), False)]

    for directory in expected_directories():
        assert (root / directory / "graph_v1.npz").read_bytes() == f"v1 bytes of {directory}".encode()
    assert (root / "sample_submission.csv").read_text() == "ID,TopConfigs\nv1\n"
    assert DataRoot(root).npz == root / "npz_all" / "npz"
    marker = json.loads((root / MARKER_NAME).read_text())
    assert marker["files"] == DATA_FILES and marker["zip_bytes"] == (tmp_path / "v1.zip").stat().st_size
    after = snapshot(root)
    assert {k: v for k, v in after.items() if k in before} == before  # the user's files are untouched
    leftovers = {k for k in after if not k.startswith(("npz_all", "sample_submission.csv", MARKER_NAME))}
    assert leftovers == set(before)  # no .download, no extraction folder

    # Complete: skipped without credentials and without touching the API.
    monkeypatch.delenv("KAGGLE_KEY")
    assert main(["download", "--data-root", str(root)]) == 0
    assert "already complete" in capsys.readouterr().out
    assert len(fake.downloads()) == 1 and snapshot(root) == after


def test_force_and_incomplete_roots_download_again(fake, tmp_path):
    root = tmp_path / "data"
    before = user_files(root)
    fake.on_download = serve(build_zip(tmp_path / "v1.zip"))
    assert main(["download", "--data-root", str(root)]) == 0

    fake.on_download = serve(build_zip(tmp_path / "v2.zip", version="v2"))
    assert main(["download", "--data-root", str(root), "--force"]) == 0
    assert fake.downloads()[-1][-1] is True  # force reaches the package too
    assert (root / "sample_submission.csv").read_text() == "ID,TopConfigs\nv2\n"
    assert not list(root.rglob("graph_v1.npz")) and len(list(root.rglob("graph_v2.npz"))) == DATA_FILES - 1

    # A marker whose data was partly deleted is not complete: downloaded again without --force.
    (root / expected_directories()[3] / "graph_v2.npz").unlink()
    assert main(["download", "--data-root", str(root)]) == 0
    assert len(fake.downloads()) == 3 and len(list(root.rglob("graph_v2.npz"))) == DATA_FILES - 1
    assert {k: v for k, v in snapshot(root).items() if k in before} == before


@pytest.mark.parametrize("error", [
    requests.exceptions.ConnectionError("Failed to resolve 'api.kaggle.com' ([Errno -2] Name or service not known)"),
    requests.exceptions.ReadTimeout("Read timed out. (read timeout=300)"),
    socket.gaierror(-2, "Name or service not known"),
    TimeoutError("timed out"),
])
def test_network_error_leaves_nothing_half_extracted_and_resumes(fake, tmp_path, capsys, error):
    root = tmp_path / "data"
    before = user_files(root)
    full = build_zip(tmp_path / "v1.zip").read_bytes()

    def interrupted(path: Path, force: bool) -> None:
        path.mkdir(parents=True, exist_ok=True)
        (path / f"{COMPETITION}.zip").write_bytes(full[: len(full) // 2])
        (path / f"{COMPETITION}.zip.kaggle-partial").write_text("{}")
        raise error

    fake.on_download = interrupted
    assert main(["download", "--data-root", str(root)]) == 1
    err = capsys.readouterr().err
    assert "could not reach Kaggle while downloading" in err and "resumed on the next run" in err
    assert "Traceback" not in err
    after = snapshot(root)
    assert {k for k in after if k not in before} == {".download", f".download/{COMPETITION}.zip",
                                                     f".download/{COMPETITION}.zip.kaggle-partial"}

    def resumed(path: Path, force: bool) -> None:
        assert not force and (path / f"{COMPETITION}.zip").stat().st_size == len(full) // 2
        (path / f"{COMPETITION}.zip").write_bytes(full)
        (path / f"{COMPETITION}.zip.kaggle-partial").unlink()

    fake.on_download = resumed
    assert main(["download", "--data-root", str(root)]) == 0
    assert (root / MARKER_NAME).is_file() and not (root / ".download").exists()


@pytest.mark.parametrize("status, expected", [
    (401, "rejected the credentials (HTTP 401"),
    (403, f"HTTP 403 Forbidden) while downloading the {COMPETITION} data: accept the competition rules at {RULES_URL}"),
    (404, "HTTP 404 Not Found"),
    (500, "answered with an error (HTTP 500)"),
])
def test_http_errors_are_explained(fake, tmp_path, capsys, status, expected):
    root = tmp_path / "data"
    before = user_files(root)

    def refuse(path: Path, force: bool) -> None:
        raise http_error(status)

    fake.on_download = refuse
    assert main(["download", "--data-root", str(root)]) == 1
    assert expected in capsys.readouterr().err
    assert snapshot(root) == before


def test_corrupt_zip_leaves_the_root_unchanged(fake, tmp_path, capsys):
    root = tmp_path / "data"
    before = user_files(root)
    garbage = tmp_path / "garbage.zip"
    garbage.write_bytes(b"PK\x03\x04 this is not really a zip archive")
    fake.on_download = serve(garbage)
    assert main(["download", "--data-root", str(root)]) == 1
    err = capsys.readouterr().err
    assert f"{COMPETITION}.zip: not a valid zip archive" in err
    assert snapshot(root) == before  # the bad archive is deleted too, so the next run downloads afresh


def test_bad_member_crc_keeps_the_previous_install(fake, tmp_path, capsys):
    root = tmp_path / "data"
    user_files(root)
    fake.on_download = serve(build_zip(tmp_path / "v1.zip"))
    assert main(["download", "--data-root", str(root)]) == 0
    installed = snapshot(root)

    damaged = build_zip(tmp_path / "v2.zip", version="v2", compression=zipfile.ZIP_STORED)
    content = damaged.read_bytes()
    target = b"v2 bytes of npz_all/npz/layout/nlp/random/test"
    assert content.count(target) == 1
    damaged.write_bytes(content.replace(target, target.upper()))  # same length: only the CRC check can tell
    fake.on_download = serve(damaged)
    assert main(["download", "--data-root", str(root), "--force"]) == 1
    assert "Bad CRC-32" in capsys.readouterr().err
    assert snapshot(root) == installed  # v1 and its marker still in place


@pytest.mark.parametrize("member", ["../escape.txt", "npz_all/../../escape.txt", "/tmp/escape.txt",
                                    "C:/escape.txt"])
def test_path_traversal_is_refused(fake, tmp_path, capsys, member):
    root = tmp_path / "data"
    before = user_files(root)
    fake.on_download = serve(build_zip(tmp_path / "evil.zip", extra={member: b"gotcha"}))
    assert main(["download", "--data-root", str(root)]) == 1
    assert "refusing to extract: unsafe member name" in capsys.readouterr().err
    assert snapshot(root) == before
    assert not (tmp_path / "escape.txt").exists() and not (root.parent.parent / "escape.txt").exists()


def test_safe_member_path():
    assert str(safe_member_path("npz_all/npz/tile/xla/train/a.npz")) == "npz_all/npz/tile/xla/train/a.npz"
    assert safe_member_path("./sample_submission.csv").parts == ("sample_submission.csv",)
    for bad in ("", "..", "a/../../b", "/abs", "..\\windows", "D:\\x"):
        with pytest.raises(ValueError, match="unsafe member name"):
            safe_member_path(bad)


def test_archive_without_the_expected_structure(fake, tmp_path, capsys):
    root = tmp_path / "data"
    before = user_files(root)
    partial = tmp_path / "partial.zip"
    with zipfile.ZipFile(partial, "w") as archive:
        archive.writestr("sample_submission.csv", "ID,TopConfigs\n")
        archive.writestr("npz_all/npz/tile/xla/train/a.npz", b"x")
    fake.on_download = serve(partial)
    assert main(["download", "--data-root", str(root)]) == 1
    assert "is not the predict-ai-model-runtime data: npz_all/npz/tile/xla/valid is missing" in capsys.readouterr().err
    assert snapshot(root) == before


# ----------------------------------------------------------------------------- submit


def test_submit_uploads_and_reports(fake, tmp_path, capsys):
    submission = tmp_path / "submission.csv"
    submission.write_text("ID,TopConfigs\n")
    assert main(["submit", str(submission), "-m", "ensemble v3"]) == 2  # unvalidated: only when asked for
    assert "--data-root" in capsys.readouterr().err and not [c for c in fake.calls if c[0] == "submit"]
    assert main(["submit", str(submission), "-m", "ensemble v3", "--no-validate"]) == 0
    assert "Successfully submitted" in capsys.readouterr().out
    assert fake.calls[-1] == ("submit", str(submission), "ensemble v3", COMPETITION)

    def offline():
        raise requests.exceptions.ConnectionError("Failed to resolve 'api.kaggle.com'")

    fake.on_submit = offline
    assert main(["submit", str(submission), "-m", "again", "--no-validate"]) == 1
    err = capsys.readouterr().err
    assert f"could not reach Kaggle while submitting {submission}" in err and "resumed" not in err

    fake.on_submit = lambda: types.SimpleNamespace(message="Could not submit to competition")
    assert main(["submit", str(submission), "-m", "again", "--no-validate"]) == 1
    assert "did not accept the upload" in capsys.readouterr().err

    assert main(["submit", str(tmp_path / "missing.csv"), "-m", "x", "--no-validate"]) == 2
    assert "no such submission file" in capsys.readouterr().err


def test_submit_validates_before_uploading(fake, tmp_path, capsys, monkeypatch):
    import pipelines.data.submission

    submission = tmp_path / "submission.csv"
    submission.write_text("ID,TopConfigs\n")
    seen = []

    def accept(path, data_root, split="test"):
        seen.append((Path(path), Path(data_root), split))
        return 894

    monkeypatch.setattr(pipelines.data.submission, "validate_submission", accept)
    assert main(["submit", str(submission), "-m", "checked", "--data-root", str(tmp_path / "data")]) == 0
    assert seen == [(submission, tmp_path / "data", "test")]
    assert "valid submission with 894 rows" in capsys.readouterr().out

    def reject(path, data_root, split="test"):
        raise SubmissionError(path, ["row 3: unknown ID"])

    monkeypatch.setattr(pipelines.data.submission, "validate_submission", reject)
    uploads = len([c for c in fake.calls if c[0] == "submit"])
    assert main(["submit", str(submission), "-m", "bad", "--data-root", str(tmp_path / "data")]) == 1
    assert "row 3: unknown ID" in capsys.readouterr().err
    assert len([c for c in fake.calls if c[0] == "submit"]) == uploads  # nothing uploaded


# ----------------------------------------------------------------------------- the real package


def run_isolated(args: list[str], home: Path, extra_env: dict[str, str], timeout: float = 60):
    """Run in a fresh interpreter (the real kaggle package reads HOME when first imported) with the
    network made unreachable: every HTTP(S) request goes to a closed local port, so nothing leaves the
    machine and the failure is immediate. Should the import itself ever block on the network, the
    timeout skips the test rather than hanging the suite."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home),
           "HTTPS_PROXY": "http://127.0.0.1:9", "HTTP_PROXY": "http://127.0.0.1:9", **extra_env}
    try:
        return subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.skip(f"the real kaggle package did not return within {timeout}s without network")


@pytest.mark.skipif(importlib.util.find_spec("kaggle") is None, reason="the kaggle package is not installed")
def test_real_package_without_credentials_or_network(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    root = tmp_path / "data"
    done = run_isolated(["-m", "pipelines", "download", "--data-root", str(root)], home, {})
    assert done.returncode == 1 and "no Kaggle credentials found" in done.stderr
    assert "Traceback" not in done.stderr and not root.exists()

    # Credentials present (fake): the real package is imported and authenticates offline; the
    # request then fails on the unreachable network and our message comes out, not a traceback.
    done = run_isolated(["-m", "pipelines", "download", "--data-root", str(root)], home,
                        {"KAGGLE_USERNAME": "nobody", "KAGGLE_KEY": "0" * 32})
    assert done.returncode == 1, done.stderr
    assert "could not reach Kaggle while downloading" in done.stderr and "Traceback" not in done.stderr
    assert not root.exists()

    # The package's own exit(1) on missing credentials becomes a PipelineError.
    code = ("from pipelines.outputs import kaggle_io\n"
            "kaggle_io.require_credentials = lambda: 'a test that skips our own check'\n"
            "try:\n    kaggle_io.kaggle_api()\n"
            "except kaggle_io.PipelineError as exc:\n    print('PipelineError:', exc)\n")
    done = run_isolated(["-c", code], home, {})
    assert "PipelineError: the kaggle package did not accept the credentials" in done.stdout, done.stderr
    assert "Traceback" not in done.stderr
