"""The `evaluate` command."""

from __future__ import annotations

import argparse
from pathlib import Path

from pipelines.core import paths
from pipelines.core.errors import ConfigError
from pipelines.commands.common import command_parser


def add(sub: argparse._SubParsersAction) -> None:
    p = command_parser(sub, "evaluate",
                       "score a run's test submission on a synthetic world's hidden labels, next to the best "
                       "heuristic (floor) and the noise-free ranking (ceiling)",
                       "evaluate 20261122T120000Z-1a2b3c4d --data-root data/synthetic-medium-v1")
    p.add_argument("run_id", metavar="RUN_ID", help="a run-id under --submissions-dir")
    p.add_argument("--data-root", type=Path, required=True,
                   help="the world the run was made on (synth's, a lowered one or another generator's with the "
                        "same labels/ sidecar)")
    p.add_argument("--submissions-dir", type=Path, default=paths.SUBMISSIONS_DIR)
    p.add_argument("--work-dir", type=Path, default=None,
                   help="where the run's training outputs are (default: as its manifest records)")
    p.add_argument("--no-models", action="store_true", help="score only the submission, not each model alone")
    p.add_argument("--per-graph", action="store_true",
                   help="also print every test graph: program family and size, each score, share of its ceiling "
                        "(worst first); evaluation.json holds it either way")
    p.add_argument("--per-node-kind", action="store_true",
                   help="also print, per layout collection and entry, each kind of configurable node (conv forward, "
                        "input / weight gradient, depthwise, 5-D; dot; reshape): its share of what layouts change "
                        "in the runtime and how well the order follows it")
    p.add_argument("--by-family", action="store_true",
                   help="with --per-node-kind: split its table by program family (cnn, rnn, transformer, mlp), "
                        "each family's shares summing to 1")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from pipelines.flows.evaluate import evaluate_run

    if args.by_family and not args.per_node_kind:
        raise ConfigError("--by-family splits the per-node-kind table: give --per-node-kind with it")
    evaluation, path = evaluate_run(args.run_id, args.data_root, submissions_dir=args.submissions_dir,
                                    work_dir=args.work_dir, with_models=not args.no_models,
                                    node_kinds=args.per_node_kind, node_kinds_by_family=args.by_family)
    print(evaluation.to_text())
    from pipelines.flows.evaluate import per_graph_table, per_graph_text, program_family_table, program_family_text
    from pipelines.synth.world import program_families, program_kinds

    print("\nper program family (submission):")
    print(program_family_text(program_family_table(evaluation, program_kinds(args.data_root))))
    if args.per_graph:
        print("\nper test graph (share: submission / ceiling, worst first):")
        print(per_graph_text(per_graph_table(evaluation, program_families(args.data_root))))
    if evaluation.node_kinds is not None:
        from pipelines.flows.evaluate import node_kind_text

        split = " and program family" if args.by_family else ""
        print(f"\nper node kind{split} (share of the runtime's layout effects; agreement of the order with them):")
        print(node_kind_text(evaluation.node_kinds))
    print(path)
    return 0

