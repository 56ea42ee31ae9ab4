"""featurize on real programs that jax lowers here (no HLO written by hand), checked against XLA's own objects.

The facts checked come from XLA (its instruction objects, their printed shapes, their operands and
opcodes) and from jax (the example arguments' shapes), never from the featurizer's own output.
"""

from __future__ import annotations

import json
import logging
import re

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
lax = pytest.importorskip("jax.lax")

from pipelines.core.collection import LAYOUT_XLA_DEFAULT, LAYOUT_XLA_RANDOM, TILE_XLA  # noqa: E402
from pipelines.core.errors import FormatError  # noqa: E402
from pipelines.hlo import featurize_jax, featurize_module, featurize_program  # noqa: E402
from pipelines.hlo.parse import load_module, module_from_jax  # noqa: E402
from pipelines.data.tpugraphs import load_graph  # noqa: E402

# ----------------------------------------------------------------------------- the programs


def _key(i):
    return jax.random.PRNGKey(i)


def mlp(params, x):
    for w, b in params[:-1]:
        x = jax.nn.relu(x @ w + b)
    w, b = params[-1]
    return jnp.mean((x @ w + b) ** 2)


MLP_ARGS = ([(jnp.ones((8, 16)), jnp.ones(16)), (jnp.ones((16, 16)), jnp.ones(16)), (jnp.ones((16, 4)), jnp.ones(4))],
            jnp.ones((5, 8)))


def cnn(layout):
    spec = ("NHWC", "HWIO", "NHWC") if layout == "NHWC" else ("NCHW", "OIHW", "NCHW")
    pool = (1, 2, 2, 1) if layout == "NHWC" else (1, 1, 2, 2)

    def net(params, x):
        w1, w2, dense = params
        y = jax.nn.relu(lax.conv_general_dilated(x, w1, (1, 1), "SAME", dimension_numbers=spec))
        y = lax.reduce_window(y, -jnp.inf, lax.max, pool, pool, "VALID")
        y = jax.nn.relu(lax.conv_general_dilated(y, w2, (2, 2), "SAME", dimension_numbers=spec))
        y = lax.reduce_window(y, 0.0, lax.add, pool, pool, "VALID") / 4.0
        return jnp.sum(y.reshape(y.shape[0], -1) @ dense)

    if layout == "NHWC":
        args = ((jnp.ones((3, 3, 3, 4)), jnp.ones((3, 3, 4, 6)), jnp.ones((6, 2))), jnp.ones((2, 8, 8, 3)))
    else:
        args = ((jnp.ones((4, 3, 3, 3)), jnp.ones((6, 4, 3, 3)), jnp.ones((6, 2))), jnp.ones((2, 3, 8, 8)))
    return net, args


def encoder(params, x):
    """One transformer encoder block: multi-head attention, layer norms, an MLP."""
    wq, wk, wv, wo, w1, w2 = params
    batch, seq, hidden = x.shape
    heads = 2

    def norm(h):
        mean = h.mean(-1, keepdims=True)
        return (h - mean) / jnp.sqrt(((h - mean) ** 2).mean(-1, keepdims=True) + 1e-5)

    def split(h):
        return h.reshape(batch, seq, heads, hidden // heads).transpose(0, 2, 1, 3)

    q, k, v = split(x @ wq), split(x @ wk), split(x @ wv)
    att = jax.nn.softmax(jnp.einsum("bhqd,bhkd->bhqk", q, k) / jnp.sqrt(hidden // heads), axis=-1)
    ctx = jnp.einsum("bhqk,bhkd->bhqd", att, v).transpose(0, 2, 1, 3).reshape(batch, seq, hidden)
    h = norm(x + ctx @ wo)
    return jnp.sum(norm(h + jax.nn.gelu(h @ w1) @ w2))


ENCODER_ARGS = (tuple(jnp.ones(s) for s in ((8, 8), (8, 8), (8, 8), (8, 8), (8, 16), (16, 8))), jnp.ones((2, 4, 8)))


def lstm(params, xs):
    wx, wh = params
    hidden = wh.shape[0]

    def step(carry, x):
        h, c = carry
        gates = x @ wx + h @ wh
        i, f, g, o = jnp.split(gates, 4, axis=-1)
        c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
        h = jax.nn.sigmoid(o) * jnp.tanh(c)
        return (h, c), h

    zeros = jnp.zeros((xs.shape[1], hidden))
    (h, _), hs = lax.scan(step, (zeros, zeros), xs)
    return jnp.sum(hs) + jnp.sum(h)


LSTM_ARGS = ((jnp.ones((3, 16)), jnp.ones((4, 16))), jnp.ones((5, 2, 3)))

_NHWC, _NHWC_ARGS = cnn("NHWC")
_NCHW, _NCHW_ARGS = cnn("NCHW")
PROGRAMS = {
    "mlp": (mlp, MLP_ARGS),
    "cnn_nhwc": (_NHWC, _NHWC_ARGS),
    "cnn_nchw": (_NCHW, _NCHW_ARGS),
    "encoder": (encoder, ENCODER_ARGS),
    "lstm": (lstm, LSTM_ARGS),
}
CASES = [(name, grad) for name in PROGRAMS for grad in (False, True)]


def _program(name: str, grad: bool):
    fn, args = PROGRAMS[name]
    return (jax.grad(fn) if grad else fn), args


# ----------------------------------------------------------------------------- independent facts

# Opcode ids as the dataset's table gives them (a subset, typed from hlo_opcode.h).
KNOWN_IDS = {"abs": 1, "add": 2, "and": 52, "broadcast": 13, "call": 14, "compare": 20, "concatenate": 22,
             "constant": 24, "convert": 25, "convolution": 26, "copy": 27, "divide": 32, "dot": 34,
             "dynamic-slice": 35, "dynamic-update-slice": 36, "exponential": 37, "fusion": 41,
             "get-tuple-element": 45, "iota": 48, "log": 50, "logistic": 107, "maximum": 57, "minimum": 58,
             "multiply": 59, "negate": 60, "pad": 62, "parameter": 63, "reduce": 70, "reduce-window": 72,
             "reshape": 75, "reverse": 76, "rsqrt": 81, "select": 83, "select-and-scatter": 84, "slice": 92,
             "sqrt": 94, "subtract": 95, "tanh": 96, "transpose": 98, "tuple": 100, "while": 102}
ETYPES = ("invalid", "pred", "s8", "s16", "s32", "s64", "u8", "u16", "u32", "u64", "f16", "f32", "f64", "bf16",
          "c64", "c128", "tuple", "opaque", "token")
_PRINTED = re.compile(r"^%?\S+ = (?P<type>[a-z0-9]+)\[(?P<dims>[0-9,]*)\](?:\{(?P<layout>[0-9,]*)[}:])?")


def _xla_opcode(instruction) -> str:
    """XLA's enum name as HLO text spells it: kGetTupleElement -> get-tuple-element."""
    name = instruction.opcode.name[1:]
    return re.sub(r"(?<!^)(?=[A-Z])", "-", name).lower()


def _check_graph_against_xla(hlo_module, graph, names):
    index = {name: i for i, name in enumerate(names)}
    feat, opcode, edges = graph.node_feat, graph.node_opcode.astype(int), graph.edge_index
    all_instructions = [(c, i) for c in hlo_module.computations() for i in c.instructions()]
    assert len(all_instructions) == feat.shape[0]
    operand_edges = set()
    configurable = set()
    for _, ins in all_instructions:
        u = index[ins.name]
        printed = ins.to_string()
        match = _PRINTED.match(printed)
        if match:  # an array shape: dims, sum, product, element type, layout as XLA prints them
            dims = [int(d) for d in match["dims"].split(",") if d]
            assert feat[u, 21:21 + len(dims)].tolist() == dims, printed
            assert not feat[u, 21 + len(dims):27].any()
            assert feat[u, 27] == sum(dims) and feat[u, 28] == float(np.prod(dims))
            assert feat[u, 2 + ETYPES.index(match["type"])] == 1 and feat[u, 2:21].sum() == 1
            if match["layout"] is not None:
                layout = [int(d) for d in match["layout"].split(",") if d]
                assert feat[u, 134:134 + len(layout)].tolist() == layout
        else:  # a tuple
            assert printed.split(" = ", 1)[1].startswith("("), printed
            assert feat[u, 2 + ETYPES.index("tuple")] == 1
            assert feat[u, 29] >= 1
        xla_op = _xla_opcode(ins)
        if xla_op in KNOWN_IDS:
            assert opcode[u] == KNOWN_IDS[xla_op], (ins.name, xla_op)
        if xla_op in ("convolution", "dot", "reshape"):
            configurable.add(u)
        for operand in ins.operands():
            operand_edges.add((u, index[operand.name]))
    edge_set = set(map(tuple, edges.tolist()))
    assert operand_edges <= edge_set
    by_name = {ins.name: (c.name, ins) for c, ins in all_instructions}
    for u, v in edge_set - operand_edges:  # the rest: a caller to the root of a computation it calls
        (caller_computation, caller), (root_computation, _) = by_name[names[u]], by_name[names[v]]
        assert feat[v, 0] == 1 and caller_computation != root_computation
        assert re.search(r"\b(calls|to_apply|body|condition|select|scatter|branch_computations)=",
                         caller.to_string()), caller.to_string()
    assert (edges[:, 0] > edges[:, 1]).all()  # topological order, no self edges
    assert len(edge_set) == edges.shape[0] and (np.lexsort(edges.T[::-1]) == np.arange(edges.shape[0])).all()
    return configurable


@pytest.mark.parametrize("name,grad", CASES, ids=[f"{n}{'-grad' if g else ''}" for n, g in CASES])
def test_featurized_program_matches_xla(name, grad, tmp_path):
    fn, args = _program(name, grad)
    hlo_module = module_from_jax(fn, *args)
    featurized = featurize_module(hlo_module, name)
    configurable = _check_graph_against_xla(hlo_module, featurized.layout, featurized.layout.names)
    assert set(featurized.config_ids.tolist()) == configurable and configurable
    # the entry's parameters are the example arguments, in jax's flattened order
    leaves = jax.tree_util.tree_leaves(args)
    params = [i for i, ins in enumerate(featurized.layout.instructions)
              if ins.opcode == "parameter" and i >= featurized.layout.node_splits[0, -2]]
    entry = featurized.module.entry
    entry_params = {ins.parameter_number: ins for ins in entry.instructions if ins.opcode == "parameter"}
    assert len(entry_params) == len(leaves) and params
    for number, leaf in enumerate(leaves):
        u = featurized.layout.names.index(entry_params[number].name)
        assert featurized.layout.node_feat[u, 30] == number
        assert featurized.layout.node_feat[u, 21:21 + leaf.ndim].tolist() == list(leaf.shape)
    # written files pass the project's reader
    result = featurize_jax(fn, *args, out_dir=tmp_path, name=name, configs=20, search="default")
    graph = load_graph(result.layout_path, LAYOUT_XLA_DEFAULT)
    sidecar = json.loads(result.sidecar.read_text())
    assert [c["node"] for c in sidecar["configurable"]] == sorted(configurable)
    for entry in sidecar["configurable"]:
        if entry["opcode"] == "dot":  # the dot dimension numbers node_feat drops
            assert "lhs_contracting_dims" in entry["attributes"] and len(entry["operand_shapes"]) == 2
    assert graph.node_config_ids.tolist() == sorted(configurable)
    assert graph.node_config_feat.shape == (20, len(configurable), 18) and not graph.has_labels
    assert graph.node_splits[0, 0] == 0 and graph.node_splits[0, -1] == graph.num_nodes
    assert (graph.node_config_feat[0] == featurized.layout_space().defaults).all()  # row 0: the module's layouts
    if name == "lstm":  # the scan's while loop: its body and condition are computations of their own
        assert featurized.layout.node_opcode.tolist().count(102) >= 1


def test_convolution_attributes_in_both_layouts():
    """Window and dimension numbers of the CNN's convolutions, against what lax was asked for."""
    for layout, feature_dim in (("NHWC", 3), ("NCHW", 1)):
        fn, args = cnn(layout)
        featurized = featurize_module(module_from_jax(fn, *args), layout)
        feat = featurized.layout.node_feat
        convs = [i for i in featurized.config_ids if featurized.layout.node_opcode[i] == 26]
        assert len(convs) == 2
        first, second = (feat[i] for i in convs)
        assert first[37:39].tolist() == [3, 3] and first[44] == 9  # window size, product
        assert first[45:47].tolist() == [1, 1] and second[45:47].tolist() == [2, 2]  # strides
        assert first[53:55].tolist() == [1, 1] and first[61:63].tolist() == [1, 1]  # SAME padding of a 3x3 window
        assert first[94] == feature_dim and first[93] == 0 and first[106] == feature_dim  # in/out feature dims
        assert first[107] == 1 and first[108] == 1  # group counts
        pools = [i for i, code in enumerate(featurized.layout.node_opcode) if code == 72]
        assert len(pools) == 2 and feat[pools[0], 37:41].sum() == 6  # 1x2x2x1 or 1x1x2x2


def test_optimized_module_writes_tile_graphs(tmp_path):
    fn, args = cnn("NHWC")
    result = featurize_jax(jax.grad(fn), *args, out_dir=tmp_path, name="cnn", optimized=True, configs=10,
                           tile_configs_per_fusion=12)
    assert result.tile_paths
    for path in result.tile_paths:
        graph = load_graph(path, TILE_XLA)
        assert 1 <= graph.num_configs <= 12 and not graph.has_labels
        assert (graph.config_runtime_normalizers == 1).all()
        assert graph.node_feat[:, 0].sum() == 1  # one root: the fused computation alone
        assert np.unique(graph.config_feat, axis=0).shape[0] == graph.num_configs
    load_graph(result.layout_path, LAYOUT_XLA_RANDOM)


def test_proto_and_text_files_give_the_same_graph(tmp_path):
    fn, args = _program("encoder", True)
    hlo_module = module_from_jax(fn, *args)
    pb = tmp_path / "enc.pb"
    pb.write_bytes(hlo_module.as_serialized_hlo_module_proto())
    txt = tmp_path / "enc.txt"
    txt.write_text(hlo_module.to_string())
    wrapped = tmp_path / "enc_wrapped.hlo.pb"  # XLA's --xla_dump_hlo_as_proto writes an HloProto around it
    payload = hlo_module.as_serialized_hlo_module_proto()
    length, varint = len(payload), bytearray()
    while True:
        byte, length = length & 0x7F, length >> 7
        varint.append(byte | (0x80 if length else 0))
        if not length:
            break
    wrapped.write_bytes(b"\x0a" + bytes(varint) + payload)
    graphs = []
    for path in (pb, txt, wrapped):
        result = featurize_program(path, tmp_path / path.name.replace(".", "_"), configs=5)
        graphs.append((load_graph(result.layout_path, LAYOUT_XLA_RANDOM),
                       featurize_module(load_module(path), str(path)).layout.names))
    # the same graph; the text's instruction order may differ from the proto's (both topological)
    first, first_names = graphs[0]
    for other, names in graphs[1:]:
        order = [names.index(n) for n in first_names]
        assert np.array_equal(other.node_feat[order], first.node_feat)
        assert np.array_equal(other.node_opcode[order], first.node_opcode)
        relabel = {new: old for old, new in enumerate(order)}
        edges = sorted((relabel[u], relabel[v]) for u, v in other.edge_index.tolist())
        assert edges == sorted(map(tuple, first.edge_index.tolist()))
    assert np.array_equal(graphs[2][0].node_feat, first.node_feat)  # the wrapped proto: the same order too
    assert (tmp_path / "enc_wrapped_hlo_pb" / "enc_wrapped.npz").is_file()


# ----------------------------------------------------------------------------- bad input


def test_bad_files_are_errors_naming_the_file(tmp_path):
    fn, args = _program("mlp", False)
    payload = module_from_jax(fn, *args).as_serialized_hlo_module_proto()
    truncated = tmp_path / "truncated.pb"
    truncated.write_bytes(payload[: len(payload) // 2])
    foreign = tmp_path / "foreign.pb"
    foreign.write_bytes(b"\x08\x96\x01\x12\x07testing")  # a valid protobuf message of some other kind
    not_hlo = tmp_path / "notes.txt"
    not_hlo.write_text("this is not a program\n")
    empty = tmp_path / "empty.hlo"
    empty.write_text("")
    for path in (truncated, foreign, not_hlo, empty, tmp_path / "missing.pb"):
        with pytest.raises(FormatError) as err:
            featurize_program(path, tmp_path / "out")
        assert str(path) in str(err.value)
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").glob("*.npz"))


def test_cli_featurize_reports_a_bad_file_and_writes_a_good_one(tmp_path, capsys):
    from pipelines.cli import main

    bad = tmp_path / "bad.pb"
    bad.write_bytes(b"\xff" * 64)
    assert main(["featurize", str(bad), "--out", str(tmp_path / "o")]) == 1
    assert str(bad) in capsys.readouterr().err
    fn, args = _program("mlp", True)
    good = tmp_path / "mlp.txt"
    good.write_text(module_from_jax(fn, *args).to_string())
    assert main(["featurize", str(good), "--out", str(tmp_path / "o"), "--configs", "7"]) == 0
    assert load_graph(tmp_path / "o" / "mlp.npz", LAYOUT_XLA_RANDOM).num_configs == 7
    assert "mlp.npz" in capsys.readouterr().out


def test_unknown_ops_get_id_zero_and_a_warning_with_counts(caplog):
    hlo_module = module_from_jax(lambda x, w: lax.erf(x @ w) + lax.erf(x @ w * 2), jnp.ones((2, 3)), jnp.ones((3, 3)))
    with caplog.at_level(logging.WARNING, logger="pipelines"):
        featurized = featurize_module(hlo_module, "erf-program")
    erf = [i for i, ins in enumerate(featurized.layout.instructions) if ins.opcode == "erf"]
    assert len(erf) == 2 and (featurized.layout.node_opcode[erf] == 0).all()
    assert any("erf-program" in r.getMessage() and "erf x2" in r.getMessage() for r in caplog.records)


def test_opcode_table_is_the_datasets():
    from pipelines.hlo.featurize import OPCODE_IDS

    assert len(OPCODE_IDS) == 120 and sorted(OPCODE_IDS.values()) == list(range(1, 121))
    assert OPCODE_IDS["trace"] == 97 and OPCODE_IDS["tuple-select"] == 101 and OPCODE_IDS["tan"] == 120
    for name, code in KNOWN_IDS.items():
        assert OPCODE_IDS[name] == code
