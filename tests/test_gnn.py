"""GNN ranker: shapes over options, losses on hand cases, fusion exactness, learning, determinism, resume."""

from __future__ import annotations

import logging
import math
import subprocess
import sys
from dataclasses import replace

import numpy as np
import polars as pl
import pytest
import torch
from scipy.stats import kendalltau

from pipelines.config.settings import config_from_dict, resolve_for_collection
from pipelines.core.collection import parse_collection
from pipelines.core.errors import ConfigError, FormatError
from pipelines.models.gnn import GNNRanker
from pipelines.models.gnn.batch import (LayoutConfigs, bytes_share, work_shares, collate, compact_configs, distinct_blocks,
                                        gather_configs, layout_physics, layout_roles, pack_blocks, prepare_for,
                                        prepare_graph)
from pipelines.models.gnn.device import autocast
from pipelines.models.gnn.losses import list_mle_loss, make_loss, pairwise_hinge_loss
from pipelines.models.gnn.model import GNNModel
from pipelines.models.gnn.ops import segment_sum
import pipelines.models.gnn.trainer as trainer
from pipelines.models.gnn.trainer import configs_per_chunk, pass_order, scoring_passes, visit_counts
from pipelines.models.gnn.pretrain import encoder_parameters, pretrain_encoder
from pipelines.config.gnn import GNNConfig
from pipelines.data.node_arrays import NODE_FEATURE_DIM, GraphArrays, transform_node_feat

FEAT = NODE_FEATURE_DIM  # layout graphs must carry node_arrays' columns (shapes, layouts)
# no per-collection overrides and one pass per epoch: the tests' hyperparameters are the ones they pass,
# whatever base.toml tunes
FAST = dict(hidden=16, opcode_dim=8, config_value_dim=4, progress=False, num_threads=1, passes_per_epoch=1,
            collections={})


def gnn(kind: str = "layout", **hp) -> GNNRanker:
    """A small ranker for the collection the test graphs of ``kind`` belong to."""
    return GNNRanker({**FAST, **hp}, collection="tile:xla" if kind == "tile" else "layout:xla:random")


def per_graph(costs: np.ndarray, graphs: list[GraphArrays]) -> list[np.ndarray]:
    """A ranker's flat costs cut back into one array per graph."""
    assert costs.shape == (sum(g.num_configs for g in graphs),)
    return np.split(costs, np.cumsum([g.num_configs for g in graphs])[:-1])


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    """Tiny tensors gain nothing from threads, and OpenMP spin-waits badly on a loaded machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# ----------------------------------------------------------------------------- graph builders


def _edges(rng: np.random.Generator, n: int) -> np.ndarray:
    """A random DAG in PyG convention (row 0 producer < row 1 consumer), every node but 0 fed."""
    consumer = np.arange(1, n)
    producer = (rng.random(n - 1) * consumer).astype(np.int64)
    extra_c = rng.integers(1, n, n // 2)
    extra_p = (rng.random(n // 2) * extra_c).astype(np.int64)
    return np.unique(np.stack([np.concatenate([producer, extra_p]), np.concatenate([consumer, extra_c])]), axis=1)


def node_features(rng: np.random.Generator, n: int) -> np.ndarray:
    """Transformed features of n rank-3 tensors with random dims and row-major layouts, plus noise columns."""
    raw = np.zeros((n, 140))
    raw[:, 21:24] = rng.integers(1, 300, (n, 3))
    raw[:, 134:137] = [2, 1, 0]
    raw[:, 37:45] = rng.normal(size=(n, 8))
    return transform_node_feat(raw)


def layout_graph(rng: np.random.Generator, n: int = 12, nc: int = 3, c: int = 24, stem: str = "g",
                 weights: np.ndarray | None = None) -> GraphArrays:
    """Random layout graph; runtime = weighted sum of config values (an easy, learnable signal)."""
    config_nodes = np.sort(rng.choice(n, nc, replace=False))
    config_feat = rng.integers(-1, 6, (c, nc, 18)).astype(np.int8)
    w = rng.normal(size=18) if weights is None else weights
    runtime = 1e9 + 1e6 * (config_feat.astype(np.float64) @ w).sum(1)
    return GraphArrays(
        collection="layout:xla:random", stem=stem, split="train", node_opcode=rng.integers(0, 121, n),
        node_feat=node_features(rng, n), message_edges=_edges(rng, n),
        config_nodes=config_nodes, config_feat=config_feat, target=runtime, config_index=np.arange(c),
    )


def tile_graph(rng: np.random.Generator, n: int = 5, c: int = 16, stem: str = "t",
               weights: np.ndarray | None = None) -> GraphArrays:
    config_feat = rng.integers(1, 64, (c, 24)).astype(np.float32)
    w = rng.normal(size=24) if weights is None else weights
    runtime = np.exp(0.3 * np.log(config_feat) @ w)
    return GraphArrays(
        collection="tile:xla", stem=stem, split="train", node_opcode=rng.integers(0, 121, n),
        node_feat=node_features(rng, n), message_edges=_edges(rng, n),
        config_nodes=np.zeros(0, np.int64), config_feat=config_feat, target=runtime, config_index=np.arange(c),
    )


def three_node(kind: str, c: int = 4) -> GraphArrays:
    """0 -> 1 -> 2, node 1 configurable (layout)."""
    rng = np.random.default_rng(3)
    if kind == "tile":
        g = tile_graph(rng, n=3, c=c)
    else:
        g = layout_graph(rng, n=3, nc=1, c=c)
        g.config_nodes = np.array([1])
    g.message_edges = np.array([[0, 1], [1, 2]])
    return g


def recorded_steps(monkeypatch) -> list[list]:
    """The prepared graphs of every training step from here on (``trainer.train_step`` wrapped)."""
    steps, original = [], trainer.train_step

    def recording_step(model, graphs, *args, **kwargs):
        steps.append(list(graphs))
        return original(model, graphs, *args, **kwargs)

    monkeypatch.setattr(trainer, "train_step", recording_step)
    return steps


def easy_world(seed: int, kind: str, count: int) -> list[GraphArrays]:
    rng = np.random.default_rng(seed)
    weights = rng.normal(size=18 if kind == "layout" else 24)
    make = layout_graph if kind == "layout" else tile_graph
    return [make(rng, stem=f"{kind}{i}", weights=weights) for i in range(count)]


# ----------------------------------------------------------------------------- config


def test_config_import_does_not_import_torch():
    code = "import sys, pipelines.config.gnn; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_config_validation_and_overrides():
    with pytest.raises(ConfigError, match="conv"):
        config_from_dict(GNNConfig, {"conv": "gcn"})
    with pytest.raises(ConfigError, match="dropout"):
        gnn(dropout=1.0)
    with pytest.raises(ConfigError, match="finite"):
        gnn(lr=float("nan"))
    with pytest.raises(ConfigError, match="gat_heads"):  # a cross-field rule
        GNNConfig(hidden=10, gat_heads=4)
    with pytest.raises(ConfigError, match="unknown_field"):
        gnn(unknown_field=1)
    cfg = GNNConfig(collections={"layout:xla:default": {"cross_config_attention": True, "loss": "listmle"}})
    resolved = resolve_for_collection(cfg, "layout:xla:default")
    assert resolved.cross_config_attention and resolved.loss == "listmle" and resolved.collections == {}
    assert resolve_for_collection(cfg, "tile:xla").loss == "hinge"
    with pytest.raises(ConfigError, match="bogus"):
        config_from_dict(GNNConfig, {"collections": {"tile:xla": {"bogus": 1}}})


# ----------------------------------------------------------------------------- shapes


@pytest.mark.parametrize("kind", ["layout", "tile"])
@pytest.mark.parametrize("conv", ["sage", "gat"])
@pytest.mark.parametrize("attention", [False, True])
@pytest.mark.parametrize("loss", ["hinge", "hinge-gap", "hinge-std", "listmle"])
def test_three_node_shapes_and_gradients(kind, conv, attention, loss):
    cfg = GNNConfig(conv=conv, cross_config_attention=attention, loss=loss, config_layers=2, **FAST)
    torch.manual_seed(0)
    model = GNNModel(cfg, FEAT, kind)
    graphs = [prepare_for(three_node(kind, c=4), cfg), prepare_for(three_node(kind, c=2), cfg)]
    configs = gather_configs(graphs, [np.arange(4), np.arange(2)])
    scores = model.score(model.encode(collate(graphs)), configs)
    assert scores.shape == (2, 4)
    assert configs.mask.tolist() == [[True] * 4, [True, True, False, False]]
    value = make_loss(loss, cfg.margin)(scores, configs.target, configs.mask)
    value.backward()
    assert torch.isfinite(value)
    assert model.head[-1].weight.grad is not None and torch.isfinite(model.head[-1].weight.grad).all()


# ----------------------------------------------------------------------------- losses


def test_hinge_hand_cases():
    runtime = torch.tensor([[1.0, 2.0, 3.0]], dtype=torch.float64)
    mask = torch.ones(1, 3, dtype=torch.bool)
    separated = torch.tensor([[0.0, 1.0, 2.0]])
    assert float(pairwise_hinge_loss(separated, runtime, mask, margin=1.0)) == 0.0
    # pairs (0,1): gap 0.5 -> 0.5; (0,2): gap 1.0 -> 0; (1,2): gap 0.5 -> 0.5; mean over 3 pairs
    close = torch.tensor([[0.0, 0.5, 1.0]])
    assert float(pairwise_hinge_loss(close, runtime, mask, margin=1.0)) == pytest.approx(1.0 / 3)
    # equal runtimes form no pair; a masked config takes no part
    tied = torch.tensor([[1.0, 1.0, 9.0]], dtype=torch.float64)
    masked = torch.tensor([[True, True, False]])
    assert float(pairwise_hinge_loss(torch.tensor([[5.0, 0.0, 0.0]]), tied, masked)) == 0.0


def test_gap_weighted_hinge_hand_cases():
    runtime = torch.tensor([[1.0, 2.0, 4.0]], dtype=torch.float64)
    mask = torch.ones(1, 3, dtype=torch.bool)
    # log gaps ln2, 2 ln2, ln2 over their mean 4 ln2 / 3: weights 0.75, 1.5, 0.75
    close = torch.tensor([[0.0, 0.5, 1.0]])  # violations 0.5, 0, 0.5
    assert float(pairwise_hinge_loss(close, runtime, mask, 1.0, "gap")) == pytest.approx((0.375 + 0.375) / 3)
    wrong_far = torch.tensor([[0.0, 1.0, 0.5]])  # violations 0, 0.5 (the far pair), 1.5
    assert float(pairwise_hinge_loss(wrong_far, runtime, mask, 1.0, "gap")) == pytest.approx((0.75 + 1.125) / 3)
    # one pair weighs 1 whatever its gap: the plain hinge
    two = torch.tensor([[0.0, 0.3]])
    pair = torch.tensor([[1.0, 7.0]], dtype=torch.float64)
    assert float(pairwise_hinge_loss(two, pair, mask[:, :2], 1.0, "gap")) == pytest.approx(0.7)
    # a padded config (runtime 0) takes no part and makes no NaN
    padded = torch.tensor([[1.0, 2.0, 0.0]], dtype=torch.float64)
    value = pairwise_hinge_loss(close, padded, torch.tensor([[True, True, False]]), 1.0, "gap")
    assert float(value) == pytest.approx(0.5)
    assert make_loss("hinge-gap", 1.0)(close, runtime, mask) == pairwise_hinge_loss(close, runtime, mask, 1.0, "gap")
    with pytest.raises(ValueError, match="weighting"):
        pairwise_hinge_loss(close, runtime, mask, 1.0, "sqrt")


def test_standardised_hinge_is_blind_to_a_graphs_score_scale():
    runtime = torch.tensor([[1.0, 2.0, 3.0]], dtype=torch.float64)
    mask = torch.ones(1, 3, dtype=torch.bool)
    # scores 0, 0.5, 1 have standard deviation sqrt(1/6): standardised gaps 0.5 sqrt(6) = 1.22 and 2.45
    close = torch.tensor([[0.0, 0.5, 1.0]])
    assert float(pairwise_hinge_loss(close, runtime, mask, 1.0)) == pytest.approx(1.0 / 3)
    assert float(pairwise_hinge_loss(close, runtime, mask, 1.0, standardise=True)) == 0.0
    # scores 100 times smaller: the plain hinge finds every pair inside its margin, the standardised
    # one the same loss at either scale, a wrong order costing alike
    wrong = torch.tensor([[0.0, 1.0, 0.5]])
    for scores in (wrong, close):
        at_scale, small = (float(pairwise_hinge_loss(s, runtime, mask, 1.0, standardise=True))
                           for s in (scores, scores / 100))
        assert at_scale == pytest.approx(small, rel=1e-4)
    plain = [float(pairwise_hinge_loss(s, runtime, mask, 1.0)) for s in (wrong, wrong / 100)]
    assert plain[1] > plain[0]
    # a masked (padded) config enters neither the pairs nor the spread; equal scores make no NaN
    padded = torch.tensor([[0.0, 0.5, 1e6]])
    value = pairwise_hinge_loss(padded, runtime, torch.tensor([[True, True, False]]), 1.0, standardise=True)
    assert float(value) == 0.0  # two scores 0.5 apart have spread 0.25: a standardised gap of 2
    flat = pairwise_hinge_loss(torch.zeros(1, 3, requires_grad=True), runtime, mask, 1.0, standardise=True)
    assert float(flat.detach()) == pytest.approx(1.0) and torch.isfinite(flat).item()
    assert make_loss("hinge-std", 1.0)(close, runtime, mask) == pairwise_hinge_loss(
        close, runtime, mask, 1.0, standardise=True)


def test_listmle_hand_cases():
    runtime = torch.tensor([[1.0, 2.0]], dtype=torch.float64)
    mask = torch.ones(1, 2, dtype=torch.bool)
    right, wrong = torch.tensor([[0.0, 1.0]]), torch.tensor([[1.0, 0.0]])
    # right order: [log(e^0 + e^-1) - 0 + log(e^-1) + 1] / 2
    expected = (math.log(1 + math.exp(-1)) + 0.0) / 2
    assert float(list_mle_loss(right, runtime, mask)) == pytest.approx(expected, rel=1e-6)
    assert float(list_mle_loss(right, runtime, mask)) < float(list_mle_loss(wrong, runtime, mask))
    # a padded slot changes nothing, and its gradient stays finite
    padded = torch.tensor([[0.0, 1.0, -50.0]], requires_grad=True)
    value = list_mle_loss(padded, torch.tensor([[1.0, 2.0, 0.0]], dtype=torch.float64),
                          torch.tensor([[True, True, False]]))
    value.backward()
    assert float(value.detach()) == pytest.approx(expected, rel=1e-6)
    assert torch.isfinite(padded.grad).all() and float(padded.grad[0, 2]) == 0.0


# ----------------------------------------------------------------------------- pooling


@pytest.mark.parametrize("rows", [1, 7, 3000])
@pytest.mark.parametrize("ties", [False, True])
def test_max_over_rows_gives_max_values_and_gradient_to_the_first_maximum(monkeypatch, rows, ties):
    import pipelines.models.gnn.ops as ops_module

    monkeypatch.setattr(ops_module, "_MAX_BLOCK_ELEMENTS", 64)  # many row blocks, a partial last one
    monkeypatch.setattr(ops_module, "_LARGE_MAX_ELEMENTS", 0)  # the blocked path at every size
    generator = torch.Generator().manual_seed(rows)
    # integer values in a small range: most columns hold their maximum in several rows
    x = (torch.randint(0, 3, (rows, 4, 5), generator=generator).float() if ties
         else torch.randn(rows, 4, 5, generator=generator))
    weight = torch.randn(4, 5, generator=generator)
    ours, reference = x.clone().requires_grad_(), x.clone().requires_grad_()
    value = ops_module.max_over_rows(ours)
    expected = reference.max(0).values
    (value * weight).sum().backward()
    (expected * weight).sum().backward()
    assert torch.equal(value, expected)
    assert torch.equal(ours.grad, reference.grad)  # every column's gradient in exactly one row, the first
    assert torch.equal(ops_module.max_over_rows(x), expected.detach())  # without a gradient
    with torch.no_grad():
        assert torch.equal(ops_module.max_over_rows(ours), expected.detach())


def test_max_over_rows_keeps_a_nan_maximum_and_its_row_as_max_does(monkeypatch):
    import pipelines.models.gnn.ops as ops_module

    monkeypatch.setattr(ops_module, "_MAX_BLOCK_ELEMENTS", 40)  # two rows per block
    monkeypatch.setattr(ops_module, "_LARGE_MAX_ELEMENTS", 0)
    x = torch.randn(30, 4, 5, generator=torch.Generator().manual_seed(1))
    x[7, 1, 2] = x[20, 1, 2] = x[6, 1, 2] = float("nan")  # a column with NaNs in two blocks, two in the first
    x[29, 0, 0] = float("nan")  # in the last block
    ours, reference = x.clone().requires_grad_(), x.clone().requires_grad_()
    value, expected = ops_module.max_over_rows(ours), reference.max(0).values
    value.backward(torch.ones_like(value))
    expected.backward(torch.ones_like(expected))
    torch.testing.assert_close(value, expected, rtol=0, atol=0, equal_nan=True)
    assert torch.equal(ours.grad, reference.grad)


@pytest.mark.parametrize("ties", [False, True])
def test_one_graph_pooling_repeats_the_separate_ops_to_the_bit(monkeypatch, ties):
    import pipelines.models.gnn.ops as ops_module
    from pipelines.models.gnn.ops import PoolOneGraph

    monkeypatch.setattr(ops_module, "_MAX_BLOCK_ELEMENTS", 64)  # many row blocks, a partial last one
    generator = torch.Generator().manual_seed(3)
    rows, k, h = 50, 4, 6
    x = (torch.randint(0, 3, (rows, k, h), generator=generator).float() if ties
         else torch.randn(rows, k, h, generator=generator))
    config_rows = torch.randperm(rows, generator=generator)[:20]
    x[config_rows[:3]] += 5.0  # the max of many columns on a configurable row, of the others elsewhere
    graph = torch.zeros(rows, dtype=torch.long)
    weights = [torch.randn(shape, generator=generator) for shape in ((1, k, h), (1, k, h), (20, k, h))]

    def gradient(pool):
        states = x.clone().requires_grad_()
        outputs = pool(states)
        sum(((out * w).sum() for out, w in zip(outputs, weights)), torch.zeros(())).backward()
        return [out.detach() for out in outputs], states.grad

    # the separate ops, created in the order the model creates them
    expected, expected_grad = gradient(lambda s: (segment_sum(s, graph, 1), s.max(0).values.unsqueeze(0),
                                                  s[config_rows]))
    got, got_grad = gradient(lambda s: PoolOneGraph.apply(s, graph, config_rows))
    assert all(torch.equal(a, b) for a, b in zip(got, expected))
    assert torch.equal(got_grad, expected_grad)


@pytest.mark.parametrize("config_layers", [0, 1, 2])
def test_a_training_step_pools_one_graph_in_one_pass_with_the_plain_ops_gradients(monkeypatch, config_layers):
    """The model's CPU training step takes ``PoolOneGraph``; every parameter's gradient equals the one
    the separate ops give (to the bit), through the whole network."""
    import pipelines.models.gnn.model as model_module

    cfg = GNNConfig(config_layers=config_layers, free_layers=1, **FAST)
    rng = np.random.default_rng(8)
    graph = prepare_graph(layout_graph(rng, n=60, nc=6, c=16), cfg.config_layers)
    configs = gather_configs([graph], [np.arange(16)])

    def gradients() -> list[torch.Tensor]:
        torch.manual_seed(4)
        model = GNNModel(cfg, FEAT, "layout")
        scores = model.score(model.encode(collate([graph])), configs)
        pairwise_hinge_loss(scores, configs.target, configs.mask).backward()
        return [p.grad.clone() for p in model.parameters() if p.grad is not None]

    taken = []
    fused_apply = model_module.PoolOneGraph.apply
    monkeypatch.setattr(model_module.PoolOneGraph, "apply", lambda *a: taken.append(1) or fused_apply(*a))
    fused = gradients()
    assert taken  # the one-pass pooling ran
    monkeypatch.setattr(model_module.PoolOneGraph, "apply", lambda x, graph_rows, config_rows: (
        segment_sum(x, graph_rows, 1), x.max(0).values.unsqueeze(0), x[config_rows]))
    plain = gradients()
    assert len(fused) == len(plain) and all(torch.equal(a, b) for a, b in zip(fused, plain))


def test_segment_max_sorted_per_group_with_an_empty_group():
    from pipelines.models.gnn.ops import segment_max_sorted

    x = torch.tensor([[1.0, 5.0], [3.0, 2.0], [4.0, 4.0]], requires_grad=True)
    index = torch.tensor([0, 0, 2])
    out = segment_max_sorted(x, index, 3)
    assert out.tolist() == [[3.0, 5.0], [float("-inf"), float("-inf")], [4.0, 4.0]]
    out[[0, 2]].sum().backward()
    assert x.grad.tolist() == [[0.0, 1.0], [1.0, 0.0], [1.0, 1.0]]


# ----------------------------------------------------------------------------- fusion and batching


def randomise_node_cost(model: GNNModel) -> None:
    """The node-cost head starts at zero (a check of it would pass with any states): give it weights."""
    for p in model.node_cost.parameters():
        torch.nn.init.normal_(p, std=0.5)


@pytest.mark.parametrize("readout", ["pooled", "pooled+sum", "pooled+sum+bytes", "pooled+sum+work"])
@pytest.mark.parametrize("config_layers", [0, 3])
def test_fused_layout_equals_unfused_reference(readout, config_layers):
    cfg = GNNConfig(config_layers=config_layers, free_layers=1, readout=readout, **FAST)
    torch.manual_seed(1)
    model = GNNModel(cfg, FEAT, "layout").eval()
    if readout != "pooled":
        randomise_node_cost(model)
    rng = np.random.default_rng(5)
    graphs = [prepare_graph(layout_graph(rng, n=40, nc=4, c=8, stem=f"g{i}"), cfg.config_layers) for i in range(2)]
    # a graph bigger than 3 hops around its configurable nodes has nodes outside D_3; without a config
    # layer only the configurable nodes themselves are inside
    varying = int((~collate(graphs).outside_final).sum())
    assert varying < sum(g.num_nodes for g in graphs)
    assert (varying == sum(g.config_nodes.shape[0] for g in graphs)) == (config_layers == 0)
    ctx = model.encode(collate(graphs))
    configs = gather_configs(graphs, [np.arange(8), np.arange(5)])
    with torch.no_grad():
        fused, reference = model.score(ctx, configs), model.score(ctx, configs, fused=False)
    torch.testing.assert_close(fused, reference, rtol=1e-4, atol=1e-5)


def chain_graph_arrays(n: int, config_nodes: list[int], c: int, seed: int = 0) -> GraphArrays:
    """A path 0 -> 1 -> ... -> n-1 with the given configurable nodes and ``c`` random configs."""
    g = layout_graph(np.random.default_rng(seed), n=n, nc=len(config_nodes), c=c)
    g.config_nodes = np.array(config_nodes)
    g.message_edges = np.stack([np.arange(n - 1), np.arange(1, n)])
    return g


def test_node_cost_readout_is_a_per_config_sum_over_nodes():
    # path 0..8, configurable nodes 1 and 6: after one config layer their reaches {0,1,2} and {5,6,7}
    # are disjoint, so a sum of per-node costs is additive in the two nodes' configs
    cfg = GNNConfig(config_layers=1, free_layers=1, config_pairs=False, readout="pooled+sum", **FAST)
    torch.manual_seed(2)
    model = GNNModel(cfg, FEAT, "layout").eval()
    g = chain_graph_arrays(9, [1, 6], c=4)
    # a 2 x 2 design over the two nodes' blocks: configs (a1, b1), (a2, b2), (a1, b2), (a2, b1)
    g.config_feat[2, 0], g.config_feat[2, 1] = g.config_feat[0, 0], g.config_feat[1, 1]
    g.config_feat[3, 0], g.config_feat[3, 1] = g.config_feat[1, 0], g.config_feat[0, 1]
    prepared = prepare_graph(g, cfg.config_layers)
    configs = gather_configs([prepared], [np.arange(4)])
    ctx = model.encode(collate([prepared]))

    def interaction(scores: torch.Tensor) -> float:  # (a1,b1) - (a2,b1) - (a1,b2) + (a2,b2)
        return float(scores[0] - scores[3] - scores[2] + scores[1])

    with torch.no_grad():
        pooled_only = model.score(ctx, configs)[0]  # the node-cost head starts at zero
        randomise_node_cost(model)
        for p in model.head[-1].parameters():  # silence the pooled head: the score is the node-cost sum
            p.zero_()
        summed = model.score(ctx, configs)[0]
    assert abs(interaction(pooled_only)) > 1e-4  # the pooled head is not additive ...
    assert abs(interaction(summed)) < 1e-5 < float(summed.std())  # ... the per-node sum is
    # a graph made of two copies of it, both copies given the same config, scores the same: the sum
    # is divided by the configurable node count, so its scale does not grow with the graph
    twice = chain_graph_arrays(18, [1, 6, 10, 15], c=4)
    twice.message_edges = np.concatenate([g.message_edges, g.message_edges + 9], axis=1)
    twice.node_opcode, twice.node_feat = np.tile(g.node_opcode, 2), np.tile(g.node_feat, (2, 1))
    twice.config_feat = np.concatenate([g.config_feat, g.config_feat], axis=1)
    doubled = prepare_graph(twice, cfg.config_layers)
    with torch.no_grad():
        again = model.score(model.encode(collate([doubled])), gather_configs([doubled], [np.arange(4)]))[0]
    torch.testing.assert_close(again, summed, rtol=1e-4, atol=1e-5)


def test_bytes_share_is_each_node_s_output_bytes_over_the_total():
    raw = np.zeros((3, 140))
    raw[0, 21:23], raw[0, 2 + 11] = [4, 8], 1  # f32 [4, 8]: 128 bytes (one-hot slot 11 = f32)
    raw[1, 21:24], raw[1, 2 + 10] = [2, 3, 128], 1  # f16/bf16-sized [2, 3, 128]: 1536 bytes
    raw[2, 2 + 11] = 1  # an f32 scalar: 4 bytes
    share = bytes_share(transform_node_feat(raw))
    np.testing.assert_allclose(share, np.array([128, 1536, 4]) / 1668, rtol=1e-6)


def test_work_shares_are_each_kernel_s_bytes_moved_and_flops_over_the_totals():
    # f32 [64, 32] x [32, 16] -> dot [64, 16] -> negate [64, 16]; the dot and the negate are the rows
    raw = np.zeros((4, 140))
    raw[:, 2 + 11] = 1
    raw[0, 21:23], raw[1, 21:23], raw[2, 21:23], raw[3, 21:23] = [64, 32], [32, 16], [64, 16], [64, 16]
    opcodes = np.array([0, 0, 34, 60])  # 34: dot
    src, dst = np.array([0, 1, 2]), np.array([2, 2, 3])
    shares = work_shares(transform_node_feat(raw), opcodes, src, dst, np.array([2, 3]))
    moved = np.array([4096 + 8192 + 2048, 4096 + 4096])  # output and operand bytes
    flops = np.array([2 * 64 * 32 * 16, 1024])  # the matmul's exactly; the negate one per element
    np.testing.assert_allclose(shares, np.stack([moved / moved.sum(), flops / flops.sum()], axis=1), rtol=1e-6)


def test_bytes_weighted_node_cost_scales_with_each_node_s_bytes():
    # path 0..8, configurable nodes 1 and 6 with disjoint reaches after one config layer; node 6's
    # reach holds 1000x the bytes of node 1's. With only the bytes-weighted cost left (the count-
    # weighted output and the pooled head silenced), changing node 6's config moves the score far
    # more than changing node 1's by the same block swap
    cfg = GNNConfig(config_layers=1, free_layers=1, config_pairs=False, readout="pooled+sum+bytes", **FAST)
    torch.manual_seed(2)
    model = GNNModel(cfg, FEAT, "layout").eval()
    g = chain_graph_arrays(9, [1, 6], c=4)
    raw = np.zeros((9, 140))
    raw[:, 21:23], raw[:, 2 + 11] = [16, 16], 1
    raw[5:8, 21:23] = [512, 500]  # 1000x the elements of the others
    g.node_feat = transform_node_feat(raw)
    g.config_feat[1] = g.config_feat[0]
    g.config_feat[1, 0] = g.config_feat[3, 0]  # config 1: node 1's block changed
    g.config_feat[2] = g.config_feat[0]
    g.config_feat[2, 1] = g.config_feat[3, 1]  # config 2: node 6's block changed
    prepared = prepare_graph(g, cfg.config_layers)
    assert prepared.varying_bytes_share.sum() == pytest.approx(1.0)
    with torch.no_grad():
        randomise_node_cost(model)
        for p in model.head[-1].parameters():
            p.zero_()
        last = model.node_cost.mlp[-1]
        last.weight[0].zero_(), last.bias[0].zero_()
        scores = model.score(model.encode(collate([prepared])), gather_configs([prepared], [np.arange(4)]))[0]
    small, big = abs(float(scores[1] - scores[0])), abs(float(scores[2] - scores[0]))
    assert big > 0 and small < big / 50


def test_node_cost_readout_trains_and_a_model_saved_before_it_loads_pooled(tmp_path):
    graphs = easy_world(9, "layout", 3)
    ranker = gnn(epochs=2, readout="pooled+sum").fit(graphs[:2], graphs[2:], seed=0)
    assert ranker.model_.node_cost is not None and float(ranker.model_.node_cost.mlp[-1].weight.detach().abs().sum()) > 0
    old = gnn(epochs=1).fit(graphs[:2], graphs[2:], seed=0)
    old.save(tmp_path, "old")
    saved = torch.load(tmp_path / "old.pt", weights_only=False)
    del saved["config"]["readout"]  # what a model file written before the option holds
    torch.save(saved, tmp_path / "old.pt")
    loaded = GNNRanker.load(tmp_path, "old")
    assert loaded.config.readout == "pooled" and loaded.model_.node_cost is None
    np.testing.assert_array_equal(old.predict(graphs), loaded.predict(graphs))


def test_distinct_blocks_round_trip():
    rng = np.random.default_rng(3)
    values = rng.integers(-1, 6, (5, 7, 18)).astype(np.int8)
    values[:, 3] = values[0, 0]  # repeated blocks share one row
    values[0, 0, :] = [-1] * 9 + [5] * 9  # the extreme ids 0 and 6 survive the packing
    blocks, inverse = distinct_blocks(values)
    assert inverse.shape == (5, 7)
    np.testing.assert_array_equal(blocks[inverse], values.astype(np.int64) + 1)
    assert len(blocks) == len(np.unique(values.reshape(-1, 18), axis=0))


def test_layout_configs_hold_the_values_compactly():
    rng = np.random.default_rng(4)
    choices = rng.integers(-1, 6, (9, 3, 18)).astype(np.int8)  # each node takes one of three blocks
    values = choices[np.arange(9), rng.integers(0, 3, (40, 9))]
    values[:, :4] = -1  # nodes left to the compiler in every config: one shared block
    values[3, 5, :] = [-1] * 9 + [5] * 9  # the extreme ids survive
    configs = LayoutConfigs.from_values(values)
    assert configs.shape == values.shape and configs.ndim == 3 and configs.ids.dtype == np.uint16
    np.testing.assert_array_equal(configs.values(), values)
    assert configs.nbytes < values.nbytes / 4
    rows = np.array([7, 2, 39])
    np.testing.assert_array_equal(configs[rows].values(), values[rows])
    np.testing.assert_array_equal(configs.block_keys(rows), pack_blocks(values[rows]))
    # pack_blocks is the packing distinct_blocks sorts: ids (value + 1) as base-7 digits, slot 0 the lowest
    one = values[:1, 5:6]
    np.testing.assert_array_equal(pack_blocks(one), (one.astype(np.int64) + 1) @ 7 ** np.arange(18))


def test_layout_configs_of_a_graph_without_configurable_nodes():
    configs = LayoutConfigs.from_values(np.zeros((3, 0, 18), np.int8))
    assert configs.shape == (3, 0, 18) and configs.values().shape == (3, 0, 18)
    assert configs.block_keys(np.array([2, 0])).shape == (2, 0)


def test_layout_configs_widen_past_65536_blocks():
    values = np.random.default_rng(5).integers(-1, 6, (1, 70_000, 18)).astype(np.int8)  # ~all blocks distinct
    configs = LayoutConfigs.from_values(values)
    assert configs.keys.shape[0] > 2**16 and configs.ids.dtype == np.int32
    np.testing.assert_array_equal(configs.values(), values)


def test_gather_configs_from_layout_configs_as_from_the_values():
    """A step's ConfigBatch is the one distinct_blocks gives on the sampled configs' raw values."""
    rng = np.random.default_rng(6)
    graphs = [layout_graph(rng, n=12, nc=4, c=24, stem="a"), layout_graph(rng, n=9, nc=2, c=10, stem="b")]
    for g in graphs:
        g.config_feat[::3] = g.config_feat[0]  # repeated configs: blocks shared across configs and graphs
    prepared = [prepare_graph(g, 1) for g in graphs]
    assert all(isinstance(p.config_feat, LayoutConfigs) for p in prepared)
    indices = [np.array([5, 0, 17, 3]), np.array([9, 1])]  # the second graph padded to K = 4
    batch = gather_configs(prepared, indices)
    padded = [indices[0], np.array([9, 1, 9, 9])]
    node_values = np.concatenate([g.config_feat[p].transpose(1, 0, 2) for g, p in zip(graphs, padded)])
    blocks, inverse = distinct_blocks(node_values)
    np.testing.assert_array_equal(batch.values.numpy(), blocks)
    np.testing.assert_array_equal(batch.inverse.numpy(), inverse)
    assert batch.values.dtype == torch.int8 and batch.inverse.dtype == torch.int32


def test_compact_configs_checks_the_graph_and_leaves_tile_graphs():
    rng = np.random.default_rng(7)
    tile = tile_graph(rng)
    assert compact_configs(tile) is tile
    g = layout_graph(rng)
    compact = compact_configs(g)
    np.testing.assert_array_equal(compact.config_feat.values(), g.config_feat)
    assert compact_configs(compact) is compact
    g.config_feat[0, 0, 0] = 6
    with pytest.raises(FormatError, match="layout:xla:random:g.*outside -1..5"):
        compact_configs(g)


def test_fit_on_compact_configs_is_the_fit_on_the_values():
    rng = np.random.default_rng(8)
    train = [layout_graph(rng, stem=f"g{i}") for i in range(3)]
    valid = [layout_graph(rng, stem="v")]
    plain = gnn(epochs=2, configs_per_graph=8).fit(train, valid, seed=0)
    compact = gnn(epochs=2, configs_per_graph=8).fit([compact_configs(g) for g in train],
                                                     [compact_configs(g) for g in valid], seed=0)
    np.testing.assert_array_equal(plain.predict(valid), compact.predict(valid))
    np.testing.assert_array_equal(plain.predict(valid), compact.predict([compact_configs(g) for g in valid]))


def test_layout_physics_hand_case():
    # output tensor (3, 200) with default layout {1, 0}; its operand (1000,) with default {0}
    shapes = np.array([[[3, 200, 0, 0, 0, 0], [1000, 0, 0, 0, 0, 0]]], dtype=np.float64)
    layouts = np.array([[[1, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0]]])
    rest = [-1] * 12
    values = np.array([[
        [1, 0, -1, -1, -1, -1, *rest],  # config sets the default: 200 minor-most, 3 second-minor
        [0, 1, -1, -1, -1, -1, *rest],  # transposed: 3 minor-most (padded to 128), 200 second (to 208)
        [-1] * 18,  # compiler's choice: the defaults of both tensors
    ]], dtype=np.int8)
    blocks, inverse = distinct_blocks(values)  # as a ConfigBatch carries them
    got = layout_physics(*(torch.from_numpy(a) for a in (blocks, inverse, shapes, layouts)))[0].numpy()
    waste = lambda size, multiple: np.log(np.ceil(size / multiple) * multiple / size)
    # per tensor: log1p(minor), waste(minor, 128), log1p(second), waste(second, 8), set by config, largest minor
    default_out = [np.log1p(200), waste(200, 128), np.log1p(3), waste(3, 8)]
    input_default = [np.log1p(1000), waste(1000, 128), 0.0, 0.0, 0.0, 1.0]  # rank 1: no second dim
    np.testing.assert_allclose(got[0], default_out + [1.0, 1.0] + input_default, rtol=1e-6)
    np.testing.assert_allclose(got[1], [np.log1p(3), waste(3, 128), np.log1p(200), waste(200, 8), 1.0, 0.0]
                               + input_default, rtol=1e-6)
    np.testing.assert_allclose(got[2], default_out + [0.0, 1.0] + input_default, rtol=1e-6)


def _convolution_graph(kernel_first: bool) -> GraphArrays:
    """input (8, 32, 32, 3) NHWC and kernel (5, 5, 3, 16) HWIO -> convolution (8, 28, 28, 16) NHWC, the
    convolution configurable; with ``kernel_first`` the kernel's edge comes first (files need not
    list edges in operand order)."""
    raw = np.zeros((3, 140))
    raw[0, 21:25], raw[1, 21:25], raw[2, 21:25] = [8, 32, 32, 3], [5, 5, 3, 16], [8, 28, 28, 16]
    raw[:, 134:138] = [3, 2, 1, 0]
    # in-batch, in-feature, in-spatial x4, kernel in/out feature, kernel spatial x4, out-batch, out-feature
    raw[2, 93:107] = [0, 3, 1, 2, 0, 0, 2, 3, 0, 1, 0, 0, 0, 3]
    edges = np.array([[1, 0], [2, 2]]) if kernel_first else np.array([[0, 1], [2, 2]])
    configs = np.full((2, 1, 18), -1, np.int8)
    configs[0, 0, :4] = [3, 2, 1, 0]  # output: feature dim minor-most
    configs[1, 0, :4] = [0, 3, 2, 1]  # output: batch dim minor-most, feature second
    configs[1, 0, 6:10] = [1, 2, 3, 0]  # input: a spatial dim minor-most, then the other spatial
    return GraphArrays(collection="layout:xla:random", stem="conv", split="train",
                       node_opcode=np.array([63, 63, 26]), node_feat=transform_node_feat(raw), message_edges=edges,
                       config_nodes=np.array([2]), config_feat=configs, target=np.array([1.0, 2.0]),
                       config_index=np.arange(2))


@pytest.mark.parametrize("kernel_first", [False, True])
def test_layout_roles_name_the_dims_each_layout_puts_minor_most(kernel_first):
    from pipelines.models.gnn.batch import (NUM_ROLES, ROLE_BATCH, ROLE_CONTRACTED, ROLE_OUT_FEATURE,
                                            ROLE_SPATIAL)
    graph = _convolution_graph(kernel_first)
    prepared = prepare_graph(graph, 1, match_operands=True)
    # the input and kernel are told apart by the dimension numbers, whatever the edge order
    np.testing.assert_array_equal(prepared.config_shapes[0, 1], [8, 32, 32, 3, 0, 0])
    np.testing.assert_array_equal(prepared.config_shapes[0, 2], [5, 5, 3, 16, 0, 0])
    np.testing.assert_array_equal(prepared.config_roles[0], [
        [ROLE_BATCH, ROLE_SPATIAL, ROLE_SPATIAL, ROLE_OUT_FEATURE, 0, 0],
        [ROLE_BATCH, ROLE_SPATIAL, ROLE_SPATIAL, ROLE_CONTRACTED, 0, 0],
        [ROLE_SPATIAL, ROLE_SPATIAL, ROLE_CONTRACTED, ROLE_OUT_FEATURE, 0, 0]])
    blocks, inverse = distinct_blocks(graph.config_feat.transpose(1, 0, 2))  # (nodes, configs) as a batch has them
    got = layout_roles(*(torch.from_numpy(a) for a in (blocks, inverse, prepared.config_shapes,
                                                         prepared.config_layouts, prepared.config_roles)))[0].numpy()
    one_hot = lambda role: np.eye(NUM_ROLES)[role]
    waste = lambda size, multiple: np.log(np.ceil(size / multiple) * multiple / size)
    # kernel left to its default {3, 2, 1, 0}: 16 output features minor-most, 3 input features second
    kernel = [np.log1p(16), waste(16, 128), np.log1p(3), waste(3, 8), 0.0, 1.0]
    default_in = [*one_hot(ROLE_CONTRACTED), *one_hot(ROLE_SPATIAL)]
    default_kernel = [*one_hot(ROLE_OUT_FEATURE), *one_hot(ROLE_CONTRACTED)]
    np.testing.assert_allclose(got[0], kernel + [*one_hot(ROLE_OUT_FEATURE), *one_hot(ROLE_SPATIAL)]
                               + default_in + default_kernel, rtol=1e-6)
    np.testing.assert_allclose(got[1], kernel + [*one_hot(ROLE_BATCH), *one_hot(ROLE_OUT_FEATURE)]
                               + [*one_hot(ROLE_SPATIAL), *one_hot(ROLE_SPATIAL)] + default_kernel, rtol=1e-6)


def _shape(*dims: int) -> np.ndarray:
    return np.array(list(dims) + [0] * (6 - len(dims)))


@pytest.mark.parametrize("out, lhs, rhs, expected", [
    # x @ w: lhs rows and contracted features, rhs contracted and output features
    ((32, 256), (32, 512), (512, 256), [[5, 4], [5, 3], [3, 4]]),
    # attention scores: two batch dims, the head dim contracted
    ((2, 4, 16, 16), (2, 4, 16, 8), (2, 4, 16, 8), [[2, 2, 5, 4], [2, 2, 5, 3], [2, 2, 4, 3]]),
    # a weight gradient x^T @ g: both contract their first (batch) dim
    ((512, 256), (32, 512), (32, 256), [[5, 4], [3, 5], [3, 4]]),
    # square: read as a plain matmul (the lhs contracts its last dim, the rhs its first)
    ((128, 128), (128, 128), (128, 128), [[5, 4], [5, 3], [3, 4]]),
    # a matrix-vector product: the output keeps the lhs rows only
    ((64,), (64, 32), (32,), [[5], [5, 3], [3]]),
])
def test_dot_roles_read_a_dot_from_its_shapes(out, lhs, rhs, expected):
    from pipelines.models.gnn.batch import dot_roles
    roles = dot_roles(_shape(*out), _shape(*lhs), _shape(*rhs))
    for block, want in enumerate(expected):
        np.testing.assert_array_equal(roles[block], want + [0] * (6 - len(want)))


def test_dot_roles_refuse_shapes_no_dot_has():
    from pipelines.models.gnn.batch import dot_roles
    # the operands the wrong way round: 256 can only come from the rhs's free dims, which follow the lhs's
    assert dot_roles(_shape(32, 256), _shape(512, 256), _shape(32, 512)) is None
    assert dot_roles(_shape(7, 9), _shape(3, 4), _shape(4, 5)) is None


@pytest.mark.parametrize("weights_first", [False, True])
def test_a_dots_operands_are_matched_by_its_shapes(weights_first):
    from pipelines.models.gnn.batch import ROLE_CONTRACTED, ROLE_OTHER, ROLE_OUT_FEATURE, ROLE_SPATIAL
    raw = np.zeros((3, 140))
    raw[0, 21:23], raw[1, 21:23], raw[2, 21:23] = [32, 512], [512, 256], [32, 256]
    raw[:, 134:136] = [1, 0]
    edges = np.array([[1, 0], [2, 2]]) if weights_first else np.array([[0, 1], [2, 2]])
    graph = GraphArrays(collection="layout:xla:default", stem="dot", split="train",
                        node_opcode=np.array([63, 63, 34]), node_feat=transform_node_feat(raw), message_edges=edges,
                        config_nodes=np.array([2]), config_feat=np.full((2, 1, 18), -1, np.int8),
                        target=np.array([1.0, 2.0]), config_index=np.arange(2))
    prepared = prepare_graph(graph, 1, match_operands=True)
    np.testing.assert_array_equal(prepared.config_shapes[0, 1], [32, 512, 0, 0, 0, 0])
    np.testing.assert_array_equal(prepared.config_shapes[0, 2], [512, 256, 0, 0, 0, 0])
    np.testing.assert_array_equal(prepared.config_roles[0, :, :2], [[ROLE_SPATIAL, ROLE_OUT_FEATURE],
                                                                    [ROLE_SPATIAL, ROLE_CONTRACTED],
                                                                    [ROLE_CONTRACTED, ROLE_OUT_FEATURE]])
    # without operand matching the edge order stands, and a dot read the wrong way round has no roles
    plain = prepare_graph(graph, 1, match_operands=False)
    np.testing.assert_array_equal(plain.config_shapes[0, 1], [512, 256, 0, 0, 0, 0] if weights_first
                                  else [32, 512, 0, 0, 0, 0])
    assert (plain.config_roles[0, :, :2] == ROLE_OTHER).all() == weights_first
    # a model's config asks for the matching with match_operands alone, or with layout_roles
    from pipelines.config.gnn import GNNConfig
    from pipelines.models.gnn.batch import prepare_for
    for cfg, matched in ((GNNConfig(), False), (GNNConfig(match_operands=True), True),
                         (GNNConfig(layout_roles=True), True)):
        got = prepare_for(graph, cfg).config_shapes[0, 1]
        np.testing.assert_array_equal(got, [32, 512, 0, 0, 0, 0] if matched or not weights_first
                                      else [512, 256, 0, 0, 0, 0])


RESHAPES = [([2, 3, 4], [6, 4]), ([2, 3], [3, 2]), ([4, 6], [2, 3, 4]), ([8, 1, 16], [128]),
            ([2, 2, 3, 5], [4, 15]), ([3, 4, 5, 2, 2], [12, 10, 2]), ([7], [7]), ([2, 3], [5])]


def _reshape_graph(rng: np.random.Generator, configs: int) -> GraphArrays:
    """A parameter feeding a reshape per entry of RESHAPES (row-major default layouts), with random
    configs: each block unset, a full minor_to_major, or only its two minor-most dims (then -1)."""
    raw = np.zeros((2 * len(RESHAPES), 140))
    for i, shapes in enumerate(RESHAPES):
        for node, dims in zip((2 * i, 2 * i + 1), shapes):
            raw[node, 21:21 + len(dims)] = dims
            raw[node, 134:134 + len(dims)] = np.arange(len(dims))[::-1]
    feat = np.full((configs, len(RESHAPES), 18), -1, np.int8)
    for c in range(configs):
        for i, shapes in enumerate(RESHAPES):
            for block, dims in enumerate(reversed(shapes)):  # output, then operand
                kind = rng.integers(3)
                if kind:
                    perm = rng.permutation(len(dims))
                    feat[c, i, 6 * block:6 * block + (len(dims) if kind == 1 else min(2, len(dims)))] = \
                        perm[:len(dims) if kind == 1 else 2]
    edges = np.stack([np.arange(0, 2 * len(RESHAPES), 2), np.arange(1, 2 * len(RESHAPES), 2)])
    return GraphArrays(collection="layout:xla:random", stem="reshapes", split="train",
                       node_opcode=np.tile([63, 75], len(RESHAPES)), node_feat=transform_node_feat(raw),
                       message_edges=edges, config_nodes=np.arange(1, 2 * len(RESHAPES), 2), config_feat=feat,
                       target=np.arange(configs, dtype=np.float64), config_index=np.arange(configs))


def test_reshape_physics_says_bitcast_exactly_when_every_element_keeps_its_place():
    from pipelines.models.gnn.batch import reshape_physics

    graph = _reshape_graph(np.random.default_rng(8), configs=300)
    assert prepare_graph(graph, 1).reshape_rows.size == 0  # only prepared for a model that reads them
    prepared = prepare_graph(graph, 1, with_reshapes=True)
    batch = collate([prepared])
    blocks, inverse = distinct_blocks(graph.config_feat.transpose(1, 0, 2))
    got = reshape_physics(torch.from_numpy(blocks), torch.from_numpy(inverse), batch).numpy()

    def minor_to_major(block: np.ndarray, rank: int) -> list[int]:
        listed = [int(d) for d in block[:rank] if d >= 0]  # a partial block: the default's order goes on
        return listed + [d for d in reversed(range(rank)) if d not in listed]

    def offsets(dims: list[int], layout: list[int]) -> np.ndarray:
        strides = np.zeros(len(dims), np.int64)
        stride = 1
        for d in layout:
            strides[d], stride = stride, stride * dims[d]
        return sum(index * strides[d] for d, index in enumerate(np.unravel_index(np.arange(np.prod(dims)), dims)))

    seen = set()
    for i, (in_dims, out_dims) in enumerate(RESHAPES):
        for c in range(graph.num_configs):
            layout_out = minor_to_major(graph.config_feat[c, i, :6], len(out_dims))
            layout_in = minor_to_major(graph.config_feat[c, i, 6:12], len(in_dims))
            checkable = np.prod(in_dims) == np.prod(out_dims)
            bitcast = checkable and np.array_equal(offsets(in_dims, layout_in), offsets(out_dims, layout_out))
            size = lambda dims, layout, slot: dims[layout[slot]] if slot < len(layout) else 0  # noqa: E731
            expected = [checkable, bitcast] + [size(out_dims, layout_out, s) == size(in_dims, layout_in, s)
                                               for s in (0, 1)]
            np.testing.assert_array_equal(got[i, c], np.array(expected, np.float32), err_msg=f"{i} {c}")
            seen.add((i, bitcast))
    # every reshape with as many elements in as out is a bitcast under some configs and not under others
    # (but the one-dim [7] -> [7], always a bitcast); the one that changes the count is never one
    assert seen == {(i, b) for i in range(len(RESHAPES) - 1) for b in (True, False)} - {(6, False)} | {(7, False)}


def test_reshape_physics_moves_the_scores_only_with_the_option():
    graph = _reshape_graph(np.random.default_rng(9), configs=16)
    scores = {}
    for on in (False, True):
        cfg = GNNConfig(reshape_physics=on, **FAST)
        prepared = prepare_for(graph, cfg)
        torch.manual_seed(0)
        model = GNNModel(cfg, FEAT, "layout").eval()
        with torch.no_grad():
            scores[on] = model.score(model.encode(collate([prepared])), gather_configs([prepared], [np.arange(16)]))
        assert (model.reshape_proj is not None) == on
    # the other modules draw the same initial weights: the option adds its own term and nothing else
    assert not torch.allclose(scores[False], scores[True])
    torch.manual_seed(0)
    off = GNNModel(GNNConfig(**FAST), FEAT, "layout").state_dict()
    torch.manual_seed(0)
    on = GNNModel(GNNConfig(reshape_physics=True, **FAST), FEAT, "layout").state_dict()
    assert all(torch.equal(off[name], on[name]) for name in off)


def test_operands_keep_the_edge_order_without_matching():
    prepared = prepare_graph(_convolution_graph(kernel_first=True), 1)
    np.testing.assert_array_equal(prepared.config_shapes[0, 1], [5, 5, 3, 16, 0, 0])


def test_chunk_size_follows_the_memory_budget():
    rng = np.random.default_rng(4)
    small = prepare_graph(layout_graph(rng, n=12, nc=3), 1)
    big = prepare_graph(layout_graph(rng, n=4000, nc=40), 1)
    cfg = GNNConfig(hidden=64, eval_chunk=512, eval_chunk_mb=1)
    # 1 MiB / (rows x 64 floats x 4 B): the 12-node graph is capped by eval_chunk, the big one is not
    assert configs_per_chunk(cfg, small) == 512
    rows = big.levels[-1].rows.shape[0]
    assert configs_per_chunk(cfg, big) == max(1, 2**20 // (rows * 64 * 4)) < 512
    # on a CUDA device the larger budget sizes the passes (a pure function: no GPU needed)
    cuda = GNNConfig(hidden=64, eval_chunk=512, eval_chunk_mb=1, eval_chunk_mb_cuda=3)
    assert configs_per_chunk(cuda, big, "cuda") == max(1, 3 * 2**20 // (rows * 64 * 4)) > configs_per_chunk(cuda, big)
    assert [len(p) for p in scoring_passes(cuda, big, 100, "cuda")][0] == configs_per_chunk(cuda, big, "cuda")


def test_batched_configs_and_graphs_score_like_one_at_a_time():
    rng = np.random.default_rng(7)
    graphs = [layout_graph(rng, n=15, nc=3, c=10, stem=f"g{i}") for i in range(3)]
    ranker = gnn(epochs=1, eval_chunk=64).fit(graphs, seed=0)
    together = per_graph(ranker.predict(graphs), graphs)
    ranker.config.eval_chunk = 1  # one config per forward pass
    for a, b in zip(together, per_graph(ranker.predict(graphs), graphs)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    # several graphs in one batch give each graph's own scores
    model = ranker.model_
    prepared = [prepare_graph(g, ranker.config.config_layers) for g in graphs]
    with torch.no_grad():
        joint = model.score(model.encode(collate(prepared)), gather_configs(prepared, [np.arange(10)] * 3))
    for i, p in enumerate(prepared):
        np.testing.assert_allclose(joint[i].numpy(), together[i], rtol=1e-5, atol=1e-6)


def test_scoring_passes_partition_the_configs():
    rng = np.random.default_rng(4)
    graph = prepare_graph(layout_graph(rng, n=12, nc=3), 1)
    plain = GNNConfig(eval_chunk=4)
    assert [p.tolist() for p in scoring_passes(plain, graph, 10)] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    attention = GNNConfig(cross_config_attention=True, configs_per_graph=8, eval_chunk=512)
    passes = scoring_passes(attention, graph, 50)
    assert len(passes) == 7 and all(7 <= p.shape[0] <= 8 for p in passes)  # 50 configs, groups of <= K = 8
    assert sorted(np.concatenate(passes).tolist()) == list(range(50))
    assert not np.array_equal(np.concatenate(passes), np.arange(50))  # mixed, as a training step samples
    assert all(np.array_equal(a, b) for a, b in zip(passes, scoring_passes(attention, graph, 50)))  # fixed
    assert scoring_passes(attention, graph, 0) == [] and scoring_passes(plain, graph, 0) == []


def test_the_fused_optimizer_takes_adamw_s_steps():
    """The training and pre-training optimiser is AdamW in one fused kernel: the steps of the per-tensor
    loop, with its learning rate and weight decay, to float rounding."""
    torch.manual_seed(0)
    start = [torch.randn(7, 5), torch.randn(5), torch.randn(3, 2, 4)]
    loop = [p.clone().requires_grad_() for p in start]
    fused = [p.clone().requires_grad_() for p in start]
    loop_opt = torch.optim.AdamW(loop, lr=3e-2, weight_decay=0.1, foreach=False)
    fused_opt = trainer.make_optimizer(fused, 3e-2, 0.1)
    assert fused_opt.defaults["fused"]
    for _ in range(6):
        for a, b in zip(loop, fused):
            a.grad = torch.randn_like(a)
            b.grad = a.grad.clone()
        loop_opt.step()
        fused_opt.step()
    for a, b, p in zip(loop, fused, start):
        assert not torch.equal(b, p)
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)


def test_cross_config_attention_scores_do_not_depend_on_memory_settings():
    """With attention a score depends on the configs scored in the same pass; the passes hold <= K configs
    whatever eval_chunk / eval_chunk_mb say (they used to set the pass size: 2 configs on large graphs)."""
    rng = np.random.default_rng(8)
    graphs = [layout_graph(rng, n=15, nc=3, c=40, stem=f"g{i}") for i in range(2)]
    ranker = gnn(epochs=1, cross_config_attention=True, configs_per_graph=8, eval_chunk=512).fit(graphs, seed=0)
    roomy = ranker.predict(graphs)
    ranker.config.eval_chunk = 3
    np.testing.assert_array_equal(roomy, ranker.predict(graphs))
    ranker.config.cross_config_attention = False  # the same weights without the attention layer's
    ranker.model_.attention = None                 # context: scores differ, so the layer is in play
    assert not np.allclose(roomy, ranker.predict(graphs))


# ----------------------------------------------------------------------------- training behaviour


def test_learns_easy_layout_signal():
    graphs = easy_world(0, "layout", 10)
    ranker = gnn(epochs=30, lr=1e-2, configs_per_graph=16, patience=0)
    ranker.fit(graphs[:7], graphs[7:], seed=0)
    taus = [kendalltau(p, g.target)[0] for p, g in zip(per_graph(ranker.predict(graphs[7:]), graphs[7:]), graphs[7:])]
    assert np.mean(taus) > 0.4, taus
    assert ranker.best_score_ == pytest.approx(max(h["valid"] for h in ranker.history_))


def test_learns_easy_tile_signal():
    graphs = easy_world(1, "tile", 40)
    ranker = gnn("tile", epochs=10, lr=3e-3, graphs_per_step=8, configs_per_graph=16, patience=0)
    ranker.fit(graphs[:30], seed=0)
    taus = [kendalltau(p, g.target)[0]
            for p, g in zip(per_graph(ranker.predict(graphs[30:]), graphs[30:]), graphs[30:])]
    assert np.mean(taus) > 0.4, taus


def test_deterministic_for_a_seed():
    graphs = easy_world(2, "layout", 4)
    fit = lambda seed: gnn(epochs=2, dropout=0.1).fit(graphs[:3], graphs[3:], seed=seed)
    a, b, c = (per_graph(fit(seed).predict(graphs), graphs) for seed in (0, 0, 1))
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    assert not np.allclose(a[0], c[0])


def test_a_fit_on_two_threads_repeats_to_the_bit():
    """Gathers whose backward adds with atomics on 2+ threads (``tensor[index]``) would make every
    multi-threaded CPU fit differ in its last bits; the graph is large enough for torch to split them."""
    rng = np.random.default_rng(5)
    weights = 0.01 * rng.normal(size=18)  # small: runtimes stay positive over 2,000 configurable nodes
    graphs = [layout_graph(rng, n=4000, nc=2000, c=32, stem=f"big{i}", weights=weights) for i in range(2)]
    for g in graphs:  # few distinct layouts: many nodes gather (and add gradients into) the same row
        g.config_feat = np.minimum(g.config_feat, 0)

    def fitted() -> bytes:
        ranker = gnn(epochs=1, num_threads=2, configs_per_graph=32, hidden=64).fit(graphs[:1], graphs[1:], seed=0)
        return ranker.predict(graphs).tobytes() + np.array([h["loss"] for h in ranker.history_]).tobytes()

    assert fitted() == fitted()


def test_each_pass_of_an_epoch_visits_every_training_graph_once(monkeypatch):
    steps = recorded_steps(monkeypatch)
    graphs = easy_world(6, "layout", 5)
    ranker = gnn(epochs=2, passes_per_epoch=3, graphs_per_step=2, patience=0).fit(graphs, seed=0)
    visits = [[id(g) for g in step] for step in steps]  # the prepared graphs live for the whole fit
    assert len(visits) == 2 * 3 * 3  # epochs x passes x ceil(5 graphs / 2 per step)
    passes = [sum(visits[i:i + 3], []) for i in range(0, len(visits), 3)]
    assert all(sorted(p) == sorted(passes[0]) and len(set(p)) == len(graphs) for p in passes)
    assert all(len({tuple(p) for p in passes[e:e + 3]}) > 1 for e in (0, 3))  # a fresh order per pass
    assert [h["epoch"] for h in ranker.history_] == [1, 2]  # one validation record per epoch, not per pass


def test_validation_every_n_epochs_counts_patience_in_epochs_and_validates_the_last(monkeypatch):
    scores, validated = iter([0.5, 0.4, 0.3, 0.2]), []

    def scripted(model, graphs, subsets, cfg, batches=None):
        validated.append(len(validated))
        return next(scores)

    monkeypatch.setattr(trainer, "validation_score", scripted)
    graphs = easy_world(8, "layout", 6)
    # validations at epochs 2, 4, 6: the best at 2, and at 6 four epochs without a better one (patience 4);
    # patience counted in validations would have run on to epoch 10
    stopped = gnn(epochs=10, validate_every=2, patience=4).fit(graphs[:4], graphs[4:], seed=0)
    valid = [h["valid"] for h in stopped.history_]
    assert len(valid) == 6 and len(validated) == 3
    assert all(math.isnan(v) for v in valid[0::2]) and valid[1::2] == [0.5, 0.4, 0.3]
    assert stopped.best_score_ == 0.5
    scores, validated[:] = iter([0.1, 0.2, 0.3]), []
    last = gnn(epochs=5, validate_every=2, patience=0).fit(graphs[:4], graphs[4:], seed=0)
    assert [e for e, h in enumerate(last.history_, 1) if not math.isnan(h["valid"])] == [2, 4, 5]
    assert last.best_score_ == 0.3  # the last epoch is always scored, so it can be kept


@pytest.mark.parametrize("heap_reuse", [True, False])
def test_prediction_keeps_freed_memory_as_the_fit_does(monkeypatch, heap_reuse):
    """eval_chunk_mb's CPU budget assumes freed passes are reused from the heap, in a fit's validation
    and in prediction alike (the malloc settings themselves are tested in test_gnn_heap)."""
    import pipelines.models.gnn.device as device_module

    asked, original = [], device_module.keep_freed_memory
    monkeypatch.setattr(device_module, "keep_freed_memory", lambda enabled: asked.append(enabled) or original(False))
    graphs = easy_world(9, "layout", 4)
    ranker = gnn(epochs=1, cpu_heap_reuse=heap_reuse).fit(graphs[:3], graphs[3:], seed=0)
    assert asked == [heap_reuse]
    ranker.predict(graphs[3:])
    assert asked == [heap_reuse, heap_reuse]


def test_training_graphs_of_another_collection_only_when_the_config_names_it():
    graphs = easy_world(7, "layout", 6)
    other = [replace(g, collection="layout:nlp:random", stem=f"nlp{i}") for i, g in enumerate(graphs[:2])]
    with pytest.raises(ConfigError, match="cannot fit graphs of layout:nlp:random"):
        gnn(epochs=1).fit(graphs[2:5] + other, graphs[5:], seed=0)
    ranker = gnn(epochs=1, extra_train_collections=["layout:nlp:random"])
    with pytest.raises(ConfigError, match="cannot fit graphs of layout:nlp:random"):  # never to validate on
        ranker.fit(graphs[2:5], graphs[5:] + other, seed=0)
    with pytest.raises(ConfigError, match="no training graphs of layout:xla:random"):  # the others only join
        ranker.fit(other, graphs[5:], seed=0)
    ranker.fit(graphs[2:5] + other, graphs[5:], seed=0)
    assert ranker.predict(graphs[5:]).shape == (graphs[5].num_configs,)
    with pytest.raises(ConfigError, match="unknown collection 'layout:nlp'"):
        gnn(extra_train_collections=["layout:nlp"])
    with pytest.raises(ConfigError, match="twice"):
        gnn(extra_train_collections=["layout:nlp:random", "layout:nlp:random"])


def test_visits_follow_the_weights_and_keep_the_pass_length():
    rng = np.random.default_rng(0)
    weights = np.array([1.0, 1.0, 2.0, 4.0, 0.5])
    share = weights / weights.sum() * 5  # 0.59, 0.59, 1.18, 2.35, 0.29 visits
    draws = np.stack([visit_counts(rng, weights) for _ in range(4000)])
    assert (draws.sum(1) == 5).all()
    assert ((draws == np.floor(share)) | (draws == np.ceil(share))).all()  # the whole part or one more
    assert np.allclose(draws.mean(0), share, atol=0.03)
    assert (visit_counts(rng, np.full(7, 3.0)) == 1).all()  # equal weights: each graph once

    order = pass_order(np.random.default_rng(1), 5, 4, 2, own_weights=weights)
    own = order[order < 5]
    assert len(order) == 7 and len(own) == 5 and len(set(order[order >= 5].tolist())) == 2
    assert np.count_nonzero(own == 3) in (2, 3)


def test_visit_power_spends_a_pass_on_the_graphs_with_more_configurable_nodes(monkeypatch):
    rng = np.random.default_rng(5)
    graphs = [layout_graph(rng, n=40, nc=nc, stem=f"g{nc}") for nc in (2, 2, 2, 32)]
    steps = recorded_steps(monkeypatch)
    gnn(epochs=1, passes_per_epoch=8).fit(graphs, seed=0)
    sizes = [len(step[0].config_nodes) for step in steps]
    assert len(sizes) == 32 and sizes.count(32) == 8  # uniform: once per pass
    steps.clear()
    gnn(epochs=1, passes_per_epoch=8, visit_power=0.5).fit(graphs, seed=0)
    sizes = [len(step[0].config_nodes) for step in steps]
    # sqrt(32) / (3 sqrt(2) + sqrt(32)) = 4/7 of a pass's 4 visits: 2 or 3 per pass
    assert len(sizes) == 32 and 16 <= sizes.count(32) <= 24 and sizes.count(2) >= 8
    with pytest.raises(ConfigError, match="visit_power"):
        gnn(visit_power=-1)


def test_a_pass_visits_every_own_graph_and_at_most_as_many_of_another_collections(monkeypatch):
    # as many or fewer extra graphs: one permutation of them all, as when they were plain training graphs
    assert np.array_equal(pass_order(np.random.default_rng(3), 4, 4, 4), np.random.default_rng(3).permutation(8))
    rng = np.random.default_rng(0)
    seen = set()
    for _ in range(20):
        order = pass_order(rng, 3, 10, 3)
        assert sorted(order[order < 3]) == [0, 1, 2] and len(order) == len(set(order)) == 6
        seen |= set(order[order >= 3].tolist())
    assert seen == set(range(3, 13))  # drawn afresh each pass

    graphs = easy_world(8, "layout", 8)
    other = [replace(g, collection="layout:nlp:random", stem=f"nlp{i}") for i, g in enumerate(graphs[3:8])]
    steps = recorded_steps(monkeypatch)
    passes = 4
    ranker = gnn(epochs=1, passes_per_epoch=passes, extra_train_collections=["layout:nlp:random"])
    ranker.fit(graphs[:3] + other, seed=0)
    assert len(steps) == passes * (3 + 3)  # 3 own + 3 of the 5 others per pass, not all 8
    by_pass = [{id(step[0]) for step in steps[i * 6:(i + 1) * 6]} for i in range(passes)]
    assert all(len(p) == 6 for p in by_pass) and len(set.intersection(*by_pass)) >= 3
    assert len(set.union(*by_pass)) == 8

    steps.clear()  # a share of the own graphs' count: 2/3 of 3 -> 2 others per pass; 0: none
    gnn(epochs=1, passes_per_epoch=passes, extra_train_collections=["layout:nlp:random"],
        extra_train_share=2 / 3).fit(graphs[:3] + other, seed=0)
    assert len(steps) == passes * (3 + 2)
    steps.clear()
    gnn(epochs=1, passes_per_epoch=passes, extra_train_collections=["layout:nlp:random"],
        extra_train_share=0).fit(graphs[:3] + other, seed=0)
    assert len(steps) == passes * 3 and len({id(step[0]) for step in steps}) == 3  # the own graphs only


def test_predict_before_fit_raises():
    with pytest.raises(RuntimeError, match="fit"):
        gnn().predict([three_node("layout")])


def test_bad_graph_is_a_format_error():
    g = three_node("layout")
    g.config_feat[0, 0, 0] = 9
    with pytest.raises(FormatError, match="outside -1..5"):
        gnn(epochs=1).fit([g], seed=0)


class _Interrupt(Exception):
    pass


class _StopAfterTwo(logging.Filter):
    """Kills the fit where it logs epoch 2 (after its checkpoint was saved)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.getMessage().startswith("epoch 2/"):
            raise _Interrupt
        return True


@pytest.mark.parametrize("average_epochs", [0.0, 1.0])
def test_resume_from_checkpoint_matches_uninterrupted_run(tmp_path, caplog, average_epochs):
    caplog.set_level(logging.DEBUG, logger="pipelines.models.gnn")  # epoch lines are DEBUG
    graphs = easy_world(3, "layout", 5)
    hp = dict(epochs=4, dropout=0.1, patience=0, weight_average_epochs=average_epochs)
    straight = gnn(**hp).fit(graphs[:4], graphs[4:], seed=0)

    trainer_log, stop = logging.getLogger("pipelines.models.gnn.trainer"), _StopAfterTwo()
    trainer_log.addFilter(stop)
    try:
        with pytest.raises(_Interrupt):
            gnn(**hp).fit(graphs[:4], graphs[4:], seed=0, checkpoint_dir=tmp_path)
    finally:
        trainer_log.removeFilter(stop)
    caplog.clear()
    resumed = gnn(**hp).fit(graphs[:4], graphs[4:], seed=0, checkpoint_dir=tmp_path)
    messages = caplog.messages
    assert messages[0].startswith("resumed") and "after epoch 2" in messages[0]
    assert [h["epoch"] for h in resumed.history_] == [1, 2, 3, 4]
    for (name, a), b in zip(straight.model_.state_dict().items(), resumed.model_.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)
    with pytest.raises(ConfigError, match="fresh checkpoint"):
        gnn(**{**hp, "lr": 0.01}).fit(graphs[:4], graphs[4:], seed=0, checkpoint_dir=tmp_path)


def test_weight_average_moves_towards_the_trained_weights_after_its_warm_up():
    model = torch.nn.Linear(2, 1)
    with torch.no_grad():
        model.weight.fill_(0.0)
        model.bias.fill_(0.0)
    average = trainer.WeightAverage(model, horizon=2.0)  # decay 1 - 1/2 once the warm-up allows it
    expected = torch.zeros(1, 2)
    for n, value in enumerate([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0], 1):
        with torch.no_grad():
            model.weight.fill_(value)
        average.update(model)
        decay = min(0.5, (1 + n) / (10 + n))  # 2/11, 3/12, ..., then 0.5 from the 8th update on
        expected = decay * expected + (1 - decay) * value
    with average.swapped_in(model):
        torch.testing.assert_close(model.weight.detach(), expected)
        assert model.bias.item() == 0.0
    assert (model.weight == 9.0).all()  # the trained weights are back
    with pytest.raises(RuntimeError), average.swapped_in(model):
        raise RuntimeError("a validation that fails")
    assert (model.weight == 9.0).all()


def test_a_fit_with_weight_averaging_keeps_the_average_of_its_steps(monkeypatch):
    """Without validation graphs the fit ends on its last epoch's averaged weights: the exponential average of
    the weights after each optimiser step, from the initial ones (what WeightAverage saw), not the trained ones."""
    trained, initial = [], []
    init, update = trainer.WeightAverage.__init__, trainer.WeightAverage.update

    def recording_init(self, model, horizon):
        initial.append({k: v.detach().clone() for k, v in model.state_dict().items()})
        init(self, model, horizon)

    def recording_update(self, model):
        trained.append({k: v.detach().clone() for k, v in model.state_dict().items()})
        update(self, model)

    monkeypatch.setattr(trainer.WeightAverage, "__init__", recording_init)
    monkeypatch.setattr(trainer.WeightAverage, "update", recording_update)
    graphs = easy_world(4, "layout", 4)
    fitted = gnn(epochs=2, passes_per_epoch=2, patience=0, weight_average_epochs=0.5).fit(graphs, seed=0)
    horizon = 0.5 * 2 * len(graphs)  # half an epoch of 2 passes over the graphs, one graph per step
    assert len(initial) == 1 and len(trained) == 2 * 2 * len(graphs)
    expected = {k: v.double() for k, v in initial[0].items()}
    for n, weights in enumerate(trained, 1):
        decay = max(0.0, min(1 - 1 / horizon, (1 + n) / (10 + n)))
        expected = {k: decay * expected[k] + (1 - decay) * weights[k].double() for k in expected}
    final = fitted.model_.state_dict()
    for name, value in expected.items():
        torch.testing.assert_close(final[name].double(), value, rtol=1e-5, atol=1e-6, msg=name)
    assert not all(torch.equal(final[k], trained[-1][k]) for k in final)  # not simply the last trained weights


def test_the_training_stage_s_settings_are_not_resolved_twice(monkeypatch):
    import pipelines.models.gnn.ranker as ranker_module
    from pipelines.config.settings import load_config, model_settings

    settings = model_settings(load_config("smoke"), "gnn", "layout:xla:random")
    expected = GNNRanker(settings, collection="layout:xla:random").config
    monkeypatch.setattr(ranker_module, "resolve_for_collection", lambda *a, **k: pytest.fail("resolved again"))
    assert GNNRanker(settings, collection="layout:xla:random").config == expected
    assert expected.passes_per_epoch == 8 and expected.collections == {}  # the table, applied once upstream


def test_init_from_starts_the_fit_from_a_saved_model_s_weights(tmp_path):
    graphs = easy_world(12, "layout", 4)
    first = gnn(epochs=2).fit(graphs[:3], graphs[3:], seed=0)
    first.save(tmp_path, "first")
    # a learning rate too small to move a weight: what the fit returns is where it started
    still = dict(epochs=1, lr=1e-12, warmup_fraction=0.0)
    started = gnn(**still, init_from=str(tmp_path / "first.pt")).fit(graphs[:3], graphs[3:], seed=5)
    np.testing.assert_allclose(started.predict(graphs), first.predict(graphs), rtol=1e-6, atol=1e-6)
    fresh = gnn(**still).fit(graphs[:3], graphs[3:], seed=5)
    assert not np.allclose(fresh.predict(graphs), first.predict(graphs), rtol=1e-3)
    # another architecture, or another kind of graph: refused, naming the file
    with pytest.raises(ConfigError, match="first.pt.*architecture differs"):
        gnn(**still, hidden=32, init_from=str(tmp_path / "first.pt")).fit(graphs[:3], graphs[3:], seed=0)
    tiles = easy_world(4, "tile", 4)
    with pytest.raises(ConfigError, match="first.pt: a layout model"):
        gnn("tile", epochs=1, init_from=str(tmp_path / "first.pt")).fit(tiles[:3], tiles[3:], seed=0)


def test_init_from_s_bytes_key_the_training_stage(tmp_path):
    from pipelines.config.settings import load_config
    from pipelines.models.gnn.adapter import INIT_DIGEST, GNNAdapter

    adapter, collection = GNNAdapter(), parse_collection("layout:xla:random")
    config = load_config("smoke")
    assert INIT_DIGEST not in adapter.settings(config, collection)
    model = tmp_path / "start.pt"
    with_init = replace(config, gnn=replace(config.gnn, init_from=str(model)))
    with pytest.raises(ConfigError, match="start.pt"):  # before any fit: the file is read for the key
        adapter.settings(with_init, collection)
    model.write_bytes(b"not a model")
    with pytest.raises(FormatError, match="start.pt"):
        adapter.settings(with_init, collection)
    graphs = easy_world(13, "layout", 3)
    fitted = gnn(epochs=1).fit(graphs[:2], graphs[2:], seed=0)
    fitted.save(tmp_path, "start")
    one = adapter.settings(with_init, collection)
    gnn(epochs=1).fit(graphs[:2], graphs[2:], seed=1).save(tmp_path, "start")  # other weights, same name
    two = adapter.settings(with_init, collection)
    assert one["init_from"] == str(model.resolve()) and one[INIT_DIGEST] != two[INIT_DIGEST]
    assert adapter.make(two, collection, num_threads=1).config.init_from == str(model.resolve())
    with pytest.raises(ConfigError, match="start.pt: a layout model cannot start the fits of tile:xla"):
        adapter.settings(with_init, parse_collection("tile:xla"))


def test_num_threads_zero_takes_the_stage_share_and_a_set_count_wins():
    assert GNNRanker({"num_threads": 0}, collection="layout:xla:default", num_threads=2).config.num_threads == 2
    assert GNNRanker({"num_threads": 3}, collection="layout:xla:default", num_threads=2).config.num_threads == 3
    # tile's own default (one thread: a second is overhead on its tiny graphs) wins over the stage's share
    assert GNNRanker({"num_threads": 0}, collection="tile:xla", num_threads=2).config.num_threads == 1
    assert GNNRanker(collection="layout:xla:default").config.num_threads == 0  # standalone: torch's own setting
    before = torch.get_num_threads()
    graphs = easy_world(4, "tile", 6)
    gnn("tile", epochs=1, num_threads=0).fit(graphs, seed=0)
    assert torch.get_num_threads() == before


def test_save_load_round_trip(tmp_path):
    graphs = easy_world(4, "tile", 6)
    ranker = gnn("tile", epochs=1, graphs_per_step=3).fit(graphs, seed=0)
    assert ranker.save(tmp_path, "m") == ["m.pt"]
    loaded = GNNRanker.load(tmp_path, "m")
    np.testing.assert_array_equal(ranker.predict(graphs), loaded.predict(graphs))
    assert loaded.config == ranker.config and loaded.collection == ranker.collection
    (tmp_path / "junk.pt").write_bytes(b"not a model")
    with pytest.raises(FormatError):
        GNNRanker.load(tmp_path, "junk")


@pytest.mark.parametrize("kind, option", [("layout", "config_pairs"), ("tile", "tile_physics")])
def test_a_model_saved_before_an_option_that_is_now_on_existed_loads_without_it(tmp_path, kind, option):
    graphs = easy_world(9, kind, 3 if kind == "layout" else 6)
    fit = {"graphs_per_step": 3} if kind == "tile" else {}
    ranker = gnn(kind, epochs=1, **{option: False}, **fit).fit(graphs[:2], graphs[2:], seed=0)
    ranker.save(tmp_path, "old")
    saved = torch.load(tmp_path / "old.pt", weights_only=False)
    del saved["config"][option]  # what a model file written before the option holds
    torch.save(saved, tmp_path / "old.pt")
    loaded = GNNRanker.load(tmp_path, "old")
    assert getattr(loaded.config, option) is False and getattr(GNNConfig(), option) is True
    np.testing.assert_array_equal(ranker.predict(graphs), loaded.predict(graphs))


def test_pretraining_changes_only_the_encoder(caplog):
    cfg = GNNConfig(pretrain=True, pretrain_epochs=2, **FAST)
    torch.manual_seed(0)
    model = GNNModel(cfg, FEAT, "layout")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    encoder_ids = {id(p) for p in encoder_parameters(model)}
    graphs = [prepare_graph(g, 0) for g in easy_world(5, "layout", 3)]
    losses = pretrain_encoder(model, graphs, cfg, np.random.default_rng(0))
    assert len(losses) == 2 and all(math.isfinite(v) for v in losses)
    for name, param in model.named_parameters():
        changed = not torch.equal(before[name], param.detach())
        assert changed == (id(param) in encoder_ids), name
    # and the ranker runs it (on unlabeled graphs too) before supervised training
    caplog.set_level(logging.DEBUG, logger="pipelines.models.gnn")
    unlabeled = easy_world(6, "layout", 1)
    unlabeled[0].target[:] = 0
    gnn(pretrain=True, pretrain_epochs=1, epochs=1).fit(
        easy_world(5, "layout", 2), seed=0, unlabeled=unlabeled)
    assert any(m.startswith("pretrain epoch 1/1") for m in caplog.messages)


def test_stage_adapter_flattens_predictions_in_index_order(monkeypatch):
    from pipelines.core.collection import LAYOUT_XLA_RANDOM
    from pipelines.models.gnn import adapter as adapter_module

    graphs = {g.stem: g for g in easy_world(7, "layout", 3)}

    class FakePrepared:
        graph_table = pl.DataFrame({"graph": list(graphs), "nodes_after": [12, 12, 1000],
                                    "configs_after": [24, 24, 10**6]})

        def load_graph_arrays(self, name: str) -> GraphArrays:
            return graphs[name]

    adapter = adapter_module.GNNAdapter()
    train = adapter.load(FakePrepared(), ["layout0", "layout1"], settings={"load_max_configs": 10}, fit=True, seed=0)
    assert [g.num_configs for g in train] == [10, 10]
    kept = train[0].config_index
    assert isinstance(train[0].config_feat, LayoutConfigs)  # a fit's graphs are held compact
    np.testing.assert_array_equal(train[0].config_feat.values(), graphs["layout0"].config_feat[kept])
    assert np.all(np.diff(kept) > 0)  # a sample kept in file order, rows aligned with their runtimes
    np.testing.assert_array_equal(train[0].target, graphs["layout0"].target[kept])
    ranker = adapter.make({**FAST, "epochs": 1}, LAYOUT_XLA_RANDOM, num_threads=1).fit(train, seed=0)
    test = adapter.load(FakePrepared(), ["layout2", "layout0"], settings={}, fit=False, seed=0)
    names, index = adapter.index(test)
    costs = ranker.predict(test)
    assert costs.shape == names.shape == index.shape == (48,)
    assert list(names[:24]) == ["layout2"] * 24 and list(index[24:]) == list(range(24))
    np.testing.assert_array_equal(costs[24:], ranker.predict([graphs["layout0"]]))
    facts, importance = adapter.describe(ranker)
    assert facts["epochs_run"] == 1 and importance is None
    settings = {"configs_per_graph": 32, "hidden": 64, "load_max_configs": 4096}
    small = adapter.job_memory(FakePrepared(), ["layout0"], settings)
    large = adapter.job_memory(FakePrepared(), ["layout0", "layout2"], settings)
    assert 0 < small < large
    kept = adapter.job_memory(FakePrepared(), ["layout0"], {**settings, "cpu_heap_reuse": True})
    assert kept > small  # freed step tensors stay in the heap


# ----------------------------------------------------------------------------- devices and precision


def test_device_choice_and_validation():
    from pipelines.models.gnn.device import resolve_device

    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    for bad in ("gpu", "cuda:x", "tpu"):
        with pytest.raises(ConfigError, match="device"):
            GNNConfig(device=bad)
    with pytest.raises(ConfigError, match="precision"):
        config_from_dict(GNNConfig, {"precision": "fp16"})  # a choice: checked on load
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="no CUDA GPU"):
            gnn(epochs=1, device="cuda").fit([three_node("layout")], seed=0)


@pytest.mark.parametrize("kind", ["layout", "tile"])
def test_training_step_never_reads_the_device(kind):
    """A whole step (both losses) on the meta device, which holds no data: any read-back of a value
    (``.item()``, ``bool(t)``, a boolean mask, ``.tolist()``), i.e. a GPU stall, would raise here."""
    from pipelines.models.gnn.trainer import train_step

    rng = np.random.default_rng(5)
    graphs = [layout_graph(rng, n=30, nc=5)] if kind == "layout" else [tile_graph(rng, stem=f"t{i}") for i in range(3)]
    cfg = GNNConfig(**FAST)
    prepared = [prepare_for(g, cfg) for g in graphs]
    model = GNNModel(cfg, FEAT, kind).to("meta")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batch = collate(prepared).to("meta")
    assert all(t.device.type == "meta" for t in vars(batch).values() if isinstance(t, torch.Tensor))
    assert all(t.device.type == "meta" for lv in batch.levels for t in vars(lv).values())
    for loss in ("hinge", "listmle"):
        value = train_step(model, prepared, [np.arange(4)] * len(prepared), make_loss(loss), optimizer, 1.0,
                           batch=batch)
        assert value.device.type == "meta"


def test_losses_without_pairs_are_zero_with_zero_gradient():
    scores = torch.tensor([[0.3, -0.2], [1.0, 2.0]], requires_grad=True)
    runtime = torch.tensor([[1.0, 1.0], [1.0, 2.0]], dtype=torch.float64)
    nothing = torch.tensor([[True, True], [True, False]])  # graph 0: a tie; graph 1: one config
    for loss in (pairwise_hinge_loss(scores, runtime, nothing), list_mle_loss(scores, runtime, nothing[[1, 1]])):
        assert float(loss.detach()) == 0.0
        (grad,) = torch.autograd.grad(loss, scores)
        assert not grad.any()
    # one graph with pairs, one without: the mean is over the graph that has some
    both = torch.tensor([[True, True], [True, True]])
    alone = pairwise_hinge_loss(scores[1:], runtime[1:], both[1:])
    assert float(pairwise_hinge_loss(scores, runtime, both).detach()) == pytest.approx(float(alone.detach()))


@pytest.mark.parametrize("kind", ["layout", "tile"])
def test_bf16_autocast_trains_and_ranks_like_fp32(kind):
    graphs = easy_world(6, kind, 8)
    fits = {p: gnn(kind, epochs=3, lr=1e-2, precision=p).fit(graphs[:6], graphs[6:], seed=0)
            for p in ("fp32", "bf16")}
    fp32, bf16 = (per_graph(fits[p].predict(graphs[6:]), graphs[6:]) for p in ("fp32", "bf16"))
    for a, b in zip(fp32, bf16):
        assert np.isfinite(b).all() and b.dtype == np.float64
        assert kendalltau(a, b)[0] > 0.6  # same model up to bf16 rounding
    assert not all(np.array_equal(a, b) for a, b in zip(fp32, bf16))  # autocast did run in bf16
    assert fits["bf16"].device_ == "cpu"


@pytest.mark.parametrize("readout", ["pooled", "pooled+sum", "pooled+sum+bytes", "pooled+sum+work"])
def test_bf16_costs_keep_float32_resolution(readout):
    # costs of one graph's configs differ in their 3rd-4th digit: a bfloat16 head (8 significant bits)
    # rounded 68% of them onto others on a small world's xla graphs, and ties lose Kendall tau
    cfg = GNNConfig(free_layers=1, readout=readout, **FAST)
    torch.manual_seed(3)
    model = GNNModel(cfg, FEAT, "layout").eval()
    if readout != "pooled":
        randomise_node_cost(model)
    graphs = [prepare_graph(layout_graph(np.random.default_rng(8), n=40, nc=6, c=64), cfg.config_layers)]
    configs = gather_configs(graphs, [np.arange(64)])
    with torch.no_grad(), autocast(torch.device("cpu"), "bf16"):
        costs = model.score(model.encode(collate(graphs)), configs)[0]
    assert costs.dtype == torch.float32
    assert not torch.equal(costs, costs.to(torch.bfloat16).float())  # not bf16 values in a float32 tensor
    assert torch.unique(costs).numel() == 64  # 64 random configs, all distinct: no two tie


def test_deterministic_mode_and_auto_device_change_nothing_on_cpu():
    graphs = easy_world(7, "layout", 4)
    fit = lambda **hp: gnn(epochs=2, dropout=0.1, **hp).fit(graphs[:3], graphs[3:], seed=0)
    plain = fit().predict(graphs)
    if not torch.cuda.is_available():
        for other in (fit(deterministic=True).predict(graphs), fit(device="auto").predict(graphs)):
            np.testing.assert_array_equal(plain, other)
    assert not torch.are_deterministic_algorithms_enabled()  # restored after the fit


def test_prediction_runs_in_deterministic_mode_when_asked(monkeypatch):
    """On CUDA the scoring sums with atomics: predict must run under gnn.deterministic like the fit
    (two H100 fits gave different test predictions before it did)."""
    from pipelines.models.gnn import model as gnn_model

    graphs = easy_world(8, "layout", 3)
    ranker = gnn(epochs=1, deterministic=True).fit(graphs[:2], graphs[2:], seed=0)
    modes = []
    segment_sum = gnn_model.segment_sum

    def recording_segment_sum(*args, **kwargs):
        modes.append(torch.are_deterministic_algorithms_enabled())
        return segment_sum(*args, **kwargs)

    monkeypatch.setattr(gnn_model, "segment_sum", recording_segment_sum)
    ranker.predict(graphs)
    assert modes and all(modes)  # every pooling sum of the scoring ran with deterministic algorithms
    assert not torch.are_deterministic_algorithms_enabled()  # and the switch is restored after


def test_gpu_config_asks_for_auto_and_runs_anywhere():
    from pipelines.config.settings import load_config
    from pipelines.models.gnn.device import resolve_device

    gnn = load_config("gpu").gnn
    assert gnn.device == "auto" and gnn.precision == "fp32"
    assert resolve_device(gnn.device).type in ("cpu", "cuda")


class _Planted:
    """Unpickling this runs code: it creates the marker file (what a planted model or checkpoint does)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_a_planted_model_or_checkpoint_file_runs_no_code(tmp_path):
    """Model files and epoch checkpoints are data: loading one that holds a program refuses it unrun."""
    marker = tmp_path / "ran"
    torch.save({"format": 1, "payload": _Planted(marker)}, tmp_path / "evil.pt")
    with pytest.raises(FormatError, match="evil.pt"):
        GNNRanker.load(tmp_path, "evil")
    assert not marker.exists()
    graphs = easy_world(4, "tile", 6)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    torch.save({"format": 1, "payload": _Planted(marker)}, ckpt / "gnn_seed0.pt")
    with pytest.raises(FormatError, match="gnn_seed0.pt.*to train this fold afresh"):  # read anyway: refused unrun
        trainer.load_checkpoint(ckpt / "gnn_seed0.pt", "x", None, None, None, None)
    assert not marker.exists()
    # on resume it is not even read: it does not match the hash recorded when a checkpoint is written
    planted = (ckpt / "gnn_seed0.pt").read_bytes()
    gnn("tile", epochs=1).fit(graphs, seed=0, checkpoint_dir=ckpt)
    assert not marker.exists() and (ckpt / "gnn_seed0.pt").read_bytes() != planted
    assert trainer.checkpoint_is_ours(ckpt / "gnn_seed0.pt")


def test_a_checkpoint_folder_removed_by_a_concurrent_run_mid_save_is_no_failure(tmp_path, monkeypatch):
    """Issue 71, class 6: two runs on one work dir; the one that finished the fold first removed its
    checkpoint folder while the other was saving there, and the other failed renaming its temporary file."""
    import shutil
    folder = tmp_path / "f0-s0.ckpt"
    real_save = torch.save

    def save_then_lose_the_folder(obj, target):
        real_save(obj, target)
        shutil.rmtree(folder)  # what the other run's cleanup does between the write and the rename

    monkeypatch.setattr(trainer.torch, "save", save_then_lose_the_folder)
    model = GNNModel(GNNConfig(**FAST), FEAT, "tile")
    optimizer = torch.optim.AdamW(model.parameters())
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    trainer.save_checkpoint(folder / "gnn_seed0.pt", "x", model, optimizer, scheduler, trainer.TrainState(),
                            np.random.default_rng(0))
    assert not folder.exists()


def _raw_tile_kernel(rng: np.random.Generator, n: int = 6, c: int = 40) -> tuple[np.ndarray, np.ndarray]:
    """Raw (n, 140) node features of a small kernel (the last node its bf16 rank-3 output, a root)
    and (c, 24) tile configs over it: kernel, output and input bounds with their products."""
    raw = np.zeros((n, 140), np.float32)
    raw[:, 21:24] = rng.integers(1, 700, (n, 3))
    raw[:, 134:137] = [2, 1, 0]
    raw[:, 2 + 10] = 1.0  # one element type for every node (a one-hot slot)
    raw[-1, 0] = 1.0  # the output: the last root
    raw[:, 37:45] = rng.normal(size=(n, 8))  # columns the transform does not keep exactly
    config = np.zeros((c, 24), np.float32)
    for start in (0, 8, 16):  # kernel, output, input tile bounds (3 used slots) and their product
        config[:, start:start + 3] = rng.choice([1, 2, 4, 8, 16, 64, 128, 256], (c, 3))
        config[:, start + 7] = config[:, start:start + 3].prod(axis=1)
    return raw, config


def test_tile_physics_are_the_gbdt_tile_columns_of_the_raw_kernel():
    from pipelines.data.features import tile_config_features
    from pipelines.models.gnn.batch import TILE_PHYSICS, TILE_PHYSICS_DIM, tile_physics

    rng = np.random.default_rng(11)
    raw, config = _raw_tile_kernel(rng)
    graph = GraphArrays(collection="tile:xla", stem="k", split="train", node_opcode=rng.integers(0, 121, 6),
                        node_feat=transform_node_feat(raw), message_edges=_edges(rng, 6),
                        config_nodes=np.zeros(0, np.int64), config_feat=config, target=rng.random(40) + 1,
                        config_index=np.arange(40))
    got = tile_physics(graph)
    expected = tile_config_features(config, raw)  # what the GBDT's features stage computes from the file
    assert got.shape == (40, TILE_PHYSICS_DIM) and TILE_PHYSICS_DIM == 13
    for j, name in enumerate(TILE_PHYSICS):
        np.testing.assert_allclose(got[:, j], expected[name], rtol=1e-6, err_msg=name)
    assert np.ptp(got, axis=0).max() > 0  # the columns vary across configs
    prepared = prepare_graph(graph, 1, with_tile_physics=True)
    assert prepared.config_feat.shape == (40, 24 + TILE_PHYSICS_DIM)
    np.testing.assert_array_equal(prepared.config_feat[:, :24], config)
    assert prepare_graph(graph, 1).config_feat.shape == (40, 24)


def test_tile_physics_model_learns_a_padding_signal_and_round_trips(tmp_path):
    """Runtime = the output tile's register padding times its tile count: a rule of the sizes the
    raw values hide and the physics columns name."""
    from pipelines.data.features import tile_config_features

    rng = np.random.default_rng(12)
    graphs = []
    for i in range(24):
        raw, config = _raw_tile_kernel(rng)
        columns = tile_config_features(config, raw)
        runtime = columns["f_tile_out_vreg_pad"] * np.exp(columns["f_tile_count_log"] / 4)
        graphs.append(GraphArrays(collection="tile:xla", stem=f"k{i}", split="train",
                                  node_opcode=rng.integers(0, 121, 6), node_feat=transform_node_feat(raw),
                                  message_edges=_edges(rng, 6), config_nodes=np.zeros(0, np.int64),
                                  config_feat=config, target=runtime, config_index=np.arange(40)))
    ranker = gnn("tile", tile_physics=True, epochs=10, lr=3e-3, graphs_per_step=8, configs_per_graph=16,
                 patience=0).fit(graphs[:18], seed=0)
    assert ranker.model_.config_proj[0].in_features == 24 + 13
    taus = [kendalltau(p, g.target)[0] for p, g in zip(per_graph(ranker.predict(graphs[18:]), graphs[18:]), graphs[18:])]
    assert np.mean(taus) > 0.85, taus  # without the physics columns the same fit reaches 0.77
    ranker.save(tmp_path, "m")
    loaded = GNNRanker.load(tmp_path, "m")
    assert loaded.config.tile_physics
    np.testing.assert_array_equal(ranker.predict(graphs), loaded.predict(graphs))
