"""Issue 77: tuning records (``tuning.proto``) in, TpuGraphs graphs with measured runtimes out, as a data root.

The records here are written by the tests (jax lowers the programs; the runs are made up), except the
two real files of ``../shared/real_tpu`` (read in place, skipped where absent), which fix the format's
facts: the official node ids and 112 of 122 layout runs kept; 15 kernels with their default normalizer.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

from pipelines.core.collection import LAYOUT_XLA_DEFAULT, LAYOUT_XLA_RANDOM, TILE_XLA  # noqa: E402
from pipelines.core.errors import ConfigError, FormatError, PipelineError  # noqa: E402
from pipelines.data.root import DataRoot  # noqa: E402
from pipelines.data.tpugraphs import load_graph  # noqa: E402
from pipelines.flows.records import fingerprint_split, records_to_data_root  # noqa: E402
from pipelines.hlo.parse import module_from_jax  # noqa: E402
from pipelines.hlo.records import signed_hex  # noqa: E402
from pipelines.hlo.schema import hlo_message, tuning_message  # noqa: E402
from tests.test_hlo_featurize import PROGRAMS, _program  # noqa: E402

REAL = Path(__file__).resolve().parents[1] / ".." / "shared" / "real_tpu"
needs_real = pytest.mark.skipif(not (REAL / "op_tuning_data.pb").is_file(), reason="../shared/real_tpu is not here")
CONFIGURABLE = ("convolution", "dot", "reshape")


# ----------------------------------------------------------------------------- records the tests write


def _positions(module_bytes: bytes) -> list[tuple[int, str, int]]:
    """(node id, opcode, rank) of every instruction, in the serialized module's order."""
    module = hlo_message("HloModuleProto").FromString(module_bytes)
    return [(i, ins.opcode.decode(), len(ins.shape.dimensions))
            for i, ins in enumerate(x for c in module.computations for x in c.instructions)]


def layout_record(module_bytes: bytes, fingerprint: int, runs: int, seed: int):
    """A ModuleTuningData of layout runs: run 0 the default, run 1 errored, the rest random permutations of
    each configurable node's output and input dims (partial, as real records often are)."""
    rng = np.random.default_rng(seed)
    record = tuning_message("ModuleTuningData")(module=module_bytes, fingerprint=fingerprint)
    nodes = [(i, rank) for i, op, rank in _positions(module_bytes) if op in CONFIGURABLE]
    record.config_index_to_node.extend(i for i, _ in nodes)
    for run in range(runs):
        profile = record.runs.add(is_default=run == 0, error=run == 1)
        profile.profile.compute_time_ns = 0 if run == 1 else int(1000 + rng.integers(1, 500))
        config = profile.module_config.layout_config
        for _, rank in nodes:
            node = config.nodes.add()
            for _ in range(2):
                node.tensors.add().dims.extend(rng.permutation(rank).tolist() if run else list(range(rank))[::-1])
    return record


def tile_record(module_bytes: bytes, fingerprint: int, runs: int, seed: int):
    rng = np.random.default_rng(seed)
    record = tuning_message("ModuleTuningData")(module=module_bytes, fingerprint=fingerprint)
    for run in range(runs):
        profile = record.runs.add(is_default=run == 0, error=run == runs - 1 and runs > 2)
        profile.profile.compute_time_ns = int(100 + rng.integers(1, 900))
        tiles = profile.op_config.tile_size_config
        tiles.output_bounds.extend([int(2 ** rng.integers(0, 4)), int(2 ** rng.integers(0, 7))])
        if run % 2:
            tiles.kernel_bounds.extend([3, 3, 8])
    return record


def _kernel(k: int):
    """Small kernels of different shapes (one XLA module each, as the op records hold them)."""
    size = 4 + 2 * k
    return module_from_jax(lambda x, w: jnp.tanh(x @ w) * (k + 1), jnp.ones((size, 8)), jnp.ones((8, size)),
                           optimized=True).as_serialized_hlo_module_proto()


@pytest.fixture(scope="module")
def record_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("records")
    layouts = []
    for k, (name, grad) in enumerate((n, g) for n in PROGRAMS for g in (False, True)):
        fn, args = _program(name, grad)
        layouts.append(layout_record(module_from_jax(fn, *args).as_serialized_hlo_module_proto(),
                                     fingerprint=(k + 1) * 0x1F3D5B79A2C4E6F8 % (1 << 64), runs=12, seed=k))
    train, test = tuning_message("TuningData")(), tuning_message("TuningData")()
    train.modules.extend(layouts[:8])
    test.modules.extend(layouts[8:])
    tiles_train, tiles_test = tuning_message("TuningData")(), tuning_message("TuningData")()
    for k in range(8):
        (tiles_train if k < 6 else tiles_test).modules.append(tile_record(_kernel(k), (k + 7) << 40, 9, seed=k))
    files = {"layout_train": train, "layout_test": test, "tile_train": tiles_train, "tile_test": tiles_test,
             "single": layouts[0]}
    out = {}
    for name, message in files.items():
        out[name] = base / f"{name}.pb"
        out[name].write_bytes(message.SerializeToString())
    return out


def test_records_of_both_kinds_round_trip(record_files, tmp_path):
    root = tmp_path / "root"
    result = records_to_data_root([record_files["layout_train"], record_files["tile_train"]], root)
    assert len(result.written) == 8 + 6 and not result.left_out
    written = tuning_message("TuningData").FromString(record_files["layout_train"].read_bytes())
    refs = DataRoot(root).graphs(LAYOUT_XLA_DEFAULT, "train")
    assert len(refs) == 8
    for record in written.modules:
        stem = next(w["stem"] for w in result.written if w["collection"] == "layout:xla:default"
                    and w["stem"].endswith(f"_{signed_hex(record.fingerprint)}"))
        graph = load_graph(root / "npz/layout/xla/default/train" / f"{stem}.npz", LAYOUT_XLA_DEFAULT)
        kept = [run for run in record.runs if not run.error]
        assert graph.node_config_ids.tolist() == list(record.config_index_to_node)
        assert graph.config_runtime.tolist() == [run.profile.compute_time_ns for run in kept]
        for row, run in enumerate(kept):
            for k, node in enumerate(run.module_config.layout_config.nodes):
                for t, tensor in enumerate(node.tensors):
                    block = graph.node_config_feat[row, k, 6 * t:6 * t + 6]
                    assert block[:len(tensor.dims)].tolist() == list(tensor.dims) and (block[len(tensor.dims):] == -1).all()
                assert (graph.node_config_feat[row, k, 12:] == -1).all()
    tiles = tuning_message("TuningData").FromString(record_files["tile_train"].read_bytes())
    for record in tiles.modules:
        ref = next(r for r in DataRoot(root).graphs(TILE_XLA, "train") if r.stem.endswith(f"_{signed_hex(record.fingerprint)}"))
        graph = load_graph(ref.path, TILE_XLA)
        kept = [run for run in record.runs if not run.error]
        assert graph.config_runtime.tolist() == [run.profile.compute_time_ns for run in kept]
        assert (graph.config_runtime_normalizers == record.runs[0].profile.compute_time_ns).all()  # the default's
        first = kept[1].op_config.tile_size_config  # kernel [3,3,8]: sum 14, product 72; no input: 0, 0
        assert graph.config_feat[1].tolist() == [3, 3, 8, 0, 0, 0, 14, 72, *first.output_bounds, 0, 0, 0, 0,
                                                 sum(first.output_bounds), np.prod(first.output_bounds), *[0] * 8]
    sidecar = json.loads(result.sidecar.read_text())
    modules = [m for f in sidecar["calls"][0]["files"] for m in f["modules"]]
    assert all(m["dropped"] == {"error": 1} for m in modules)  # the errored run of each, named
    # every graph's compiler default (the run marked is_default, counted among the kept runs) is in defaults.json
    defaults = DataRoot(root).defaults()
    for message, name in ((written, "layout:xla:default"), (tiles, "tile:xla")):
        for record in message.modules:
            stem = next(w["stem"] for w in result.written if w["collection"] == name
                        and w["stem"].endswith(f"_{signed_hex(record.fingerprint)}"))
            kept = [run for run in record.runs if not run.error]
            assert defaults[name][stem] == next(i for i, run in enumerate(kept) if run.is_default)
    assert {m["split"] for m in modules} == {"train"}


def test_a_single_module_tuning_data_is_read_too(record_files, tmp_path):
    result = records_to_data_root([record_files["single"]], tmp_path / "root", split="test",
                                  layout_collection="layout:xla:random")
    assert [(w["collection"], w["split"]) for w in result.written] == [("layout:xla:random", "test")]
    graph = load_graph(result.written[0]["path"], LAYOUT_XLA_RANDOM)
    assert not graph.has_labels  # a test file: its runtimes are in the hidden-label sidecar
    labels = np.load(tmp_path / "root/labels/npz/layout/xla/random/test" / f"{graph.stem}.npz")
    assert (labels["runtime"] > 0).all() and labels["runtime"].shape[0] == graph.num_configs
    assert (tmp_path / "root/sample_submission.csv").read_text().splitlines()[1].startswith(
        f"layout:xla:random:{graph.stem},")


def test_the_fingerprint_split_is_the_official_encoders():
    assert fingerprint_split(0) == "train" and fingerprint_split(int(0.8 * 2**64) - 2**20) == "train"
    assert fingerprint_split(int(0.85 * 2**64)) == "valid" and fingerprint_split(2**64 - 1) == "test"


def test_a_records_root_runs_predicts_and_evaluates(record_files, tmp_path):
    from pipelines.config.settings import load_config
    from pipelines.flows.evaluate import evaluate_run
    from pipelines.flows.predict import predict_run
    from pipelines.flows.run import run_pipeline

    root = tmp_path / "root"
    for split in ("train", "test"):  # a submission covers the five collections: the layout records go to all four
        records_to_data_root([record_files[f"layout_{split}"], record_files[f"tile_{split}"]], root, split=split,
                             layout_collection="all")
    result = run_pipeline(load_config("smoke"), root, work_dir=tmp_path / "work", models=["gbdt"],
                          submissions_dir=tmp_path / "subs")
    predicted = predict_run(result.run_id, root, submissions_dir=tmp_path / "subs")
    assert predicted.submission.is_file()
    evaluation, path = evaluate_run(result.run_id, root, submissions_dir=tmp_path / "subs")
    assert json.loads(path.read_text())["run_id"] == result.run_id
    ceiling, submission = evaluation.reports["ceiling"], evaluation.reports["submission"]
    for name in ("tile:xla", "layout:xla:default"):  # the ceiling ranks by the measured runtimes themselves
        assert submission.collection_score(name) <= ceiling.collection_score(name)
        assert ceiling.collection_score(name) > 0.99  # below 1 only where two runs measured the same time


@needs_real
def test_the_real_records_give_the_official_node_ids_and_112_layout_runs(tmp_path):
    official = list(tuning_message("ModuleTuningData").FromString(
        (REAL / "module_tuning_data_layout.pb").read_bytes()).config_index_to_node)
    result = records_to_data_root([REAL / "module_tuning_data_layout.pb", REAL / "op_tuning_data.pb"], tmp_path / "r")
    layout = [w for w in result.written if w["collection"] == "layout:xla:default"]
    assert len(layout) == 1 and layout[0]["configs"] == 112
    graph = load_graph(layout[0]["path"], LAYOUT_XLA_DEFAULT)
    assert graph.node_config_ids.tolist() == official and graph.num_nodes == 3163
    blocks = graph.node_config_feat.reshape(-1, 6)
    lengths = (blocks[blocks[:, 0] >= 0] >= 0).sum(axis=1)
    assert (lengths == 2).mean() > 0.5  # partial configs: mostly the two minor-most dims only
    sidecar = json.loads(result.sidecar.read_text())
    entry = sidecar["calls"][0]["files"][0]["modules"][0]
    assert entry["dropped"] == {"error": 10} and entry["config_index_to_node_is_ours"]
    tiles = [w for w in result.written if w["collection"] == "tile:xla"]
    assert len(tiles) == 15
    fusion = next(w for w in tiles if w["module"] == "fusion.191")
    tile = load_graph(fusion["path"], TILE_XLA)
    assert tile.num_configs == 579 and tile.config_feat[0, :8].tolist() == [3, 1, 24, 3, 0, 0, 31, 216]
    assert (tile.config_runtime_normalizers == 151565).all()
    defaults = DataRoot(tmp_path / "r").defaults()
    assert len(defaults["tile:xla"]) == 15 and len(defaults["layout:xla:default"]) == 1
    assert tile.config_runtime[defaults["tile:xla"][fusion["stem"]]] == 151565  # the default run's own time


# ----------------------------------------------------------------------------- bad input


def _listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")) if root.exists() else []


def test_bad_records_are_errors_naming_the_file_and_nothing_is_written(record_files, tmp_path):
    truncated = tmp_path / "truncated.pb"
    data = record_files["layout_train"].read_bytes()
    truncated.write_bytes(data[: len(data) // 2])
    foreign = tmp_path / "foreign.pb"
    foreign.write_bytes(b"\x08\x96\x01\x12\x07testing")
    hlo_only = tmp_path / "module.pb"  # a bare HloModuleProto is a program for `featurize`, not a record
    hlo_only.write_bytes(_kernel(0))
    root = tmp_path / "root"
    for bad in (truncated, foreign, hlo_only, tmp_path / "missing.pb"):
        with pytest.raises(FormatError) as err:
            records_to_data_root([record_files["tile_train"], bad], root)
        assert str(bad) in str(err.value)
        assert _listing(root) == []


def test_records_refuse_a_folder_they_did_not_make_and_a_graph_already_there(record_files, tiny_world, tmp_path):
    with pytest.raises(PipelineError, match="not a data root `records` made"):
        records_to_data_root([record_files["tile_train"]], tiny_world)
    root = tmp_path / "root"
    records_to_data_root([record_files["tile_train"]], root)
    before = _listing(root)
    with pytest.raises(PipelineError, match="already holds 6 of these graphs"):
        records_to_data_root([record_files["tile_train"]], root, split="test")
    assert _listing(root) == before
    with pytest.raises(ConfigError):
        records_to_data_root([record_files["tile_train"]], root, split="holdout")


def test_the_records_command_writes_a_root_and_refuses_bad_input_as_usage_or_data_errors(record_files, tmp_path,
                                                                                        capsys):
    from pipelines.cli import main

    root = tmp_path / "root"
    assert main(["records", str(record_files["tile_train"]), "--out", str(root), "--split", "fingerprint"]) == 0
    printed = capsys.readouterr().out
    assert printed.count("tile:xla ") == 6 and str(root / "records.json") in printed
    assert main(["records", str(record_files["layout_train"]), "--out", str(root), "--layout-collection",
                 "tile:xla"]) == 2
    assert "--layout-collection" in capsys.readouterr().err
    truncated = tmp_path / "truncated.pb"
    truncated.write_bytes(record_files["layout_train"].read_bytes()[:100])
    assert main(["records", str(truncated), "--out", str(root)]) == 1
    assert str(truncated) in capsys.readouterr().err


def test_a_module_with_more_runs_than_a_graph_file_holds_is_refused_naming_the_file(record_files, tmp_path,
                                                                                    monkeypatch):
    import pipelines.hlo.records as records

    monkeypatch.setattr(records, "MAX_CONFIGS", 5)  # the tile records hold 8 kept runs per module
    with pytest.raises(FormatError, match="kept runs, more than one graph file may hold") as err:
        records_to_data_root([record_files["tile_train"]], tmp_path / "root")
    assert str(record_files["tile_train"]) in str(err.value) and not (tmp_path / "root").exists()
