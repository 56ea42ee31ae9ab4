"""Typed TOML configs: base and experiment files, overrides, per-collection overrides, validation."""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Literal

import pytest

from pipelines.core.collection import ALL_COLLECTIONS, TILE_XLA
from pipelines.config.settings import (
    PipelineConfig,
    apply_overrides,
    available_configs,
    config_from_dict,
    config_to_dict,
    config_to_toml,
    load_config,
    resolve_for_collection,
)
from pipelines.core.engine import flatten, fingerprint
from pipelines.core.errors import ConfigError


def shipped(name: str) -> dict:
    return tomllib.loads((resources.files("pipelines") / "configs" / f"{name}.toml").read_text())


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# ----------------------------------------------------------------------------- shipped files


def test_base_is_the_dataclass_defaults():
    assert load_config() == load_config("base") == PipelineConfig()
    assert {"base", "quick"} <= set(available_configs())


def test_base_toml_lists_every_knob():
    """Users read base.toml to see every setting: each dataclass field must appear there."""
    listed = set(flatten(shipped("base")))
    # a per-collection table that base.toml fills in lists its section's `collections` too
    listed |= {k.split(".collections.")[0] + ".collections" for k in listed if ".collections." in k}
    expected = {k for k in flatten(config_to_dict(PipelineConfig())) if not k.endswith(".collections")}
    expected |= {f"{s}.collections" for s in ("gbdt", "gnn")}
    missing = sorted(expected - listed)
    assert not missing, f"add these fields (with a comment) to pipelines/configs/base.toml: {missing}"


def test_quick_extends_base_and_changes_only_its_own_keys():
    quick_file = shipped("quick")
    assert quick_file.pop("extends") == "base"
    base, quick = flatten(config_to_dict(load_config())), flatten(config_to_dict(load_config("quick")))
    changed = {k for k in base.keys() | quick.keys() if base.get(k) != quick.get(k)}
    own = set(flatten(quick_file))
    # a section key quick sets to base's own value is there to clear base's per-collection values of it
    # (gnn.extra_train_collections: base's xla:random also trains on nlp:random)
    clearing = {k for k in own if base[k] == quick[k]}
    assert clearing == {"gnn.extra_train_collections"}
    assert changed == (own - clearing) | {"gnn.collections.layout:xla:random.extra_train_collections"}
    assert load_config("quick").folds.k == 2


def test_base_gpu_cpu_and_demo_train_xla_random_on_the_nlp_random_graphs_and_the_light_configs_do_not():
    for name in (None, "gpu", "cpu", "demo", "quick", "smoke"):
        config = load_config(name)
        for collection in ALL_COLLECTIONS:
            extra = resolve_for_collection(config.gnn, collection).extra_train_collections
            on = name in (None, "gpu", "cpu", "demo") and collection.name == "layout:xla:random"
            assert extra == (["layout:nlp:random"] if on else []), (name, collection.name)


def test_tile_fits_on_one_thread_in_every_config_and_layout_takes_the_stages_share():
    # tile's tiny graphs run 3.6x slower on two threads than on one; layout graphs gain from more
    for name in (None, "gpu", "cpu", "demo", "quick", "smoke"):
        config = load_config(name)
        for collection in ALL_COLLECTIONS:
            threads = resolve_for_collection(config.gnn, collection).num_threads
            assert threads == (1 if collection.is_tile or name == "smoke" else 0), (name, collection.name)


def test_cpu_trains_at_most_base_passes_at_a_larger_lr_and_demo_keeps_four_on_layouts():
    expected = {"tile:xla": 1, "layout:xla:default": 5, "layout:xla:random": 8, "layout:nlp:default": 3,
                "layout:nlp:random": 3}
    for collection in ALL_COLLECTIONS:
        cpu = resolve_for_collection(load_config("cpu").gnn, collection)
        base = resolve_for_collection(load_config(None).gnn, collection)
        # cpu's section value clears base's per-collection passes; its own tables set them again
        assert cpu.passes_per_epoch == expected[collection.name]
        assert cpu.passes_per_epoch <= base.passes_per_epoch
        # fewer steps, a larger learning rate: on every collection (no per-collection lr shadows it)
        assert cpu.lr > base.lr
        assert cpu.configs_per_graph == base.configs_per_graph  # 32: xla:random's minutes went to passes
        if not collection.is_tile:
            assert resolve_for_collection(load_config("demo").gnn, collection).passes_per_epoch == 4


def test_user_file_extends_by_name_and_by_relative_path(tmp_path):
    write(tmp_path, "mid.toml", 'extends = "quick"\n[folds]\nseed = 7\n')
    sub = tmp_path / "exp"
    sub.mkdir()
    top = write(sub, "top.toml", 'extends = "../mid.toml"\n[folds]\nk = 3\n[run]\nseeds = [1, 2, 3]\n')
    config = load_config(top)
    assert (config.folds.k, config.folds.seed, config.run.seeds) == (3, 7, [1, 2, 3])
    assert config.gnn.hidden == load_config("quick").gnn.hidden  # inherited two levels up
    assert load_config(str(top)) == config


@pytest.mark.parametrize(
    "text, match",
    [
        ("[folds]\nk = 1\n", r"bad\.toml: folds\.k: must be >= 2, got 1"),
        ("[folds]\nk = 2.5\n", r"bad\.toml: folds\.k: expected int, got float"),
        ("[folds]\nholdout_valid = 1\n", r"folds\.holdout_valid: expected bool, got int"),
        ("[folds]\nkk = 3\n", r"unknown key 'folds\.kk' \(did you mean 'k'\?\)"),
        ("[fold]\nk = 3\n", r"unknown section \[fold\] \(did you mean 'folds'\?\)"),
        ("[prune]\nmode = \"all\"\n", r"prune\.mode: 'all' is not one of 'khop', 'config_only'"),
        ("[run]\nmodels = [\"gbdt\", \"xgb\"]\n", r"run\.models: 'xgb' is not one of"),
        ("[run]\nseeds = []\n", r"run\.seeds: needs at least 1 item"),
        ("[run]\nseeds = [0, \"1\"]\n", r"run\.seeds\[1\]: expected int, got str"),
        ("folds = 3\n", r"folds: expected a table, got int"),
        ("[folds\n", r"bad\.toml: invalid TOML"),
        ('extends = "nosuch"\n', r"unknown config 'nosuch'; shipped configs: .*base"),
    ],
)
def test_bad_files_raise_config_error_naming_file_and_key(tmp_path, text, match):
    with pytest.raises(ConfigError, match=match):
        load_config(write(tmp_path, "bad.toml", text))


def test_error_names_the_file_of_the_chain_that_has_it(tmp_path):
    write(tmp_path, "parent.toml", 'extends = "base"\n[gbdt]\nnum_leaves = "many"\n')
    child = write(tmp_path, "child.toml", 'extends = "parent.toml"\n')
    with pytest.raises(ConfigError, match=r"parent\.toml: gbdt\.num_leaves: expected int"):
        load_config(child)


def test_extends_cycle_and_missing_file(tmp_path):
    write(tmp_path, "a.toml", 'extends = "b.toml"\n')
    write(tmp_path, "b.toml", 'extends = "a.toml"\n')
    with pytest.raises(ConfigError, match="cycle"):
        load_config(tmp_path / "a.toml")
    sub = tmp_path / "sub"
    sub.mkdir()
    write(sub, "c.toml", 'extends = "../sub/d.toml"\n')
    write(sub, "d.toml", 'extends = "../sub/c.toml"\n')  # same files under other spellings
    with pytest.raises(ConfigError, match="cycle"):
        load_config(sub / "c.toml")
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "missing.toml")


# ----------------------------------------------------------------------------- --set overrides


def test_overrides_are_parsed_as_toml_and_type_checked():
    config = load_config(
        "quick",
        ["folds.k=4", "gbdt.learning_rate=1", "prune.mode=config_only", 'run.scheduler="tcp://h:8786"',
         "run.seeds=[3, 4]", "folds.holdout_valid=true"],
    )
    assert config.folds.k == 4
    assert config.gbdt.learning_rate == 1.0 and isinstance(config.gbdt.learning_rate, float)
    assert config.prune.mode == "config_only"  # a bare word is a string
    assert config.run.scheduler == "tcp://h:8786" and config.run.seeds == [3, 4]
    assert config.folds.holdout_valid is True
    assert config.features == load_config("quick").features  # untouched sections unchanged
    assert apply_overrides(config, ["run.scheduler=tcp://h:8786"]).run.scheduler == "tcp://h:8786"


@pytest.mark.parametrize(
    "override, match",
    [
        ("gbdt.num_leaves=true", r"override 'gbdt.num_leaves=true': gbdt\.num_leaves: expected int, got bool"),
        ("gbdt.num_leaves=abc", r"gbdt\.num_leaves: expected int, got str 'abc'"),
        ("folds.k=1", r"folds\.k: must be >= 2"),
        ("gbdt.nope=1", r"unknown key 'gbdt\.nope'"),
        ("nope.k=1", r"unknown section \[nope\]"),
        ("folds=3", r"expected section\.key=value"),
        ("folds.k", r"expected section\.key=value"),
        ("ensemble.method=median", r"ensemble\.method: 'median' is not one of 'minmax', 'rank'"),
    ],
)
def test_bad_overrides_raise_config_error_naming_the_override(override, match):
    with pytest.raises(ConfigError, match=match):
        load_config(overrides=[override])


# ----------------------------------------------------------------------------- per-collection overrides


def test_per_collection_overrides_from_file_and_resolution(tmp_path):
    path = write(
        tmp_path,
        "exp.toml",
        'extends = "base"\n[gbdt]\nnum_leaves = 15\n'
        '[gbdt.collections."layout:xla:default"]\nnum_leaves = 63\nlearning_rate = 1\n'
        '[gbdt.collections." tile:xla "]\nobjective = "xendcg"\n',
    )
    config = load_config(path, ['gnn.collections."layout:nlp:random".epochs=3'])
    assert config.gbdt.collections == {
        "layout:xla:default": {"num_leaves": 63, "learning_rate": 1.0},
        "tile:xla": {"objective": "xendcg"},  # names are normalised
    }
    layout = resolve_for_collection(config.gbdt, "layout:xla:default")
    assert (layout.num_leaves, layout.learning_rate, layout.objective) == (63, 1.0, "pairwise")
    assert layout.collections == {}
    tile = resolve_for_collection(config.gbdt, TILE_XLA)
    assert (tile.num_leaves, tile.objective) == (15, "xendcg")
    assert resolve_for_collection(config.gbdt, "layout:nlp:default") == dataclasses.replace(config.gbdt, collections={})
    assert resolve_for_collection(config.gnn, "layout:nlp:random").epochs == 3
    # a collection's resolved section does not depend on another collection's overrides
    other = apply_overrides(config, ['gbdt.collections."layout:xla:default".num_leaves=7'])
    assert fingerprint(resolve_for_collection(other.gbdt, TILE_XLA)) == fingerprint(tile)


def test_a_later_section_value_reaches_every_collection_and_a_later_per_collection_value_wins(tmp_path):
    # base.toml sets passes_per_epoch per collection (tile, xla); a later --set of the section key
    # replaces those, and a per-collection --set after it applies to its collection only
    config = load_config(None, ["gnn.passes_per_epoch=2", 'gnn.collections."layout:xla:random".passes_per_epoch=3'])
    passes = {c.name: resolve_for_collection(config.gnn, c).passes_per_epoch for c in ALL_COLLECTIONS}
    assert passes == {**{c.name: 2 for c in ALL_COLLECTIONS}, "layout:xla:random": 3}
    assert resolve_for_collection(config.gnn, TILE_XLA).graphs_per_step == 16  # other keys of the table stay
    # the same for a file extending base; its own per-collection table wins within the file
    path = write(tmp_path, "exp.toml", 'extends = "base"\n[gnn]\npasses_per_epoch = 5\n'
                                       '[gnn.collections."tile:xla"]\npasses_per_epoch = 6\n')
    from_file = load_config(path)
    assert resolve_for_collection(from_file.gnn, "layout:xla:default").passes_per_epoch == 5
    assert resolve_for_collection(from_file.gnn, TILE_XLA).passes_per_epoch == 6
    assert resolve_for_collection(from_file.gnn, TILE_XLA).graphs_per_step == 16


@pytest.mark.parametrize(
    "table, match",
    [
        ('[gbdt.collections."tile:xla"]\nnum_leafs = 3\n', r'unknown key \'gbdt\.collections\."tile:xla"\.num_leafs\''),
        ('[gbdt.collections."tile:xla"]\nnum_leaves = "3"\n', r'gbdt\.collections\."tile:xla"\.num_leaves: expected int'),
        ('[gbdt.collections."tile:nlp"]\nnum_leaves = 3\n', r"unknown collection 'tile:nlp'"),
        ('[gnn.collections."tile:xla"]\nconv = "gcn"\n', r'gnn\.collections\."tile:xla"\.conv: .gcn. is not one of'),
        ('[gbdt.collections."tile:xla".collections]\n', r"cannot contain 'collections'"),
        ('[gbdt]\ncollections = 3\n', r"gbdt\.collections: expected a table"),
    ],
)
def test_bad_per_collection_overrides(tmp_path, table, match):
    with pytest.raises(ConfigError, match=match):
        load_config(write(tmp_path, "exp.toml", 'extends = "base"\n' + table))


def test_resolve_rejects_unknown_collection():
    with pytest.raises(ConfigError, match="unknown collection"):
        resolve_for_collection(PipelineConfig().gbdt, "layout:tpu:default")


# ----------------------------------------------------------------------------- round trips


def test_round_trips_keep_config_and_fingerprint(tmp_path):
    config = load_config("quick", ['gbdt.collections."tile:xla".num_leaves=63', "run.seeds=[1, 2]"])
    plain = config_to_dict(config)
    again = config_from_dict(PipelineConfig, plain)
    assert again == config and fingerprint(again) == fingerprint(config) == fingerprint(plain)
    assert load_config(write(tmp_path, "dump.toml", config_to_toml(config))) == config
    assert fingerprint(load_config("quick")) == fingerprint(load_config("quick"))
    assert fingerprint(load_config("quick")) != fingerprint(load_config())
    assert [c.name for c in ALL_COLLECTIONS if c.name in config.gbdt.collections] == ["tile:xla"]


# ----------------------------------------------------------------------------- generic machinery


@dataclass
class Inner:
    width: float = 1.0
    tag: Literal["a", "b"] = "a"


@dataclass
class Outer:
    inner: Inner = field(default_factory=Inner)
    pair: tuple[int, int] = (1, 2)
    weights: dict[str, float] = field(default_factory=dict)
    cap: int | None = None
    out: Path = Path("out")
    names: list[str] = field(default_factory=list, metadata={"choices": ("x", "y"), "unique": True})
    rate: float = field(default=0.5, metadata={"min": 0, "max": 1})


def test_generic_checker_handles_nested_containers_optional_literal_path():
    built = config_from_dict(
        Outer,
        {"inner": {"width": 2}, "pair": [3, 4], "weights": {"a": 1, "b": 0.5}, "cap": 10, "out": "x/y",
         "names": ["y", "x"]},
    )
    assert built == Outer(Inner(2.0, "a"), (3, 4), {"a": 1.0, "b": 0.5}, 10, Path("x/y"), ["y", "x"])
    assert config_from_dict(Outer, config_to_dict(built)) == built
    assert apply_overrides(built, ["inner.tag=b", "weights.c=2"]) == dataclasses.replace(
        built, inner=Inner(2.0, "b"), weights={"a": 1.0, "b": 0.5, "c": 2.0}
    )
    for bad, match in [
        ({"inner": {"tag": "c"}}, r"inner\.tag: 'c' is not one of 'a', 'b'"),
        ({"inner": {"width": "w"}}, r"inner\.width: expected float"),
        ({"pair": [1, 2, 3]}, r"pair: expected 2 items"),
        ({"weights": {"a": "heavy"}}, r"weights\.a: expected float"),
        ({"cap": 1.5}, r"cap: expected int \| None"),
        ({"names": ["x", "x"]}, r"names: items must be distinct"),
        ({"names": ["z"]}, r"names: 'z' is not one of"),
        ({"rate": 2}, r"rate: must be <= 1, got 2"),
        ({"inner": {"depth": 1}}, r"unknown key 'inner\.depth'"),
    ]:
        with pytest.raises(ConfigError, match=match):
            config_from_dict(Outer, bad, "test")


def test_config_command_prints_loadable_toml(tmp_path, capsys):
    from pipelines.cli import main

    assert main(["config", "--config", "quick", "--set", "folds.k=3"]) == 0
    text = capsys.readouterr().out
    expected = load_config("quick", ["folds.k=3"])
    assert text.startswith(f"# fingerprint {fingerprint(expected)}\n")
    assert load_config(write(tmp_path, "printed.toml", text)) == expected
    assert main(["config", "--set", "folds.k=1"]) == 2
    assert "folds.k: must be >= 2" in capsys.readouterr().err


@pytest.mark.parametrize("override", [
    "run.seeds=[-1]", "run.seeds=[4294967296]", "folds.seed=-1", "features.seed=18446744073709551616",
    "gbdt.seed=1099511627776", "gbdt.num_leaves=200000", "gbdt.n_estimators=1000000000000", "gnn.hidden=1000000",
])
def test_seeds_and_sizes_out_of_bounds_are_config_errors_before_any_stage(override):
    """Issue 71: seeds outside [0, 2^32) aliased or crashed; LightGBM's and memory's limits were not checked."""
    with pytest.raises(ConfigError, match=override.split("=")[0].split(".")[-1]):
        load_config(None, [override])
    assert load_config(None, ["run.seeds=[4294967295]"]).run.seeds == [4294967295]


def test_a_very_long_extends_chain_is_a_config_error_not_a_recursion_error(tmp_path):
    (tmp_path / "c0.toml").write_text('extends = "base"\n')
    for i in range(1, 1200):
        (tmp_path / f"c{i}.toml").write_text(f'extends = "c{i - 1}.toml"\n')
    with pytest.raises(ConfigError, match="'extends' chain longer than"):
        load_config(tmp_path / "c1199.toml")
    assert load_config(tmp_path / "c10.toml") == load_config("base")
