"""Features and GNN node arrays against hand computations on 3-node graphs."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest

from pipelines.data.features import (
    config_feature_table,
    graph_aggregates,
    graph_feature_table,
    layout_config_features,
    layout_feature_names,
    pack_blocks,
    tile_config_features,
    value_frequencies,
)
from pipelines.data.layout_geometry import config_pairs
from pipelines.data.node_arrays import (NODE_FEATURE_DIM, make_graph_arrays, node_feature_names, shape_and_layout,
                                   transform_node_feat)
from pipelines.data.prune import PrunedGraph

F32 = 13  # node_feat column of the one-hot f32 element type (2 + index 11)
DOT, ADD = 34, 2


def node(dims: tuple[int, ...], layout: tuple[int, ...] = ()) -> np.ndarray:
    row = np.zeros(140, dtype=np.float32)
    row[F32] = 1
    row[21 : 21 + len(dims)] = dims
    row[27] = sum(dims)
    row[28] = math.prod(dims)
    row[134 : 134 + len(layout)] = layout
    return row


def block(*values: int) -> list[int]:
    return list(values) + [-1] * (6 - len(values))


DEFAULT = block()


def three_node_layout_graph() -> PrunedGraph:
    """dot(3x200) -> add -> dot(200x3); both dots configurable, defaults (1,0) and (0,1).

    Configs (out, in, kernel) per configurable node:
      A: n0 (1,0) (1,0) -  | n2 (0,1) (1,0) -
      B: n0 (0,1) (1,0) -  | n2  -    (1,0) -
      C: n0  -    (0,1) -  | n2 (1,0)  -    -
    """
    node_feat = np.stack([node((3, 200), (1, 0)), node((3, 200), (1, 0)), node((200, 3), (0, 1))])
    rows = {
        "A": [block(1, 0) + block(1, 0) + DEFAULT, block(0, 1) + block(1, 0) + DEFAULT],
        "B": [block(0, 1) + block(1, 0) + DEFAULT, DEFAULT + block(1, 0) + DEFAULT],
        "C": [DEFAULT + block(0, 1) + DEFAULT, block(1, 0) + DEFAULT + DEFAULT],
    }
    configs = np.array([rows[k] for k in "ABC"], dtype=np.int8)
    return PrunedGraph(
        stem="g3", kind="layout", node_feat=node_feat, node_opcode=np.array([DOT, ADD, DOT], np.uint8),
        edge_index=np.array([[1, 0], [2, 1]]), node_ids=np.arange(3), config_nodes=np.array([0, 2]),
        config_feat=configs, config_index=np.array([4, 7, 9]), target=np.array([5.0, 6.0, 7.0]),
        file_target=np.zeros(10),
    )


@pytest.fixture(scope="module")
def layout_features() -> dict[str, np.ndarray]:
    return layout_config_features(three_node_layout_graph(), value_frequency=True)


def test_violation_ratio(layout_features) -> None:
    # A: both minor-most dims are the 200s. B: n0 puts 3 minor-most; n2's default (0,1) has 200.
    # C: n0's default (1,0) has 200; n2 puts its dim 1 (= 3) minor-most.
    np.testing.assert_allclose(layout_features["f_violation_ratio"], [0.0, 0.5, 0.5])


def test_padding_on_the_8x128_tile(layout_features) -> None:
    # 200 minor -> 256, 3 second -> 8: 2048 / 600; 3 minor -> 128, 200 second -> 200: 25600 / 600.
    good, bad = 256 * 8 / 600, 128 * 200 / 600
    np.testing.assert_allclose(layout_features["f_pad_ratio_sum"], [2 * good, bad + good, good + bad], rtol=1e-6)
    np.testing.assert_allclose(layout_features["f_pad_ratio_mean"], [good, (bad + good) / 2, (good + bad) / 2],
                               rtol=1e-6)
    actual = 2 * 600 * 4  # two f32 tensors of 600 elements
    np.testing.assert_allclose(layout_features["f_pad_waste"][0], 2 * good * 2400 / actual, rtol=1e-6)
    np.testing.assert_allclose(layout_features["f_pad_log_bytes"][1], np.log1p((bad + good) * 2400), rtol=1e-6)


def test_implied_copies_through_a_non_configurable_node(layout_features) -> None:
    # A: (1,0) -> (1,0) agree. B: (0,1) -> (1,0) differ, both explicit.
    # C: producer default (1,0) vs consumer default input, resolved to the producer's default: agree.
    np.testing.assert_array_equal(layout_features["f_implied_copies"], [0, 1, 0])
    np.testing.assert_array_equal(layout_features["f_implied_copies_explicit"], [0, 1, 0])


def test_outputs_off_their_default(layout_features) -> None:
    # A: n2 (0,1) is its default, n0 (1,0) too. B: n0 (0,1) is not. C: n2 (1,0) is not.
    np.testing.assert_array_equal(layout_features["f_out_off_default"], [0, 1, 1])
    np.testing.assert_allclose(layout_features["f_out_off_default_log_bytes"], np.log1p([0, 2400, 2400]), rtol=1e-6)


def test_default_and_value_counts(layout_features) -> None:
    np.testing.assert_array_equal(layout_features["f_default_out"], [0, 1, 1])
    np.testing.assert_array_equal(layout_features["f_default_in"], [0, 0, 1])
    np.testing.assert_array_equal(layout_features["f_default_kernel"], [2, 2, 2])
    np.testing.assert_array_equal(layout_features["f_dot_out_s0_v1"], [1, 0, 1])
    np.testing.assert_array_equal(layout_features["f_dot_out_s0_v0"], [1, 1, 0])
    np.testing.assert_array_equal(layout_features["f_dot_in_s1_v0"], [2, 2, 0])
    np.testing.assert_array_equal(layout_features["f_conv_out_s0_v1"], [0, 0, 0])


def test_value_frequencies(layout_features) -> None:
    # varying cells: n0.out (all distinct), n0.in (A=B), n2.out (all distinct), n2.in (A=B);
    # the two kernel cells never vary and are left out.
    third, two_thirds = 1 / 3, 2 / 3
    np.testing.assert_allclose(layout_features["f_freq_mean"], [0.5, 0.5, third], rtol=1e-6)
    np.testing.assert_allclose(layout_features["f_freq_min"], [third, third, third], rtol=1e-6)
    logmean = (2 * math.log(third) + 2 * math.log(two_thirds)) / 4
    np.testing.assert_allclose(layout_features["f_freq_logmean"], [logmean, logmean, math.log(third)], rtol=1e-6)
    mean, _, _ = value_frequencies(np.zeros((4, 2, 18), np.int8))  # nothing varies
    np.testing.assert_allclose(mean, 1.0)


def test_value_frequencies_match_a_per_cell_count_on_both_counting_paths() -> None:
    rng = np.random.default_rng(3)
    # 40 configs over 4 distinct blocks: the bincount path; 3 configs over many: the sort path
    for count, pool in ((40, 4), (3, 200)):
        blocks = rng.integers(-1, 6, size=(pool, 6)).astype(np.int8)
        configs = blocks[rng.integers(0, pool, size=(count, 5, 3))].reshape(count, 5, 18)
        configs[:, 0] = configs[0, 0]  # a node whose cells never vary
        cells = [tuple(configs[:, n, 6 * b : 6 * b + 6].tolist()) for n in range(5) for b in range(3)]
        shares = [[column.count(column[r]) / count for column in cells if len(set(map(tuple, column))) > 1]
                  for r in range(count)]
        mean, lowest, logmean = value_frequencies(configs)
        np.testing.assert_allclose(mean, [np.mean(row) for row in shares], rtol=1e-12)
        np.testing.assert_allclose(lowest, [min(row) for row in shares], rtol=1e-12)
        np.testing.assert_allclose(logmean, [np.mean(np.log(row)) for row in shares], rtol=1e-12)


def test_pack_blocks_writes_each_block_as_base_7_digits_across_chunks() -> None:
    rng = np.random.default_rng(5)
    configs = rng.integers(-1, 6, size=(40, 1000, 18)).astype(np.int8)  # 18,000 values a row: several chunks
    configs[7, 3] = 5  # the largest code, 7**6 - 1
    expected = ((configs.reshape(40, 1000, 3, 6).astype(np.int64) + 1) * 7 ** np.arange(6)).sum(axis=3)
    packed = pack_blocks(configs)
    assert packed.dtype == np.int32 and packed.shape == (40, 1000, 3)
    np.testing.assert_array_equal(packed, expected)
    assert packed.max() == 7**6 - 1


def test_block_codes_and_padding_table_agree_with_the_blocks() -> None:
    from pipelines.data.layout_geometry import block_codes, layout_codes, padding_table, slot_pairs, tile_padding

    rng = np.random.default_rng(4)
    configs = rng.integers(-1, 2, size=(30, 4, 18)).astype(np.int8)
    codes = block_codes(configs)  # (30, 3, 4)
    blocks = configs.reshape(30, 4, 3, 6).transpose(0, 2, 1, 3).reshape(-1, 6)
    flat = codes.reshape(-1)
    for i, j in rng.integers(0, flat.size, size=(500, 2)):
        assert (flat[i] == flat[j]) == (blocks[i].tobytes() == blocks[j].tobytes())
    np.testing.assert_array_equal(layout_codes(blocks), flat)
    dims = rng.choice([0, 1, 3, 8, 9, 127, 128, 300], size=(6, 6))
    table = padding_table(dims)
    for pair in range(49):
        layout = np.full((1, 6, 6), -1, np.int8)
        layout[..., 0], layout[..., 1] = pair % 7 - 1, pair // 7 - 1
        assert slot_pairs(layout, 0)[0, 0] == pair
        np.testing.assert_array_equal(table[:, pair], tile_padding(dims, layout)[0])


def test_feature_names_and_chunking_agree(monkeypatch, layout_features) -> None:
    graph = three_node_layout_graph()
    assert list(layout_features) == layout_feature_names(True)
    assert "f_freq_mean" not in layout_config_features(graph, value_frequency=False)
    monkeypatch.setattr("pipelines.data.features.CELLS_PER_CHUNK", 2)  # one config per chunk, one cell per group
    chunked = layout_config_features(graph, value_frequency=True)
    for name, values in layout_features.items():
        np.testing.assert_allclose(chunked[name], values, err_msg=name)


def test_config_pairs_stop_at_configurable_nodes() -> None:
    # c0 -> x -> c1 -> y -> c2 (positions 0..4); configurable: 0, 2, 4
    edges = np.array([[1, 0], [2, 1], [3, 2], [4, 3]])
    pairs = config_pairs(5, edges, np.array([0, 2, 4]))
    np.testing.assert_array_equal(pairs, [[0, 1], [1, 2]])
    # a diamond of non-configurable nodes gives the pair once
    edges = np.array([[1, 0], [2, 0], [3, 1], [3, 2]])
    np.testing.assert_array_equal(config_pairs(4, edges, np.array([0, 3])), [[0, 1]])
    assert config_pairs(3, np.zeros((0, 2), np.int64), np.array([0, 2])).shape == (0, 2)


def test_tile_padding_waste_and_count() -> None:
    node_feat = np.stack([node((7,)), node((100, 300))])
    node_feat[1, 0] = 1  # is_root: the output node
    config = np.zeros((3, 24), dtype=np.float32)
    config[0, 8:10] = (64, 128)  # 2 x 3 tiles covering 128 x 384
    config[1, 8:10] = (100, 300)  # one exact tile
    config[0, 15] = 64 * 128
    features = tile_config_features(config, node_feat)
    np.testing.assert_allclose(features["f_tile_waste"], [128 * 384 / 30000, 1.0, 1.0], rtol=1e-6)
    np.testing.assert_allclose(features["f_tile_count_log"], [math.log(6), 0.0, 0.0], atol=1e-6)
    np.testing.assert_allclose(features["f_log_output_prod"], [math.log1p(8192), 0, 0], rtol=1e-6)
    np.testing.assert_array_equal(features["f_cfg_9"], [128, 300, 0])


def test_graph_aggregates_matmul_by_hand() -> None:
    node_feat = np.stack([node((4, 8)), node((8, 16)), node((4, 16))])
    aggregates = graph_aggregates(node_feat, np.array([63, 63, DOT]), np.array([[2, 0], [2, 1]]), np.array([2]))
    assert aggregates["g_num_nodes"] == 3 and aggregates["g_num_edges"] == 2
    assert aggregates["g_op_parameter"] == 2 and aggregates["g_op_dot"] == 1 and aggregates["g_op_other"] == 0
    assert aggregates["g_log_flops_dot"] == pytest.approx(math.log1p(2 * 4 * 8 * 16))  # 2*m*k*n
    assert aggregates["g_log_bytes_dot"] == pytest.approx(math.log1p((32 + 128 + 64) * 4))
    assert aggregates["g_log_config_bytes"] == pytest.approx(math.log1p(64 * 4))
    assert aggregates["g_num_config_nodes"] == 1 and aggregates["g_rank_max"] == 2
    assert aggregates["g_log_flops_conv"] == 0.0


def test_tables_follow_the_schema() -> None:
    table = config_feature_table(three_node_layout_graph(), value_frequency=True)
    assert table.columns[:3] == ["graph", "config_index", "target"]
    assert table.schema["config_index"] == pl.Int32 and table.schema["target"] == pl.Float64
    assert all(table.schema[c] == pl.Float32 for c in table.columns[3:]) and all(
        c.startswith("f_") for c in table.columns[3:])
    assert table["config_index"].to_list() == [4, 7, 9]
    graphs = graph_feature_table([{"g_a": 1.0}, {"g_a": 2.0}], ["x", "y"])
    assert graphs.columns == ["graph", "g_a"] and graphs.schema["g_a"] == pl.Float32


def test_graph_arrays_from_pruned_graph() -> None:
    graph = three_node_layout_graph()
    graph.node_feat[0, 21] = 300
    graph.node_feat[0, 28] = 1e9
    graph.node_feat[0, 53] = -3  # a negative window padding
    arrays = make_graph_arrays(graph, "layout:xla:default", "train")
    names = node_feature_names()
    assert arrays.node_feat.shape == (3, NODE_FEATURE_DIM) and len(names) == NODE_FEATURE_DIM
    assert arrays.node_feat.dtype == np.float32 and np.isfinite(arrays.node_feat).all()
    row = dict(zip(names, arrays.node_feat[0].tolist()))
    assert row["log_c21"] == pytest.approx(math.log1p(300), rel=1e-6)
    assert row["mod128_c21"] == pytest.approx(44 / 128)
    assert row["log_div128_c21"] == pytest.approx(math.log1p(2), rel=1e-6)
    assert row["log_c28"] == pytest.approx(math.log1p(1e9), rel=1e-6)
    assert row["log_c53"] == pytest.approx(-math.log1p(3), rel=1e-6)
    assert row["c13"] == 1.0
    np.testing.assert_array_equal(arrays.message_edges, [[0, 1], [1, 2]])  # row 0 producer, row 1 consumer
    assert arrays.message_edges.dtype == np.int64 and arrays.node_opcode.dtype == np.int64
    np.testing.assert_array_equal(arrays.config_nodes, [0, 2])
    assert arrays.config_feat.dtype == np.int8 and arrays.config_feat.shape == (3, 2, 18)
    np.testing.assert_array_equal(arrays.config_index, [4, 7, 9])
    assert arrays.target.dtype == np.float64


def test_tile_graph_arrays_keep_raw_configs() -> None:
    graph = PrunedGraph("t", "tile", np.stack([node((4,)), node((4,))]), np.array([1, 2], np.uint8),
                        np.array([[1, 0]]), np.arange(2), np.zeros(0, np.int64),
                        np.full((2, 24), 7.0, np.float32), np.arange(2), np.array([1.5, 2.5]), np.array([1.5, 2.5]))
    arrays = make_graph_arrays(graph, "tile:xla", "valid")
    assert arrays.config_feat.dtype == np.float32 and arrays.config_feat.shape == (2, 24)
    np.testing.assert_array_equal(arrays.config_feat, 7.0)  # the GNN scales tile values itself
    assert arrays.config_nodes.size == 0 and arrays.split == "valid"


def test_tile_output_is_the_shaped_node_behind_a_tuple_root():
    from pipelines.data.features import output_node, tile_config_features

    node_feat = np.zeros((3, 140), dtype=np.float32)
    node_feat[1, 21:23] = [100, 300]  # the real output, shape (100, 300)
    node_feat[2, 0] = 1  # root: a tuple without dims
    assert output_node(node_feat) == 1
    config = np.zeros((1, 24), dtype=np.float32)
    config[0, 8:10] = [64, 128]
    features = tile_config_features(config, node_feat)
    # ceil(100/64) * ceil(300/128) = 2 * 3 tiles; padded 128 * 384 over 100 * 300 elements
    assert features["f_tile_count_log"][0] == pytest.approx(np.log(6))
    assert features["f_tile_waste"][0] == pytest.approx(128 * 384 / 30000)
    node_feat[1, 0], node_feat[2, 0] = 1, 0  # a shaped root wins over later shaped non-root nodes
    node_feat[2, 21] = 7
    assert output_node(node_feat) == 1


def test_shape_and_layout_recover_the_raw_dims_and_layouts():
    rng = np.random.default_rng(5)
    raw = np.zeros((500, 140))
    raw[:, 21:27] = rng.integers(0, 10**6, (500, 6))
    raw[:4, 21] = [128, 256, 1, 2**25]  # multiples of 128 are where padding changes
    raw[:, 134:140] = rng.integers(0, 6, (500, 6))
    raw[0, 22] = -3  # not a shape: read back as absent (0), as the transform clips it
    dims, layout = shape_and_layout(transform_node_feat(raw))
    expected = np.maximum(raw[:, 21:27], 0)
    np.testing.assert_array_equal(dims, expected)
    np.testing.assert_array_equal(layout, raw[:, 134:140])


# ----------------------------------------------------------------------------- chains of elementwise ops

PARAMETER, BROADCAST, TUPLE, NEGATE = 63, 13, 100, 60


def chain_graph() -> PrunedGraph:
    """parameter(8x256) -> dot c0 (8x256) -> add -> dot c1 (8x128) -> tuple, a broadcast into the add.

    Defaults are all (1, 0). Configs (out, in) of (c0, c1), kernel blocks all default:
      A: (1,0) (1,0) | (1,0) (1,0)   layouts agree everywhere
      B: (0,1) (0,1) | -     (1,0)   c0 -> c1 disagree (tiled dims), c0's input disagrees with the parameter
      C: (1,0) -     | (0,1) -       default inputs adapt; c1's output feeds the tuple off its default
    """
    node_feat = np.stack([node((8, 256), (1, 0)), node((8, 256), (1, 0)), node((8, 256), (1, 0)),
                          node((8, 256), (1, 0)), node((8, 128), (1, 0)), node(())])
    rows = {
        "A": [block(1, 0) + block(1, 0) + DEFAULT, block(1, 0) + block(1, 0) + DEFAULT],
        "B": [block(0, 1) + block(0, 1) + DEFAULT, DEFAULT + block(1, 0) + DEFAULT],
        "C": [block(1, 0) + DEFAULT + DEFAULT, block(0, 1) + DEFAULT + DEFAULT],
    }
    return PrunedGraph(
        stem="chain", kind="layout", node_feat=node_feat,
        node_opcode=np.array([PARAMETER, DOT, ADD, BROADCAST, DOT, TUPLE], np.uint8),
        edge_index=np.array([[1, 0], [2, 1], [2, 3], [4, 2], [5, 4]]), node_ids=np.arange(6),
        config_nodes=np.array([1, 4]), config_feat=np.array([rows[k] for k in "ABC"], dtype=np.int8),
        config_index=np.arange(3), target=np.array([1.0, 2.0, 3.0]), file_target=np.zeros(3),
    )


def test_chain_ends_stop_at_the_first_non_passable_node() -> None:
    from pipelines.data.layout_geometry import chain_ends

    graph = chain_graph()
    elementwise = np.isin(graph.node_opcode, [ADD])
    down = chain_ends(6, graph.edge_index, np.array([1, 4]), elementwise, downstream=True)
    np.testing.assert_array_equal(down, [[0, 4], [1, 5]])  # c0 reaches c1 through the add; c1 the tuple
    up = chain_ends(6, graph.edge_index, np.array([1, 4]), elementwise, downstream=False)
    np.testing.assert_array_equal(up, [[0, 0], [1, 1], [1, 3]])  # parameter; c0 and the broadcast via the add
    # a chain through a non-passable node ends there
    np.testing.assert_array_equal(chain_ends(6, graph.edge_index, np.array([1]), np.zeros(6, bool)), [[0, 2]])


def test_chain_copies_count_and_bytes() -> None:
    features = layout_config_features(chain_graph(), value_frequency=False)
    np.testing.assert_array_equal(features["f_chain_copies"], [0, 1, 0])
    np.testing.assert_array_equal(features["f_chain_copies_tiled"], [0, 1, 0])
    np.testing.assert_array_equal(features["f_chain_in_fixed"], [0, 1, 0])  # the broadcast never counts
    np.testing.assert_array_equal(features["f_chain_out_fixed"], [0, 0, 1])
    # B: 8x256 f32 (8192 bytes) as (0,1) puts 8 on the 128 lanes (16x padding), as (1,0) none: each
    # copy reads one layout and writes the other, 8192 * (16 + 1) bytes, twice (c0 -> c1, parameter -> c0).
    # C: 8x128 f32 (4096 bytes) moved from (0,1) (16x) to the tuple's (1,0): 4096 * 17.
    moved = np.array([0.0, 2 * 8192 * 17, 4096 * 17])
    np.testing.assert_allclose(features["f_chain_copy_log_bytes"], np.log1p(moved), rtol=1e-6)
    np.testing.assert_allclose(features["f_chain_copy_share"], moved / (8192 + 4096), rtol=1e-6)


def test_chain_copies_tiled_dims_and_kernel_block() -> None:
    """parameter(16x256) and c0 (rank 4) feed dot c1 through a negate; c1's kernel block is rank 2.

    c0's rank-4 output goes to c1's input block, the rank-2 parameter to its kernel block.
    """
    node_feat = np.stack([node((2, 4, 8, 256), (3, 2, 1, 0)), node((16, 256), (1, 0)),
                          node((2, 4, 8, 256), (3, 2, 1, 0)), node((8, 256), (1, 0))])
    configs = np.array([
        # c0 out (3,2,1,0) vs c1 in (3,2,0,1): major dims only; kernel (1,0) agrees with the parameter
        [block(3, 2, 1, 0) + DEFAULT + DEFAULT, DEFAULT + block(3, 2, 0, 1) + block(1, 0)],
        # c0 out (2,3,1,0) vs (3,2,1,0): the tiled dims; kernel (0,1) disagrees with the parameter
        [block(2, 3, 1, 0) + DEFAULT + DEFAULT, DEFAULT + block(3, 2, 1, 0) + block(0, 1)],
    ], dtype=np.int8)
    graph = PrunedGraph(
        stem="k", kind="layout", node_feat=node_feat, node_opcode=np.array([DOT, PARAMETER, NEGATE, DOT], np.uint8),
        edge_index=np.array([[2, 0], [3, 1], [3, 2]]), node_ids=np.arange(4), config_nodes=np.array([0, 3]),
        config_feat=configs, config_index=np.arange(2), target=np.array([1.0, 2.0]), file_target=np.zeros(2))
    features = layout_config_features(graph, value_frequency=False)
    np.testing.assert_array_equal(features["f_chain_copies"], [1, 1])
    np.testing.assert_array_equal(features["f_chain_copies_tiled"], [0, 1])
    np.testing.assert_array_equal(features["f_chain_in_fixed"], [0, 1])
    # config 0: 2x4x8x256 f32 = 65536 bytes, both layouts keep 256 x 8 minor (no padding): 2 * 65536.
    # config 1: (2,3,1,0) puts dim 2 (8) on the 128 lanes (16x) and 256 on the sublanes (1x), plus 1x
    # for (3,2,1,0); the 16x256 parameter (16384 bytes) as (0,1) pads 16 -> 128 lanes (8x), as (1,0) 1x.
    moved = np.array([2 * 65536, 65536 * (16 + 1) + 16384 * (8 + 1)])
    np.testing.assert_allclose(features["f_chain_copy_log_bytes"], np.log1p(moved), rtol=1e-6)


def test_chain_pairs_only_through_elementwise_nodes() -> None:
    # c0 -> transpose -> c1: config_pairs (any non-configurable chain) pairs them, the elementwise-only
    # chains do not: the transpose decides its own output layout.
    edges = np.array([[1, 0], [2, 1]])
    np.testing.assert_array_equal(config_pairs(3, edges, np.array([0, 2])), [[0, 1]])
    passable = np.array([False, False, False])  # a transpose is not elementwise
    assert config_pairs(3, edges, np.array([0, 2]), passable).shape == (0, 2)


def test_tile_vreg_features_by_hand() -> None:
    output = node((100, 300), (1, 0))  # minor-most dim 1 (300), second-minor dim 0 (100)
    output[0] = 1  # is_root
    node_feat = np.stack([node((7,)), output])
    config = np.zeros((2, 24), dtype=np.float32)
    # 0: output tile 64x128 (2 x 3 tiles), input tile 8x32x512, a rank-1 kernel tile of 5
    config[0, 8:10], config[0, 15] = (64, 128), 64 * 128
    config[0, 16:19], config[0, 23] = (8, 32, 512), 8 * 32 * 512
    config[0, 0], config[0, 7] = 5, 5
    # 1: one whole 100x300 output tile, input tile 3x100, no kernel
    config[1, 8:10], config[1, 15] = (100, 300), 30000
    config[1, 16:18], config[1, 23] = (3, 100), 300
    features = tile_config_features(config, node_feat)
    lane, sublane = 384 / 300, 104 / 100  # 300 -> 3 x 128 lanes, 100 -> 13 x 8 sublanes
    np.testing.assert_allclose(features["f_tile_out_lane_pad"], [1.0, lane], rtol=1e-6)
    np.testing.assert_allclose(features["f_tile_out_sublane_pad"], [1.0, sublane], rtol=1e-6)
    np.testing.assert_allclose(features["f_tile_out_vreg_pad"], [1.0, lane * sublane], rtol=1e-6)
    in_pad = 128 / 100 * 8 / 3  # minor 100 -> 128 lanes, second 3 -> 8 sublanes
    np.testing.assert_allclose(features["f_tile_in_vreg_pad"], [1.0, in_pad], rtol=1e-6)
    kernel_pad = 128 / 5 * 8  # a rank-1 tile of 5: one sublane of 8, 5 of 128 lanes
    np.testing.assert_allclose(features["f_tile_kernel_vreg_pad"], [kernel_pad, 1.0], rtol=1e-6)
    np.testing.assert_allclose(features["f_tile_minor_waste"], [384 / 300, 1.0], rtol=1e-6)
    traffic = np.array([6 * (131072 + 5) + 30000, 300 + 30000]) * 4.0  # f32
    np.testing.assert_allclose(features["f_tile_log_traffic"], np.log1p(traffic), rtol=1e-6)
    working = np.array([131072 + 5 * kernel_pad + 8192, 300 * in_pad + 30000 * lane * sublane]) * 4.0
    np.testing.assert_allclose(features["f_tile_log_working_set"], np.log1p(working), rtol=1e-6)


def _reachable_ends(n, edges, source, passable):
    """Brute force: non-passable nodes reached from ``source`` through passable nodes (edges [to, from])."""
    out, seen, stack = set(), set(), [source]
    while stack:
        v = stack.pop()
        for to, frm in edges:
            if frm == v:
                if not passable[to]:
                    out.add(to)
                elif to not in seen:
                    seen.add(to)
                    stack.append(to)
    return out


def test_chain_ends_match_a_brute_force_search_on_random_graphs_with_cycles() -> None:
    from pipelines.data.layout_geometry import chain_ends
    rng = np.random.default_rng(0)
    for _ in range(30):
        n = int(rng.integers(2, 12))
        edges = rng.integers(0, n, size=(int(rng.integers(0, 25)), 2))  # self-loops and cycles included
        passable = rng.random(n) < 0.6
        sources = rng.choice(n, size=int(rng.integers(1, n + 1)), replace=False)
        got = chain_ends(n, edges, sources, passable)
        want = sorted((i, e) for i, s in enumerate(sources) for e in _reachable_ends(n, edges.tolist(), s, passable))
        assert [tuple(p) for p in got.tolist()] == want


def test_chain_ends_are_linear_along_long_chains() -> None:
    """Issue 71: a union over the whole visited set at every level took 17.9 s for a 500-node chain."""
    import time
    from pipelines.data.layout_geometry import chain_ends
    n = 5000
    edges = np.stack([np.arange(1, n), np.arange(n - 1)], axis=1)  # [consumer, producer]: 0 -> 1 -> ... -> n-1
    passable = np.ones(n, bool)
    passable[-1] = False
    t0 = time.perf_counter()
    ends = chain_ends(n, edges, np.arange(n), passable)
    assert time.perf_counter() - t0 < 2.0
    np.testing.assert_array_equal(ends, np.stack([np.arange(n - 1), np.full(n - 1, n - 1)], axis=1))
