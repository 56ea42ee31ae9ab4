"""GNN config-pair term: chain ends in the node arrays, what each end sees per config, and the model's
use of them (an endpoint's layout reaches the other endpoint, an unrelated node's does not)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipelines.data.features import layout_config_features
from pipelines.models.gnn import GNNRanker
from pipelines.models.gnn.batch import CHAIN_DIM, chain_layouts, collate, distinct_blocks, gather_configs, prepare_graph
from pipelines.models.gnn.model import GNNModel
from pipelines.config.gnn import GNNConfig
from pipelines.data.node_arrays import NODE_FEATURE_DIM, load_graph_arrays, make_graph_arrays, save_graph_arrays
from pipelines.data.prune import PrunedGraph
from tests.test_features import ADD, DEFAULT, DOT, block, chain_graph, node

from tests.test_gnn import FAST, _one_torch_thread

pytestmark = pytest.mark.usefixtures(_one_torch_thread.__name__)  # test_gnn's one-thread fixture, here too


def node_major(configs: np.ndarray) -> np.ndarray:
    """(c, nc, 18) -> (nc, c, 18), the layout of ``gather_configs``."""
    return np.ascontiguousarray(configs.transpose(1, 0, 2))


def test_chain_ends_and_what_they_see_match_the_gbdt_chain_features():
    graph = chain_graph()
    arrays = make_graph_arrays(graph, "layout:xla:default", "train")
    # c0 -> add -> c1; parameter -> c0 (the broadcast into the add is free); c1 -> tuple (fixed)
    ends = sorted(zip(arrays.chain_src.tolist(), arrays.chain_dst.tolist()))
    assert ends == [(-1, 0), (0, 1), (1, -1)]
    blocks, inverse = distinct_blocks(node_major(arrays.config_feat))  # as a ConfigBatch carries the configs
    seen = chain_layouts(*(torch.from_numpy(a) for a in (blocks, inverse, arrays.chain_src, arrays.chain_dst,
                                                         arrays.chain_kernel, arrays.chain_src_layout,
                                                         arrays.chain_dims, arrays.chain_bytes)))
    ids, feat = seen.ids().numpy(), seen.feat.numpy()
    assert ids.shape == (3, 3, 12) and feat.shape == (3, 3, CHAIN_DIM) and ids.min() >= 0 and ids.max() <= 6
    gbdt = layout_config_features(graph, value_frequency=False)
    pair, fixed_in, fixed_out = (arrays.chain_src >= 0) & (arrays.chain_dst >= 0), arrays.chain_src < 0, arrays.chain_dst < 0
    np.testing.assert_array_equal(feat[pair, :, 0].sum(0), gbdt["f_chain_copies"])
    np.testing.assert_array_equal(feat[pair, :, 1].sum(0), gbdt["f_chain_copies_tiled"])
    np.testing.assert_array_equal(feat[fixed_in, :, 0].sum(0), gbdt["f_chain_in_fixed"])
    np.testing.assert_array_equal(feat[fixed_out, :, 0].sum(0), gbdt["f_chain_out_fixed"])
    moved = np.expm1(feat[..., 2].astype(np.float64) * 10.0).sum(0)  # per-end copy bytes, summed
    np.testing.assert_allclose(np.log1p(moved), gbdt["f_chain_copy_log_bytes"], rtol=1e-5)
    np.testing.assert_array_equal(feat[:, :, 6:], np.broadcast_to(np.stack([pair, fixed_in, fixed_out], 1)[:, None], (3, 3, 3)))


def test_chain_fields_survive_the_cache_round_trip(tmp_path):
    arrays = make_graph_arrays(chain_graph(), "layout:xla:default", "train")
    save_graph_arrays(tmp_path / "g.npz", arrays)
    back = load_graph_arrays(tmp_path / "g.npz")
    for name in ("chain_src", "chain_dst", "chain_kernel", "chain_src_layout", "chain_dims", "chain_bytes"):
        np.testing.assert_array_equal(getattr(back, name), getattr(arrays, name))
        assert getattr(back, name).dtype == getattr(arrays, name).dtype


def distant_pair_graph() -> PrunedGraph:
    """dot A -> add -> add -> add -> dot C (4 hops apart), and an unconnected dot U; 3 configs:
    0: all defaults; 1: A's output block changed; 2: U's output block changed."""
    node_feat = np.stack([node((8, 256), (1, 0))] * 5 + [node((8, 128), (1, 0))])
    base = [block(1, 0) + DEFAULT + DEFAULT, DEFAULT + block(1, 0) + DEFAULT, block(1, 0) + DEFAULT + DEFAULT]
    a_changed = [block(0, 1) + DEFAULT + DEFAULT] + base[1:]
    u_changed = base[:2] + [block(0, 1) + DEFAULT + DEFAULT]
    return PrunedGraph(
        stem="far", kind="layout", node_feat=node_feat,
        node_opcode=np.array([DOT, ADD, ADD, ADD, DOT, DOT], np.uint8),
        edge_index=np.array([[1, 0], [2, 1], [3, 2], [4, 3]]), node_ids=np.arange(6),
        config_nodes=np.array([0, 4, 5]), config_feat=np.array([base, a_changed, u_changed], dtype=np.int8),
        config_index=np.arange(3), target=np.array([1.0, 2.0, 3.0]), file_target=np.zeros(3))


@pytest.mark.parametrize("pairs", [False, True])
def test_pair_term_carries_an_endpoint_layout_to_the_other_end_only(pairs):
    arrays = make_graph_arrays(distant_pair_graph(), "layout:xla:default", "train")
    assert [(int(s), int(d)) for s, d in zip(arrays.chain_src, arrays.chain_dst)] == [(0, 1)]  # A -> C only
    cfg = GNNConfig(config_pairs=pairs, **FAST)
    torch.manual_seed(0)
    model = GNNModel(cfg, NODE_FEATURE_DIM, "layout").eval()
    graph = prepare_graph(arrays, cfg.config_layers)
    configs = gather_configs([graph], [np.arange(3)])
    with torch.no_grad():
        ctx = model.encode(collate([graph]))
        states, chain_sum = model.inject(ctx, configs)  # (3 configurable nodes, 3 configs, H)
        scores = model.score(ctx, configs)[0]
    at_c = states[1]
    if pairs:
        assert not torch.allclose(at_c[0], at_c[1])  # A's layout reaches C, 4 hops away, before any layer
        assert not torch.allclose(chain_sum[0, 0], chain_sum[0, 1])
        torch.testing.assert_close(chain_sum[0, 0], chain_sum[0, 2])  # U is in no chain: pair term unchanged
    else:
        assert chain_sum is None
        torch.testing.assert_close(at_c[0], at_c[1])  # one config layer cannot carry A's layout to C
    torch.testing.assert_close(at_c[0], at_c[2])  # U's layout never reaches C
    assert scores.shape == (3,) and not torch.isclose(scores[0], scores[1])


def test_pair_term_moves_scores_only_through_the_pair():
    """With the node-level injection of A's and U's configs silenced, only the pair term can see A's change."""
    arrays = make_graph_arrays(distant_pair_graph(), "layout:xla:default", "train")
    graph = prepare_graph(arrays, 1)
    configs = gather_configs([graph], [np.arange(3)])
    for pairs in (False, True):
        torch.manual_seed(0)
        model = GNNModel(GNNConfig(config_pairs=pairs, **FAST), NODE_FEATURE_DIM, "layout").eval()
        embed = model.embed_layout_configs

        def silenced(configs, batch, embed=embed):  # A's (row 0) and U's (row 2) node blocks as in config 0, always
            embedded = embed(configs, batch).clone()
            embedded[[0, 2]] = embedded[[0, 2], :1]
            return embedded

        model.embed_layout_configs = silenced
        with torch.no_grad():
            scores = model.score(model.encode(collate([graph])), configs)[0]
        torch.testing.assert_close(scores[0], scores[2])  # U: in no pair
        assert torch.isclose(scores[0], scores[1]) != pairs  # A: moves the score only through the pair


@pytest.mark.parametrize("readout", ["pooled", "pooled+sum", "pooled+sum+bytes", "pooled+sum+work"])
def test_fused_equals_unfused_and_batched_equals_single_with_pairs(readout):
    cfg = GNNConfig(config_pairs=True, config_layers=2, free_layers=1, readout=readout, **FAST)
    torch.manual_seed(1)
    model = GNNModel(cfg, NODE_FEATURE_DIM, "layout").eval()
    if model.node_cost is not None:  # it starts at zero: give it weights
        for p in model.node_cost.parameters():
            torch.nn.init.normal_(p, std=0.5)
    graphs = [prepare_graph(make_graph_arrays(g, "layout:xla:default", "train"), cfg.config_layers)
              for g in (chain_graph(), distant_pair_graph())]
    batch = collate(graphs)
    configs = gather_configs(graphs, [np.arange(3), np.arange(3)])
    seen = chain_layouts(configs.values, configs.inverse, batch.chain_src, batch.chain_dst, batch.chain_kernel,
                         batch.chain_src_layout, batch.chain_dims, batch.chain_bytes)
    assert seen.ids().shape == (4, 3, 12) and seen.feat.shape == (4, 3, CHAIN_DIM)
    assert batch.chain_graph.tolist() == [0, 0, 0, 1]
    with torch.no_grad():
        ctx = model.encode(batch)
        fused, reference = model.score(ctx, configs), model.score(ctx, configs, fused=False)
        torch.testing.assert_close(fused, reference, rtol=1e-4, atol=1e-5)
        for i, g in enumerate(graphs):
            alone = model.score(model.encode(collate([g])), gather_configs([g], [np.arange(3)]))
            torch.testing.assert_close(alone[0], fused[i], rtol=1e-4, atol=1e-5)


def test_ranker_with_pairs_fits_and_predicts():
    graphs = [make_graph_arrays(g, "layout:xla:default", "train") for g in (chain_graph(), distant_pair_graph())]
    ranker = GNNRanker({**FAST, "config_pairs": True, "epochs": 2, "configs_per_graph": 3},
                       collection="layout:xla:default").fit(graphs, seed=0)
    costs = ranker.predict(graphs)
    assert costs.shape == (6,) and np.isfinite(costs).all()


@pytest.mark.parametrize("together", [False, True])
def test_folded_pair_term_equals_the_plain_message_mlp(together):
    """``inject`` splits the pair MLP's first layer per distinct layout and folds its last layer into the
    node projection and the pooled sum; the result is the plain per-end-and-config MLP's, up to rounding."""
    cfg = GNNConfig(config_pairs=True, **FAST)
    torch.manual_seed(2)
    model = GNNModel(cfg, NODE_FEATURE_DIM, "layout").eval()
    graphs = [prepare_graph(make_graph_arrays(g, "layout:xla:default", "train"), cfg.config_layers)
              for g in (chain_graph(), distant_pair_graph())]
    for part in ([graphs] if together else [[g] for g in graphs]):
        batch, configs = collate(part), gather_configs(part, [np.arange(3)] * len(part))
        with torch.no_grad():
            ctx = model.encode(batch)
            states, pooled = model.inject(ctx, configs)
            seen = chain_layouts(configs.values, configs.inverse, batch.chain_src, batch.chain_dst, batch.chain_kernel,
                                 batch.chain_src_layout, batch.chain_dims, batch.chain_bytes)
            embedded = model.value_embed(seen.ids()) + model.chain_slot_embed  # (E, K, 12, dv)
            message = model.chain_mlp(torch.cat([embedded.flatten(-2), seen.feat], dim=-1))
            to_producer, to_consumer = model.chain_to_node(message).chunk(2, dim=-1)
            expected = ctx.config_states.unsqueeze(1) + model.embed_layout_configs(configs, batch)
            for ends, share in ((batch.chain_src, to_producer), (batch.chain_dst, to_consumer)):
                at = ends >= 0
                expected = expected.index_add(0, ends[at].long(), share[at])
            expected_pooled = torch.zeros_like(pooled).index_add(0, batch.chain_graph, message)
            expected_pooled = expected_pooled / batch.num_config_nodes[:, None, None]
        torch.testing.assert_close(states, expected, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(pooled, expected_pooled, rtol=1e-5, atol=1e-5)
        assert not torch.allclose(pooled[:, 0], pooled[:, 1])  # the configs differ at some end
