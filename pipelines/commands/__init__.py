"""The commands, one module each: ``add(sub)`` declares its parser (and sets its ``handler``),
``run(args)`` (or one handler per action) calls one flow and prints its result. Handlers import
their flows lazily, so ``--help`` and light commands stay fast (torch is heavy)."""

from __future__ import annotations

from types import ModuleType

from pipelines.commands import (config, demo, download, ensemble, evaluate, featurize, gc, predict, prepare, rank,
                                records, report, run, runs, score, status, submissions, submit, synth, train, tune,
                                validate_submission)

# The order of `--help`'s command list.
COMMANDS: tuple[ModuleType, ...] = (
    synth, validate_submission, score, demo, prepare, train, status, gc, config, download, submit, submissions,
    run, ensemble, report, runs, predict, featurize, rank, records, evaluate, tune,
)
