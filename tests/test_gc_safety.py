"""``gc`` and ``runs rm`` never lose data (issue 78, items 1-2): gc deletes only what it can prove is a
stage output no run needs, refuses a work dir that is, holds or links to raw data or run folders,
refuses what it cannot read, and ``runs rm`` never removes a run its text does not name alone.

Stage and run folders are hand-built here (a manifest each, as the engine and ``run`` write them):
no training, each test takes milliseconds."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from pipelines.cli import main
from pipelines.core.errors import ConfigError, PipelineError
from pipelines.outputs import cache_gc
from pipelines.outputs.run_folders import record_submissions_dir

KEYS = {name: f"{i:x}" * 16 for i, name in enumerate(("prune", "features", "train", "ensemble", "orphan"), 1)}


def stage(work: Path, name: str, key: str, inputs: dict | None = None, manifest: bool = True) -> Path:
    folder = work / name / key
    folder.mkdir(parents=True)
    (folder / "out.bin").write_bytes(b"x" * 100)
    if manifest:
        (folder / "manifest.json").write_text(json.dumps({
            "stage": name, "key": key, "inputs": inputs or {},
            "outputs": [{"path": "out.bin", "bytes": 100,
                         "sha256": "ab6e5c4f0f8bdc6e02a87d8e0e2a7d8b26d9c7ee8d4cbb0bf8a4e0f9d4a7a38c"}]}))
    return folder


def complete_stage(work: Path, name: str, key: str, inputs: dict | None = None) -> Path:
    """A stage folder the engine accepts as complete (its output's real SHA-256)."""
    import hashlib

    folder = stage(work, name, key, inputs)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["outputs"][0]["sha256"] = hashlib.sha256(b"x" * 100).hexdigest()
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


def run_folder(subs: Path, run_id: str, work: Path, *, name: str | None = None, ensemble: str = KEYS["ensemble"],
               train: str = KEYS["train"]) -> Path:
    folder = subs / run_id
    folder.mkdir(parents=True)
    manifest = {"run_id": run_id, "work_dir": str(work.resolve()), "stages": {"tile:xla": {
        "prepare": {"prune": KEYS["prune"], "features": KEYS["features"]},
        "train": {"random": {"stage": "train-random", "key": train, "work_dir": str(work.resolve())}},
        "ensemble": ensemble}}}
    if name:
        manifest["name"] = name
    (folder / "manifest.json").write_text(json.dumps(manifest))
    (folder / "submission.csv").write_text("ID,TopConfigs\n")
    record_submissions_dir([work], subs)
    return folder


@pytest.fixture
def world(tmp_path: Path) -> dict[str, Path]:
    """A work dir with a used chain (prune -> features -> train -> ensemble) and one orphan stage, and one
    published run of it under ``subs``."""
    work, subs = tmp_path / "work", tmp_path / "subs"
    complete_stage(work, "prune", KEYS["prune"])
    complete_stage(work, "features", KEYS["features"], {"prune": KEYS["prune"]})
    complete_stage(work, "train-random", KEYS["train"], {"features": KEYS["features"]})
    complete_stage(work, "ensemble", KEYS["ensemble"], {"prune": KEYS["prune"], "train-random": KEYS["train"]})
    complete_stage(work, "train-random", KEYS["orphan"], {"features": KEYS["features"]})
    run_folder(subs, "20261201T000000Z-aaaaaaaa", work)
    return {"work": work, "subs": subs, "base": tmp_path}


def fake_data_root(root: Path) -> Path:
    (root / "npz_all" / "npz" / "tile" / "xla" / "train").mkdir(parents=True)
    (root / "npz_all" / "npz" / "tile" / "xla" / "train" / "g.npz").write_bytes(b"raw")
    (root / "sample_submission.csv").write_text("ID,TopConfigs\n")
    return root


def listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def gc(work: Path, *subs: Path, delete: bool = False) -> int:
    args = ["gc", "--work-dir", str(work), *(a for s in subs for a in ("--submissions-dir", str(s)))]
    return main([*args, "--delete"] if delete else args)


# ----------------------------------------------------------------------------- what gc may delete


def test_gc_deletes_the_orphan_stage_and_keeps_the_chain_a_run_uses(world, capsys):
    before = listing(world["work"])
    assert gc(world["work"], world["subs"], delete=True) == 0
    assert "removed 1 stage folder(s)" in capsys.readouterr().out
    assert listing(world["work"]) == [p for p in before if KEYS["orphan"] not in p]


@pytest.mark.parametrize("delete", [False, True])
def test_gc_refuses_a_work_dir_that_is_a_data_root(tmp_path, capsys, delete):
    root = fake_data_root(tmp_path / "data")
    (tmp_path / "subs").mkdir()
    before = listing(root)
    assert gc(root, tmp_path / "subs", delete=delete) == 2
    err = capsys.readouterr().err
    assert "data root" in err and str(root) in err
    assert listing(root) == before


def test_gc_refuses_a_work_dir_holding_the_data_root_and_the_run_folders(world, capsys):
    fake_data_root(world["work"] / "raw")
    before = listing(world["work"])
    assert gc(world["work"], world["subs"], delete=True) == 2
    assert "data root" in capsys.readouterr().err and listing(world["work"]) == before
    # the same with the submissions folder inside the work dir (its run folders are not stages either)
    other = world["base"] / "work2"
    complete_stage(other, "prune", KEYS["orphan"])
    run_folder(other / "subs", "20261201T000000Z-bbbbbbbb", other, ensemble=KEYS["orphan"])
    before = listing(other)
    assert gc(other, other / "subs", delete=True) == 2
    assert "submissions" in capsys.readouterr().err and listing(other) == before


def test_gc_never_follows_a_symlink_into_the_data_root(world, capsys):
    root = fake_data_root(world["base"] / "data")
    before = listing(root)
    (world["work"] / "link").symlink_to(root)
    assert gc(world["work"], world["subs"], delete=True) == 2  # a link to raw data: refused, naming it
    assert "link" in capsys.readouterr().err and listing(root) == before
    os.unlink(world["work"] / "link")
    # a link to some other folder, or a key-named link inside a stage folder, is never followed nor deleted
    elsewhere = world["base"] / "elsewhere"
    (elsewhere / KEYS["orphan"]).mkdir(parents=True)
    (elsewhere / KEYS["orphan"] / "precious.txt").write_text("keep")
    (world["work"] / "features-old").symlink_to(elsewhere)
    (world["work"] / "prune" / ("9" * 16)).symlink_to(elsewhere / KEYS["orphan"])
    assert gc(world["work"], world["subs"], delete=True) == 0
    assert (elsewhere / KEYS["orphan"] / "precious.txt").read_text() == "keep"
    assert (world["work"] / "prune" / ("9" * 16)).is_symlink()


def test_gc_leaves_what_does_not_look_like_a_stage_output_alone(world, capsys):
    (world["work"] / "notes").mkdir()
    (world["work"] / "notes" / "ideas").mkdir()  # not a stage folder name
    (world["work"] / "prune" / "my-backup").mkdir()  # not key-shaped
    (world["work"] / "prune" / "my-backup" / "f.txt").write_text("mine")
    assert gc(world["work"], world["subs"], delete=True) == 0
    assert (world["work"] / "notes" / "ideas").is_dir() and (world["work"] / "prune" / "my-backup" / "f.txt").exists()


# ----------------------------------------------------------------------------- what gc must read


def test_gc_refuses_a_garbled_run_manifest_instead_of_dropping_that_runs_stages(world, capsys):
    (world["subs"] / "20261201T000000Z-aaaaaaaa" / "manifest.json").write_text("{ not json")
    before = listing(world["work"])
    for delete in (False, True):
        assert gc(world["work"], world["subs"], delete=delete) == 2
        err = capsys.readouterr().err
        assert "20261201T000000Z-aaaaaaaa" in err and "manifest.json" in err
    assert listing(world["work"]) == before


def test_gc_refuses_when_the_runs_of_the_work_dir_are_in_another_submissions_folder(world, capsys):
    other = world["base"] / "other-subs"
    other.mkdir()  # exists, holds no run of this work dir (the default submissions/ when runs went elsewhere)
    before = listing(world["work"])
    assert gc(world["work"], other, delete=True) == 2
    err = capsys.readouterr().err
    assert str(world["subs"].resolve()) in err and "--submissions-dir" in err  # says where the runs are
    assert listing(world["work"]) == before
    assert gc(world["work"], other) == 0  # the dry run lists, with the same warning
    assert f"warning: runs published from the work dir" in capsys.readouterr().out
    assert gc(world["work"], other, world["subs"], delete=True) == 0  # both given: only the orphan goes
    assert not (world["work"] / "train-random" / KEYS["orphan"]).exists()


def test_gc_refuses_a_work_dir_that_records_no_runs_when_no_given_run_uses_it(world, capsys):
    """A work dir of an earlier version records nowhere where its runs were published: with no run found
    that uses it, deleting every stage could be every trained model of runs elsewhere."""
    (world["work"] / cache_gc.PUBLISHED_LEDGER).unlink()
    other = world["base"] / "other-subs"
    other.mkdir()
    before = listing(world["work"])
    assert gc(world["work"], other, delete=True) == 2
    assert "records no submissions folder" in capsys.readouterr().err and listing(world["work"]) == before
    assert gc(world["work"], world["subs"], delete=True) == 0  # its runs found: the orphan goes


def test_a_referenced_stage_with_an_unreadable_manifest_stops_gc(world, capsys):
    (world["work"] / "ensemble" / KEYS["ensemble"] / "manifest.json").write_text("garbage")
    before = listing(world["work"])
    assert gc(world["work"], world["subs"], delete=True) == 2
    assert "ensemble" in capsys.readouterr().err and listing(world["work"]) == before


def test_a_referenced_but_damaged_stage_is_kept_with_its_inputs(world, capsys):
    (world["work"] / "train-random" / KEYS["train"] / "out.bin").write_bytes(b"y" * 100)  # content changed
    assert gc(world["work"], world["subs"], delete=True) == 0
    assert (world["work"] / "train-random" / KEYS["train"]).is_dir() and (world["work"] / "features" /
                                                                           KEYS["features"]).is_dir()


def test_what_a_killed_gc_leaves_is_reclaimed_by_the_next(world, capsys):
    trash = world["work"] / "train-random" / f".trash-gc-{KEYS['orphan']}-0badf00d"
    (world["work"] / "train-random" / KEYS["orphan"]).rename(trash)  # renamed aside, then killed
    assert gc(world["work"], world["subs"]) == 0
    assert "trash" in capsys.readouterr().out  # listed by the dry run
    assert gc(world["work"], world["subs"], delete=True) == 0
    assert not trash.exists()


# ----------------------------------------------------------------------------- run and the layout


def test_run_refuses_a_data_root_or_a_submissions_folder_inside_the_work_dir(tiny_world, tmp_path, capsys):
    import shutil

    from pipelines.config.settings import load_config
    from pipelines.flows.run import run_pipeline

    work = tmp_path / "work"
    inside = work / "raw"
    shutil.copytree(tiny_world, inside)
    with pytest.raises(ConfigError, match="data root"):
        run_pipeline(load_config("smoke"), inside, work_dir=work, models=["random"],
                     submissions_dir=tmp_path / "subs")
    with pytest.raises(ConfigError, match="submissions"):
        run_pipeline(load_config("smoke"), tiny_world, work_dir=work, models=["random"],
                     submissions_dir=work / "subs")
    assert sorted(p.name for p in work.iterdir()) == ["raw"]  # nothing computed


# ----------------------------------------------------------------------------- runs rm


def test_runs_rm_reports_an_ambiguity_between_a_name_and_an_id_prefix(world, capsys):
    from pipelines.outputs.run_folders import remove_run_folder, resolve_run_id

    subs = world["subs"]
    run_folder(subs, "20261202T000000Z-beef0001", world["work"], name="cafe")  # named like a hex prefix
    run_folder(subs, "20261203T000000Z-cafe0002", world["work"])
    with pytest.raises(PipelineError, match="names 2 runs"):
        resolve_run_id(subs, "cafe")
    with pytest.raises(PipelineError, match="names 2 runs"):
        remove_run_folder(subs, "cafe")
    assert (subs / "20261202T000000Z-beef0001").is_dir() and (subs / "20261203T000000Z-cafe0002").is_dir()
    assert main(["runs", "rm", "cafe", "--submissions-dir", str(subs), "--yes"]) == 1
    assert "names 2 runs" in capsys.readouterr().err
    assert resolve_run_id(subs, "beef") == "20261202T000000Z-beef0001"  # unique: still resolved


@pytest.mark.parametrize("name", ["20261202T000000Z-beef0001", "2026", "7", "20261202T00", "cafe0002-2",
                                  "0123abcd", "20261202T000000Z-be", "a", "beef"])
def test_run_names_that_look_like_run_ids_are_refused(name):
    from pipelines.outputs.run_folders import check_run_name

    with pytest.raises(ConfigError, match="looks like a run-id"):
        check_run_name(name)


@pytest.mark.parametrize("name", ["baseline", "gnn-v2", "seed1", "first", "deadline", "beefy"])
def test_ordinary_run_names_are_accepted(name):
    from pipelines.outputs.run_folders import check_run_name

    check_run_name(name)


def test_what_a_killed_runs_rm_leaves_is_reclaimed(world, monkeypatch):
    from pipelines.outputs import run_folders

    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(run_folders.shutil, "rmtree", killed)
    with pytest.raises(KeyboardInterrupt):
        run_folders.remove_run_folder(world["subs"], "20261201T000000Z-aaaaaaaa")
    monkeypatch.undo()
    run_folders.tidy_submissions(world["subs"])  # what status and the next publish do
    assert list(world["subs"].iterdir()) == []


def test_run_refuses_an_id_like_name_before_any_work(tiny_world, tmp_path, capsys):
    assert main(["run", "--data-root", str(tiny_world), "--work-dir", str(tmp_path / "work"), "--submissions-dir",
                 str(tmp_path / "subs"), "--config", "smoke", "--models", "random", "--name", "2026"]) == 2
    assert "looks like a run-id" in capsys.readouterr().err and not (tmp_path / "work").exists()


def test_a_ledger_that_cannot_be_written_is_a_warning_not_a_lost_run(tmp_path, caplog):
    work = tmp_path / "work"
    (work / cache_gc.PUBLISHED_LEDGER).mkdir(parents=True)  # a folder in its place
    record_submissions_dir([work, tmp_path / "gone"], tmp_path / "subs")
    assert "cannot record" in caplog.text and not (tmp_path / "gone").exists()
