"""benchmarks/op_timer.py and gnn_throughput's ``--ops``: a step's time, op by op."""
import time

import pytest
import torch
import torch.nn.functional as F

from benchmarks.common import measure
from benchmarks.gnn_throughput import measured_code, ops_table
from benchmarks.op_timer import OpTimer
from pipelines.data.node_arrays import make_graph_arrays, save_graph_arrays
from tests.test_features import chain_graph


@pytest.mark.slow
def test_the_timer_sees_forward_and_backward_ops_by_shape_per_repeat():
    weight = torch.randn(16, 8, requires_grad=True)
    x = torch.randn(64, 8)
    started = time.perf_counter()
    with OpTimer() as timer:
        for _ in range(3):
            F.gelu(F.linear(x, weight)).sum().backward()
    wall = time.perf_counter() - started
    calls = {(op, shape): c for (op, shape), (_, c) in timer.totals.items()}
    assert calls[("aten.gelu", (64, 16))] == 3
    assert calls[("aten.gelu_backward", (64, 16))] == 3  # the backward runs under the mode too
    assert any(op == "aten.mm" for op, _ in calls)
    rows = timer.top(2, repeats=3)
    assert len(rows) == 2 and rows[0][2] >= rows[1][2] > 0
    assert 0 < timer.seconds(repeats=3) <= wall / 3
    assert timer.top(100, repeats=3)[-1][1] in {"x".join(map(str, s)) or "-" for _, s in calls}


@pytest.mark.slow
def test_a_training_figure_with_ops_lists_the_longest_ops_of_its_step(tmp_path):
    path = tmp_path / "node_arrays" / "k" / "train.g.npz"
    path.parent.mkdir(parents=True)
    save_graph_arrays(path, make_graph_arrays(chain_graph(), "layout:xla:default", "train"))
    result = measure(measured_code(path, "layout:xla:default", "train", steps=2, threads=1, ops=4,
                                   overrides=["gnn.hidden=8"]))
    assert len(result["ops"]) == 4 and result["steps"] == 2
    assert 0 < result["ops_s"] <= result["ops_step_s"]
    lines = ops_table(result)
    assert "ms in ops of" in lines[0] and len(lines) == 1 + 2 + 4  # the line, the table's header, 4 ops
