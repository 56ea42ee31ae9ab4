"""Tensor operations the GNN's layers and its model share: scatter sums over edges and segments, and
maxima over rows whose gradient goes to the first maximum (bit for bit as ``max(0)``), in cache-sized
passes on a CPU; the one-pass pooling of one graph's per-config states."""

from __future__ import annotations

import torch


def weighted_gather_sum(x: torch.Tensor, src: torch.Tensor, dst: torch.Tensor, weight: torch.Tensor,
                         num_rows: int) -> torch.Tensor:
    """``out[dst[e]] += weight[e] * x[src[e]]`` over edges e; x is (rows, ...) of any trailing shape."""
    # weight in x's dtype: under bf16 autocast x is bfloat16 (a no-op in float32)
    msg = x.index_select(0, src) * weight.to(x.dtype).view(-1, *([1] * (x.dim() - 1)))
    return x.new_zeros((num_rows, *x.shape[1:])).index_add_(0, dst, msg)


def segment_sum(x: torch.Tensor, index: torch.Tensor, size: int) -> torch.Tensor:
    return x.new_zeros((size, *x.shape[1:])).index_add_(0, index, x)


# elements of one block of rows in ``_max_and_first_rows``: 1 MB of float32, within a core's L2 cache
# (the fastest block size on one thread, against half, a quarter and four times it)
_MAX_BLOCK_ELEMENTS = 1 << 18
# below this many elements ``x.max(0)`` runs in cache and beats ``_max_and_first_rows`` (1 thread, forward and
# backward; above it the blocked search is the faster, by more the larger ``x``)
_LARGE_MAX_ELEMENTS = 1 << 20


def _max_and_first_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x.max(0)`` of ``x`` (rows, ...): each column's maximum and the first row holding it, from ``max(0)``
    over row blocks that stay in cache (on a CPU, on tensors larger than its cache, ``x.max(0)`` runs many
    times slower than ``amax(0)``: it tracks the index through the reduction; in cache it does not, and the
    blocks' results are merged in order, a later block winning only with a strictly larger value). One pass
    over ``x`` where ``amax`` and a blocked search for its rows took two (docs/decisions.md)."""
    rows = x.shape[0]
    flat = x.reshape(rows, -1)
    step = max(1, _MAX_BLOCK_ELEMENTS // max(1, flat.shape[1]))
    maximum, first = flat[:step].max(0)
    for start in range(step, rows, step):
        values, at = flat[start:start + step].max(0)
        # a NaN wins over numbers, as in max(0); the first block holding one keeps it
        later = (values > maximum) | (values.isnan() & ~maximum.isnan())
        maximum = torch.where(later, values, maximum)
        first = torch.where(later, at + start, first)
    return maximum.view(x.shape[1:]), first.view(x.shape[1:])


class _MaxOverRows(torch.autograd.Function):
    """``x.max(0).values`` with the same gradient, all of it to the first row holding the maximum (so a
    fit repeats ``max``'s to the bit), in one pass over cache-sized row blocks."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        maximum, first = _max_and_first_rows(x)
        ctx.rows = x.shape[0]
        ctx.save_for_backward(first)
        return maximum

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        (first,) = ctx.saved_tensors
        return grad.new_zeros((ctx.rows, *grad.shape)).scatter_(0, first.unsqueeze(0), grad.unsqueeze(0))


def max_over_rows(x: torch.Tensor) -> torch.Tensor:
    """``x.max(0).values`` (rows >= 1), its gradient to the first arg-max row.

    ``max(0)`` rather than ``amax(0)`` for the gradient: ``amax``'s backward spreads it over ties with
    several full-size passes (a large share of a training step on a large graph). Without a gradient the values
    come from ``amax``; for the gradient of a large ``x`` on a CPU, from ``max`` over cache-sized row
    blocks; on a GPU ``max(0)`` is kept (not measured).
    """
    if not (x.requires_grad and torch.is_grad_enabled()):
        return x.amax(0)
    if x.device.type == "cpu" and x.numel() >= _LARGE_MAX_ELEMENTS:
        return _MaxOverRows.apply(x)
    return x.max(0).values


class PoolOneGraph(torch.autograd.Function):
    """The per-config pooling inputs of one graph's varying states ``x`` (rows, K, H): their sum over rows
    (1, K, H), their max (1, K, H) and the rows of its configurable nodes (R0, K, H), as
    ``segment_sum``, ``max_over_rows`` and ``x[config_in_final]`` give them, with one gradient pass.

    Taken apart, the three backwards each build a full (rows, K, H) tensor (the sum's broadcast, the
    max's and the indexing's zero-filled scatters) and autograd adds them with two more full passes,
    on a CPU step that is bound by its passes over (rows, K, H) (with ``max_over_rows``: +13 to +23% per
    xla training step, 0.2-0.3 GB lower peak). Here the gradient is one copy of the sum's plus the max's
    and the configurable rows' parts, added in autograd's order (the indexing's, then the max's, then
    the sum's) so that a fit repeats the three separate ops' to the bit.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, graph: torch.Tensor, config_rows: torch.Tensor):
        total = segment_sum(x, graph, 1)
        maximum, first = _max_and_first_rows(x)
        ctx.rows = x.shape[0]
        ctx.save_for_backward(first, config_rows)
        return total, maximum.unsqueeze(0), x.index_select(0, config_rows)

    @staticmethod
    def backward(ctx, grad_total: torch.Tensor, grad_max: torch.Tensor, grad_config: torch.Tensor):
        first, config_rows = ctx.saved_tensors
        rows, shape, width = ctx.rows, grad_max.shape[1:], grad_max[0].numel()
        grad_total, grad_max, first = grad_total.reshape(width), grad_max.reshape(width), first.reshape(width)
        columns = torch.arange(width, device=first.device)
        position = torch.full((rows,), -1, dtype=torch.long, device=first.device)
        position[config_rows] = torch.arange(config_rows.shape[0], device=first.device)
        at_config = position[first]  # per column, the configurable row holding the max, or -1
        max_at_config = at_config >= 0
        # the configurable rows: (their own + the max's) + the sum's
        config_part = grad_config.reshape(-1, width).clone()
        config_part.view(-1).index_add_(0, at_config.clamp(min=0) * width + columns,
                                        torch.where(max_at_config, grad_max, 0))
        config_part += grad_total
        # every other row: the sum's, + the max's where the max is there
        grad = grad_total.expand(rows, width).clone()
        grad.view(-1).index_add_(0, first * width + columns, torch.where(max_at_config, 0, grad_max))
        grad.index_copy_(0, config_rows, config_part)
        return grad.view(rows, *shape), None, None


def segment_max_sorted(x: torch.Tensor, index: torch.Tensor, size: int,
                       counts: list[int] | None = None) -> torch.Tensor:
    """Max over rows grouped by ``index`` (sorted, as node ids of a batch are); empty groups give -inf.

    ``counts`` (rows per group, known on the host from the batch) spares a GPU a device-to-host read of
    the group sizes.
    """
    if size == 1 and x.shape[0]:
        return max_over_rows(x).unsqueeze(0)
    if counts is None:
        counts = torch.bincount(index, minlength=size).tolist()
    parts = []
    for chunk in torch.split(x, counts):  # a loop over graphs, never over nodes
        if chunk.shape[0]:
            parts.append(max_over_rows(chunk))
        else:
            parts.append(x.new_full(x.shape[1:], float("-inf")))
    return torch.stack(parts) if parts else x.new_zeros((0, *x.shape[1:]))
