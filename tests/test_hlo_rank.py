"""Featurized real programs through the rest of the pipeline: prepare + predict, and ``rank``."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

jax = pytest.importorskip("jax")

from pipelines.cli import main  # noqa: E402
from pipelines.config.settings import load_config  # noqa: E402
from pipelines.flows.rank import build_data_root  # noqa: E402
from pipelines.hlo import featurize_module  # noqa: E402
from pipelines.hlo.parse import load_module, module_from_jax  # noqa: E402
from pipelines.flows.predict import predict_run  # noqa: E402
from pipelines.flows.run import run_pipeline  # noqa: E402
from pipelines.data.submission import validate_submission  # noqa: E402
from tests.test_hlo_featurize import PROGRAMS, _program, cnn  # noqa: E402


@pytest.fixture(scope="module")
def run(tiny_world: Path, tmp_path_factory: pytest.TempPathFactory):
    base = tmp_path_factory.mktemp("hlo-rank")
    result = run_pipeline(load_config("smoke"), tiny_world, work_dir=base / "work", models=["gbdt"],
                          submissions_dir=base / "subs")
    return {"run_id": result.run_id, "subs": base / "subs", "base": base}


@pytest.mark.slow
def test_a_data_root_of_real_programs_runs_through_prepare_and_predict(run, tmp_path):
    root = tmp_path / "programs"
    for name in PROGRAMS:
        for grad in (False, True):
            fn, args = _program(name, grad)
            stem = f"{name}{'_grad' if grad else ''}"
            featurized = featurize_module(module_from_jax(fn, *args), stem)
            build_data_root(featurized, stem, root, configs=30, sources=("xla", "nlp"))
    fn, args = cnn("NHWC")  # the tile collection: an optimized module's fusions
    fused = featurize_module(module_from_jax(jax.grad(fn), *args, optimized=True), "cnn_opt",
                             tile_configs_per_fusion=10)
    assert fused.tiles
    build_data_root(fused, "cnn_opt", root, configs=30, sources=("xla", "nlp"))
    result = predict_run(run["run_id"], root, submissions_dir=run["subs"])
    rows = validate_submission(result.submission, root)
    assert rows == 4 * (2 * len(PROGRAMS) + 1) + len(fused.tiles)


def test_rank_prints_every_configurable_node_and_an_answer_a_user_can_act_on(run, tmp_path, capsys):
    fn, args = _program("encoder", True)
    program = tmp_path / "encoder.txt"
    program.write_text(module_from_jax(fn, *args).to_string())
    featurized = featurize_module(load_module(program), "encoder")
    out = tmp_path / "ranked"
    code = main(["rank", "--run", run["run_id"], str(program), "--submissions-dir", str(run["subs"]),
                 "--out", str(out), "--configs", "40", "--top", "3"])
    assert code == 0
    printed = capsys.readouterr().out
    report = json.loads((out / "rank.json").read_text())
    assert set(report["layout"]) == {"layout:xla:random", "layout:xla:default"}
    candidates = report["layout_candidates"]  # one set: the module's own, 40 default-search, 40 random-search
    assert candidates["own"] == 1 and candidates["distinct"] <= 81
    assert candidates["distinct"] == 1 + candidates["default search"] + candidates["random search"]
    for part in report["layout"].values():
        assert [n["name"] for n in part["nodes"]] == [i.name for i in featurized.config_nodes]
        assert len(part["top"]) == 3 and part["top"][0]["score"] <= part["top"][-1]["score"]
        assert part["configs"] == candidates["distinct"] and part["own_layouts_rank"] >= 1
        gain = part["gain_over_own"]  # the best over the module's own layouts, per fold model (smoke: k=2)
        assert gain["fold_models"] == 2 and gain["blended"] >= 0 and 0 <= gain["fold_models_in_favour"] <= 2
        for node in part["nodes"]:  # as HLO writes a layout: the shape and {minor,...,major}
            assert re.fullmatch(r"[a-z0-9]+\[[0-9,]*\]\{[0-9,]*\}", node["output"]), node
    rec = report["recommendation"]  # one answer per node, whatever the two collections prefer
    assert set(rec["collections"]) == set(report["layout"]) and rec["rule"] == "best mean score"
    assert rec["collections_disagree"] == (len({p["best_config"] for p in report["layout"].values()}) > 1)
    assert all(n["changed"] for n in rec["nodes"]) and len(rec["nodes"]) == rec["nodes_changed"]
    for node in rec["nodes"]:  # what to change is printed; every node's layouts are in rank.json
        assert f"{node['name']}  " in printed and node["output"] in printed
    assert "recommended layouts: config" in printed and "Acting on a ranking" in printed
    assert (out / "rank.txt").read_text() in printed


def test_ties_are_ranked_as_ties():
    from pipelines.flows.rank import competition_order

    order, ranks = competition_order(np.array([0.2, 0.0, 0.0, 0.5, 0.2]))
    assert order.tolist() == [1, 2, 0, 4, 3] and ranks.tolist() == [1, 1, 3, 3, 5]


def test_one_recommendation_when_the_collections_disagree():
    """Two collections' models prefer different candidates: one config is recommended (the best mean), and
    the report says which each preferred and where it ranks the recommendation."""
    from types import SimpleNamespace

    from pipelines.flows.rank import recommend
    from pipelines.hlo.configs import LayoutSpace
    from pipelines.hlo.parse import Instruction, Shape

    shape = Shape("f32", (4, 8), (1, 0))
    nodes = [Instruction(f"dot.{k}", "dot", shape, ("a", "b"), {}, ()) for k in range(2)]
    operands = [Instruction(n, "parameter", shape, (), {}, ()) for n in ("a", "b")]
    defaults = np.full((2, 18), -1, np.int8)
    defaults[:, [0, 1, 6, 7, 12, 13]] = [1, 0, 1, 0, 1, 0]
    space = LayoutSpace(np.array([[2, 2, 2], [2, 2, 2]]), defaults)
    featurized = SimpleNamespace(config_ids=np.array([2, 3]), config_nodes=nodes, layout_space=lambda: space,
                                 layout=SimpleNamespace(instructions=operands + nodes))
    blocks = np.stack([defaults] * 3)
    blocks[1, 0, :2] = [0, 1]  # config 1: dot.0's output transposed
    blocks[2, 1, 6:8] = [0, 1]  # config 2: dot.1's input transposed
    folds = np.array([[1.0, 0.5, 0.0], [1.0, 0.5, 0.0]])  # every fold model scores config 2 faster than the own
    scores = {"layout:xla:random": (np.array([1.0, 0.0, 0.3]), folds),
              "layout:xla:default": (np.array([1.0, 0.6, 0.0]), folds)}
    rec = recommend(featurized, blocks, np.array([0, 1, 2]), scores)
    assert rec["config"] == 2 and rec["collections_disagree"] and rec["change_advised"]
    assert rec["collections"]["layout:xla:random"] == {**rec["collections"]["layout:xla:random"], "best_config": 1,
                                                       "rank_of_recommended": 2}
    assert rec["nodes_changed"] == 1 and rec["nodes"][0]["name"] == "dot.1"
    assert rec["nodes"][0]["input"] == "f32[4,8]{0,1}" and rec["nodes"][0]["module_input"] == "{1,0}"
    # one fold model of one collection sees no gain: the own layouts are the advice (the anchor), the best stays shown
    split = {"layout:xla:random": scores["layout:xla:random"],
             "layout:xla:default": (scores["layout:xla:default"][0], np.array([[1.0, 0.5, 0.0], [0.0, 0.5, 1.0]]))}
    cautious = recommend(featurized, blocks, np.array([0, 1, 2]), split)
    assert cautious["config"] == 2 and not cautious["change_advised"] and cautious["nodes_changed"] == 1


def test_rank_ranks_the_tiles_of_an_optimized_module(run, tmp_path):
    fn, args = cnn("NCHW")
    program = tmp_path / "cnn.hlo.pb"
    program.write_bytes(module_from_jax(jax.grad(fn), *args, optimized=True).as_serialized_hlo_module_proto())
    out = tmp_path / "ranked"
    assert main(["rank", "--run", run["run_id"], str(program), "--submissions-dir", str(run["subs"]),
                 "--out", str(out), "--configs", "20", "--tile-configs", "8", "-q"]) == 0
    report = json.loads((out / "rank.json").read_text())
    assert report["tiles"] and all(1 <= len(t["top"]) <= 5 and t["configs"] <= 8 for t in report["tiles"])
    assert all(t["top"][0]["output_tile"] for t in report["tiles"])


def test_rank_of_a_bad_file_is_a_clean_error(run, tmp_path, capsys):
    bad = tmp_path / "model.txt"
    bad.write_text("HloModule broken\n\nENTRY %main {\n")
    assert main(["rank", "--run", run["run_id"], str(bad), "--submissions-dir", str(run["subs"]),
                 "--out", str(tmp_path / "o")]) == 1
    assert str(bad) in capsys.readouterr().err


def test_rank_rebuilds_only_a_data_root_it_made(run, tmp_path, capsys):
    fn, args = _program("mlp", False)
    program = tmp_path / "mlp.txt"
    program.write_text(module_from_jax(fn, *args).to_string())
    common = ["rank", "--run", run["run_id"], str(program), "--submissions-dir", str(run["subs"]), "--configs", "5",
              "-q"]
    assert main([*common, "--out", str(tmp_path / "r")]) == 0
    assert main([*common, "--out", str(tmp_path / "r")]) == 0  # its own folder: rebuilt
    mine = tmp_path / "mine"
    (mine / "data").mkdir(parents=True)
    (mine / "data" / "precious.txt").write_text("keep me")
    assert main([*common, "--out", str(mine)]) == 1
    assert "was not built by rank" in capsys.readouterr().err
    assert (mine / "data" / "precious.txt").read_text() == "keep me"
