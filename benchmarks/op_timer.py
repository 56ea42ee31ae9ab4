"""Where a block of PyTorch work spends its time, by aten op and input shape, timed at dispatch.

``torch.profiler`` misplaces a CPU training step's time on large tensors: its own allocations break the
heap reuse a fit runs under (``gnn.cpu_heap_reuse``), so the step's large outputs are mapped and
zero-filled afresh and each ~90 MB op reads 2-3x its cost (on the largest real-size xla graph, GELU's
forward 60-71 ms under the profiler, 20-24 ms in the same step timed alone; 180k page faults in three
profiled steps, none in plain ones; benchmarks/results/2026-11-29-vm-gnn-step-ops.md). A dispatch mode
adds a clock read per op and leaves the heap as it is. Forward and backward ops are both seen (on a
CPU the autograd engine runs the backward on the calling thread, which carries the mode). CPU only: a GPU
runs its kernels asynchronously, so the clock would read launch times there (use ``torch.profiler``'s CUDA
activity, which has no heap to disturb).
"""

from __future__ import annotations

import time
from collections import defaultdict

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class OpTimer(TorchDispatchMode):
    """Inside ``with OpTimer() as timer:``, every aten op's wall time is added to ``timer.totals[(op,
    shape)]`` (seconds, calls), ``shape`` that of the op's first tensor argument (() for none)."""

    def __init__(self):
        super().__init__()
        self.totals: dict[tuple[str, tuple[int, ...]], list] = defaultdict(lambda: [0.0, 0])

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        started = time.perf_counter()
        out = func(*args, **(kwargs or {}))
        seconds = time.perf_counter() - started
        shape = next((tuple(a.shape) for a in args if isinstance(a, torch.Tensor)), ())
        total = self.totals[(str(func.overloadpacket), shape)]
        total[0] += seconds
        total[1] += 1
        return out

    def top(self, count: int, repeats: int = 1) -> list[list]:
        """The ``count`` (op, shape) pairs that took longest: [op, shape, ms, calls] per repeat of the
        timed block (``repeats`` steps timed: per step), longest first."""
        ranked = sorted(self.totals.items(), key=lambda item: -item[1][0])[:count]
        return [[op, "x".join(map(str, shape)) or "-", seconds / repeats * 1000, calls / repeats]
                for (op, shape), (seconds, calls) in ranked]

    def seconds(self, repeats: int = 1) -> float:
        """Time inside the ops, per repeat: the rest of a block's wall time is Python between them."""
        return sum(seconds for seconds, _ in self.totals.values()) / repeats
