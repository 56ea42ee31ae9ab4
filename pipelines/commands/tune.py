"""The `tune` command."""

from __future__ import annotations

import argparse
from pathlib import Path

from pipelines.core import paths
from pipelines.config.registry import tunable_models
from pipelines.commands.common import announce_config, config_options, command_parser, seed


def add(sub: argparse._SubParsersAction) -> None:
    p = command_parser(sub, "tune", "Optuna search over a model's hyperparameters for one collection (objective: the "
                                    "grouped-CV OOF score); writes the best trial as a config file",
                       "tune --model gbdt --collection layout:xla:random --trials 20 --data-root data/synthetic-small")
    p.add_argument("--model", required=True, choices=tunable_models())
    p.add_argument("--collection", required=True, metavar="NAME", help="e.g. layout:xla:random")
    p.add_argument("--trials", type=int, required=True, help="trials to add to the study in this call")
    p.add_argument("--data-root", type=Path, required=True)
    p.add_argument("--work-dir", type=Path, default=paths.WORK_DIR)
    config_options(p, config_help="base config name or TOML file (default: base)")
    p.add_argument("--storage", default=None, metavar="URL",
                   help="Optuna storage URL shared by several machines (default: sqlite file WORK_DIR/tune/studies.db)")
    p.add_argument("--study", default=None,
                   help="study name (default: model, collection and a data+config fingerprint)")
    p.add_argument("--out", type=Path, default=None,
                   help="config file for the best trial (default: WORK_DIR/tune/<study>.toml; manifest next to it)")
    p.add_argument("--seed", type=seed, default=0, help="seed of the TPE sampler")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from pipelines.flows.tune import tune

    result = tune(announce_config(args.config, "base"), args.overrides, model=args.model, collection=args.collection, trials=args.trials,
                  data_root=args.data_root, work_dir=args.work_dir, storage=args.storage, study_name=args.study,
                  out=args.out, seed=args.seed)
    print(result.describe())
    print(result.config_file)
    return 0

