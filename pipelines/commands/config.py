"""The `config` command."""

from __future__ import annotations

import argparse

from pipelines.commands.common import config_options, command_parser


def add(sub: argparse._SubParsersAction) -> None:
    p = command_parser(sub, "config", "validate a configuration and print it resolved, as TOML",
                              "config --config demo --set gnn.epochs=4")
    config_options(p)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from pipelines.config.settings import config_to_toml, load_config
    from pipelines.core.engine import fingerprint

    config = load_config(args.config, args.overrides)
    from pipelines.flows.prepare import check_feature_exclusions

    check_feature_exclusions(config)  # the rule prepare applies, so `config` validates what a run would
    print(f"# fingerprint {fingerprint(config)}")
    print(config_to_toml(config), end="")
    return 0

