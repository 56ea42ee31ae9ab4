"""Featurized real programs through the rest of the pipeline: prepare + predict, and ``rank``."""

from __future__ import annotations

import json
from pathlib import Path

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


def test_rank_prints_every_configurable_node_and_the_top_configs(run, tmp_path, capsys):
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
    for part in report["layout"].values():
        assert [n["name"] for n in part["nodes"]] == [i.name for i in featurized.config_nodes]
        assert len(part["top"]) == 3 and part["top"][0]["score"] <= part["top"][-1]["score"]
        assert part["configs"] == 40
    assert report["layout"]["layout:xla:default"]["default_layout_rank"] is not None  # row 0 is the default
    for node in featurized.config_nodes:
        assert node.name in printed
    assert "top configs" in printed and (out / "rank.txt").read_text() in printed


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
