"""benchmarks/paired_arms.py: which training stages form the two arms, and their paired OOF gain."""
import hashlib
import json

import polars as pl
import pytest

from benchmarks.paired_arms import (default_settings, find_arms, finished_stages, hidden_test_pair, load_arm, main,
                                    matching_stages, paired_cells, stage_manifest, stage_pair, toml_value)
from pipelines.flows.evaluate import CEILING, Evaluation
from pipelines.core.metric import GraphScore, summarize


def find_stage(work, model, collection, wanted, key, value):
    """The first stage :func:`matching_stages` keeps among the finished ones (None: there is none)."""
    found = matching_stages(finished_stages(work, model, collection), default_settings(model, collection),
                            wanted, key, value)
    return next(iter(found), None)


def write_stage(work, key, settings, seeds, finished, cell_scores, model="gnn"):
    """A finished training stage: manifest and the per-graph OOF scores (two graphs per (fold, seed) cell)."""
    folder = work / f"train-{model}" / key
    folder.mkdir(parents=True)
    # what each model's fold job records of its fit (pipelines.training.fit adds wall_s to every one)
    facts = {"gnn": {"train_seconds": 10.0, "epochs_run": 20}, "gbdt": {"best_iteration": 40}}[model]
    models = [{"fold": f, "seed": s, "wall_s": 12.0, **facts} for (f, s) in cell_scores]
    rows = [{"fold": f, "seed": s, "split": "oof", "graph": f"g{f}{i}", "score": score + d}
            for (f, s), score in cell_scores.items() for i, d in enumerate((-0.1, 0.1))]
    scores = folder / "scores.parquet"
    pl.DataFrame(rows).with_columns(pl.col("fold").cast(pl.Int16), pl.col("seed").cast(pl.Int32)).write_parquet(scores)
    # a complete stage output as the engine writes it: its outputs listed with their sizes and hashes
    manifest = {"stage": f"train-{model}", "key": key, "finished": finished, "metrics": {"models": models},
                "outputs": [{"path": scores.name, "bytes": scores.stat().st_size,
                             "sha256": hashlib.sha256(scores.read_bytes()).hexdigest()}],
                "config": {"collection": "layout:xla:default", "seeds": seeds, "settings": settings}}
    (folder / "manifest.json").write_text(json.dumps(manifest))


def test_the_base_arm_differs_from_the_candidate_in_the_key_alone(tmp_path):
    base = {"config_layers": 1, "precision": "fp32"}
    write_stage(tmp_path, "base", base, [0, 1], "2026-01-02", {(0, 0): 0.5, (1, 0): 0.6, (0, 1): 0.5})
    # the same key value but another setting: never the base of an fp32 candidate, even when newer
    write_stage(tmp_path, "bf16", {**base, "precision": "bf16"}, [0, 1], "2026-01-05", {(0, 0): 0.9})
    # two candidates: the one with more seeds wins over the newer one
    write_stage(tmp_path, "cand", {**base, "config_layers": 0}, [0, 1], "2026-01-03",
                {(0, 0): 0.4, (1, 0): 0.7, (0, 1): 0.3, (1, 1): 0.9})
    write_stage(tmp_path, "cand-1seed", {**base, "config_layers": 0}, [0], "2026-01-04", {(0, 0): 0.0})
    candidate = find_stage(tmp_path, "gnn", "layout:xla:default", None, "config_layers", 0)
    assert candidate["key"] == "cand"
    found = find_stage(tmp_path, "gnn", "layout:xla:default", candidate["config"]["settings"], "config_layers", 1)
    assert found["key"] == "base"
    assert find_stage(tmp_path, "gnn", "layout:xla:random", None, "config_layers", 0) is None

    arms = [load_arm(tmp_path, "gnn", stage) for stage in (found, candidate)]
    assert arms[0].per_seed.tolist() == pytest.approx([0.55, 0.5])  # seed 0: cells 0.5 and 0.6
    gain, se, up, cells = paired_cells(*arms)
    # cells both ran: (0,0) -0.1, (1,0) +0.1, (0,1) -0.2; (1,1) ran in the candidate only
    assert cells == 3 and up == 1
    assert gain == pytest.approx(-0.2 / 3) and se == pytest.approx(0.152753 / 3 ** 0.5, rel=1e-4)


def test_gbdt_arms_report_their_fold_jobs_wall_time_and_trees(tmp_path):
    write_stage(tmp_path, "base", {"exclude_features": []}, [0], "2026-01-02", {(0, 0): 0.5, (1, 0): 0.6},
                model="gbdt")
    write_stage(tmp_path, "chains-off", {"exclude_features": ["f_chain_"]}, [0], "2026-01-03",
                {(0, 0): 0.4, (1, 0): 0.7}, model="gbdt")
    arms = find_arms(tmp_path, "gbdt", "layout:xla:default", "exclude_features", [], ["f_chain_"])
    assert [arm["key"] for arm in arms] == ["base", "chains-off"]
    base = load_arm(tmp_path, "gbdt", arms[0])
    assert base.fit_seconds == 24.0 and base.epochs == 40.0  # two fold jobs' wall_s; best_iteration
    # a GNN's own training time (setup and scoring left out) is preferred to its fold job's wall time
    write_stage(tmp_path, "gnn-base", {"exclude_features": []}, [0], "2026-01-02", {(0, 0): 0.5, (1, 0): 0.6})
    gnn = load_arm(tmp_path, "gnn", stage_manifest(tmp_path, "gnn", "layout:xla:default", "gnn-base"))
    assert gnn.fit_seconds == 20.0 and gnn.epochs == 20.0


def test_a_stage_written_before_the_setting_existed_ran_its_default(tmp_path):
    base = {"config_layers": 1}  # no validate_every: the default, one validation per epoch
    write_stage(tmp_path, "old", base, [0], "2026-01-02", {(0, 0): 0.5})
    write_stage(tmp_path, "every2", {**base, "validate_every": 2}, [0], "2026-01-03", {(0, 0): 0.6})
    candidate = find_stage(tmp_path, "gnn", "layout:xla:default", None, "validate_every", 2)
    assert candidate["key"] == "every2"
    assert find_stage(tmp_path, "gnn", "layout:xla:default", candidate["config"]["settings"],
                      "validate_every", 1)["key"] == "old"
    assert find_stage(tmp_path, "gnn", "layout:xla:default", None, "validate_every", 3) is None


def test_a_setting_missing_from_either_stage_is_compared_at_its_default(tmp_path):
    # the arms differ in lr; the older base stage predates validate_every, the newer one predates
    # nothing: compared at validate_every's default (1), they differ in lr alone
    write_stage(tmp_path, "old", {"config_layers": 1, "lr": 1e-3}, [0], "2026-01-02", {(0, 0): 0.5})
    write_stage(tmp_path, "new", {"config_layers": 1, "lr": 3e-3, "validate_every": 1}, [0], "2026-01-03",
                {(0, 0): 0.6})
    # ... but a stage that validated every other epoch is never the base of one that validated every epoch
    write_stage(tmp_path, "every2", {"config_layers": 1, "lr": 1e-3, "validate_every": 2}, [0], "2026-01-04",
                {(0, 0): 0.7})
    candidate = find_stage(tmp_path, "gnn", "layout:xla:default", None, "lr", 3e-3)
    assert candidate["key"] == "new"
    found = find_stage(tmp_path, "gnn", "layout:xla:default", candidate["config"]["settings"], "lr", 1e-3)
    assert found["key"] == "old"
    # and the other way round: the older stage as the candidate finds the newer base
    old = find_stage(tmp_path, "gnn", "layout:xla:default", {"config_layers": 1}, "lr", 1e-3)
    assert old["key"] == "old"
    assert find_stage(tmp_path, "gnn", "layout:xla:default", old["config"]["settings"], "lr", 3e-3)["key"] == "new"


def test_the_arms_are_the_preferred_candidate_that_has_a_base(tmp_path):
    base = {"config_layers": 1, "passes_per_epoch": 1, "lr": 1e-3}
    write_stage(tmp_path, "base", base, [0], "2026-01-02", {(0, 0): 0.5})
    write_stage(tmp_path, "cand", {**base, "lr": 3e-3}, [0], "2026-01-03", {(0, 0): 0.6})
    # newer, and with as many seeds, but no stage at the base value of lr shares its passes
    write_stage(tmp_path, "cand-2passes", {**base, "lr": 3e-3, "passes_per_epoch": 2}, [0], "2026-01-04",
                {(0, 0): 0.7})
    assert find_stage(tmp_path, "gnn", "layout:xla:default", None, "lr", 3e-3)["key"] == "cand-2passes"
    found = find_arms(tmp_path, "gnn", "layout:xla:default", "lr", 1e-3, 3e-3)
    assert [stage["key"] for stage in found] == ["base", "cand"]
    assert find_arms(tmp_path, "gnn", "layout:xla:default", "lr", 1e-3, 1e-2) is None


def test_stages_named_by_key_are_checked_before_they_are_paired(tmp_path):
    write_stage(tmp_path, "base", {"config_layers": 1}, [0], "2026-01-02", {(0, 0): 0.5})
    assert stage_manifest(tmp_path, "gnn", "layout:xla:default", "base")["key"] == "base"
    absent = r"train-gnn/nope: no complete output of stage 'train-gnn' with key nope \(absent\)"
    with pytest.raises(SystemExit, match=absent):
        stage_manifest(tmp_path, "gnn", "layout:xla:default", "nope")
    other = r"train-gnn/base: the stage trained layout:xla:default, not layout:nlp:default"
    with pytest.raises(SystemExit, match=other):
        stage_manifest(tmp_path, "gnn", "layout:nlp:default", "base")
    (tmp_path / "train-gnn" / "base" / "scores.parquet").unlink()  # an output its manifest lists is gone
    with pytest.raises(SystemExit, match=r"train-gnn/base: no complete output .* \(incomplete"):
        stage_manifest(tmp_path, "gnn", "layout:xla:default", "base")


def test_a_stage_pair_is_collection_equals_two_keys(tmp_path, capsys):
    assert stage_pair("layout:xla:default=abc,def") == ("layout:xla:default", "abc", "def")
    for bad in ("layout:xla:default=abc", "=abc,def", "layout:xla:default=abc,", "abc,def"):
        with pytest.raises(Exception, match="COLLECTION=BASE_KEY,CANDIDATE_KEY"):
            stage_pair(bad)
    common = ["--data-root", str(tmp_path), "--work-dir", str(tmp_path)]
    with pytest.raises(SystemExit):
        main([*common, "--stages", "layout:xla:default=a,b", "--key", "lr"])
    assert "leave out --key" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([*common, "--key", "lr", "--base", "1e-3"])
    assert "--key, --base and --candidate are required" in capsys.readouterr().err


def test_the_test_split_gain_is_paired_over_graphs_in_units_of_the_ceiling():
    collection = "layout:xla:default"
    def report(scores):
        return summarize([GraphScore(collection, f"g{i}", 10, score) for i, score in enumerate(scores)])
    # the candidate gains 0.1 on every graph but the last (0.2): graph-to-graph spread cancels in the pair
    evaluation = Evaluation({CEILING: report([0.5, 0.5, 0.5, 0.5]), "base": report([0.1, 0.4, 0.2, 0.3]),
                             "candidate": report([0.2, 0.5, 0.3, 0.5])}, {}, (), ())
    pair = hidden_test_pair(evaluation, collection, "base", "candidate")
    assert pair.base == pytest.approx(0.25 / 0.5) and pair.candidate == pytest.approx(0.375 / 0.5)
    assert pair.gain == pytest.approx(0.125 / 0.5) == pytest.approx(pair.candidate - pair.base)
    gains = [0.1, 0.1, 0.1, 0.2]
    se = (sum((g - 0.125) ** 2 for g in gains) / 3) ** 0.5 / 4 ** 0.5
    assert pair.se == pytest.approx(se / 0.5)
    assert pair.describe() == "0.5000 -> 0.7500 (+0.2500 +- 0.0500)"


def test_values_are_toml_literals():
    assert toml_value("0") == 0 and toml_value('"bf16"') == "bf16" and toml_value("[0, 1]") == [0, 1]
