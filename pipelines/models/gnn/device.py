"""Where the GNN runs (``gnn.device``), in which precision (``gnn.precision``) and how deterministically.

The model, the graph batches, the sampled configs and the loss all live on the chosen device; the
host keeps the numpy arrays (configs are sampled and gathered there, K at a time) and reads back
one loss per epoch and the scores of a predicted graph. On CPU nothing is copied and every result
is the same to the bit as before devices existed.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import os
import platform
import threading
from typing import Iterator

import torch

from pipelines.core.errors import ConfigError

# cuBLAS needs a fixed workspace to be deterministic (CUDA >= 10.2); read when cuBLAS starts
CUBLAS_DETERMINISTIC = ":4096:8"

# glibc's mallopt parameters (malloc.h), and what they are given after a CPU fit: the mmap count's
# default, and the thresholds where glibc's own adjustment ends once a process has freed a large block
# (setting any of them ends that adjustment for good, so the settled values are set explicitly)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_MMAP_MAX = -1, -3, -4
GLIBC_MMAP_MAX, GLIBC_MMAP_THRESHOLD_MAX = 65536, 32 * 2**20


def resolve_device(name: str) -> torch.device:
    """``"auto"`` -> the first CUDA device when torch sees one, else CPU; ``"cuda"`` without a GPU fails."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"gnn.device = {name!r} but torch sees no CUDA GPU (torch {torch.__version__}, "
                              f"built for CUDA {torch.version.cuda}); use 'cpu' or 'auto'")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ConfigError(f"gnn.device = {name!r} but torch sees {torch.cuda.device_count()} GPU(s)")
    return device


def cuda_summary() -> str | None:
    """What CUDA hardware torch sees (``"1 CUDA GPU (NVIDIA H200)"``), or None without one."""
    if not torch.cuda.is_available():
        return None
    count = torch.cuda.device_count()
    names = sorted({torch.cuda.get_device_name(i) for i in range(count)})
    return f"{count} CUDA GPU{'s' if count != 1 else ''} ({', '.join(names)})"


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    """bf16 autocast of the forward pass for ``precision == "bf16"``, else nothing.

    Weights, optimizer state and the loss stay float32; matrix products and the message passing
    run in bfloat16, LayerNorm and the pooling sums in float32 (torch's autocast lists).
    """
    if precision != "bf16":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


def full_precision(tensor: torch.Tensor) -> contextlib.AbstractContextManager:
    """Autocast switched off for the ops inside, where one is on for ``tensor``'s device; else nothing.

    For the last layers of a score: a bfloat16 output keeps 8 significant bits, and the costs of a
    graph's configs, which differ in their 3rd-4th digit, would round onto each other (ties).
    """
    kind = tensor.device.type
    if kind in ("cpu", "cuda") and torch.is_autocast_enabled(kind):
        return torch.autocast(device_type=kind, enabled=False)
    return contextlib.nullcontext()


@contextlib.contextmanager
def deterministic(enabled: bool) -> Iterator[None]:
    """Inside the block, ``torch.use_deterministic_algorithms(True)`` when ``enabled`` (restored after).

    On CUDA this makes ``index_add_`` (the message passing and every gather's backward) use a
    deterministic algorithm instead of float atomics, and an op without one raises. CPU kernels
    of this model are deterministic already.
    """
    if not enabled:
        yield
        return
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_DETERMINISTIC)
    before, warn_before = torch.are_deterministic_algorithms_enabled(), \
        torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before, warn_only=warn_before)


_heap_lock = threading.Lock()
_heap_depth = 0


@functools.cache  # per process: it reads the interpreter's binary and asks ldconfig
def _glibc() -> ctypes.CDLL | None:
    """The C library when it is glibc (mallopt and malloc_trim are glibc's), else None."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


@contextlib.contextmanager
def keep_freed_memory(enabled: bool) -> Iterator[bool]:
    """Inside the block, memory the process frees stays in its heap for the next allocation (glibc);
    yields whether that is in force.

    A CPU training step on a large graph allocates dozens of (nodes, K, hidden) tensors larger than
    glibc's mmap ceiling (32 MiB): each one is mapped afresh and unmapped when freed, so every step
    page-faults and zero-fills them again, and a large share of the step is spent in the kernel. With
    mmap off (``M_MMAP_MAX = 0``) and no trimming, the blocks are reused: same arithmetic, same bytes,
    more steps per second, at a higher peak (freed blocks of other sizes stay mapped; figures in
    docs/decisions.md, ``gnn.cpu_heap_reuse``). On exit the free
    heap is handed back to the system (``malloc_trim``), so a worker process does not keep a fit's
    peak, and mmap is on again with the thresholds glibc settles at by itself after large frees.
    Nested blocks (and threads) share one setting; no-op off glibc.
    """
    global _heap_depth
    libc = _glibc() if enabled else None
    if libc is None:
        yield False
        return
    with _heap_lock:
        if _heap_depth == 0:
            libc.mallopt(M_MMAP_MAX, 0)
            libc.mallopt(M_TRIM_THRESHOLD, 2**31 - 1)  # an int: the largest mallopt takes
        _heap_depth += 1
    try:
        yield True
    finally:
        with _heap_lock:
            _heap_depth -= 1
            if _heap_depth == 0:
                libc.mallopt(M_MMAP_MAX, GLIBC_MMAP_MAX)
                libc.mallopt(M_MMAP_THRESHOLD, GLIBC_MMAP_THRESHOLD_MAX)
                libc.mallopt(M_TRIM_THRESHOLD, 2 * GLIBC_MMAP_THRESHOLD_MAX)
                libc.malloc_trim(0)


def heap_reuse_on(device: torch.device, enabled: bool) -> contextlib.AbstractContextManager:
    """``gnn.cpu_heap_reuse`` for a block of work on ``device``: a CPU's heap only (a GPU's memory has
    its own caching allocator). Fits, predictions and the throughput benchmark all enter it here."""
    return keep_freed_memory(enabled and device.type == "cpu")


def rng_devices(device: torch.device) -> list[int]:
    """Devices whose RNG ``torch.random.fork_rng`` must save and restore around a fit."""
    if device.type != "cuda":
        return []
    return [device.index if device.index is not None else torch.cuda.current_device()]
