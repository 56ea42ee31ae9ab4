"""Configurable nodes by kind, read from node features alone: convolutions that jax's autodiff writes
(forward, input and weight gradients, depthwise, 5-D, strided), dots and reshapes, through our own
featurizer on programs lowered here."""

from __future__ import annotations

import pytest

jax = pytest.importorskip("jax")

import jax.numpy as jnp  # noqa: E402

from pipelines.data.node_kinds import configurable_node_kinds  # noqa: E402
from pipelines.hlo import featurize_module  # noqa: E402
from pipelines.hlo.parse import module_from_jax  # noqa: E402


def kinds_of(fn, *args) -> dict[str, str]:
    featurized = featurize_module(module_from_jax(fn, *args), "test")
    layout = featurized.layout
    kinds = configurable_node_kinds(layout.node_feat, layout.node_opcode, layout.edge_index, featurized.config_ids)
    return {layout.names[i]: kind for i, kind in zip(featurized.config_ids, kinds)}


def conv(x, w, strides=(1, 1), groups=1, spec=("NHWC", "HWIO", "NHWC")):
    return jax.lax.conv_general_dilated(x, w, strides, "SAME", dimension_numbers=spec, feature_group_count=groups)


def test_a_conv_training_step_has_forward_input_and_weight_gradient_convolutions():
    def loss(x, w):
        return (conv(x, w) ** 2).sum()

    kinds = sorted(kinds_of(jax.grad(loss, argnums=(0, 1)), jnp.ones((2, 8, 8, 4)), jnp.ones((3, 3, 4, 6))).values())
    assert kinds == ["conv-forward", "conv-input-grad", "conv-weight-grad"]


def test_strided_depthwise_5d_dot_and_reshape_kinds():
    def strided(x, w):
        return (conv(x, w, strides=(2, 2)) ** 2).sum()

    kinds = set(kinds_of(jax.grad(strided), jnp.ones((2, 8, 8, 4)), jnp.ones((3, 3, 4, 6))).values())
    assert kinds == {"conv-forward", "conv-input-grad"}  # the input is dilated by the stride

    depthwise = kinds_of(lambda x, w: conv(x, w, groups=4), jnp.ones((2, 8, 8, 4)), jnp.ones((3, 3, 1, 4)))
    assert list(depthwise.values()) == ["conv-depthwise"]

    def conv3d(x, w):
        return jax.lax.conv_general_dilated(x, w, (1, 1, 1), "SAME", dimension_numbers=("NDHWC", "DHWIO", "NDHWC"))

    def loss3d(x, w):
        return (conv3d(x, w) ** 2).sum()

    kinds = sorted(kinds_of(jax.grad(loss3d, argnums=(0, 1)), jnp.ones((1, 4, 8, 8, 2)), jnp.ones((3, 3, 3, 2, 4))).values())
    assert kinds == ["conv-forward-5d", "conv-input-grad-5d", "conv-weight-grad-5d"]

    other = kinds_of(lambda a, b: (a @ b).reshape(-1), jnp.ones((4, 8)), jnp.ones((8, 16)))
    assert sorted(other.values()) == ["dot", "reshape"]


def test_node_effects_find_the_node_that_matters_and_whether_the_order_follows_it():
    """Three configurable nodes; only node 1's output minor dim moves the runtime. An order that follows
    the truth agrees there (+1); one that follows node 1 backwards disagrees (-1); the other nodes have
    no importance."""
    import numpy as np

    from pipelines.data.node_kinds import node_effects

    rng = np.random.default_rng(0)
    configs = np.full((300, 3, 18), -1, np.int8)
    configs[:, :, 0] = rng.integers(0, 2, size=(300, 3))
    configs[:, :, 1] = 1 - configs[:, :, 0]
    truth = 100.0 + 10.0 * configs[:, 1, 0] + rng.normal(0, 0.01, 300)
    importance, agreement = node_effects(configs, truth, truth)
    assert importance[1] > 0.2 and importance[0] < 0.05 and importance[2] < 0.05
    assert agreement[1] == pytest.approx(1.0)
    _, backwards = node_effects(configs, truth, -truth)
    assert backwards[1] == pytest.approx(-1.0)
    constant = np.full((300, 3, 18), -1, np.int8)
    importance, agreement = node_effects(constant, truth, truth)  # one choice per node: nothing to compare
    assert (importance == 0).all() and np.isnan(agreement).all()


def test_evaluate_tables_node_kinds_and_leaves_a_share_of_a_non_positive_ceiling_empty(tiny_world):
    """The per-node-kind table sums each kind's share of the layout effects to 1 per (collection, entry),
    its agreement lies in [-1, 1]; a program family whose ceiling is <= 0 gets no share of it."""
    import numpy as np
    import polars as pl

    from pipelines.core.metric import GraphScore, summarize
    from pipelines.data.submission import read_submission
    from pipelines.flows.evaluate import CEILING, SUBMISSION, Evaluation, node_kind_table, program_family_table

    rows = {"identity": read_submission(tiny_world / "sample_submission.csv")}
    table = node_kind_table(tiny_world, rows)
    assert set(table["collection"]) == {"layout:xla:default", "layout:xla:random", "layout:nlp:default",
                                        "layout:nlp:random"}
    shares = table.drop_nulls("importance_share").group_by("collection").agg(pl.col("importance_share").sum())
    assert shares.height >= 1 and np.allclose(shares["importance_share"].to_numpy(), 1.0)
    agreement = table["agreement"].drop_nulls().to_numpy()
    assert ((agreement >= -1 - 1e-9) & (agreement <= 1 + 1e-9)).all()
    assert set(table["kind"]) <= {"dot", "reshape"} | {k for k in table["kind"] if k.startswith("conv-")}

    reports = {name: summarize([GraphScore("layout:xla:default", "g", 10, score)])
               for name, score in ((SUBMISSION, 0.1), (CEILING, -0.01))}
    table = program_family_table(Evaluation(reports, {}, (), ()), {("layout:xla:default", "g"): "mlp"})
    assert table["share_of_ceiling"].to_list() == [None]


def test_node_kind_table_split_by_program_family_reads_each_family_on_its_own(tiny_world):
    """With program families the table gains a family column: each family's shares sum to 1 and its
    agreement is its own graphs' (the unsplit agreement lies between two families'); a graph the
    mapping does not name is kept under no family; the text gains a family column."""
    import numpy as np
    import polars as pl

    from pipelines.core.collection import parse_collection
    from pipelines.data.root import DataRoot
    from pipelines.data.submission import read_submission
    from pipelines.flows.evaluate import node_kind_table, node_kind_text
    from pipelines.synth.world import program_kinds

    rows = {"identity": read_submission(tiny_world / "sample_submission.csv")}
    nlp_random = parse_collection("layout:nlp:random")
    test_stems = [ref.stem for ref in DataRoot(tiny_world).graphs(nlp_random, "test")]
    assert len(test_stems) == 2
    families = {**program_kinds(tiny_world), **{(nlp_random.name, stem): name for stem, name in zip(test_stems, "ab")}}
    table = node_kind_table(tiny_world, rows, families)
    assert table.columns[:3] == ["collection", "program_family", "entry"]
    shares = (table.drop_nulls("importance_share")
              .group_by("collection", "program_family", "entry").agg(pl.col("importance_share").sum()))
    assert np.allclose(shares["importance_share"].to_numpy(), 1.0)

    def dot_agreement(frame: pl.DataFrame, family: str | None = None) -> float:
        frame = frame.filter(pl.col("collection") == nlp_random.name, pl.col("kind") == "dot")
        return frame.filter(pl.col("program_family") == family)["agreement"].item() if family else frame["agreement"].item()

    whole = node_kind_table(tiny_world, rows)
    a, b, both = dot_agreement(table, "a"), dot_agreement(table, "b"), dot_agreement(whole)
    assert abs(a - b) > 0.1 and min(a, b) < both < max(a, b)
    assert table["nodes"].sum() == whole["nodes"].sum()
    assert "family" in node_kind_text(table).splitlines()[0] and "family" not in node_kind_text(whole).splitlines()[0]

    unnamed = {key: value for key, value in families.items() if key != (nlp_random.name, test_stems[0])}
    partial = node_kind_table(tiny_world, rows, unnamed)
    assert partial["program_family"].null_count() > 0 and partial["nodes"].sum() == whole["nodes"].sum()
