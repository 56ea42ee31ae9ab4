"""Benchmarks: scripts that print figures (wall time, peak memory, throughput); never timed tests."""
