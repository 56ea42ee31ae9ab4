"""The `records` command."""

from __future__ import annotations

import argparse
from pathlib import Path

from pipelines.commands.common import command_parser


def add(sub: argparse._SubParsersAction) -> None:
    p = command_parser(sub, "records",
                       "turn TpuGraphs tuning records (tuning.proto: a TuningData or ModuleTuningData file of "
                       "programs with measured runtimes per layout or tile config) into a data root of measured "
                       "graphs that train, run, predict and evaluate read; needs the hlo extra",
                       "records tuning/op_tuning_data.pb tuning/module_tuning_data_layout.pb --out data/mine")
    p.add_argument("files", type=Path, nargs="+", metavar="FILE", help="serialized TuningData or ModuleTuningData")
    p.add_argument("--out", type=Path, required=True,
                   help="the data root to write (new, empty, or one `records` made; graphs are added to it)")
    p.add_argument("--split", choices=("train", "valid", "test", "fingerprint"), default="train",
                   help="where the graphs go: one split, or by module fingerprint as the official encoder splits "
                        "(0.8 train, 0.1 valid, 0.1 test); test runtimes go to the hidden labels evaluate reads")
    p.add_argument("--layout-collection", dest="layout_collections", action="append", default=[], metavar="NAME",
                   help="layout collection(s) for layout records, repeatable, or all (default: layout:xla:default)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from pipelines.flows.records import records_to_data_root

    result = records_to_data_root(args.files, args.out, split=args.split,
                                  layout_collection=args.layout_collections or "layout:xla:default")
    for graph in result.written:
        print(f"{graph['collection']} {graph['split']}: {graph['stem']} ({graph['configs']} configs, "
              f"from module {graph['module']} of {graph['file']})")
    for item in result.left_out:
        print(f"left out: module {item['module']} of {item['file']}: {item['reason']}")
    print(result.sidecar)
    return 0
