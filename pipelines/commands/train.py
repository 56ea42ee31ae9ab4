"""The `train` command."""

from __future__ import annotations

import argparse
from pathlib import Path

from pipelines.core import paths
from pipelines.config.registry import MODELS
from pipelines.commands.common import announce_config, config_options, command_parser


def add(sub: argparse._SubParsersAction) -> None:
    p = command_parser(sub, "train", "grouped k-fold training of one model per collection (runs prepare first)",
                              "train --model gnn --collection tile:xla --data-root data/synthetic-small --config quick")
    p.add_argument("--model", required=True,
                   help=f"registered model: {', '.join(MODELS)} (feature: the best single f_* "
                        "column; feature:<column> fixes it)")
    p.add_argument("--collection", "--collections", dest="collections", action="append", default=[],
                   metavar="NAME", help="collection name(s), repeatable or comma-separated (default: all present)")
    p.add_argument("--data-root", type=Path, required=True)
    p.add_argument("--work-dir", type=Path, default=paths.WORK_DIR)
    config_options(p)
    p.add_argument("--force", action="store_true",
                   help="retrain even when a cached output exists (prepare stays cached)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from pipelines.core.collection import parse_collections
    from pipelines.config.settings import load_config
    from pipelines.flows.prepare import prepare
    from pipelines.config.registry import get_adapter
    from pipelines.training.fit import format_summary, train_model

    config = load_config(announce_config(args.config, "base"), args.overrides)
    get_adapter(args.model)  # an unknown model fails before any data is prepared
    names = [n for text in args.collections for n in text.split(",") if n.strip()]
    collections = list(parse_collections(names)) if names else None
    from pipelines.flows.prepare import collections_to_prepare
    from pipelines.flows.schedule import check_devices

    # a GPU asked for and absent fails before the data stages, as in `run`
    chosen = collections_to_prepare(config, args.data_root, collections)[0]
    check_devices(config, [args.model], chosen)
    from pipelines.training.fit import check_models

    check_models([args.model], chosen)
    from pipelines.flows.run import log_epoch_caps

    prepared = prepare(config, args.data_root, args.work_dir, collections)
    outputs = []
    for name, item in prepared.items():
        outputs.append(train_model(config, item, model=args.model, work_dir=args.work_dir, force=args.force))
        print(format_summary(outputs[-1]))
    log_epoch_caps(outputs)
    return 0

