"""Cores and memory available to new work: the affinity mask and /proc capped by cgroup limits (v1 and v2)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pipelines.core import machine
from pipelines.core.machine import (available_cores, available_memory, cgroup_cpu_limit, cgroup_memory_available,
                               meminfo_bytes)

GIB = 2**30


def tree(root: Path, files: dict[str, str], proc_cgroup: str) -> tuple[Path, Path]:
    """A fake /sys/fs/cgroup under ``root`` with ``files`` (relative path -> content) and /proc/self/cgroup."""
    for name, content in files.items():
        path = root / "cgroup" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
    proc = root / "proc-self-cgroup"
    proc.write_text(proc_cgroup)
    return root / "cgroup", proc


def test_v2_quota_of_an_ancestor_applies(tmp_path):
    root, proc = tree(tmp_path, {"cgroup.controllers": "cpu memory\n", "kubepods/pod1/cpu.max": "200000 100000\n",
                                 "kubepods/pod1/ctr/cpu.max": "max 100000\n", "cpu.max": "max 100000\n"},
                      "0::/kubepods/pod1/ctr\n")
    assert cgroup_cpu_limit(root, proc) == 2.0


def test_v2_the_tightest_quota_wins_and_no_quota_is_none(tmp_path):
    root, proc = tree(tmp_path, {"a/cpu.max": "400000 100000\n", "a/b/cpu.max": "50000 100000\n"}, "0::/a/b\n")
    assert cgroup_cpu_limit(root, proc) == 0.5
    root, proc = tree(tmp_path / "free", {"a/cpu.max": "max 100000\n"}, "0::/a\n")
    assert cgroup_cpu_limit(root, proc) is None


def test_v1_quota_under_a_joint_controller_mount(tmp_path):
    root, proc = tree(tmp_path, {"cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "150000\n",
                                 "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n",
                                 "memory/docker/abc/memory.limit_in_bytes": "9223372036854771712\n"},
                      "4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n0::/\n")
    assert cgroup_cpu_limit(root, proc) == 1.5
    assert cgroup_memory_available(root, proc) is None  # v1's "no limit"


def test_v1_unlimited_quota_is_none(tmp_path):
    root, proc = tree(tmp_path, {"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, "1:cpu:/\n")
    assert cgroup_cpu_limit(root, proc) is None


def test_a_container_without_a_cgroup_namespace_reads_its_mount_root(tmp_path):
    # /proc/self/cgroup names the host's path, which the container's own mount does not have
    root, proc = tree(tmp_path, {"cpu.max": "300000 100000\n", "memory.max": str(8 * GIB),
                                 "memory.current": str(2 * GIB), "memory.stat": "anon 1\ninactive_file 0\n"},
                      "0::/system.slice/docker-0123.scope\n")
    assert cgroup_cpu_limit(root, proc) == 3.0
    assert cgroup_memory_available(root, proc) == 6 * GIB


def test_memory_left_counts_reclaimable_page_cache_and_the_tightest_ancestor(tmp_path):
    root, proc = tree(tmp_path, {"pod/memory.max": str(4 * GIB), "pod/memory.current": str(3 * GIB),
                                 "pod/memory.stat": f"anon {GIB}\ninactive_file {GIB // 2}\n",
                                 "pod/ctr/memory.max": "max\n", "pod/ctr/memory.current": str(3 * GIB)},
                      "0::/pod/ctr\n")
    assert cgroup_memory_available(root, proc) == GIB + GIB // 2
    v1, proc1 = tree(tmp_path / "v1", {"memory/x/memory.limit_in_bytes": str(2 * GIB),
                                       "memory/x/memory.usage_in_bytes": str(GIB),
                                       "memory/x/memory.stat": "cache 5\ntotal_inactive_file 1024\n"}, "9:memory:/x\n")
    assert cgroup_memory_available(v1, proc1) == GIB + 1024


def test_unreadable_or_garbled_cgroup_files_mean_no_limit(tmp_path):
    assert cgroup_cpu_limit(tmp_path / "none", tmp_path / "missing") is None
    assert cgroup_memory_available(tmp_path / "none", tmp_path / "missing") is None
    root, proc = tree(tmp_path, {"cpu.max": "lots\n", "memory.max": "12 GB\n", "memory.current": "1\n"},
                      "garbage line\n0::/\n")
    assert cgroup_cpu_limit(root, proc) is None
    assert cgroup_memory_available(root, proc) is None


def test_available_cores_is_the_affinity_mask_capped_by_the_quota():
    cores = len(os.sched_getaffinity(0))
    assert available_cores(lambda: None) == cores
    assert available_cores(lambda: cores + 10.0) == cores
    assert available_cores(lambda: 1.5) == 1  # rounded down: threads beyond the quota are throttled
    assert available_cores(lambda: 0.25) == 1


def test_available_memory_is_the_smaller_of_meminfo_and_the_cgroup(monkeypatch):
    free = meminfo_bytes("MemAvailable")
    if free is None:
        pytest.skip("no /proc/meminfo")
    # MemAvailable moves between two reads (other processes allocate): read it once, here.
    monkeypatch.setattr(machine, "meminfo_bytes", lambda key: free if key == "MemAvailable" else None)
    assert available_memory(lambda: None) == free
    assert available_memory(lambda: 1234) == 1234
    assert available_memory(lambda: free * 2) == free
