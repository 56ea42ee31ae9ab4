"""Ranking losses over the K sampled configs of each graph. Scores are costs: LOWER = predicted FASTER.

Each takes ``scores`` (B, K), true ``runtime`` (B, K, float64 so large runtimes keep their order)
and a ``mask`` (B, K) of real (not padded) configs, and returns the mean loss over graphs that
have something to rank.
"""

from __future__ import annotations

from typing import Callable

import torch

from pipelines.core.errors import ConfigError

Loss = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def pairwise_hinge_loss(scores: torch.Tensor, runtime: torch.Tensor, mask: torch.Tensor,
                        margin: float = 0.1, weighting: str = "equal", standardise: bool = False) -> torch.Tensor:
    """Mean over pairs (i faster than j) of ``w_ij * max(0, margin - (s_j - s_i))``, per graph, then over graphs.

    Pairs with equal runtimes are ignored; the loss is zero when every slower config scores at
    least ``margin`` above every faster one. ``weighting="equal"``: every pair weighs 1.
    ``weighting="gap"``: a pair weighs its log-runtime gap ``log r_j - log r_i`` over the graph's mean
    gap, so pairs a measurement cannot tell apart weigh little and the order of large effects, which
    says which nodes' layouts matter most, weighs most (the mean weight per graph stays 1).
    ``standardise``: each graph's scores are first divided by their standard deviation over its real
    configs, so the margin is a share of the graph's own score spread and the loss is blind to the scale
    of a graph's scores (a graph whose configs the model spreads little is not left inside the margin).
    """
    if standardise:
        scores = scores / _spread(scores, mask)[:, None]
    faster = (runtime.unsqueeze(2) < runtime.unsqueeze(1)) & mask.unsqueeze(2) & mask.unsqueeze(1)
    gap = scores.unsqueeze(1) - scores.unsqueeze(2)  # gap[b, i, j] = s_j - s_i
    violation = torch.relu(margin - gap) * faster
    pairs = faster.sum(dim=(1, 2))
    if weighting == "gap":
        log_runtime = torch.log(torch.where(mask, runtime, torch.ones_like(runtime)).clamp(min=1e-30))
        true_gap = (log_runtime.unsqueeze(1) - log_runtime.unsqueeze(2)) * faster  # log r_j - log r_i >= 0
        mean_gap = true_gap.sum(dim=(1, 2)) / pairs.clamp(min=1)
        weight = true_gap / mean_gap.clamp(min=1e-30)[:, None, None]
        violation = violation * weight.to(violation.dtype)
    elif weighting != "equal":
        raise ValueError(f"weighting must be 'equal' or 'gap', got {weighting!r}")
    per_graph = violation.sum(dim=(1, 2)) / pairs.clamp(min=1)
    return _mean_over(per_graph, pairs > 0)


def _spread(scores: torch.Tensor, mask: torch.Tensor, floor: float = 1e-6) -> torch.Tensor:
    """(B,) standard deviation of each row's scores over its masked configs, kept from 0 by ``floor``."""
    weight = mask.to(scores.dtype)
    count = weight.sum(dim=1).clamp(min=1)
    mean = (scores * weight).sum(dim=1) / count
    variance = (((scores - mean[:, None]) ** 2) * weight).sum(dim=1) / count
    return torch.sqrt(variance + floor ** 2)


def _mean_over(values: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Mean of ``values`` where ``keep`` (0 with a zero gradient when nothing is kept).

    Weighted by the 0/1 mask rather than ``values[keep].mean()`` behind an ``if keep.any()``: both
    read a count back from the device, which on a GPU stalls every training step. The result is
    the same to the bit when every graph is kept (multiplying by one changes nothing); otherwise the
    zeros of the left-out graphs can regroup the float sum (a last-bit difference).
    """
    weight = keep.to(values.dtype)
    return (values * weight).sum() / weight.sum().clamp(min=1)


def list_mle_loss(scores: torch.Tensor, runtime: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """ListMLE (Xia et al. 2008) on relevance ``-score``: negative log-likelihood of the true order.

    For the configs sorted fastest first, ``sum_i [logsumexp_{j >= i}(-s_j) + s_i]``, divided by
    the number of configs of the graph. Ties in runtime keep their sampled order (stable sort).
    """
    key = torch.where(mask, runtime, torch.full_like(runtime, float("inf")))
    order = torch.argsort(key, dim=1, stable=True)
    relevance = torch.gather(-scores, 1, order)
    valid = torch.gather(mask, 1, order)
    # padded slots get a very low (finite: -inf would turn the logcumsumexp gradient into NaN) relevance
    relevance = torch.where(valid, relevance, torch.full_like(relevance, -1e9))
    # logsumexp over the suffix j >= i: reverse cumulative logsumexp
    suffix = torch.logcumsumexp(relevance.flip(1), dim=1).flip(1)
    terms = torch.where(valid, suffix - relevance, torch.zeros_like(relevance))
    counts = valid.sum(dim=1)
    return _mean_over(terms.sum(dim=1) / counts.clamp(min=1), counts > 1)


def make_loss(name: str, margin: float = 0.1) -> Loss:
    if name == "hinge":
        return lambda s, y, m: pairwise_hinge_loss(s, y, m, margin)
    if name == "hinge-gap":
        return lambda s, y, m: pairwise_hinge_loss(s, y, m, margin, weighting="gap")
    if name == "hinge-std":
        return lambda s, y, m: pairwise_hinge_loss(s, y, m, margin, standardise=True)
    if name == "listmle":
        return list_mle_loss
    raise ConfigError(f"unknown GNN loss {name!r}; expected 'hinge', 'hinge-gap', 'hinge-std' or 'listmle'")
