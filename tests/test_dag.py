"""The stage DAG declared as data (pipelines.core.stages, pipelines.flows.dag): a valid order, the one
sequence prepare, run and predict follow, a stage for every registered model, and declarations that
tell the truth: a setting a stage lists changes its key, a setting it does not list leaves it alone."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from pipelines.config.registry import registered
from pipelines.config.settings import apply_overrides, load_config, resolve_for_collection
from pipelines.core.collection import ALL_COLLECTIONS, parse_collection
from pipelines.core.engine import Code, StageOutput
from pipelines.core.stages import DagError, RawFiles, Stage, StageCall, check_dag
from pipelines.data.prepared import Prepared
from pipelines.flows import dag

MODELS = ["gbdt", "gnn", "random", "feature"]


def _stage(name: str, *inputs: str) -> Stage:
    return Stage(name, inputs=inputs, code=Code(("pipelines.core.stages",)), settings={}, run=lambda call: None)


def test_the_pipeline_is_a_topological_order_of_its_declared_stages():
    stages = dag.pipeline(MODELS)
    names = [s.name for s in stages]
    assert names == ["prune", "features", "node_arrays", "folds", "train-gbdt", "train-gnn", "train-random",
                     "train-feature", "ensemble"]
    for i, stage in enumerate(stages):
        assert set(stage.inputs) <= set(names[:i]), stage.name
    assert {s.name: s.inputs for s in stages} == {
        "prune": (), "features": ("prune",), "node_arrays": ("prune",), "folds": ("prune",),
        "train-gbdt": ("features", "folds"), "train-gnn": ("node_arrays", "folds"),
        "train-random": ("features", "folds"), "train-feature": ("features", "folds"),
        "ensemble": ("prune", "train-gbdt", "train-gnn", "train-random", "train-feature")}
    assert [s.name for s in stages if s.training_only] == names[3:]  # predict skips folds, fits and the blend
    assert [s.name for s in dag.pipeline()] == names  # every registered model, in registry order


@pytest.mark.parametrize("stages, message", [
    ([_stage("a"), _stage("b", "a"), _stage("a")], "declared twice: a"),
    ([_stage("a"), _stage("b", "c")], "stage 'b' reads 'c', which no stage of the DAG is"),
    ([_stage("a", "c"), _stage("b", "a"), _stage("c", "b")], "cycle a -> c -> b -> a"),
    ([_stage("b", "a"), _stage("a")], "stage 'b' is declared before its input(s) 'a': the order is not a topological"),
])
def test_a_bad_dag_is_refused_with_a_clear_message(stages, message):
    with pytest.raises(DagError, match="^stage DAG: ") as caught:
        check_dag(stages)
    assert message in str(caught.value)


def test_a_registered_model_gets_its_stage_with_no_edit_to_the_dag():
    from tests.test_model_registry import TOY

    with registered("toy", TOY):
        stages = {s.name: s for s in dag.pipeline()}
        toy = stages["train-toy"]
        assert toy.inputs == ("features", "folds") and toy.training_only
        assert toy.code.roots == ("pipelines.training.fit", "tests.test_model_registry")
        assert "train-toy" in stages["ensemble"].inputs
        config = load_config("smoke", ["toy.weight=2.5"])
        assert toy.setting_values(config, parse_collection("tile:xla"))["settings"]["weight"] == 2.5
    assert "train-toy" not in {s.name for s in dag.pipeline()}


def test_prepare_run_and_predict_follow_the_dag(tiny_world, tmp_path):
    from pipelines.flows import predict, prepare, run

    data = [s.name for s in dag.data_stages()]
    assert prepare.STAGES == tuple(data) == ("prune", "features", "node_arrays", "folds")
    assert predict.PREPARE_FOR_PREDICTION == tuple(s.name for s in dag.data_stages(training=False))
    assert "folds" not in predict.PREPARE_FOR_PREDICTION

    config = load_config("smoke", ["run.seeds=[0]", "run.n_jobs=1"])
    work = tmp_path / "work"
    runs, computed = run.train_and_blend(config, tiny_world, work_dir=work, models=["random"],
                                         collections=["tile:xla"])
    assert [item.split("/")[0] for item in computed] == [s.name for s in dag.pipeline(["random"])]
    assert list(runs[0].prepare_keys) == data
    collection = parse_collection("tile:xla")
    prepared = predict.prepare_test_graphs(config, collection, tiny_world, work)
    assert tuple(prepared.stages) == predict.PREPARE_FOR_PREDICTION


# ----------------------------------------------------------------------------- honest declarations


def _output(stage: str) -> StageOutput:
    return StageOutput(stage, f"{stage}-key", Path("/nonexistent") / stage, {})


def _call(stage: Stage, config, collection) -> StageCall:
    """A call of ``stage`` with fixed stand-ins for its inputs: only the config varies between two calls."""
    fake = {name: _output(name) for name in ("prune", "features", "node_arrays", "folds")}
    companions = {c.name: Prepared(c, fake) for c in ALL_COLLECTIONS}
    trained = {name.removeprefix("train-"): _output(name) for name in stage.inputs if name.startswith("train-")}
    return StageCall(config, collection, Path("/nonexistent"), upstream={n: fake[n] for n in stage.inputs if n in fake},
                     raw=RawFiles({"train": [], "valid": [], "test": []}, "data-key"),
                     prepared=Prepared(collection, fake, companions=companions), options={"trained": trained})


def _changed(config, section: str, name: str, value):
    """``config`` with ``section.name`` set to another valid value (through the config's own checks)."""
    field = next(f for f in dataclasses.fields(getattr(config, section)) if f.name == name)
    choices = field.metadata.get("choices")
    choices = choices() if callable(choices) else choices
    if isinstance(value, bool):
        candidates = [not value]
    elif isinstance(value, int):
        candidates = [value + 1, value - 1, value * 2, value + 4]
    elif isinstance(value, float):
        candidates = [value / 2, value + 0.5, 0.5]
    elif isinstance(value, str):
        candidates = [c for c in choices or () if c != value] or [value + "x", "auto", "tcp://127.0.0.1:8786"]
    elif isinstance(value, list):
        candidates = ([[*value, max(value) + 1]] if value and isinstance(value[0], int) else
                      [[c] for c in choices or () if [c] != value] or [["layout:xla:random"], ["f_x"]])
    else:
        candidates = [1, "x"]
    for candidate in candidates:
        try:
            return apply_overrides(config, [f"{section}.{name}={json.dumps(candidate)}"])
        except Exception:  # noqa: BLE001 - the next candidate
            continue
    raise AssertionError(f"no other valid value found for {section}.{name} = {value!r}")


def _settings(config):
    for section in dataclasses.fields(config):
        for field in dataclasses.fields(getattr(config, section.name)):
            if field.name != "collections":
                yield section.name, field.name, getattr(getattr(config, section.name), field.name)


def _resolved(config, section: str, name: str, collection):
    return getattr(resolve_for_collection(getattr(config, section), collection), name)


# Besides the dotted names they list, the training stages are keyed by their adapter's settings: these
# are the config settings those read.
ADAPTER_READS = {"train-gbdt": "gbdt.*", "train-gnn": "gnn.*", "train-random": "", "train-feature": "gbdt.load_max_configs"}


def _saved_gnn(folder: Path, collection) -> Path:
    """An (untrained) GNN model file of ``collection``'s kind: a valid ``gnn.init_from``."""
    import math

    from pipelines.data.node_arrays import NODE_FEATURE_DIM
    from pipelines.models.gnn import GNNRanker
    from pipelines.models.gnn.model import GNNModel

    ranker = GNNRanker({"hidden": 8, "opcode_dim": 4, "config_value_dim": 2}, collection=collection)
    ranker.model_ = GNNModel(ranker.config, NODE_FEATURE_DIM, collection.kind)
    ranker.kind_, ranker.node_feat_dim_, ranker.history_, ranker.best_score_ = (collection.kind, NODE_FEATURE_DIM,
                                                                                [], math.nan)
    ranker.save(folder, "start")
    return folder / "start.pt"


@pytest.mark.parametrize("collection", ["tile:xla", "layout:xla:default"])
def test_a_listed_setting_changes_the_key_and_no_other_setting_does(collection, tmp_path):
    collection = parse_collection(collection)
    config = load_config("smoke")
    stages = dag.pipeline(MODELS)
    before = {s.name: s.key(_call(s, config, collection)) for s in stages}
    # settings whose valid values are files, given one
    files = {"gnn.init_from": lambda: str(_saved_gnn(tmp_path, collection))}
    for section, name, value in _settings(config):
        dotted = f"{section}.{name}"
        changed = (apply_overrides(config, [f"{dotted}={json.dumps(files[dotted]())}"]) if dotted in files
                   else _changed(config, section, name, value))
        for stage in stages:
            listed = {source for source in stage.setting_sources(config, collection).values() if isinstance(source, str)}
            reads = ADAPTER_READS.get(stage.name, "")
            if reads in (dotted, f"{section}.*") and _resolved(changed, section, name, collection) != \
                    _resolved(config, section, name, collection):  # a collection's own value may stay
                listed.add(dotted)
            key = stage.key(_call(stage, changed, collection))
            if dotted in listed:
                assert key != before[stage.name], f"{dotted} is in the key of {stage.name}, yet does not change it"
            else:
                assert key == before[stage.name], f"{dotted} changes the key of {stage.name}, which does not list it"


def test_the_prune_stage_keys_fewer_settings_for_tile_graphs():
    config = load_config("smoke")
    tile = dag.DATA_STAGES[0].setting_sources(config, parse_collection("tile:xla"))
    layout = dag.DATA_STAGES[0].setting_sources(config, parse_collection("layout:xla:random"))
    assert set(tile.values()) == {"prune.dedup", "data.on_bad_file"}
    assert set(layout.values()) == {"prune.hops", "prune.mode", "prune.dedup", "prune.compress_configs",
                                    "data.on_bad_file"}


def test_a_dotted_setting_of_a_section_with_per_collection_overrides_is_refused():
    from pipelines.core.stages import config_value

    with pytest.raises(DagError, match="per-collection overrides"):
        config_value(load_config("smoke"), "gbdt.num_leaves")


# ----------------------------------------------------------------------------- status --explain


def _explain(*args: str, capsys) -> str:
    from pipelines.cli import main

    assert main(["status", "--explain", *args]) == 0
    return capsys.readouterr().out


def _block_of(text: str, stage: str) -> str:
    """The lines ``status --explain`` prints for ``stage`` (of its first collection)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"  {stage}  "))
    end = next((i for i in range(start + 1, len(lines)) if not lines[i].startswith("    ")), len(lines))
    return "\n".join(lines[start:end])


def test_status_explain_lists_inputs_code_roots_settings_and_keys(tiny_world, tmp_path, capsys):
    from pipelines.flows.prepare import prepare
    from pipelines.training.fit import train_model

    work = tmp_path / "work"
    config = load_config("smoke", ["run.seeds=[0]", "run.n_jobs=1"])
    collection = parse_collection("tile:xla")
    item = prepare(config, tiny_world, work, [collection])["tile:xla"]
    common = ["--data-root", str(tiny_world), "--work-dir", str(work), "--config", "smoke", "--set", "run.seeds=[0]",
              "--set", "run.n_jobs=1", "--collections", "tile:xla", "--models", "gbdt"]
    text = _explain(*common, capsys=capsys)
    assert "prune -> features -> node_arrays -> folds -> train-gbdt -> ensemble" in text
    for stage in dag.pipeline(["gbdt"]):
        block = _block_of(text, stage.name)
        assert f"inputs:   {', '.join(stage.inputs) or 'the raw files'}" in block
        assert f"code:     {', '.join(stage.code.roots)}" in block
        values = stage.setting_values(config, collection)
        for field, source in stage.setting_sources(config, collection).items():
            if isinstance(source, str):
                assert f"{source} = {json.dumps(values[field], sort_keys=True)}" in block
            else:
                assert "settings = GBDTAdapter.settings(config, tile:xla):" in block and "num_leaves = " in block
    for name, key in item.stage_keys.items():  # the keys prepare used, found on disk
        assert f"  {name}  key {key}  (complete)" in text
    assert "data.on_bad_file = \"error\"" in _block_of(text, "prune") and "prune.hops" not in _block_of(text, "prune")
    assert "(no complete output)" in _block_of(text, "train-gbdt")
    assert "not computable: no complete output of train-gbdt" in _block_of(text, "ensemble")

    # the key listed is the key the training stage then computes under
    listed = _block_of(text, "train-gbdt").split("key ", 1)[1].split()[0]
    assert train_model(config, item, model="gbdt", work_dir=work).key == listed
    after = _explain(*common, capsys=capsys)
    assert f"  train-gbdt  key {listed}  (complete)" in after
    assert "models = {\"gbdt\": \"train-gbdt\"}" in _block_of(after, "ensemble")

    # a setting in the prune key: another prune key, and every stage after it waits for its output
    changed = _explain(*common, "--set", "prune.dedup=\"mean\"", capsys=capsys)
    assert "prune.dedup = \"mean\"" in changed and f"key {item.stage_keys['prune']}" not in changed
    assert "not computable: no complete output of prune" in _block_of(changed, "features")
    # --stage keeps those; without --data-root there is no key to compute
    bare = _explain("--work-dir", str(work), "--config", "smoke", "--collections", "layout:xla:random",
                    "--stage", "prune", capsys=capsys)
    assert "prune.hops = 1" in bare and "not computable: needs --data-root" in bare and "  features  " not in bare
