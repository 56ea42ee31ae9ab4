"""Lowered programs (issue 76): model code lowered by jax, priced by every cost family, written as a world.

The programs are tiny variants of the catalogue's own model code (flax layers written in
``pipelines.synth.lowered.models``), lowered inside the tests into a temporary cache; the facts checked
come from XLA's modules (dimension labels, shapes, call sites), not from the converter's output.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("flax")
jax = pytest.importorskip("jax")

from pipelines.core.collection import LAYOUT_XLA_DEFAULT, LAYOUT_XLA_RANDOM  # noqa: E402
from pipelines.core.errors import ConfigError  # noqa: E402
from pipelines.data.root import DataRoot
from pipelines.data.tpugraphs import load_ref  # noqa: E402
from pipelines.hlo.featurize import OPCODE_IDS  # noqa: E402
from pipelines.hlo.parse import module_from_jax  # noqa: E402
from pipelines.synth import costmodel  # noqa: E402
from pipelines.synth.families import REGISTRY, load_family  # noqa: E402
from pipelines.synth.lowered import cache, convert, models  # noqa: E402
from pipelines.synth.lowered import world as lowered  # noqa: E402
from pipelines.synth.lowered.catalogue import Architecture, ProgramSpec  # noqa: E402
from pipelines.synth.world import SCALES, program_families, read_labels  # noqa: E402

TINY = (
    Architecture("vgg_t", "vgg", "cnn", "xla", {"widths": (8,), "convs": 1, "image": 16}, (2, 4), ("NHWC", "NCHW")),
    Architecture("unet_3d_t", "unet_3d", "cnn", "xla", {"widths": (4, 8), "image": 8}, (1, 2), ("NDHWC", "NCDHW")),
    Architecture("lstm_t", "lstm", "rnn", "xla", {"hidden": 16, "layers": 1, "steps": 4, "features": 8}, (2, 4)),
)
BY_NAME = {a.name: a for a in TINY}


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("lowered-cache")


def _featurized(cache_dir: Path, spec: ProgramSpec, stage: str = "lowered"):
    return lowered.featurize(cache.load_module(cache_dir, BY_NAME[spec.arch], spec, stage), spec.key)


def _priced(featurized) -> convert.PricedProgram:
    return convert.priced_program(featurized.module, featurized.layout, featurized.config_ids)


# ----------------------------------------------------------------------------- pure parts


def test_conv_dims_follow_the_dimension_labels() -> None:
    assert convert.conv_dims("b01f_01io->b01f") == (0, 3, 1, 2, 2, 3, 0, 1, 0, 3)
    # a weight gradient: the activations' batch is contracted ('f' of the lhs), the output is a kernel
    assert convert.conv_dims("f01b_i01o->01bf") == (3, 0, 1, 2, 0, 3, 1, 2, 2, 3)
    assert convert.conv_dims("bf012_oi012->bf012") == (0, 1, 2, 3, 4, 1, 0, 2, 3, 4, 0, 1)


def test_partial_blocks_are_cut_and_completed_in_the_default_order() -> None:
    defaults = np.full((2, 18), -1, np.int8)
    defaults[0, :5] = [4, 3, 2, 1, 0]
    defaults[1, :3] = [2, 1, 0]
    configs = np.full((3, 2, 18), -1, np.int8)
    configs[0, 0, :5] = [0, 4, 3, 2, 1]  # full: kept, then cut
    configs[1, 0, :2] = [1, 4]  # partial: completed
    configs[0, 1, :3] = [0, 2, 1]  # rank 3: never cut
    cut = convert.truncate_blocks(configs, np.array([[True, False, False], [False, False, False]]))
    assert cut[0, 0, :6].tolist() == [0, 4, -1, -1, -1, -1] and cut[0, 1, :3].tolist() == [0, 2, 1]
    full = convert.complete_blocks(cut, defaults)
    assert full[0, 0, :6].tolist() == [0, 4, 3, 2, 1, -1]
    assert full[1, 0, :6].tolist() == [1, 4, 3, 2, 0, -1]
    assert (full[2] == -1).all()  # the compiler's choice stays the compiler's choice
    assert (full[:, 1] == cut[:, 1]).all()


def test_a_missing_model_package_names_the_extra() -> None:
    with pytest.raises(ConfigError, match=r"\.\[lowered\]"):
        models.require("no_such_model_package_xyz")


# ----------------------------------------------------------------------------- lowered modules


def _conv_step(layout: str):
    lax, jnp = jax.lax, jax.numpy
    numbers = ("NHWC", "HWIO", "NHWC") if layout == "NHWC" else ("NCHW", "OIHW", "NCHW")

    def loss(w, x):
        return jnp.sum(lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=numbers) ** 2)

    w = jax.ShapeDtypeStruct((3, 3, 4, 8) if layout == "NHWC" else (8, 4, 3, 3), jnp.float32)
    x = jax.ShapeDtypeStruct((2, 6, 6, 4) if layout == "NHWC" else (2, 4, 6, 6), jnp.float32)
    return jax.grad(loss), (w, x)


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_the_reference_reads_each_convolution_s_own_dimension_numbers(layout: str) -> None:
    fn, args = _conv_step(layout)
    featurized = lowered.featurize(module_from_jax(fn, *args), layout)
    priced = _priced(featurized)
    model = costmodel.layout_cost_model(priced.program)
    by_name = {i.name: i for i in featurized.layout.instructions}
    shapes = {i.name: i.shape for i in featurized.layout.instructions}
    convs = 0
    for k, u in enumerate(priced.program.config_ids):
        ins = featurized.layout.instructions[featurized.config_ids[priced.order[k]]]
        if ins.opcode != "convolution":
            continue
        convs += 1
        lhs_labels, _, rest = by_name[ins.name].attrs["dim_labels"].partition("_")
        out_labels = rest.partition("->")[2]
        lhs = shapes[ins.operands[0]]
        taps = np.prod([int(s) for s in ins.attrs["window"].split("size=")[1].split()[0].rstrip("}").split("x")])
        assert model.contract_dim[k] == lhs_labels.index("f")
        assert model.out_feat_dim[k] == out_labels.index("f")
        assert model.flops[k] == pytest.approx(2.0 * np.prod(ins.shape.dims) * lhs.dims[lhs_labels.index("f")] * taps)
    assert convs == 2  # the forward convolution and the weight gradient (a convolution of its own)


def test_the_priced_program_inlines_calls_and_keeps_every_configurable_node(cache_dir: Path) -> None:
    spec = ProgramSpec("lstm_t", True, 2, "f32")
    featurized = _featurized(cache_dir, spec)
    opcodes = [i.opcode for i in featurized.layout.instructions]
    assert "while" in opcodes and "call" in opcodes  # lax.scan: loops, and calls into their bodies
    priced = _priced(featurized)
    program = priced.program
    assert sorted(priced.order.tolist()) == list(range(len(featurized.config_ids)))
    assert all(v < u for u, node in enumerate(program.nodes) for v in node.inputs)  # inputs come first
    single_site = {c for i in featurized.layout.instructions for c in i.called
                   if sum(c in j.called for j in featurized.layout.instructions) == 1}
    calls_kept = sum(1 for i in featurized.layout.instructions if i.opcode == "call" and i.called[0] not in single_site)
    assert sum(node.opcode == OPCODE_IDS["call"] for node in program.nodes) == calls_kept
    for k, u in enumerate(program.config_ids):  # the same instruction: shape and opcode
        ins = featurized.layout.instructions[featurized.config_ids[priced.order[k]]]
        assert program.nodes[u].shape == tuple(ins.shape.dims) and program.nodes[u].opcode == OPCODE_IDS[ins.opcode]


@pytest.mark.parametrize("spec", [ProgramSpec("vgg_t", True, 2, "bf16", "NCHW"), ProgramSpec("lstm_t", False, 4, "f32"),
                                  ProgramSpec("unet_3d_t", True, 1, "f32", "NDHWC")], ids=lambda s: s.key)
def test_every_family_prices_lowered_programs(cache_dir: Path, spec: ProgramSpec) -> None:
    featurized = _featurized(cache_dir, spec)
    priced = _priced(featurized)
    space = featurized.layout_space()
    rng = np.random.default_rng(0)
    model = costmodel.layout_cost_model(priced.program)
    from pipelines.synth import searches

    stored = priced.stored_blocks(searches.random_search(model, 40, rng), space.defaults)
    stored = convert.truncate_blocks(stored, lowered.partial_blocks(space.ranks, rng))
    blocks = priced.priced_blocks(convert.complete_blocks(stored, space.defaults))
    for name in REGISTRY:
        runtimes = load_family(name).layout_runtimes(priced.program, blocks)
        assert runtimes.shape == (40,) and np.isfinite(runtimes).all() and (runtimes > 0).all(), name
        assert np.unique(runtimes).size > 5, name  # the configs matter


def test_cached_modules_are_keyed_by_the_package_versions_and_the_lowering_call(cache_dir: Path, monkeypatch) -> None:
    arch, spec = BY_NAME["vgg_t"], ProgramSpec("vgg_t", False, 2, "f32", "NHWC")
    first = cache.module_bytes(cache_dir, arch, spec)
    monkeypatch.setattr(cache, "lower", lambda *a, **k: pytest.fail("lowered again"))
    assert cache.module_bytes(cache_dir, arch, spec) == first
    assert "jax.jit(fn).lower(" in cache.lowering_call_source()
    with monkeypatch.context() as patch:
        patch.setattr(cache, "lowering_call_source", lambda: "another way to lower")
        assert not cache.cache_path(cache_dir, arch, spec, "lowered").exists()  # another digest: lowered anew
    upgraded = dict(cache.package_versions(), jax="99.0")
    monkeypatch.setattr(cache, "package_versions", lambda: upgraded)
    assert not cache.cache_path(cache_dir, arch, spec, "lowered").exists()


def test_fused_kernels_of_a_compiled_program_become_priced_tile_graphs(cache_dir: Path) -> None:
    spec = ProgramSpec("vgg_t", True, 4, "f32", "NHWC")
    featurized = _featurized(cache_dir, spec, "optimized")
    kernels = lowered.fused_kernels(featurized)
    assert kernels
    parts = {p.computation: p for p in featurized.tiles}
    family = load_family("reference")
    for index, (name, space, kernel) in enumerate(kernels):
        file = lowered.TileFile("train", f"k{index}", index, spec, name, 12)
        graph, labels = lowered.make_tile_graph(parts[name], space, kernel, file, 0, family)
        assert graph.config_feat.shape[1] == 24 and 5 <= graph.num_configs <= 12 and graph.num_nodes >= 3
        assert (graph.config_runtime == labels.runtime).all() and np.isfinite(labels.noise_free).all()
        out_rank = int((graph.config_feat[:, 8:14] > 0).sum(axis=1).max())
        assert out_rank == len(kernel.out_shape)
        for other in REGISTRY:
            assert np.isfinite(load_family(other).tile_runtimes(kernel, graph.config_feat)).all(), other


# ----------------------------------------------------------------------------- a world


@pytest.fixture(scope="module")
def world(cache_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("lowered-world") / "data"
    lowered.generate_lowered_world(root, scale="tiny", seed=3, collections="layout:xla:default,layout:xla:random",
                                   cache_dir=cache_dir, architectures=TINY)
    return root


@pytest.mark.slow  # behind the lowered-world fixture (lowers ten programs)
def test_a_lowered_world_holds_real_programs_with_hidden_labels(world: Path) -> None:
    marker = json.loads((world / "labels" / "labels.json").read_text())
    assert marker["generator"] == lowered.GENERATOR
    assert marker["collections"] == [LAYOUT_XLA_DEFAULT.name, LAYOUT_XLA_RANDOM.name]
    families = program_families(world)
    defaults = DataRoot(world).defaults()
    counts = SCALES["tiny"].layout_counts
    for collection in (LAYOUT_XLA_DEFAULT, LAYOUT_XLA_RANDOM):
        for s, split in enumerate(("train", "valid", "test")):
            refs = DataRoot(world).graphs(collection, split)
            assert len(refs) == counts[collection.name][s]
            for ref in refs:
                graph, labels = load_ref(ref), read_labels(world, collection, split, ref.stem)
                program = families[(collection.name, ref.stem)]
                assert program.kind == BY_NAME[program.name].kind
                assert labels.runtime.shape == (graph.num_configs,) and (labels.runtime > 0).all()
                if split != "test":
                    assert (graph.config_runtime == labels.runtime).all()
                configs = np.asarray(graph.node_config_feat)
                assert (configs[defaults[collection.name][ref.stem]] == -1).all()  # the compiler's own config
                ranks = (graph.node_feat[graph.node_config_ids, 21:27] > 0).sum(axis=1)
                assert (configs[:, ranks >= 5, 2:6] == -1).all()  # rank-5 layouts list two dims only
    default = {r.stem for r in DataRoot(world).graphs(LAYOUT_XLA_DEFAULT, "train")}
    random = {r.stem for r in DataRoot(world).graphs(LAYOUT_XLA_RANDOM, "train")}
    assert default <= random  # one pool of programs per source


@pytest.mark.slow
def test_a_lowered_world_is_written_once_per_arguments(world: Path, cache_dir: Path) -> None:
    again = lowered.generate_lowered_world(world, scale="tiny", seed=3, cache_dir=cache_dir, architectures=TINY,
                                           collections="layout:xla:default,layout:xla:random")
    assert "already complete" in again
    with pytest.raises(ConfigError, match="other arguments"):
        lowered.generate_lowered_world(world, scale="tiny", seed=4, cache_dir=cache_dir, architectures=TINY,
                                       collections="layout:xla:default,layout:xla:random")


def test_a_layout_file_is_a_pure_function_of_its_arguments(cache_dir: Path) -> None:
    files = lowered.layout_files(SCALES["tiny"], 3, LAYOUT_XLA_DEFAULT, TINY)["train"]
    file = files[0]
    featurized = _featurized(cache_dir, file.program)
    priced = _priced(featurized)
    family = load_family("heldout")
    first, first_labels = lowered.make_layout_graph(featurized, priced, file, 3, SCALES["tiny"], family)
    second, second_labels = lowered.make_layout_graph(featurized, priced, file, 3, SCALES["tiny"], family)
    assert (np.asarray(first.node_config_feat) == np.asarray(second.node_config_feat)).all()
    assert (first_labels.runtime == second_labels.runtime).all()


@pytest.mark.parametrize("extra, problem", [(["--programs", "lowered", "--variant", "2"], "--variant"),
                                            (["--programs", "lowered", "--limit", "3"], "--limit"),
                                            (["--lowered-cache", "somewhere"], "--lowered-cache")])
def test_synth_refuses_options_the_chosen_programs_do_not_take(tmp_path: Path, extra: list[str], problem: str,
                                                               capsys) -> None:
    from pipelines.cli import main

    assert main(["synth", "--out", str(tmp_path / "w"), *extra]) == 2
    assert problem in capsys.readouterr().err
    assert not (tmp_path / "w").exists()
