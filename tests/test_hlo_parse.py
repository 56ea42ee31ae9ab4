"""The pure parts of the HLO featurizer on tiny hand-made attribute strings, and its bounds."""

from __future__ import annotations

import numpy as np
import pytest

from pipelines.hlo.configs import LayoutSpace, default_search, random_search, tile_configs, TileSpace
from pipelines.hlo.featurize import group, parse_dim_labels, parse_padding, parse_slice, parse_window
from pipelines.hlo.parse import parse_attributes, parse_shape


def test_window_text_with_xla_defaults():
    w = parse_window("{size=3x3 stride=2x1 pad=0_1x2_3 lhs_dilate=2x2 rhs_reversal=1x0}")
    assert w.size == (3, 3) and w.stride == (2, 1) and w.pad_low == (0, 2) and w.pad_high == (1, 3)
    assert w.base_dilation == (2, 2) and w.window_dilation == (1, 1) and w.reversal == (True, False)
    empty = parse_window("")
    assert empty.size == () and group(empty.size, 6) == [0.0] * 7 + [1.0]  # no window: sum 0, product 1


def test_dim_labels_give_the_14_convolution_numbers():
    assert parse_dim_labels("b01f_01io->b01f") == [0, 3, 1, 2, 0, 0, 2, 3, 0, 1, 0, 0, 0, 3]
    assert parse_dim_labels("bf01_oi01->bf01") == [0, 1, 2, 3, 0, 0, 1, 0, 2, 3, 0, 0, 0, 1]
    assert parse_dim_labels("b10f_10io->b01f")[2:4] == [2, 1]  # spatial dims in their numeric order


def test_slice_padding_shape_and_attribute_text():
    assert parse_slice("{[0:4], [1:7:2]}") == ([0, 1], [1, 2], [4, 7])
    assert parse_padding("0_0x-1_2_3x1_0") == ([0, -1, 1], [0, 2, 0])
    shape = parse_shape("(f32[2,3]{1,0}, (s32[], pred[4]{0}), token[])")
    assert shape.is_tuple and len(shape.elements) == 3 and shape.first_array().dims == (2, 3)
    assert parse_shape("bf16[<=8,128]{0,1:T(8,128)}").dims == (8, 128)
    assert parse_shape("bf16[<=8,128]{0,1:T(8,128)}").minor_to_major == (0, 1)
    attrs = parse_attributes('window={size=2x2}, dim_labels=b01f_01io->b01f, metadata={op_name="a, b" x=1}')
    assert attrs["window"] == "{size=2x2}" and attrs["dim_labels"] == "b01f_01io->b01f" and len(attrs) == 3
    assert group([2, 3, 4], 2) == [2.0, 3.0, 9.0, 24.0]


def test_layout_searches_respect_ranks_and_defaults():
    ranks = np.array([[2, 3, 2], [4, 4, 0]])
    defaults = np.full((2, 18), -1, dtype=np.int8)
    defaults[0, :2], defaults[0, 6:9], defaults[0, 12:14] = [1, 0], [2, 1, 0], [1, 0]
    defaults[1, :4], defaults[1, 6:10] = [3, 2, 1, 0], [3, 2, 1, 0]
    space = LayoutSpace(ranks, defaults)
    rng = np.random.default_rng(0)
    for configs in (random_search(space, 200, rng), default_search(space, 200, rng)):
        assert configs.shape == (200, 2, 18) and configs.dtype == np.int8
        for node in range(2):
            for block in range(3):
                cells = configs[:, node, 6 * block:6 * block + 6]
                rank = ranks[node, block]
                assert (cells[:, rank:] == -1).all()
                set_rows = cells[(cells[:, :rank] >= 0).all(axis=1), :rank]
                assert all(sorted(r) == list(range(rank)) for r in set_rows.tolist())
        assert (configs[:, :, 14:] == -1).all()
    assert (default_search(space, 5, rng)[0] == defaults).all()


def test_tile_configs_are_distinct_and_bounded():
    feat = tile_configs(TileSpace("dot", (64, 256), 512, (), 0), 50, seed=0)
    assert feat.shape == (50, 24) and np.unique(feat, axis=0).shape[0] == 50
    assert (feat[:, 8] <= 64).all() and (feat[:, 9] <= 256).all() and (feat[:, 15] == feat[:, 8] * feat[:, 9]).all()
    assert (feat[:, 0] <= 512).all() and (feat[:, 2:6] == 0).all()
    scalar = tile_configs(TileSpace("eltwise", (), 0, (), 0), 10, seed=0)
    assert scalar.shape == (1, 24) and scalar[0, 15] == 0  # product of an empty list is 0 in config_feat


def test_a_module_above_the_node_bound_is_refused_naming_it(monkeypatch):
    jax = pytest.importorskip("jax")
    import pipelines.hlo as hlo
    from pipelines.core.errors import FormatError
    from pipelines.hlo.parse import module_from_jax

    module = module_from_jax(lambda x: jax.numpy.tanh(x @ x) + 1.0, jax.numpy.ones((3, 3)))
    monkeypatch.setattr(hlo, "MAX_NODES", 3)
    with pytest.raises(FormatError, match="big-program.*more than a TpuGraphs graph may hold"):
        hlo.featurize_module(module, "big-program")


def test_a_program_without_configurable_nodes_writes_tiles_only_with_a_warning(tmp_path, caplog):
    jax = pytest.importorskip("jax")
    from pipelines.hlo import featurize_jax

    result = featurize_jax(lambda x: jax.numpy.tanh(x) * 2.0, jax.numpy.ones((4, 8)), out_dir=tmp_path, name="ew")
    assert result.layout_path is None and (tmp_path / "ew.json").is_file()
    assert any("no convolution, dot or reshape" in r.getMessage() for r in caplog.records)


def test_help_of_the_new_commands_carries_an_example(capsys):
    from pipelines.cli import build_parser

    parser = build_parser()
    for command in ("featurize", "rank"):
        with pytest.raises(SystemExit):
            parser.parse_args([command, "--help"])
        assert f"example:\n  python -m pipelines {command} " in capsys.readouterr().out


def test_conv_tiles_read_batch_spatial_feature_whatever_the_layout():
    nhwc = tile_configs(TileSpace("conv", (2, 8, 8, 16), 4, (3, 3), 0, (0, 1, 2, 3)), 500, seed=0)
    nchw = tile_configs(TileSpace("conv", (2, 16, 8, 8), 4, (3, 3), 0, (0, 2, 3, 1)), 500, seed=0)
    for feat, feature_col in ((nhwc, 11), (nchw, 9)):
        assert (feat[:, 3] == feat[:, feature_col]).all()  # kernel's output-feature tile = output's feature tile
        assert (feat[:, 0:2] == 3).all()  # the window
