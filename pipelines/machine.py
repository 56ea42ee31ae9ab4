"""What this machine offers to new work: cores this process may use and memory (Linux ``/proc``)."""

from __future__ import annotations

import os


def available_cores() -> int:
    """Cores this process may run on (its affinity mask; all logical cores where there is none)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


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


def available_memory() -> int | None:
    """Bytes of memory available to new work (Linux ``MemAvailable``); None where unknown."""
    return meminfo_bytes("MemAvailable")
