"""``gnn.cpu_heap_reuse``: a CPU fit keeps freed memory in the heap (glibc), which changes speed, never results.

Both tests run in a fresh interpreter: they change the process's malloc settings.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pipelines.models.gnn.device import _glibc

pytestmark = pytest.mark.skipif(_glibc() is None, reason="mallopt is glibc's")
ROOT = Path(__file__).resolve().parents[1]


def run_python(code: str) -> dict:
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.splitlines()[-1])


FAULTS = """
import json, resource
import torch
from pipelines.models.gnn.device import keep_freed_memory

def faults(times=4, mib=64):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(times):
        # above glibc's 32 MiB mmap ceiling: mapped afresh by default (numpy would ask for huge pages)
        block = torch.ones(mib * 2**20 // 4)
        del block
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

outside = faults()
with keep_freed_memory(True) as active:
    faults(1)  # the first block grows the heap
    inside = faults(times=8)
after = faults()
print(json.dumps(dict(active=active, outside=outside, inside=inside, after=after, block=64 * 2**20 // 4096)))
"""


def test_freed_memory_is_reused_inside_the_block_and_mapped_afresh_after_it():
    got = run_python(FAULTS)
    assert got["active"]
    if got["outside"] < 2 * got["block"]:
        pytest.skip(f"the kernel backs these blocks with huge pages ({got})")
    # 8 blocks inside fault at most ~1 block's pages: the heap grows once more when a small allocation
    # lands in the freed block and splits it (seen on CI), then every block reuses freed pages
    assert got["inside"] < 2 * got["block"], got
    assert got["after"] > 2 * got["block"], got  # 4 blocks: glibc's mapping of large blocks is back


SAME_RESULTS = """
import hashlib, json
import numpy as np
import torch
from pipelines.models.gnn.device import M_MMAP_THRESHOLD, _glibc
from tests.test_gnn import easy_world, gnn

torch.set_num_threads(1)
graphs = easy_world(4, "layout", 5)
def fitted_bytes(heap_reuse):
    ranker = gnn(epochs=2, dropout=0.1, configs_per_graph=8, cpu_heap_reuse=heap_reuse)
    ranker.fit(graphs[:4], graphs[4:], seed=3)
    losses = np.array([h["loss"] for h in ranker.history_], dtype=np.float64)
    return hashlib.sha256(ranker.predict(graphs).tobytes() + losses.tobytes()).hexdigest()

_glibc().mallopt(M_MMAP_THRESHOLD, 4096)  # every block above 4 KiB a fresh mapping of zero pages
fresh = fitted_bytes(False)
recycled = fitted_bytes(True)  # blocks reused, holding what the last tensor left in them
print(json.dumps(dict(fresh=fresh, recycled=recycled)))
"""


@pytest.mark.slow
def test_a_fit_gives_the_same_bytes_on_fresh_and_on_recycled_memory():
    got = run_python(SAME_RESULTS)
    assert got["fresh"] == got["recycled"]


def test_heap_reuse_is_asked_for_on_a_cpu_only(monkeypatch):
    import torch

    import pipelines.models.gnn.device as device_module

    asked = []
    monkeypatch.setattr(device_module, "keep_freed_memory", lambda enabled: asked.append(enabled))
    for device, enabled in (("cpu", True), ("cpu", False), ("cuda", True), ("cuda:1", True)):
        device_module.heap_reuse_on(torch.device(device), enabled)
    assert asked == [True, False, False, False]
