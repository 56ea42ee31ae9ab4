"""``runs list`` / ``runs compare`` from run manifests, and ``submit RUN_ID`` (the kaggle package faked)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pipelines.outputs import runs_table as runs
from pipelines.cli import main
from pipelines.config.settings import load_config
from pipelines.outputs.kaggle_io import COMPETITION
from pipelines.flows.run import run_pipeline
from tests.test_kaggle_io import fake, no_credentials  # noqa: F401  (fixtures: a fake kaggle package)



@pytest.fixture(scope="module")
def one_run(tiny_world: Path, tmp_path_factory: pytest.TempPathFactory):
    base = tmp_path_factory.mktemp("runs")
    result = run_pipeline(load_config("smoke"), tiny_world, work_dir=base / "work", models=["random", "feature"],
                          submissions_dir=base / "subs")
    return result, base


def copy_run(source: Path, subs: Path, run_id: str, edit) -> Path:
    """A new run folder under ``subs`` holding ``source``'s manifest changed by ``edit(manifest)``."""
    manifest = json.loads((source / "manifest.json").read_text())
    edit(manifest)
    target = subs / run_id
    target.mkdir(parents=True)
    (target / "manifest.json").write_text(json.dumps(manifest))
    return target


def set_score(value: float, created: str, wall: float = 10.0, seeds=(0,)):
    def edit(manifest: dict) -> None:
        manifest["combined_oof"]["ensemble"]["value"] = value
        manifest["created"] = created
        manifest["wall_time_s"] = wall
        manifest["config"]["run"]["seeds"] = list(seeds)
        manifest["submission"]["sha256"] = f"{value}"  # another result (same stages, other bytes)
        for scores in manifest["cv_scores"].values():
            scores["blend"]["ensemble"] = value
    return edit


def test_runs_list_fits_100_columns_unless_wide(one_run, tmp_path, capsys):
    """Issue 79: the table was ~230 characters wide, the data-root column cut by the terminal."""
    result, _ = one_run

    def label(name: str, created: str, score: float):
        def edit(manifest: dict) -> None:
            set_score(score, created)(manifest)
            manifest["name"] = name
        return edit

    subs = tmp_path / "subs"
    copy_run(result.run_dir, subs, "20260101T000000Z-aaaaaaaa", label("a short name", "2026-01-01T00:00:00+00:00", 0.61))
    copy_run(result.run_dir, subs, "20260102T000000Z-bbbbbbbb",
             label("a name far longer than the room left for it", "2026-01-02T00:00:00+00:00", 0.62))
    assert main(["runs", "list", "--submissions-dir", str(subs)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert max(map(len, lines)) <= 100
    # the name has priority over the models, which are left out when no room is left for them
    assert lines[0].split() == ["RUN", "tile", "xla:def", "xla:rnd", "nlp:def", "nlp:rnd", "COMBINED", "NAME"]
    assert lines[1].startswith("20260101T000000Z-aaaaaaaa") and lines[1].endswith("0.6100  a short name")
    assert lines[2].endswith("  a name far longer ~") and len(lines[2]) == 100
    assert lines[-1] == "--wide adds MODELS, DATA ROOT, SEEDS, FOLDS, WALL, SUBMITTED, DIFFERS FROM BASE, NOTE"
    assert main(["runs", "list", "--wide", "--submissions-dir", str(subs)]) == 0
    wide = capsys.readouterr().out.splitlines()
    assert max(map(len, wide)) > 100 and "a name far longer than the room left for it" in wide[2]
    assert "DATA ROOT" in wide[0] and "DIFFERS FROM BASE" in wide[0]


def test_runs_list_shows_each_run_with_its_scores_and_sorts(one_run, tmp_path, capsys):
    result, _ = one_run
    subs = tmp_path / "subs"
    copy_run(result.run_dir, subs, "20260101T000000Z-aaaaaaaa", set_score(0.61, "2026-01-01T00:00:00+00:00", 5))
    copy_run(result.run_dir, subs, "20260102T000000Z-bbbbbbbb", set_score(0.72, "2026-01-02T00:00:00+00:00", 50,
                                                                          seeds=(0, 1, 2)))
    copy_run(result.run_dir, subs, "20260103T000000Z-cccccccc", set_score(0.55, "2026-01-03T00:00:00+00:00", 20))
    (subs / "not-a-run").mkdir()  # folders without a manifest are not runs

    assert main(["runs", "list", "--wide", "--submissions-dir", str(subs), "--sort", "score"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:5] == ["RUN", "CREATED", "KIND", "DATA", "ROOT"]
    assert [line.split()[0] for line in lines[1:4]] == ["20260102T000000Z-bbbbbbbb", "20260101T000000Z-aaaaaaaa",
                                                        "20260103T000000Z-cccccccc"]
    best = lines[1]
    assert "0.7200" in best and "random,feature" in best and "3 (0,1,2)" in best and "s  no " in best

    rows = runs.load_runs(subs)
    assert [r["run_id"] for r in runs.sort_runs(rows, "wall")][0] == "20260101T000000Z-aaaaaaaa"
    assert [r["run_id"] for r in runs.sort_runs(rows, "date", reverse=True)][0] == "20260103T000000Z-cccccccc"
    assert main(["runs", "list", "--submissions-dir", str(tmp_path / "none")]) == 1


def test_one_unreadable_submission_record_does_not_hide_the_other_runs(one_run, tmp_path, capsys, caplog):
    result, _ = one_run
    subs = tmp_path / "subs"
    broken = copy_run(result.run_dir, subs, "20260101T000000Z-aaaaaaaa", set_score(0.61, "2026-01-01T00:00:00+00:00"))
    copy_run(result.run_dir, subs, "20260102T000000Z-bbbbbbbb", set_score(0.72, "2026-01-02T00:00:00+00:00"))
    (broken / runs.SUBMITTED_RECORD).write_text("{not json")
    assert main(["runs", "list", "--submitted", "--wide", "--submissions-dir", str(subs)]) == 0
    lines = capsys.readouterr().out.splitlines()
    listed = [line for line in lines if line.startswith("2026")]
    assert len(listed) == 1 and listed[0].startswith("20260101T000000Z-aaaaaaaa") and "unreadable" in listed[0]
    assert str(broken / runs.SUBMITTED_RECORD) in caplog.text
    assert main(["runs", "list", "--submissions-dir", str(subs)]) == 0
    assert "20260102T000000Z-bbbbbbbb" in capsys.readouterr().out


def test_runs_compare_shows_scores_side_by_side_and_the_config_difference(one_run, tmp_path, capsys):
    result, _ = one_run
    subs = tmp_path / "subs"

    def changed(manifest: dict) -> None:
        manifest["config"]["folds"]["k"] = 5
        manifest["cv_scores"]["tile:xla"]["training"]["random"]["oof_score"] += 0.1

    copy_run(result.run_dir, subs, "a", lambda m: None)
    copy_run(result.run_dir, subs, "b", changed)
    assert main(["runs", "compare", "a", "b", "--submissions-dir", str(subs), "--no-test"]) == 0
    out = capsys.readouterr().out
    tile = next(line for line in out.splitlines() if line.startswith("tile:xla") and " random " in line)
    assert tile.split()[-1] == "+0.1000"
    assert "config differences (1):" in out and "folds.k  A 2  B 5" in out
    assert main(["runs", "compare", "a", "nope", "--submissions-dir", str(subs)]) == 1


def test_runs_compare_lists_only_the_settings_both_runs_used():
    """Issue 79: 14 gnn.* settings listed as differences when one run trained no GNN."""
    a = {"models": ["gbdt", "gnn"], "config": {"gnn": {"epochs": 8, "hidden": 64}, "gbdt": {"num_leaves": 31},
                                               "folds": {"k": 5}}}
    b = {"models": ["gbdt"], "config": {"gnn": {"epochs": 20, "hidden": 128}, "gbdt": {"num_leaves": 63},
                                        "folds": {"k": 5}}}
    diff, notes = runs.used_settings_difference(a, b)
    assert [key for key, _, _ in diff] == ["models", "gbdt.num_leaves"]
    assert notes == ["2 gnn.* setting(s) differ but are not listed: only A trains gnn"]
    both = {**b, "models": ["gbdt", "gnn"]}
    assert [key for key, _, _ in runs.used_settings_difference(a, both)[0]] == [
        "gbdt.num_leaves", "gnn.epochs", "gnn.hidden"]


def test_runs_compare_tests_once_states_its_rule_and_does_not_test_identical_stages():
    """Issue 79: identical cached models shown as a tested +0.0000, two combined figures for one
    difference, 18 tests with no word on multiple comparisons."""
    import polars as pl

    from pipelines.outputs import graph_scores as gs

    def table(model: str, collection: str, values) -> pl.DataFrame:
        return pl.DataFrame({"collection": collection, "model": model, "graph": [f"g{i}" for i in range(len(values))],
                             "score": [float(v) for v in values]})

    base = [0.1 * i for i in range(10)]
    a = pl.concat([table("ensemble", "tile:xla", base), table("gbdt", "tile:xla", base),
                   table("ensemble", "layout:xla:default", base), table("gbdt", "layout:xla:default", base)])
    b = pl.concat([table("ensemble", "tile:xla", [v + 0.05 for v in base]), table("gbdt", "tile:xla", base),
                   table("ensemble", "layout:xla:default", [v + 0.02 for v in base]),
                   table("gbdt", "layout:xla:default", [v + 0.01 for v in base])])
    manifest_a = {"stages": {"tile:xla": {"ensemble": "e1", "train": {"gbdt": {"stage": "train-gbdt", "key": "k1"}}},
                             "layout:xla:default": {"ensemble": "e2",
                                                    "train": {"gbdt": {"stage": "train-gbdt", "key": "k2"}}}}}
    manifest_b = {"stages": {"tile:xla": {"ensemble": "e3", "train": {"gbdt": {"stage": "train-gbdt", "key": "k1"}}},
                             "layout:xla:default": {"ensemble": "e4",
                                                    "train": {"gbdt": {"stage": "train-gbdt", "key": "k9"}}}}}
    identical = gs.identical_stages(manifest_a, manifest_b)
    assert identical == {("tile:xla", "gbdt"): "the same train-gbdt/k1 output"}
    tests = gs.compare_scores(a, b, identical=identical)
    assert ("tile:xla", "gbdt") not in tests["graphs"] and tests["identical"] == identical
    # tested: 2 ensemble rows, 1 gbdt row, the gbdt combined row (the combined ensemble is the primary)
    assert tests["levels"] == {"primary": 0.05, "secondary": 0.05 / 4, "tests": 4}
    assert tests["combined"]["ensemble"].mean == pytest.approx((0.05 + 0.02) / 2)  # the CV tables' figure
    text = gs.format_tests(tests)
    assert "rule: the combined ensemble row answers" in text and "5% / 4" in text and "98.8% intervals" in text
    same = next(line for line in text.splitlines() if line.startswith("tile:xla") and " gbdt " in line)
    assert same.split()[2] == "=" and same.endswith("identical: the same train-gbdt/k1 output, not tested")
    # other stage outputs with the same score on every graph: identical too, not tested
    again = gs.compare_scores(a, a)
    assert not again["graphs"] and not again["combined"] and again["levels"]["tests"] == 0
    assert again["identical_models"] == ["ensemble", "gbdt"]


def test_a_predict_run_is_compared_by_its_source_run(one_run, tmp_path, capsys):
    """Issue 79: comparing a predict run with its source said "no graph ... in the prepared data"."""
    result, _ = one_run
    subs = tmp_path / "subs"
    copy_run(result.run_dir, subs, "a", lambda m: None)

    def as_predict(manifest: dict) -> None:
        manifest.update(kind="predict", source_run="a", data_root="/data/new-graphs")
        for entry in manifest["stages"].values():
            entry["ensemble"] = "0" * 16  # the predict run's own ensemble stage: test predictions only
    copy_run(result.run_dir, subs, "p", as_predict)
    assert main(["runs", "compare", "a", "p", "--submissions-dir", str(subs)]) == 0
    out = capsys.readouterr().out
    assert "B: p is a predict run (it ranked /data/new-graphs with the fold models of a): compared by a's scores" in out
    assert "not tested" in out and "in the prepared data" not in out
    tested = out[out.index("is B - A real?"):].splitlines()
    assert all(line.split()[2] == "=" for line in tested if line.startswith(("tile", "layout", "combined")))
    cv_table = out[:out.index("is B - A real?")].splitlines()
    assert "B - A" not in next(line for line in cv_table if line.startswith("collection"))  # one figure: below
    copy_run(result.run_dir, subs, "orphan", lambda m: m.update(kind="predict", source_run="gone"))
    assert main(["runs", "compare", "a", "orphan", "--submissions-dir", str(subs)]) == 1
    assert "run orphan is a predict run of gone, whose scores it would be compared by" in capsys.readouterr().err


def test_submit_a_run_validates_uploads_with_a_default_message_and_records_it(one_run, fake, capsys):  # noqa: F811
    result, base = one_run
    subs = base / "subs"
    assert main(["submit", result.run_id, "--submissions-dir", str(subs)]) == 1  # a synthetic world: refused
    assert not [c for c in fake.calls if c[0] == "submit"]
    assert main(["submit", result.run_id[-8:-3], "--submissions-dir", str(subs), "--allow-synthetic"]) == 0
    score = result.manifest["combined_oof"]["ensemble"]["value"]
    upload = [c for c in fake.calls if c[0] == "submit"][-1]
    assert upload == ("submit", str(result.submission), f"{result.run_id} CV {score:.4f}", COMPETITION)
    record = json.loads((result.run_dir / runs.SUBMITTED_RECORD).read_text())
    entry = record["submissions"][-1]
    assert entry["message"] == upload[2] and entry["validated_against"] == result.manifest["data_root"]
    assert entry["sha256"] == result.manifest["submission"]["sha256"] and "Successfully" in entry["kaggle_response"]
    capsys.readouterr()
    assert main(["runs", "list", "--wide", "--submissions-dir", str(subs), "--submitted"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert listed[1].startswith(result.run_id) and entry["submitted_at"][:10] in listed[1]


def test_submit_refuses_a_changed_csv_and_records_nothing_when_the_upload_fails(one_run, fake, tmp_path):  # noqa: F811
    result, _ = one_run
    subs = tmp_path / "subs"
    shutil.copytree(result.run_dir, subs / result.run_id)
    (subs / result.run_id / runs.SUBMITTED_RECORD).unlink(missing_ok=True)
    fake.on_submit = lambda: (_ for _ in ()).throw(OSError("network is down"))
    assert main(["submit", result.run_id, "--submissions-dir", str(subs), "-m", "try", "--allow-synthetic"]) == 1
    assert not (subs / result.run_id / runs.SUBMITTED_RECORD).exists()

    csv = subs / result.run_id / "submission.csv"
    csv.write_text(csv.read_text().replace("\n", "\r\n", 1))
    uploads = len([c for c in fake.calls if c[0] == "submit"])
    assert main(["submit", result.run_id, "--submissions-dir", str(subs), "--allow-synthetic"]) == 1
    assert len([c for c in fake.calls if c[0] == "submit"]) == uploads
    assert main(["submit", "no-such-run", "--submissions-dir", str(subs)]) == 1


def test_submit_takes_a_run_folder_path_too(one_run, fake):  # noqa: F811
    result, _ = one_run
    assert main(["submit", str(result.run_dir), "-m", "by path", "--allow-synthetic"]) == 0
    assert [c for c in fake.calls if c[0] == "submit"][-1][1:3] == (str(result.submission), "by path")
    assert json.loads((result.run_dir / runs.SUBMITTED_RECORD).read_text())["submissions"][-1]["message"] == "by path"


HAND_EDITS = {
    "a list for the whole manifest": lambda m: [m],
    "null": lambda m: None,
    "stages a list": lambda m: {**m, "stages": list(m["stages"].values())},
    "a collection's stages a string": lambda m: {**m, "stages": {**m["stages"], "tile:xla": "x"}},
    "cv_scores a string": lambda m: {**m, "cv_scores": "high"},
    "combined_oof a list": lambda m: {**m, "combined_oof": [1, 2]},
    "models an integer": lambda m: {**m, "models": 5},
    "created an integer": lambda m: {**m, "created": 12},
    "kind an integer": lambda m: {**m, "kind": 3},
    "submission a string": lambda m: {**m, "submission": "s"},
    "no stages": lambda m: {k: v for k, v in m.items() if k != "stages"},
}


@pytest.mark.parametrize("edit", sorted(HAND_EDITS))
def test_a_hand_edited_run_manifest_is_named_and_left_out_of_runs_list(one_run, tmp_path, capsys, caplog, edit):
    """Issue 71, class 3: one valid-JSON manifest of other types broke ``runs list`` for every run."""
    result, _ = one_run
    subs = tmp_path / "subs"
    shutil.copytree(result.run_dir, subs / result.run_id)
    bad = subs / "20260101T000000Z-badbadba"
    bad.mkdir()
    (bad / "manifest.json").write_text(json.dumps(HAND_EDITS[edit](json.loads((result.run_dir / "manifest.json")
                                                                              .read_text()))))
    assert main(["runs", "list", "--submissions-dir", str(subs)]) == 0
    table = [line for line in capsys.readouterr().out.splitlines() if not line.startswith("warning:")]
    assert any(line.startswith(result.run_id) for line in table) and not any("badbadba" in line for line in table)
    assert f"warning: {bad / 'manifest.json'}: not a valid run manifest" in caplog.text


@pytest.mark.slow
def test_a_hand_edited_run_manifest_is_refused_by_name_and_breaks_no_other_run(one_run, tiny_world, tmp_path, capsys):
    result, base = one_run
    subs = tmp_path / "subs"
    shutil.copytree(result.run_dir, subs / result.run_id)
    bad = subs / "20260101T000000Z-badbadba"
    bad.mkdir()
    manifest = json.loads((result.run_dir / "manifest.json").read_text())
    (bad / "manifest.json").write_text(json.dumps({**manifest, "stages": {**manifest["stages"], "tile:xla": "x"}}))
    common = ["--submissions-dir", str(subs)]
    for args in (["report", "badbadba", "--out", str(tmp_path / "bad.html")], ["runs", "compare", "badbadba",
                 result.run_id], ["predict", "--run", "badbadba", "--data-root", str(tiny_world)]):
        assert main([*args, *common]) == 1, args
        err = capsys.readouterr().err
        assert f"error: {bad / 'manifest.json'}: not a valid run manifest (stages.tile:xla: expected an object" in err
    assert main(["report", result.run_id, "--out", str(tmp_path / "good.html"), *common]) == 0
    assert main(["predict", "--run", result.run_id, "--data-root", str(tiny_world), *common]) == 0
    assert main(["runs", "rm", "badbadba", "--yes", *common]) == 0 and not bad.exists()  # as its error suggests
