"""The ``heldout`` cost family (pipelines/synth/families/heldout.py): contract and behaviour."""

from __future__ import annotations

import importlib
import time

import numpy as np
import pytest

from pipelines.synth.programs import Family, Program, ProgramBuilder, Variant, build_program, build_tile_kernel

H = importlib.import_module("pipelines.synth.families.heldout")

FAMILIES = [
    (Family("resnet50", "cnn", 400, 64, layout_style="feature_minor"), Variant(32, "bf16", True)),
    (Family("inception", "cnn", 300, 32), Variant(8, "f32", False)),
    (Family("bert", "transformer", 500, 256, heads=4, seq=128), Variant(16, "bf16", True)),
    (Family("dlrm", "mlp", 200, 128, filler=2), Variant(64, "f32", True, 4)),
]


def _ranks(program: Program) -> np.ndarray:
    """(nc, 3) ranks of the output, input and (rank 1-2 conv/dot kernels only) kernel blocks."""
    rows = []
    for v in program.config_ids:
        node = program.nodes[v]
        kr = len(program.nodes[node.inputs[1]].shape) if len(node.inputs) > 1 else 0
        rows.append((len(node.shape), len(program.nodes[node.inputs[0]].shape), kr if 1 <= kr <= 2 else 0))
    return np.array(rows, dtype=np.int64)


def _random_blocks(program: Program, k: int, rng: np.random.Generator) -> np.ndarray:
    ranks = _ranks(program)
    out = np.full((k, len(ranks), 18), -1, dtype=np.int8)
    for i, row in enumerate(ranks):
        for j, r in enumerate(row):
            if r:
                keep = rng.random(k) >= 0.1
                out[keep, i, 6 * j:6 * j + r] = np.argsort(rng.random((int(keep.sum()), r)), axis=1)
    return out


def _explicit_default(program: Program) -> np.ndarray:
    ranks = _ranks(program)
    out = np.full((len(ranks), 18), -1, dtype=np.int8)
    for i, v in enumerate(program.config_ids):
        node = program.nodes[v]
        out[i, :len(node.layout)] = node.layout
        lay = program.nodes[node.inputs[0]].layout
        out[i, 6:6 + len(lay)] = lay
        if ranks[i, 2]:
            lay = program.nodes[node.inputs[1]].layout
            out[i, 12:12 + len(lay)] = lay
    return out


@pytest.fixture(scope="module")
def programs() -> list[Program]:
    return [build_program(f, v, np.random.default_rng(3)) for f, v in FAMILIES]


def test_contract_names():
    assert H.NAME == "heldout"
    for search in ("tile", "default", "random"):
        assert 0.0 < H.noise_sigma(search) < 0.2


def test_layout_shapes_positive_deterministic_and_default(programs):
    rng = np.random.default_rng(0)
    for program in programs:
        nc = len(program.config_ids)
        blocks = _random_blocks(program, 40, rng)
        blocks[0] = -1
        blocks[1] = _explicit_default(program)
        costs = H.layout_runtimes(program, blocks)
        assert costs.shape == (40,) and costs.dtype == np.float64
        assert np.all(np.isfinite(costs)) and np.all(costs > 0)
        np.testing.assert_array_equal(costs, H.layout_runtimes(program, blocks.copy()))
        assert costs[0] == pytest.approx(costs[1], rel=1e-12)  # default == explicit default layouts
        assert len(np.unique(costs)) > 20  # configs are told apart
        # chunking over k does not change a config's cost
        single = H.layout_runtimes(program, blocks[5:6])
        assert single[0] == pytest.approx(costs[5], rel=1e-12)
        assert nc == blocks.shape[1]


def test_random_configs_mostly_slower_than_default_but_not_all(programs):
    rng = np.random.default_rng(1)
    slower = []
    for program in programs:
        blocks = _random_blocks(program, 300, rng)
        default = H.layout_runtimes(program, np.full((1, len(program.config_ids), 18), -1, np.int8))[0]
        costs = H.layout_runtimes(program, blocks)
        slower.append(np.mean(costs > default))
        assert costs.max() / costs.min() > 1.1  # layouts matter
    assert np.mean(slower) > 0.6


def _one_conv(batch: int = 32, size: int = 7, cin: int = 256, cout: int = 256) -> Program:
    b = ProgramBuilder("bf16")
    x = b.parameter((batch, size, size, cin))
    w = b.parameter((3, 3, cin, cout))
    y = b.conv(x, w, layout=(3, 0, 2, 1))
    y = b.binary("maximum", y, b.scalar(b.shape(y)))
    return b.build((y,))


def test_padding_heavy_layout_costs_more_on_a_big_conv():
    program = _one_conv()
    good = np.full((1, 1, 18), -1, np.int8)
    good[0, 0, 0:4] = (3, 0, 2, 1)  # feature minor-most, batch second-minor
    good[0, 0, 6:10] = (3, 0, 2, 1)
    bad = good.copy()
    bad[0, 0, 0:4] = (2, 1, 3, 0)  # the 7-wide spatial dim on the 128 lanes
    bad[0, 0, 6:10] = (2, 1, 3, 0)
    cost_good, cost_bad = H.layout_runtimes(program, np.concatenate([good, bad]))
    assert cost_bad > 2.0 * cost_good


def test_mismatch_inserts_a_copy_and_tile_order_changes_are_absorbed():
    b = ProgramBuilder("f32")
    x = b.parameter((64, 32, 512))
    w = b.parameter((512, 256))
    flat = b.reshape(x, (64 * 32, 512))
    y = b.dot(flat, w)
    y = b.binary("add", y, b.scalar(b.shape(y)))
    program = b.build((y,))
    nc = len(program.config_ids)  # reshape, dot
    assert nc == 2
    base = np.full((1, nc, 18), -1, np.int8)
    cost0 = H.layout_runtimes(program, base)[0]
    # the dot's output transposed: the result must be copied back to the tuple's layout
    t_out = base.copy()
    t_out[0, 1, 0:2] = (0, 1)
    # the reshape's output transposed while the dot's input keeps following it: reshape is a copy
    t_reshape = base.copy()
    t_reshape[0, 0, 0:2] = (0, 1)
    # the dot's input wants a transposed lhs: a copy of the lhs before the dot
    t_in = base.copy()
    t_in[0, 1, 6:8] = (0, 1)
    costs = H.layout_runtimes(program, np.concatenate([t_out, t_reshape, t_in]))
    assert np.all(costs > cost0 + H.LAUNCH)
    # only major dims swapped (same (8,128) tiles): absorbed by the DMA for a fraction of a copy
    b2 = ProgramBuilder("f32")
    x = b2.parameter((16, 32, 64, 256))
    w = b2.parameter((3, 3, 256, 256))
    y = b2.conv(x, w)
    program2 = b2.build((b2.binary("add", y, b2.scalar(b2.shape(y))),))
    base2 = np.full((1, 1, 18), -1, np.int8)
    swap = base2.copy()
    swap[0, 0, 6:10] = (3, 2, 0, 1)  # default is (3, 2, 1, 0): tiles identical, tile order differs
    relaid = base2.copy()
    relaid[0, 0, 6:10] = (2, 3, 1, 0)  # the feature dim off the lanes: a real copy of the input
    c_base, c_swap, c_copy = H.layout_runtimes(program2, np.concatenate([base2, swap, relaid]))
    assert c_base < c_swap
    assert c_swap - c_base < 0.25 * (c_copy - c_base)


def test_reshape_is_a_bitcast_under_aligned_row_major_layouts():
    def program_for(seq: int) -> Program:
        b = ProgramBuilder("f32")
        x = b.parameter((8, seq, 256))
        y = b.reshape(x, (8 * seq, 256))
        return b.build((b.binary("add", y, b.scalar(b.shape(y))),))

    blocks = np.full((2, 1, 18), -1, np.int8)
    blocks[1, 0, 0:2] = (0, 1)
    aligned = H.layout_runtimes(program_for(16), blocks)  # 16 % 8 == 0: tiles line up
    ragged = H.layout_runtimes(program_for(12), blocks)  # 12 rows straddle sublane tiles: a copy
    assert aligned[1] > aligned[0] + H.LAUNCH
    # the aligned default is a bitcast, the ragged one a copy (per byte it costs more)
    per_byte_aligned, per_byte_ragged = aligned[0] / 16, ragged[0] / 12
    assert per_byte_ragged > per_byte_aligned


def test_big_ops_dominate():
    small = _one_conv(batch=2, cin=64, cout=64)
    big = _one_conv(batch=64, size=28, cin=256, cout=256)
    blocks = np.full((1, 1, 18), -1, np.int8)
    assert H.layout_runtimes(big, blocks)[0] > 50 * H.layout_runtimes(small, blocks)[0]


def _all_tile_configs(kernel):
    from pipelines.synth.searches import tile_configs, tile_space_size

    return tile_configs(kernel, tile_space_size(kernel), np.random.default_rng(0))


@pytest.mark.parametrize("kind", ["conv", "dot", "reduce", "eltwise"])
def test_tile_costs_shape_positive_and_interior_optimum(kind):
    family = Family("resnet", "cnn", 100, 64) if kind == "conv" else Family("bert", "transformer", 100, 128)
    found_interior = 0
    for seed in range(4):
        _, kernel = build_tile_kernel(family, Variant(32, "bf16"), kind, 10, np.random.default_rng(seed))
        cf = _all_tile_configs(kernel)
        costs = H.tile_runtimes(kernel, cf)
        assert costs.shape == (len(cf),) and costs.dtype == np.float64 and np.all(costs > 0)
        np.testing.assert_array_equal(costs, H.tile_runtimes(kernel, cf.copy()))
        volume = cf[:, 15] * (cf[:, 7] if kind in ("conv", "dot") else 1)
        smallest, largest = np.argmin(volume), np.argmax(volume)
        best = int(np.argmin(costs))
        assert costs[smallest] > costs[best]  # tiny tiles pay grid-step overhead and re-reads
        if best not in (smallest, largest) and costs[largest] > costs[best]:
            found_interior += 1
    assert found_interior >= 2


def test_tile_vmem_overflow_is_penalised():
    _, kernel = build_tile_kernel(Family("resnet", "cnn", 100, 64), Variant(64, "f32"), "conv", 10,
                                  np.random.default_rng(5))
    cf = _all_tile_configs(kernel)
    costs = H.tile_runtimes(kernel, cf)
    full = np.all(cf[:, 8:12] == np.array(kernel.out_shape), axis=1)
    assert costs[full].min() > costs.min()


def test_pricing_1000_configs_of_a_500_node_program_is_fast():
    family = Family("bert", "transformer", 380, 256, heads=4, seq=128)
    program = build_program(family, Variant(16, "bf16", True), np.random.default_rng(0))
    assert 400 <= program.num_nodes <= 900 and len(program.config_ids) >= 80
    blocks = _random_blocks(program, 1000, np.random.default_rng(0))
    H.layout_runtimes(program, blocks[:10])
    start = time.perf_counter()
    costs = H.layout_runtimes(program, blocks)
    elapsed = time.perf_counter() - start
    assert costs.shape == (1000,)
    assert elapsed < 2.0  # about 0.1 s alone on one core; loose for a shared machine
