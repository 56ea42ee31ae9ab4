"""Benchmarks: scripts that print figures (wall time, peak memory, throughput); never timed tests."""

# The package sets the OpenMP wait policy on import; importing it here puts that setting in the
# environment every measured process inherits (``common.measure``), before any of them imports torch.
import pipelines  # noqa: F401
