"""Where the GNN runs (``gnn.device``), in which precision (``gnn.precision``) and how deterministically.

The model, the graph batches, the sampled configs and the loss all live on the chosen device; the
host keeps the numpy arrays (configs are sampled and gathered there, K at a time) and reads back
one loss per epoch and the scores of a predicted graph. On CPU nothing is copied and every result
is the same to the bit as before devices existed.
"""

from __future__ import annotations

import contextlib
import os
from typing import Iterator

import torch

from pipelines.errors import ConfigError

# cuBLAS needs a fixed workspace to be deterministic (CUDA >= 10.2); read when cuBLAS starts
CUBLAS_DETERMINISTIC = ":4096:8"


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


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    """bf16 autocast of the forward pass for ``precision == "bf16"``, else nothing.

    Weights, optimizer state and the loss stay float32; matrix products and the message passing
    run in bfloat16, LayerNorm and the pooling sums in float32 (torch's autocast lists).
    """
    if precision != "bf16":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


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


def rng_devices(device: torch.device) -> list[int]:
    """Devices whose RNG ``torch.random.fork_rng`` must save and restore around a fit."""
    if device.type != "cuda":
        return []
    return [device.index if device.index is not None else torch.cuda.current_device()]
