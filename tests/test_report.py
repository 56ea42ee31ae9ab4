"""The run report: its pure tables on hand-made inputs, and ``python -m pipelines report RUN_ID``
rendering a self-contained HTML file for a demo run on the tiny world."""

from __future__ import annotations

import base64
import re

import polars as pl
import pytest

from pipelines.cli import main
from pipelines.config.settings import load_config
from pipelines.core.errors import PipelineError
from pipelines.reports.report import (REPORT_FILE, Section, cv_table, graph_scores_table, render_html, worst_graphs,
                                      write_run_report)

FAST = ["run.seeds=[0, 1]", "gbdt.n_estimators=10"]  # on top of the smoke config


def test_cv_table_lists_each_model_then_the_blend():
    manifest = {"cv_scores": {"tile:xla": {"training": {"gbdt": {"oof_score": 0.9, "oof_score_std": 0.01,
                                                                 "oof_score_by_seed": {"0": 0.89, "1": 0.91}}},
                                           "blend": {"gbdt": 0.92, "ensemble": 0.92}}},
                "ensemble_weights": {"tile:xla": {"gbdt": 1.0}}}
    table = cv_table(manifest)
    assert table.rows() == [("tile:xla", "gbdt", 0.9, 0.01, 2, 0.92, 1.0),
                            ("tile:xla", "ensemble", 0.92, None, None, 0.92, None)]


def test_worst_graphs_take_the_lowest_seed_means():
    scores = pl.DataFrame({"collection": ["c"] * 6, "model": ["m"] * 6, "graph": ["a", "a", "b", "b", "c", "c"],
                           "split": ["oof"] * 6, "fold": [0] * 6, "seed": [0, 1] * 3, "num_configs": [5] * 6,
                           "score": [0.2, 0.4, 0.9, 0.7, 0.1, float("nan")]})
    per_graph = graph_scores_table(scores)
    assert per_graph.select("graph", "mean").rows() == [("c", 0.1), ("a", pytest.approx(0.3)), ("b", 0.8)]
    assert worst_graphs(per_graph, k=2)["graph"].to_list() == ["c", "a"]


def test_render_html_escapes_text_and_inlines_figures():
    png = b"\x89PNG"
    section = Section("A <b> & c", ["x < y"], [("t", pl.DataFrame({"name": ["<i>"], "v": [0.123456]}))],
                      [("fig", png)])
    text = render_html("title", [section])
    assert "A &lt;b&gt; &amp; c" in text and "x &lt; y" in text and "<td>&lt;i&gt;</td><td>0.1235</td>" in text
    assert "data:image/png;base64," + base64.b64encode(png).decode() in text


@pytest.fixture(scope="module")
def demo_run(tiny_world, tmp_path_factory):
    from pipelines.flows.run import run_pipeline

    root = tmp_path_factory.mktemp("report")
    result = run_pipeline(load_config("smoke", FAST), tiny_world, work_dir=root / "work", models=["gbdt", "feature"],
                          submissions_dir=root / "submissions")
    write_run_report(result.run_id, root / "submissions")
    return root, result


@pytest.mark.slow
def test_report_command_writes_a_self_contained_html(demo_run, capsys):
    root, result = demo_run
    assert main(["report", result.run_id, "--submissions-dir", str(root / "submissions")]) == 0
    path = root / "submissions" / result.run_id / REPORT_FILE
    assert capsys.readouterr().out.strip() == str(path)
    text = path.read_text(encoding="utf-8")
    for title in ("Cross-validation scores per collection", "Per-graph score distribution", "Worst graphs",
                  "Feature importances (GBDT)", "Ensemble weights"):
        assert f"<h2>{title}</h2>" in text
    sources = re.findall(r"src='([^']*)'", text)
    assert len(sources) == 3 and all(s.startswith("data:image/png;base64,") for s in sources)
    assert not re.search(r"(href|src)=['\"](?!data:)", text)  # nothing outside the file
    for png in sources:  # distribution, importances, weight curve: each a real PNG
        assert base64.b64decode(png.split(",", 1)[1])[:8] == b"\x89PNG\r\n\x1a\n"
    # The CV table carries the manifest's numbers.
    gbdt = result.manifest["cv_scores"]["tile:xla"]["training"]["gbdt"]["oof_score"]
    assert f"<td>tile:xla</td><td>gbdt</td><td>{gbdt:.4f}</td>" in text


@pytest.mark.slow
def test_report_names_a_missing_run_and_a_deleted_cache(demo_run, tmp_path):
    root, result = demo_run
    assert main(["report", "no-such-run", "--submissions-dir", str(root / "submissions")]) == 1  # a data error
    with pytest.raises(PipelineError, match=r"run .*: the saved \S+ output of \S+ is gone: "):
        from pipelines.reports.report import write_report

        write_report(result.run_id, submissions_dir=root / "submissions", work_dir=tmp_path, out=tmp_path / "r.html")
    assert not (tmp_path / "r.html").exists()


@pytest.mark.slow
def test_a_run_report_puts_the_summary_first(demo_run):
    root, result = demo_run
    path = result.run_dir / REPORT_FILE
    text = path.read_text(encoding="utf-8")
    assert text.index("<h2>Summary</h2>") < text.index("<h2>Run</h2>") < text.index("<h2>Worst graphs</h2>")
    combined = result.manifest["combined_oof"]["ensemble"]["value"]
    assert f"<b>{combined:.4f}</b>" in text
    assert "&plusmn;" in text and "seeds" in text and "folds" in text  # spread over seeds and folds
    assert "<details>" in text  # the worst-graphs table is folded away


def test_summary_table_has_spread_over_seeds_and_folds():
    from pipelines.reports.report import summary_table

    manifest = {"cv_scores": {
        "tile:xla": {"training": {"gbdt": {"oof_score": 0.9, "oof_score_std": 0.01,
                                           "oof_score_by_seed": {"0": 0.89, "1": 0.91}}},
                     "blend": {"gbdt": 0.92, "ensemble": 0.92}},
        "layout:xla:default": {"training": {"gbdt": {"oof_score": 0.5, "oof_score_std": 0.03,
                                                     "oof_score_by_seed": {"0": 0.47, "1": 0.53}}},
                               "blend": {"gbdt": 0.51, "ensemble": 0.51}}}}
    folds = {("tile:xla", "gbdt"): {"0": 0.8, "1": 1.0}}
    table = summary_table(manifest, folds).rows(named=True)
    gbdt, ensemble = table
    assert gbdt["model"] == "gbdt" and gbdt["combined"] == pytest.approx(0.7)
    assert gbdt["combined:seeds"] == pytest.approx(0.02)  # seed 0: 0.68, seed 1: 0.72
    assert gbdt["tile:xla:folds"] == pytest.approx(0.1) and gbdt["layout:xla:default:folds"] is None
    assert ensemble["model"] == "ensemble" and ensemble["combined"] == pytest.approx(0.715)


@pytest.mark.slow
def test_a_reblended_run_reports_its_source_runs(demo_run):
    from pipelines.flows.run import ensemble_runs

    root, result = demo_run
    again = ensemble_runs([result.run_id], submissions_dir=root / "submissions", method="rank")
    write_run_report(again.run_id, root / "submissions")
    text = (again.run_dir / REPORT_FILE).read_text(encoding="utf-8")
    assert f"re-blend of 1 run(s), training nothing: {result.run_id} (2 folds x seeds [0, 1])" in text
    assert "None folds" not in text


def test_gnn_training_keeps_its_curves_and_the_report_draws_them(tiny_world, tmp_path):
    from pipelines.core.collection import TILE_XLA
    from pipelines.flows.prepare import prepare
    from pipelines.reports.report import _training_curves_figure, epoch_cap_lines
    from pipelines.training.fit import CURVES_FILE, CURVES_SCHEMA, format_summary, train_model

    config = load_config("smoke", ["gnn.epochs=2", "gnn.patience=0", "gnn.hidden=8", "gnn.free_layers=1",
                                   "gnn.configs_per_graph=4", "gnn.eval_max_configs=16"])
    prepared = prepare(config, tiny_world, tmp_path / "work", [TILE_XLA])[TILE_XLA.name]
    output = train_model(config, prepared, model="gnn", work_dir=tmp_path / "work")
    curves = pl.read_parquet(output.file(CURVES_FILE))
    assert dict(curves.schema) == CURVES_SCHEMA
    assert sorted(set(curves.select("fold", "seed", "epoch").iter_rows())) == \
        [(f, 0, e) for f in (0, 1) for e in (1, 2)]
    assert curves["train_loss"].is_finite().all()
    # patience 0: no early stopping, every fold model ran to the cap
    assert output.metrics["epoch_cap"] == {"epochs": 2, "fold_models": 2, "at_cap": 2}
    assert "2 of 2 fold models stopped at the epoch cap" in format_summary(output)
    assert epoch_cap_lines({TILE_XLA.name: {"gnn": output}}) == \
        ["tile:xla gnn: 2 of 2 fold models stopped at the epoch cap (2 epochs)"]
    assert _training_curves_figure(curves).startswith(b"\x89PNG")
