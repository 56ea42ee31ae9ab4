"""The analysis notebooks: every one executes as a real notebook (jupytext -> nbclient, the venv's
Python kernel) in smoke mode on the tiny world, and the shared helpers of pipelines.reports.analysis compute
what they claim on hand-made frames."""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from pipelines.reports import analysis
from pipelines.core.predictions import prediction_frame

pytestmark = pytest.mark.slow  # end-to-end: left out of make test-quick

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO / "notebooks").glob("[0-9][0-9]-*.py"))


# ----------------------------------------------------------------------------- helpers (pure)


def test_notebooks_are_numbered_in_order():
    assert [p.name[:3] for p in NOTEBOOKS] == ["01-", "02-", "03-", "04-", "05-"]


def test_settings_come_from_one_config_and_overrides(tmp_path):
    scratch = f"notebook.scratch='{tmp_path}'"
    smoke = analysis.notebook_settings({"TPUGRAPHS_CONFIG": "smoke", "TPUGRAPHS_SET": scratch})
    assert smoke.smoke and smoke.scale == "tiny" and smoke.folds == 2 and smoke.seeds == (0, 1)
    assert smoke.config == "smoke" and smoke.overrides == () and smoke.run_id is None
    assert smoke.data_root == tmp_path / "tiny-world" and smoke.work_dir == tmp_path / "work"
    assert smoke.config_overrides("prune.hops=2")[:2] == ["folds.k=2", "run.seeds=[0, 1]"]
    assert smoke.config_overrides("prune.hops=2")[-1] == "prune.hops=2"

    default = analysis.notebook_settings({"TPUGRAPHS_SET": "folds.k=3; run.seeds=[4, 5]; prune.hops=2; "
                                                           "notebook.collections=['layout:xla:random']; "
                                                           "notebook.run_id=r1"})
    assert not default.smoke and default.scale == "small" and default.data_root == Path("data/synthetic-small")
    assert (default.folds, default.seeds, default.collections) == (3, (4, 5), ("layout:xla:random",))
    assert default.overrides == ("folds.k=3", "run.seeds=[4, 5]", "prune.hops=2") and default.run_id == "r1"
    assert smoke.models == ("gbdt", "feature", "random") and default.models is None
    with_gnn = {"TPUGRAPHS_CONFIG": "smoke", "TPUGRAPHS_SET": f'{scratch}; run.models=["gbdt", "gnn"]'}
    assert analysis.notebook_settings(with_gnn).models == ("gbdt", "gnn")
    assert analysis.choose_models(smoke, ["gbdt", "gnn", "no-such-model"]) == ["gbdt"]
    assert analysis.notebook_settings({}).folds == 5 and len(analysis.notebook_settings({}).seeds) == 3
    # every value is checked by the config's own checker before a notebook runs anything
    with pytest.raises(analysis.ConfigError, match="run.seeds"):
        analysis.notebook_settings({"TPUGRAPHS_SET": "run.seeds=['a']"})
    with pytest.raises(analysis.ConfigError, match="notebook.data_root"):
        analysis.notebook_settings({"TPUGRAPHS_SET": "notebook.dataroot=x"})
    with pytest.raises(analysis.ConfigError, match="no_such_config"):
        analysis.notebook_settings({"TPUGRAPHS_CONFIG": "no_such_config"})


def test_summarize_cells_mean_over_seeds_and_spreads_by_hand():
    # Two seeds x two folds; seed 0 cells 0.2, 0.4 (mean 0.3); seed 1 cells 0.6, 0.8 (mean 0.7).
    cells = pl.DataFrame({"collection": ["c"] * 4, "seed": [0, 0, 1, 1], "fold": [0, 1, 0, 1],
                          "score": [0.2, 0.4, 0.6, 0.8]})
    row = analysis.summarize_cells(cells, ["collection"]).row(0, named=True)
    assert row["mean"] == pytest.approx(0.5)
    assert row["std_seeds"] == pytest.approx(0.2)  # population std of 0.3, 0.7
    assert row["std_cells"] == pytest.approx(np.std([0.2, 0.4, 0.6, 0.8], ddof=1))
    assert row["sem"] == pytest.approx(row["std_cells"] / 2)
    assert (row["cells"], row["seeds"]) == (4, 2)


def test_cell_scores_averages_defined_oof_graphs_per_fold_and_seed():
    scores = pl.DataFrame({"collection": ["c"] * 5, "graph": list("abcde"),
                           "split": ["oof", "oof", "oof", "holdout", "oof"], "fold": [0, 0, 1, 0, 1],
                           "seed": [0] * 5, "score": [0.1, 0.3, float("nan"), 0.9, 0.5]})
    cells = analysis.cell_scores(scores)
    assert cells.select("fold", "score", "graphs").rows() == [(0, pytest.approx(0.2), 2), (1, 0.5, 1)]


def test_blend_weight_curve_ends_are_the_single_models():
    truth = np.array([4.0, 3.0, 1.0, 2.0])  # not sorted: all-tied scores (index order) score badly
    good = prediction_frame(collection="layout:xla:random", graph="g", split="oof", fold=0, seed=0, model="a",
                            scores=truth.copy())
    bad = prediction_frame(collection="layout:xla:random", graph="g", split="oof", fold=0, seed=0, model="b",
                           scores=-truth)
    curve = analysis.weight_curve({"a": good, "b": bad}, {"g": truth}, "layout:xla:random", [0.0, 1.0])
    assert curve["score"].to_list() == [pytest.approx(-1.0), pytest.approx(1.0)]  # w = weight of "a"
    fitted = analysis.blend_by_seed({"a": good, "b": bad}, {"g": truth}, "layout:xla:random")
    # Any weight of "a" above 1/2 keeps a's order (score 1); ties go to the weights closest to equal.
    assert fitted["weight:a"].to_list() == [0.55] and fitted["score"].to_list() == [pytest.approx(1.0)]
    with pytest.raises(analysis.ConfigError):
        analysis.weight_curve({"a": good}, {"g": truth}, "layout:xla:random", [0.5])


def test_importance_shares_groups_and_opcode_mix():
    importance = pl.DataFrame({"collection": ["c"] * 4, "fold": [0, 0, 1, 1], "seed": [0] * 4,
                               "feature": ["f_pad_waste", "f_cfg_1", "f_pad_waste", "f_cfg_1"],
                               "gain": [3.0, 1.0, 1.0, 1.0]})
    table = analysis.importance_table(importance)
    assert table["feature"].to_list() == ["f_pad_waste", "f_cfg_1"]
    assert table["mean"].to_list() == [pytest.approx(0.625), pytest.approx(0.375)]
    assert table["group"].to_list() == ["padding cost", "other"]
    assert analysis.feature_group_of("f_freq_min") == "value frequencies"

    counts = pl.DataFrame({"collection": ["c"] * 3, "opcode": [26, 34, 999], "nodes": [6, 3, 1]})
    mix = analysis.opcode_mix(counts, top=2)
    assert mix["name"].to_list() == ["conv", "dot", "other"]
    assert mix["share"].to_list() == [pytest.approx(0.6), pytest.approx(0.3), pytest.approx(0.1)]
    spread = analysis.runtime_spread(np.array([1.0, 10.0, 0.0]))
    assert spread["log10_max_over_min"] == pytest.approx(1.0)
    assert math.isnan(analysis.runtime_spread(np.array([5.0]))["cv"])


# ----------------------------------------------------------------------------- notebooks executed


@pytest.fixture(scope="module")
def smoke_env(tiny_world, tmp_path_factory):
    """One scratch folder shared by the five notebooks, so later ones reuse cached stages."""
    scratch = tmp_path_factory.mktemp("notebooks")
    return {"TPUGRAPHS_CONFIG": "smoke",
            "TPUGRAPHS_SET": f"notebook.scratch='{scratch}'; notebook.data_root='{tiny_world}'",
            "MPLBACKEND": "Agg", "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_executes_in_smoke_mode(path, smoke_env, monkeypatch):
    jupytext = pytest.importorskip("jupytext")
    nbclient = pytest.importorskip("nbclient")
    for name, value in smoke_env.items():
        monkeypatch.setenv(name, value)  # the kernel inherits this process's environment
    notebook = jupytext.read(path)
    assert any(cell.cell_type == "markdown" for cell in notebook.cells)
    client = nbclient.NotebookClient(notebook, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(REPO)}})
    client.execute()
    errors = [o for c in notebook.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors
    figures = analysis.notebook_settings(smoke_env).work_dir / "figures"
    assert list(figures.glob(f"{path.name[:2]}-*.png")), "every notebook saves at least one figure"


def test_gbdt_exclude_features_drops_f_columns_by_prefix_only():
    """The switch the feature ablation uses: gbdt.exclude_features removes f_* columns by prefix."""
    from pipelines.core.collection import parse_collection
    from pipelines.config.settings import load_config
    from pipelines.models.gbdt import GBDTAdapter

    frame = pl.DataFrame({"graph": ["g"], "config_index": [0], "target": [1.0], "f_pad_waste": [1.0],
                          "f_pad_ratio_sum": [2.0], "f_violation_ratio": [0.5], "g_pad_x": [3.0]})

    class Prepared:
        def load_features(self, graphs, max_configs=None, seed=0):
            return frame

    adapter = GBDTAdapter()
    config = load_config("quick", ['gbdt.exclude_features=["f_pad_"]'])
    settings = adapter.settings(config, parse_collection("layout:xla:default"))
    loaded = adapter.load(Prepared(), ["g"], settings=settings, fit=True, seed=0)
    assert loaded.columns == ["graph", "config_index", "target", "f_violation_ratio", "g_pad_x"]
    settings = adapter.settings(load_config("quick"), parse_collection("layout:xla:default"))
    assert adapter.load(Prepared(), ["g"], settings=settings, fit=False, seed=0).columns == frame.columns


def test_paired_differences_subtract_the_baseline_of_the_same_cell():
    cells = pl.DataFrame({"collection": ["c"] * 4, "variant": ["base", "base", "x", "x"], "seed": [0, 0, 0, 0],
                          "fold": [0, 1, 0, 1], "score": [0.5, 0.1, 0.6, 0.3]})
    paired = analysis.paired_differences(cells, "base")
    assert paired.select("variant", "fold", "score").rows() == [("x", 0, pytest.approx(0.1)),
                                                                ("x", 1, pytest.approx(0.2))]
    with pytest.raises(analysis.ConfigError, match="baseline"):
        analysis.paired_differences(cells, "missing")


def test_finish_says_where_the_figures_went_and_removes_a_temporary_scratch(tmp_path):
    made = analysis.notebook_settings({"TPUGRAPHS_CONFIG": "smoke"})
    assert made.temporary is not None and made.temporary.name.startswith("tpugraphs-smoke-")
    figures = made.work_dir / "figures"
    figures.mkdir(parents=True)
    (figures / "01-a.png").write_bytes(b"png")
    text = analysis.finish(made, figures)
    assert f"1 PNG file(s) in {figures} (01-a.png)" in text and "removed the smoke scratch folder" in text
    assert not made.temporary.exists()
    named = analysis.notebook_settings({"TPUGRAPHS_CONFIG": "smoke", "TPUGRAPHS_SET": f"notebook.scratch='{tmp_path}'"})
    assert named.temporary is None and "removed" not in analysis.finish(named, tmp_path / "figures")
    assert tmp_path.exists()
