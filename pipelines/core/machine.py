"""What this machine offers to new work: cores this process may use and memory (Linux ``/proc``, cgroups).

In a container (Docker ``--cpus``/``--memory``, a Kubernetes pod's limits, a CI runner) the kernel
enforces the cgroup's CPU quota and memory limit while ``/proc`` and the affinity mask still show the
whole host: sizing threads and jobs by the host would oversubscribe a quota of 2 CPUs on a 64-core
node 32-fold, and the memory guard would admit jobs the limit then kills. Both cgroup versions are
read (v1: ``cpu.cfs_quota_us``, ``memory.limit_in_bytes``; v2: ``cpu.max``, ``memory.max``), at the
process's own cgroup and every ancestor, since a limit anywhere above applies too.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Callable, Iterable, Iterator

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")
UNLIMITED = 2**60  # cgroup v1 writes "no limit" as a page-rounded 2**63 - 1


def _cgroup_dirs(controller: str, root: Path, proc_cgroup: Path) -> Iterator[Path]:
    """Directories holding ``controller``'s files for this process: its cgroup and every ancestor, under
    the v1 mount of the controller and the v2 hierarchy. Inside a container whose cgroup path is not
    namespaced, the listed path does not exist under the container's mount, whose root is then its own
    cgroup: the mount roots are always included."""
    try:
        lines = proc_cgroup.read_text(encoding="ascii").splitlines()
    except OSError:
        return
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":  # v2: one hierarchy, mounted at the root (or at root/unified on hybrid systems)
            mounts = [root, root / "unified"]
        elif controller in controllers.split(","):
            mounts = [root / controllers, root / controller]  # the same folder where it is mounted alone
        else:
            continue
        for mount in dict.fromkeys(mounts):
            here = mount / path.lstrip("/")
            while True:
                yield here
                if here == mount or mount not in here.parents:
                    break
                here = here.parent


def _read_number(path: Path) -> int | None:
    try:
        text = path.read_text(encoding="ascii").strip()
        return None if text == "max" else int(text)
    except (OSError, ValueError):
        return None


def _smallest(values: Iterable[float | None]) -> float | None:
    found = [v for v in values if v is not None]
    return min(found) if found else None


def cgroup_cpu_limit(root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_CGROUP) -> float | None:
    """CPUs this process's cgroups let it use (quota / period, the smallest over the hierarchy); None
    where no quota is set or nothing can be read."""

    def limit(folder: Path) -> float | None:
        try:  # v2: "QUOTA PERIOD" or "max PERIOD"
            quota, period = (folder / "cpu.max").read_text(encoding="ascii").split()
            return None if quota == "max" else int(quota) / int(period)
        except (OSError, ValueError):
            pass
        quota, period = _read_number(folder / "cpu.cfs_quota_us"), _read_number(folder / "cpu.cfs_period_us")
        return quota / period if quota is not None and quota > 0 and period else None

    return _smallest(limit(folder) for folder in _cgroup_dirs("cpu", root, proc_cgroup))


def cgroup_memory_available(root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_CGROUP) -> int | None:
    """Bytes this process's cgroups can still allocate: limit - usage + inactive page cache (which the
    kernel reclaims before it kills), the smallest over the hierarchy; None where nothing is limited."""

    def available(folder: Path) -> int | None:
        for limit_file, usage_file, cache_field in (("memory.max", "memory.current", "inactive_file"),
                                                     ("memory.limit_in_bytes", "memory.usage_in_bytes",
                                                      "total_inactive_file")):
            limit, usage = _read_number(folder / limit_file), _read_number(folder / usage_file)
            if limit is not None and limit < UNLIMITED and usage is not None:
                return max(0, limit - usage + _stat_field(folder / "memory.stat", cache_field))
        return None

    found = _smallest(available(folder) for folder in _cgroup_dirs("memory", root, proc_cgroup))
    return None if found is None else int(found)


def _stat_field(path: Path, field: str) -> int:
    """A field of a cgroup ``memory.stat`` file; 0 where absent."""
    try:
        for line in path.read_text(encoding="ascii").splitlines():
            name, _, value = line.partition(" ")
            if name == field:
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


def available_cores(cpu_limit: Callable[[], float | None] = cgroup_cpu_limit) -> int:
    """Cores this process may use: its affinity mask (all logical cores where there is none), capped by
    its cgroups' CPU quota (rounded down, at least 1)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    quota = cpu_limit()
    return cores if quota is None else max(1, min(cores, math.floor(quota)))


def meminfo_bytes(field: str) -> int | None:
    """A ``/proc/meminfo`` field (``MemAvailable``, ``MemTotal``...) in bytes; None where unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith(f"{field}:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def available_memory(cgroup_available: Callable[[], int | None] = cgroup_memory_available) -> int | None:
    """Bytes of memory available to new work: Linux ``MemAvailable``, or what this process's cgroups
    still allow where that is less; None where neither is known."""
    return _smallest([meminfo_bytes("MemAvailable"), cgroup_available()])
