"""``evaluate``: a run's test submission scored on the tiny world's hidden labels, next to the
heuristics (floor) and the noise-free ranking (ceiling); refusal of a world without labels; the run
folder's evaluation file and its report section; the blend-weight curve on hidden labels."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from pipelines.cli import main
from pipelines.core.collection import ALL_COLLECTIONS, TILE_XLA
from pipelines.config.settings import load_config
from pipelines.core.errors import PipelineError
from pipelines.flows.evaluate import (CEILING, EVALUATION_FILE, FLOOR, HEURISTIC, SUBMISSION, costs_row, evaluate_rows,
                                evaluate_run, heuristics)
from pipelines.synth.world import read_labels
from pipelines.training.fit import load_predictions
from pipelines.data.root import DataRoot



@pytest.fixture(scope="module")
def run(tiny_world: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    from pipelines.flows.run import run_pipeline

    root = tmp_path_factory.mktemp("evaluate")
    result = run_pipeline(load_config("smoke", ["gbdt.n_estimators=10"]), tiny_world, work_dir=root / "work", models=["gbdt", "feature"],
                          submissions_dir=root / "submissions")
    return root / "submissions", result.run_id


def _rows_from(world: Path, array: str) -> dict[str, list[int]]:
    """Submission rows ranking every test graph by one of its hidden label arrays."""
    rows = {}
    for collection in ALL_COLLECTIONS:
        for ref in DataRoot(world).graphs(collection, "test"):
            labels = read_labels(world, collection, "test", ref.stem)
            values = labels.runtime / labels.normalizer if collection.is_tile and array == "runtime" \
                else getattr(labels, array)
            rows[ref.submission_id] = costs_row(collection, values)
    return rows


def test_ranking_by_the_labels_themselves_scores_the_top_and_the_ceiling(tiny_world: Path) -> None:
    evaluation = evaluate_rows(tiny_world, {"measured": _rows_from(tiny_world, "runtime"),
                                            "noise_free": _rows_from(tiny_world, "noise_free")})
    measured = evaluation.collection_scores("measured")
    assert measured[TILE_XLA.name] == 1.0  # the true fastest config is in every top 5
    for name in ("layout:xla:random", "layout:nlp:random"):
        assert measured[name] == pytest.approx(1.0), name  # no ties among random configs: tau-b of the truth is 1
    # the ceiling is exactly the noise-free ranking; noise keeps it below the measured truth's own order
    # (default-search files repeat configs, whose shared measurements tie: their tau-b stays below 1 even then)
    assert evaluation.collection_scores("noise_free") == evaluation.collection_scores(CEILING)
    ceiling = evaluation.collection_scores(CEILING)
    assert all(measured[name] >= value for name, value in ceiling.items())
    assert all(0.5 < value <= 1.0 for value in ceiling.values())
    assert any(value < 1.0 for value in ceiling.values())


def test_floor_is_the_best_heuristic_of_each_collection(tiny_world: Path) -> None:
    evaluation = evaluate_rows(tiny_world, {})
    floor = evaluation.collection_scores(FLOOR)
    for collection in ALL_COLLECTIONS:
        scores = {h: evaluation.collection_scores(HEURISTIC + h)[collection.name] for h in heuristics(collection)}
        assert set(scores) >= {"identity", "random", "baseline", "padding_waste"}
        assert floor[collection.name] == max(scores.values())
        assert evaluation.floor_by_collection[collection.name] == max(scores, key=scores.get)
    assert "violation_ratio" in evaluation.heuristic_names


@pytest.mark.slow
def test_evaluate_command_scores_the_run_and_writes_its_folder(run, tiny_world: Path, capsys) -> None:
    submissions, run_id = run
    args = ["evaluate", run_id, "--data-root", str(tiny_world), "--submissions-dir", str(submissions)]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "combined" in out and "floor" in out and "ceiling" in out and "gbdt" in out
    assert "per program family" in out and "transformer" in out  # the per-(collection, program family) table
    record = json.loads((submissions / run_id / EVALUATION_FILE).read_text())
    assert record["run_id"] == run_id and record["world"]["variant"] == 0 and sorted(record["models"]) == ["feature", "gbdt"]
    assert set(record["collections"]) == {c.name for c in ALL_COLLECTIONS}
    for row in record["collections"].values():
        for entry in (FLOOR, "gbdt", "feature", SUBMISSION, CEILING):
            assert -1.0 <= row[entry] <= 1.0
        assert row["ratio_to_ceiling"][SUBMISSION] == pytest.approx(row[SUBMISSION] / row[CEILING])
    combined = record["combined"]
    assert combined[CEILING]["complete"] and combined[CEILING]["value"] > combined["heuristic:random"]["value"]
    # the submission's rows are the run's: scoring them directly gives the same figures
    from pipelines.data.submission import read_submission

    direct = evaluate_rows(tiny_world, {SUBMISSION: read_submission(submissions / run_id / "submission.csv")})
    assert direct.collection_scores(SUBMISSION) == {k: v[SUBMISSION] for k, v in record["collections"].items()}

    # a second evaluation replaces its own file; the report shows it
    assert main(args) == 0
    assert main(["report", run_id, "--submissions-dir", str(submissions)]) == 0
    html = (submissions / run_id / "report.html").read_text()
    assert "Test evaluation (hidden labels)" in html and "submission/ceiling" in html


@pytest.mark.slow
def test_scoring_some_collections_reuses_the_runs_stages_and_gives_its_scores(run, tiny_world: Path) -> None:
    from pipelines.flows.evaluate import evaluate_collection_runs
    from pipelines.flows.run import train_and_blend

    submissions, run_id = run
    evaluate_run(run_id, tiny_world, submissions_dir=submissions)
    full = json.loads((submissions / run_id / EVALUATION_FILE).read_text())["collections"]
    chosen = ["tile:xla", "layout:nlp:random"]
    runs, computed = train_and_blend(load_config("smoke", ["gbdt.n_estimators=10"]), tiny_world,
                                     work_dir=submissions.parent / "work", models=["gbdt", "feature"],
                                     collections=chosen)
    assert computed == []  # the run's own stages, nothing trained again
    part = evaluate_collection_runs(runs, tiny_world, method="minmax")
    for entry in (FLOOR, "gbdt", "feature", SUBMISSION, CEILING):
        scores = part.collection_scores(entry)
        assert sorted(scores) == sorted(chosen), entry
        for name in chosen:
            assert scores[name] == pytest.approx(full[name][entry]), (entry, name)
        assert part.reports[entry].combined.value == pytest.approx(np.mean([scores[n] for n in chosen]))
    assert not part.reports[SUBMISSION].combined.complete  # a mean of two collections, flagged as not the score


@pytest.mark.slow
def test_each_run_seed_is_scored_alone_and_the_ensemble_is_checked_against_their_spread(run, tiny_world: Path) -> None:
    from pipelines.flows.evaluate import (
        SeedCheck,
        evaluate_collection_runs,
        evaluate_collection_seeds,
        seed_checks,
        seed_entry,
    )
    from pipelines.flows.run import train_and_blend

    submissions, _ = run
    chosen = ["layout:nlp:random"]
    runs, _ = train_and_blend(load_config("smoke", ["gbdt.n_estimators=10", "run.seeds=[0, 1]"]), tiny_world,
                              work_dir=submissions.parent / "work", models=["gbdt", "feature"], collections=chosen)
    evaluation = evaluate_collection_runs(runs, tiny_world, method="minmax")
    seeds = evaluate_collection_seeds(runs, tiny_world, method="minmax")
    assert set(seeds.model_names) == {seed_entry(m, s) for m in ("gbdt", "feature") for s in (0, 1)}
    (check,) = seed_checks(evaluation, seeds)
    scores = {m: evaluation.collection_scores(m)[chosen[0]] for m in ("gbdt", "feature")}
    assert check.best_model == max(scores, key=scores.get) and check.best_score == scores[check.best_model]
    assert check.seed_scores == tuple(seeds.collection_scores(seed_entry(check.best_model, s))[chosen[0]]
                                      for s in (0, 1))
    assert check.ensemble_score == evaluation.collection_scores(SUBMISSION)[chosen[0]]
    assert check.within_spread == (check.gap >= -check.spread)
    assert (check.gap_se, check.gap) == pytest.approx(
        evaluation.graph_gap(SUBMISSION, check.best_model, chosen[0])[::-1], nan_ok=True)  # test 3 graphs: an se
    assert SeedCheck("c", "m", 0.5, (), 0.6).within_spread and not SeedCheck("c", "m", 0.5, (), 0.4).within_spread
    assert SeedCheck("c", "m", 0.5, (0.45, 0.5), 0.46).within_spread
    assert not SeedCheck("c", "m", 0.5, (0.45, 0.5), 0.44).within_spread

    # one run seed: scoring it alone is scoring the model
    one, _ = train_and_blend(load_config("smoke", ["gbdt.n_estimators=10", "run.seeds=[3]"]), tiny_world,
                             work_dir=submissions.parent / "work", models=["gbdt"], collections=chosen)
    alone = evaluate_collection_seeds(one, tiny_world, method="minmax")
    assert alone.model_names == (seed_entry("gbdt", 3),)
    assert alone.collection_scores(seed_entry("gbdt", 3)) == evaluate_collection_runs(
        one, tiny_world, method="minmax").collection_scores("gbdt")
    (single,) = seed_checks(evaluate_collection_runs(one, tiny_world, method="minmax"), alone)
    assert single.spread == 0 and single.within_spread == (single.gap >= 0)


def test_the_gap_of_two_entries_is_paired_over_the_test_graphs_both_score() -> None:
    from pipelines.flows.evaluate import paired_graph_gap

    def frame(scores):
        return pl.DataFrame({"graph": [f"g{i}" for i in range(len(scores))], "score": scores})

    # better on every graph by 0.1 +- 0.05
    gap, se = paired_graph_gap(frame([0.5, 0.4, 0.3, 0.2]), frame([0.35, 0.35, 0.15, 0.15]))
    assert gap == pytest.approx(0.1)
    assert se == pytest.approx(0.1 / math.sqrt(3) / math.sqrt(4))  # std (ddof 1) of 0.15, 0.05, 0.15, 0.05 / sqrt(4)
    # paired by graph name, not by row order; a graph one entry cannot score (NaN) or lacks is left out
    gap, se = paired_graph_gap(frame([0.5, math.nan, 0.3, 0.9]).reverse(), frame([0.4, 0.0, 0.2]))
    assert gap == pytest.approx(0.1) and se == pytest.approx(0.0)
    assert math.isnan(paired_graph_gap(frame([0.5]), frame([0.4]))[1])  # one graph: no standard error


@pytest.mark.slow
def test_evaluate_never_overwrites_a_file_it_did_not_write(run, tiny_world: Path, tmp_path: Path) -> None:
    submissions, run_id = run
    copy = tmp_path / "submissions"
    shutil.copytree(submissions / run_id, copy / run_id)
    (copy / run_id / EVALUATION_FILE).write_text("my notes\n")
    with pytest.raises(PipelineError, match="not written by `evaluate`"):
        evaluate_run(run_id, tiny_world, submissions_dir=copy, with_models=False)
    assert (copy / run_id / EVALUATION_FILE).read_text() == "my notes\n"


@pytest.mark.slow
def test_a_world_without_hidden_labels_is_refused(run, tiny_world: Path, tmp_path: Path, capsys) -> None:
    submissions, run_id = run
    real_like = tmp_path / "real"
    shutil.copytree(tiny_world, real_like, ignore=shutil.ignore_patterns("labels"))
    code = main(["evaluate", run_id, "--data-root", str(real_like), "--submissions-dir", str(submissions)])
    assert code == 1  # a data problem, not a usage error
    assert "no hidden test labels" in capsys.readouterr().err
    assert not (submissions / run_id / EVALUATION_FILE).exists() or \
        json.loads((submissions / run_id / EVALUATION_FILE).read_text())["data_root"] != str(real_like.resolve())


@pytest.mark.slow
def test_a_run_made_for_another_world_is_refused(run, tmp_path: Path) -> None:
    from pipelines.core.errors import SubmissionError
    from pipelines.synth import generate_world

    submissions, run_id = run
    other = tmp_path / "other"
    generate_world(other, scale="tiny", seed=7)
    with pytest.raises(SubmissionError, match="unknown ID"):
        evaluate_run(run_id, other, submissions_dir=submissions, with_models=False)


@pytest.mark.slow
def test_hidden_label_weight_curve_ends_are_the_models_and_the_run_weight_is_its_submission(
        run, tiny_world: Path, tmp_path: Path) -> None:
    from pipelines.reports import analysis
    from pipelines.training.ensemble import AVERAGED

    submissions, run_id = run
    record, _ = evaluate_run(run_id, tiny_world, submissions_dir=submissions)
    record = record.to_dict()["collections"]
    outputs = analysis.run_outputs(submissions, run_id)
    seeds = set(outputs.manifest["config"]["run"]["seeds"])
    for name in ("tile:xla", "layout:nlp:random"):
        predictions = {m: load_predictions(outputs.trained[name][m]) for m in ("gbdt", "feature")}
        chosen = outputs.manifest["ensemble_weights"][name]["gbdt"]
        curve = analysis.hidden_label_weight_curve(predictions, tiny_world, name, [0.0, chosen, 1.0])
        assert set(curve["seed"].to_list()) == seeds | {AVERAGED} and curve.height == 3 * (len(seeds) + 1)
        averaged = dict(curve.filter(pl.col("seed") == AVERAGED).select("weight", "score").rows())
        # every seed and fold model averaged: what `evaluate` scores for each model alone, and the submission
        assert averaged[1.0] == pytest.approx(record[name]["gbdt"])
        assert averaged[0.0] == pytest.approx(record[name]["feature"])
        assert averaged[chosen] == pytest.approx(record[name][SUBMISSION])
    real_like = tmp_path / "real"
    shutil.copytree(tiny_world, real_like, ignore=shutil.ignore_patterns("labels"))
    with pytest.raises(PipelineError, match="no hidden test labels"):
        analysis.hidden_label_weight_curve(predictions, real_like, name, [0.5])


def _first_tile_labels(world: Path) -> Path:
    return sorted((world / "labels" / "npz" / "tile" / "xla" / "test").glob("*.npz"))[0]


def _edit_labels(world: Path, change) -> Path:
    path = _first_tile_labels(world)
    with np.load(path) as archive:
        arrays = {name: archive[name] for name in archive.files}
    change(arrays, arrays["runtime"].shape[0])
    np.savez(path, **arrays)
    return path


def _edit_marker(world: Path, change) -> Path:
    path = world / "labels" / "labels.json"
    path.write_text(json.dumps(change(json.loads(path.read_text()))))
    return path


MALFORMED_LABELS = {
    "runtime strings": lambda w: _edit_labels(w, lambda a, n: a.update(runtime=np.array(["a"] * n))),
    "runtime booleans": lambda w: _edit_labels(w, lambda a, n: a.update(runtime=np.ones(n, bool))),
    "runtime complex": lambda w: _edit_labels(w, lambda a, n: a.update(runtime=np.ones(n, np.complex128))),
    "runtime NaN": lambda w: _edit_labels(w, lambda a, n: a.update(runtime=np.full(n, np.nan))),
    "runtime zero": lambda w: _edit_labels(w, lambda a, n: a.update(runtime=np.zeros(n, np.int64))),
    "normalizer zero": lambda w: _edit_labels(w, lambda a, n: a.update(normalizer=np.zeros(n, np.int64))),
    "noise_free NaN": lambda w: _edit_labels(w, lambda a, n: a.update(noise_free=np.full(n, np.nan))),
    "noise_free missing": lambda w: _edit_labels(w, lambda a, n: a.pop("noise_free")),
    "labels.json a list": lambda w: _edit_marker(w, lambda m: [m]),
    "labels.json unknown scale": lambda w: _edit_marker(w, lambda m: {**m, "scale": "huge"}),
    "labels.json no scale": lambda w: _edit_marker(w, lambda m: {k: v for k, v in m.items() if k != "scale"}),
    "labels.json seed a string": lambda w: _edit_marker(w, lambda m: {**m, "seed": "x"}),
    "labels.json unknown collection": lambda w: _edit_marker(w, lambda m: {**m, "collections": ["tile:foo"]}),
    "labels.json collections an integer": lambda w: _edit_marker(w, lambda m: {**m, "collections": 3}),
}


@pytest.mark.slow
@pytest.mark.parametrize("damage", sorted(MALFORMED_LABELS))
def test_malformed_hidden_labels_are_an_error_naming_the_file(run, tiny_world: Path, tmp_path: Path, capsys,
                                                              damage) -> None:
    """Issue 71, class 3: malformed labels were tracebacks (or, booleans and complex, scored)."""
    submissions, run_id = run
    world, copy = tmp_path / "world", tmp_path / "submissions"
    shutil.copytree(tiny_world, world)
    shutil.copytree(submissions / run_id, copy / run_id)
    path = MALFORMED_LABELS[damage](world)
    record = copy / run_id / EVALUATION_FILE
    before = record.read_bytes() if record.exists() else None  # an earlier test's evaluation, if any
    code = main(["evaluate", run_id, "--data-root", str(world), "--submissions-dir", str(copy), "--no-models"])
    err = capsys.readouterr().err
    assert code == 1 and f"error: {path}: " in err and "Traceback" not in err, err[-2000:]
    assert (record.read_bytes() if record.exists() else None) == before  # nothing scored, nothing written


@pytest.mark.slow
def test_per_graph_view_lists_every_test_graph_with_its_program_size_and_scores(run, tiny_world: Path, capsys) -> None:
    from pipelines.flows.evaluate import per_graph_table
    from pipelines.synth.world import program_families

    submissions, run_id = run
    assert main(["evaluate", run_id, "--data-root", str(tiny_world), "--submissions-dir", str(submissions),
                 "--per-graph"]) == 0
    out = capsys.readouterr().out
    record = json.loads((submissions / run_id / EVALUATION_FILE).read_text())
    rows = pl.DataFrame(record["per_graph"])
    graphs = {(c.name, ref.stem) for c in ALL_COLLECTIONS for ref in DataRoot(tiny_world).graphs(c, "test")}
    assert set(zip(rows["collection"], rows["graph"])) == graphs and rows.height == len(graphs)
    families = program_families(tiny_world)
    for row in rows.iter_rows(named=True):
        key = (row["collection"], row["graph"])
        assert (row["program_family"], row["program"]) == (families[key].kind, families[key].name)
        assert row["share_of_ceiling"] == pytest.approx(row[SUBMISSION] / row[CEILING])
        assert row["graph"][:24] in out
    # sizes and config counts are the files' own; the collection means are the per-graph means
    for collection in ALL_COLLECTIONS:
        part = rows.filter(pl.col("collection") == collection.name)
        for ref, row in zip(sorted(DataRoot(tiny_world).graphs(collection, "test"), key=lambda r: r.stem),
                            part.sort("graph").iter_rows(named=True)):
            from pipelines.data.tpugraphs import load_ref

            graph = load_ref(ref)
            assert (row["nodes"], row["num_configs"]) == (graph.num_nodes, graph.num_configs)
            assert row["config_nodes"] == (None if collection.is_tile else graph.node_config_ids.shape[0])
        for entry in ("gbdt", SUBMISSION, CEILING):
            assert part[entry].mean() == pytest.approx(record["collections"][collection.name][entry])
        shares = part["share_of_ceiling"].drop_nans().drop_nulls().to_list()
        assert shares == sorted(shares)  # worst first
    table = per_graph_table(evaluate_rows(tiny_world, {SUBMISSION: _rows_from(tiny_world, "noise_free")}), {})
    assert set(table["program"]) == {"unknown"} and table["share_of_ceiling"].drop_nans().eq(1.0).all()


def test_by_family_without_per_node_kind_is_refused_before_any_work(tmp_path: Path, capsys) -> None:
    """--by-family splits the per-node-kind table: alone it is an error that names it, before the run or
    the data root is read (neither exists here)."""
    code = main(["evaluate", "no-such-run", "--data-root", str(tmp_path / "missing"), "--by-family"])
    err = capsys.readouterr().err
    assert code != 0 and "--by-family" in err and "--per-node-kind" in err and "Traceback" not in err
    assert not (tmp_path / "missing").exists()
