"""The `run` command."""

from __future__ import annotations

import argparse
from pathlib import Path

from pipelines.core import paths
from pipelines.commands.common import announce_config, config_options, command_parser, report_new_run


def add(sub: argparse._SubParsersAction) -> None:
    p = command_parser(sub, "run", "every stage, every model, the ensemble, a validated submission and report.html "
                                   "(cached stages are reused); prints the submission path last",
                       "run --data-root data/kaggle --config quick --models gbdt")
    p.add_argument("--data-root", type=Path, required=True, help="any data root in the Kaggle layout")
    p.add_argument("--work-dir", type=Path, default=paths.WORK_DIR)
    config_options(p, config_help="config name (e.g. quick) or TOML file (default: the machine's: gpu, base's "
                                  "schedule, where torch sees a CUDA GPU, else cpu; base is sized for a GPU, "
                                  "hours on a CPU)")
    p.add_argument("--models", default=None,
                   help="comma-separated models to train and blend (default: the config's ensemble.models, "
                        "each of which must be one of run.models, the models the config allows)")
    p.add_argument("--submissions-dir", type=Path, default=paths.SUBMISSIONS_DIR)
    p.add_argument("--scheduler", default=None, metavar="ADDRESS",
                   help="Dask scheduler address for the data-stage and training jobs (workers must share this "
                        "filesystem); default: run.scheduler of the config ('local': local processes)")
    p.add_argument("--collections", default=None, metavar="NAMES",
                   help="comma-separated collections to train, blend and score (and the data of those their models "
                        "also train on); publishes no submission, which needs all five (default: every collection)")
    p.add_argument("--force", action="store_true", help="recompute every stage even when cached")
    p.add_argument("--name", default=None, help="a name for the run (runs list shows it; any command taking a "
                                                "run-id takes it too, while it is unique)")
    p.add_argument("--note", default=None, help="a free-text note kept in the run manifest (runs list shows it)")
    p.add_argument("--track", default=None, choices=("mlflow",),
                   help="also log the run to a local MLflow store (params, CV metrics, curves, artifacts)")
    p.add_argument("--track-uri", default=None, metavar="URI",
                   help="MLflow tracking URI (default: sqlite:///SUBMISSIONS_DIR/mlflow.db)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    import logging

    from pipelines.config.registry import device_models
    from pipelines.config.settings import load_config
    from pipelines.flows.run import checked_models, parse_models, run_pipeline
    from pipelines.flows.schedule import gpu_sized_on_cpu, machine_config
    from pipelines.models.gnn.device import cuda_summary

    log = logging.getLogger(__name__)
    gpu = cuda_summary() if args.config is None else None  # the schedule for this machine; --config always wins
    name = announce_config(args.config, *machine_config(gpu))
    config = load_config(name, args.overrides)
    labels = {k: v for k, v in (("name", args.name), ("note", args.note)) if v}
    if args.name is not None:
        from pipelines.outputs.run_folders import check_run_name

        check_run_name(args.name)  # a name shaped like a run-id would also name other runs
    models = checked_models(config, parse_models(args.models))
    if args.config is not None and device_models(models):
        gpu = cuda_summary()  # torch only where a model trains on a device
    if gpu_sized_on_cpu(config, models, gpu):
        log.warning(f"warning: config {name}'s GNN schedule is base's, sized for a GPU, and torch sees none: the GNN "
                    "trains on the CPU (hours at real scale); --config cpu is the CPU's schedule")
    if args.collections is not None:  # some collections: their stages and scores, no submission
        from pipelines.core.collection import parse_collections
        from pipelines.flows.run import check_training_root, train_and_blend
        from pipelines.flows.scores import format_scores, scores_table

        check_training_root(args.data_root)
        runs, _ = train_and_blend(config, args.data_root, work_dir=args.work_dir, models=parse_models(args.models),
                                  collections=list(parse_collections(args.collections)), scheduler=args.scheduler,
                                  force=args.force)
        print(format_scores(scores_table(runs)))
        log.info("no submission: it needs all five collections (run without --collections publishes one)")
        return 0
    if args.track == "mlflow":  # the store is opened before the first stage, not after the run is published
        from pipelines.outputs.tracking import check_store, default_uri

        check_store(args.track_uri or default_uri(args.submissions_dir))
    result = run_pipeline(config, args.data_root, work_dir=args.work_dir, models=parse_models(args.models),
                          submissions_dir=args.submissions_dir, scheduler=args.scheduler, force=args.force,
                          extra=labels)
    report_new_run(result.run_id, args.submissions_dir)
    if args.track == "mlflow":
        from pipelines.outputs.tracking import track_run

        track_run(result.run_id, submissions_dir=args.submissions_dir, uri=args.track_uri)
    print(result.describe())
    print(result.submission)
    return 0

