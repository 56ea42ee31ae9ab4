"""TpuGraphs runtime-ranking pipelines: data, features, rankers, ensembles and submissions."""

import os as _os

__version__ = "0.1.0"

# GNU OpenMP (the runtime of torch's CPU kernels and of LightGBM) lets a thread that waits for work
# spin ~300,000 iterations before sleeping. Where other processes hold the cores (a CI runner, a
# shared workstation, a second job), a process with 2+ threads then spends its time slices spinning
# while its partner thread waits for a core, at every parallel region: on busy cores GNN training,
# scoring and LightGBM fits ran many times slower (docs/decisions.md, "OMP_WAIT_POLICY"). Waiting
# passively costs little to a multi-threaded process on an idle machine and nothing to a one-thread
# process (a fold job on 2 cores). A user's
# OMP_WAIT_POLICY or GOMP_SPINCOUNT is kept. libgomp reads it once, when loaded: this runs before
# torch or lightgbm is imported by the package (a process that imported them earlier keeps their
# setting).
if "OMP_WAIT_POLICY" not in _os.environ and "GOMP_SPINCOUNT" not in _os.environ:
    _os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
