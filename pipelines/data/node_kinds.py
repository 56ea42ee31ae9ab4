"""What kind of operation each configurable node of a layout graph is, read from its node features alone
(so it works on any file in the format: ours, an outside world's, the real data).

Kinds: ``dot``, ``reshape`` and convolutions by role, with ``-5d`` added for rank-5 tensors:

- ``conv-depthwise``: ``feature_group_count`` > 1;
- ``conv-input-grad``: the gradient of a convolution's input: its kernel flipped (an operand that is a
  ``reverse``, as jax writes it, or the window reversed) or its input dilated (``base_dilation`` > 1, a
  strided convolution's gradient);
- ``conv-weight-grad``: the gradient of a kernel: the window spans the activations' spatial extent
  and the output's spatial dims are the kernel's window (window product > output spatial product);
- ``conv-forward``: every other convolution.
"""

from __future__ import annotations

import numpy as np

from pipelines.data.tpugraphs import NodeFeat

CONVOLUTION, DOT, RESHAPE, REVERSE = 26, 34, 75, 76
# node_feat columns of the convolution's output batch and feature dimension numbers (CONVOLUTION_DIMS' last two)
OUT_BATCH_DIM, OUT_FEATURE_DIM = NodeFeat.CONVOLUTION_DIMS.stop - 2, NodeFeat.CONVOLUTION_DIMS.stop - 1
FEATURE_GROUP_COUNT = NodeFeat.GROUP_COUNTS.start
WINDOW_REVERSED = NodeFeat.WINDOW_REVERSAL.start + 6  # the "true count" column
BASE_DILATION_PRODUCT = NodeFeat.WINDOW.start + 47  # the last of the 6 groups of 8: base dilation's product


def conv_role(feat: np.ndarray, operand_opcodes: tuple[int, ...] = ()) -> str:
    """The role of one convolution node (its 140 features and its operands' opcodes): forward,
    input-grad, weight-grad or depthwise."""
    if feat[FEATURE_GROUP_COUNT] > 1:
        return "depthwise"
    if feat[WINDOW_REVERSED] > 0 or feat[BASE_DILATION_PRODUCT] > 1 or REVERSE in operand_opcodes:
        return "input-grad"
    dims = feat[NodeFeat.SHAPE_DIMS]
    rank = int(np.count_nonzero(dims))
    not_spatial = {int(feat[OUT_BATCH_DIM]), int(feat[OUT_FEATURE_DIM])}
    spatial = [dims[i] for i in range(rank) if i not in not_spatial]
    if spatial and feat[NodeFeat.WINDOW_SIZE_PRODUCT] > float(np.prod(spatial)):
        return "weight-grad"
    return "forward"


def node_kind(feat: np.ndarray, opcode: int, operand_opcodes: tuple[int, ...] = ()) -> str:
    """``dot``, ``reshape``, ``conv-<role>`` (``-5d`` for a rank-5 convolution), or the opcode id."""
    if opcode == DOT:
        return "dot"
    if opcode == RESHAPE:
        return "reshape"
    if opcode == CONVOLUTION:
        rank = int(np.count_nonzero(feat[NodeFeat.SHAPE_DIMS]))
        return f"conv-{conv_role(feat, operand_opcodes)}" + ("-5d" if rank == 5 else "")
    return f"opcode-{int(opcode)}"


def configurable_node_kinds(node_feat: np.ndarray, node_opcode: np.ndarray, edge_index: np.ndarray,
                            config_ids: np.ndarray) -> list[str]:
    """The kind of every configurable node, in ``node_config_ids`` order (``edge_index`` rows
    ``[consumer, producer]``, as in the files)."""
    kinds = []
    for node in config_ids:
        producers = edge_index[edge_index[:, 0] == node, 1] if edge_index.size else np.zeros(0, np.int64)
        kinds.append(node_kind(node_feat[node], int(node_opcode[node]), tuple(int(node_opcode[p]) for p in producers)))
    return kinds


# ----------------------------------------------------------------------------- which kinds are ranked right

MIN_GROUP = 3  # configs a choice needs at a node before its mean rank is compared


def _ranks01(values: np.ndarray) -> np.ndarray:
    """Ranks in [0, 1] (ties share their mean rank), 0 = fastest."""
    order = np.argsort(values, kind="stable")
    ranks = np.empty(len(values), np.float64)
    ranks[order] = np.arange(len(values), dtype=np.float64)
    _, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    if (counts > 1).any():  # average the ranks of ties
        sums = np.bincount(inverse, weights=ranks)
        ranks = sums[inverse] / counts[inverse]
    return ranks / max(1, len(values) - 1)


def node_choice_keys(configs: np.ndarray) -> np.ndarray:
    """Per config and configurable node, what a node's choice is taken as: the minor-most and second-minor
    dim of its output and first input block (what the (8, 128) tiling sees), one int per (config, node).
    ``configs`` int (c, nc, 18)."""
    picked = configs[:, :, [0, 1, 6, 7]].astype(np.int64) + 1  # -1..5 -> 0..6
    return ((picked[..., 0] * 7 + picked[..., 1]) * 7 + picked[..., 2]) * 7 + picked[..., 3]


def node_effects(configs: np.ndarray, truth: np.ndarray, predicted: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per configurable node, how much its layout choice moves the true runtime and how well the predicted
    order follows it (pure).

    Each config's true runtime and its predicted position become ranks in [0, 1]. At a node, the configs
    are grouped by their choice there (:func:`node_choice_keys`; groups of >= ``MIN_GROUP`` configs); under
    a random search the other nodes' choices are independent of it, so the groups' mean true ranks are the
    node's main effect. ``importance``: the spread (weighted standard deviation) of those means;
    ``agreement``: the weighted correlation of the groups' mean true and mean predicted ranks (NaN with
    fewer than two groups or no spread). Returns (importance, agreement), each (nc,)."""
    true_rank, predicted_rank = _ranks01(np.asarray(truth, np.float64)), _ranks01(np.asarray(predicted, np.float64))
    keys = node_choice_keys(configs)
    nc = keys.shape[1]
    importance, agreement = np.zeros(nc), np.full(nc, np.nan)
    for node in range(nc):
        _, inverse, counts = np.unique(keys[:, node], return_inverse=True, return_counts=True)
        kept = counts >= MIN_GROUP
        if kept.sum() < 2:
            continue
        weight = counts[kept].astype(np.float64)
        mean_true = (np.bincount(inverse, weights=true_rank) / counts)[kept]
        mean_pred = (np.bincount(inverse, weights=predicted_rank) / counts)[kept]
        centred_true = mean_true - np.average(mean_true, weights=weight)
        centred_pred = mean_pred - np.average(mean_pred, weights=weight)
        var_true, var_pred = np.average(centred_true ** 2, weights=weight), np.average(centred_pred ** 2, weights=weight)
        importance[node] = float(np.sqrt(var_true))
        if var_true > 0 and var_pred > 0:
            agreement[node] = float(np.average(centred_true * centred_pred, weights=weight) / np.sqrt(var_true * var_pred))
    return importance, agreement
