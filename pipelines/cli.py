"""Command line: ``python -m pipelines <command> ...`` (also the ``tpugraphs`` console script).

Each command has an ``_add_<name>`` function declaring its arguments and a ``_run_<name>`` handler.
Handlers import their modules lazily so ``--help`` and light commands stay fast (torch is heavy).
Expected failures raise :class:`PipelineError` and are printed as one clear message, exit code 2.
"""

from __future__ import annotations

import argparse
import errno
import sys
from pathlib import Path
from typing import Callable

from pipelines.errors import PipelineError

_DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EROFS, getattr(errno, "EDQUOT", errno.ENOSPC)})

Handler = Callable[[argparse.Namespace], int | None]


# ----------------------------------------------------------------------------- synth


def _add_synth(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("synth", help="write a synthetic dataset in the exact TpuGraphs on-disk format")
    p.add_argument("--out", type=Path, required=True, help="data root to create (Kaggle layout)")
    p.add_argument("--scale", choices=("tiny", "small", "medium", "full"), default="small")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--variant", type=int, default=0,
                   help="cost-model variant: 0 = the original constants, N >= 1 = constants drawn from "
                        "documented ranges (pipelines/synth/costmodel.py)")
    p.add_argument("--limit", type=int, default=None,
                   help="write at most this many files per collection and split (for benchmarks)")
    p.add_argument("--collections", default=None, help="comma-separated collection names (default: all)")
    p.add_argument("--jobs", type=int, default=1, help="parallel worker processes")
    p.set_defaults(handler=_run_synth)


def _run_synth(args: argparse.Namespace) -> int:
    from pipelines.synth import generate_world

    summary = generate_world(args.out, scale=args.scale, seed=args.seed, limit=args.limit,
                             collections=args.collections, jobs=args.jobs, variant=args.variant)
    print(summary)
    return 0


# ----------------------------------------------------------------------------- submissions


def _add_validate_submission(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("validate-submission", help="check a submission CSV against a data root's test files")
    p.add_argument("--data-root", type=Path, required=True)
    p.add_argument("--split", default="test", choices=("train", "valid", "test"))
    p.add_argument("file", type=Path)
    p.set_defaults(handler=_run_validate_submission)


def _run_validate_submission(args: argparse.Namespace) -> int:
    from pipelines.submission import validate_submission

    rows = validate_submission(args.file, args.data_root, split=args.split)
    print(f"{args.file}: valid submission with {rows} rows")
    return 0


def _add_score(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("score", help="score a submission written for a labelled split (e.g. valid)")
    p.add_argument("--data-root", type=Path, required=True)
    p.add_argument("--split", default="valid", choices=("train", "valid"))
    p.add_argument("--submission", type=Path, required=True)
    p.set_defaults(handler=_run_score)


def _run_score(args: argparse.Namespace) -> int:
    from pipelines.submission import score_submission

    report = score_submission(args.submission, args.data_root, split=args.split)
    print(report.to_text())
    return 0


# ----------------------------------------------------------------------------- demo


def _add_demo(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="the README's main job on the embedded synthetic world")
    p.add_argument("--data-root", type=Path, default=Path("data/synthetic-small"))
    p.add_argument("--scale", choices=("tiny", "small", "full"), default="small")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--work-dir", type=Path, default=Path("data/work"))
    p.add_argument("--submissions-dir", type=Path, default=Path("submissions"))
    p.add_argument("--config", default=None, help="config name (e.g. quick) or TOML file (default: base)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override one config value (repeatable)")
    p.set_defaults(handler=_run_demo)


def _run_demo(args: argparse.Namespace) -> int:
    from pipelines.demo import run_demo

    return run_demo(data_root=args.data_root, scale=args.scale, seed=args.seed, work_dir=args.work_dir,
                    submissions_dir=args.submissions_dir, config=args.config, overrides=args.overrides)


# ----------------------------------------------------------------------------- prepare


def _add_prepare(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("prepare", help="prune graphs, build feature tables, GNN arrays and folds (cached stages)")
    p.add_argument("--data-root", type=Path, required=True)
    p.add_argument("--work-dir", type=Path, default=Path("data/work"))
    p.add_argument("--config", default=None, help="config name (e.g. quick) or TOML file (default: base)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override one config value (repeatable)")
    p.add_argument("--collections", default=None, help="comma-separated collection names (default: all present)")
    p.add_argument("--force", action="store_true", help="recompute even when a cached output exists")
    p.set_defaults(handler=_run_prepare)


def _run_prepare(args: argparse.Namespace) -> int:
    from pipelines.collections import parse_collections
    from pipelines.config import load_config
    from pipelines.prepare import prepare

    config = load_config(args.config, args.overrides)
    collections = None if args.collections is None else list(parse_collections(args.collections))
    prepared = prepare(config, args.data_root, args.work_dir, collections, force=args.force)
    for name, item in prepared.items():
        for stage, output in item.stages.items():
            state = "cached" if item.cached.get(stage) else "computed"
            print(f"{name:<20} {stage:<12} {output.key}  {state:<8}  {output.path}")
    return 0


# ----------------------------------------------------------------------------- train


def _add_train(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="grouped k-fold training of one model per collection (runs prepare first)")
    p.add_argument("--model", required=True,
                   help="registered model: gbdt, random, feature (best single f_* column) or feature:<column>")
    p.add_argument("--collection", "--collections", dest="collections", action="append", default=[],
                   metavar="NAME", help="collection name(s), repeatable or comma-separated (default: all present)")
    p.add_argument("--data-root", type=Path, required=True)
    p.add_argument("--work-dir", type=Path, default=Path("data/work"))
    p.add_argument("--config", default=None, help="config name (e.g. quick) or TOML file (default: base)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override one config value (repeatable)")
    p.add_argument("--force", action="store_true", help="retrain even when a cached output exists (prepare stays cached)")
    p.set_defaults(handler=_run_train)


def _run_train(args: argparse.Namespace) -> int:
    from pipelines.collections import parse_collections
    from pipelines.config import load_config
    from pipelines.prepare import prepare
    from pipelines.train import format_summary, get_adapter, train_model

    config = load_config(args.config, args.overrides)
    get_adapter(args.model)  # an unknown model fails before any data is prepared
    names = [n for text in args.collections for n in text.split(",") if n.strip()]
    collections = list(parse_collections(names)) if names else None
    prepared = prepare(config, args.data_root, args.work_dir, collections)
    for name, item in prepared.items():
        output = train_model(config, item, model=args.model, work_dir=args.work_dir, force=args.force)
        print(format_summary(output))
    return 0


# ----------------------------------------------------------------------------- status and config


def _add_status(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("status", help="list cached stage outputs (complete, incomplete, running, interrupted)")
    p.add_argument("--work-dir", type=Path, default=Path("data/work"))
    p.add_argument("--stage", action="append", default=[], help="show only this stage (repeatable)")
    p.set_defaults(handler=_run_status)


def _run_status(args: argparse.Namespace) -> int:
    from pipelines.engine import format_status, list_stages

    rows = [r for r in list_stages(args.work_dir) if not args.stage or r["stage"] in args.stage]
    if not rows:
        print(f"no stage outputs under {args.work_dir}")
        return 0
    print(format_status(rows))
    return 0


def _add_config(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("config", help="validate a configuration and print it resolved, as TOML")
    p.add_argument("--config", default=None, help="config name (e.g. quick) or TOML file (default: base)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override one config value (repeatable)")
    p.set_defaults(handler=_run_config)


def _run_config(args: argparse.Namespace) -> int:
    from pipelines.config import config_to_toml, load_config
    from pipelines.engine import fingerprint

    config = load_config(args.config, args.overrides)
    print(f"# fingerprint {fingerprint(config)}")
    print(config_to_toml(config), end="")
    return 0


# ----------------------------------------------------------------------------- kaggle


def _add_download(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("download", help="download the competition data from Kaggle into a data root")
    p.add_argument("--data-root", type=Path, required=True,
                   help="folder to receive npz_all/ and sample_submission.csv (other files in it are left alone)")
    p.add_argument("--force", action="store_true", help="download again even if the data root is complete")
    p.set_defaults(handler=_run_download)


def _run_download(args: argparse.Namespace) -> int:
    from pipelines.kaggle_io import download_competition_data

    print(download_competition_data(args.data_root, force=args.force).describe())
    return 0


def _add_submit(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("submit", help="upload a submission CSV to the Kaggle competition")
    p.add_argument("file", type=Path)
    p.add_argument("-m", "--message", required=True, help="submission description shown on Kaggle")
    p.add_argument("--data-root", type=Path, default=None,
                   help="validate the file against this data root's test files before uploading")
    p.set_defaults(handler=_run_submit)


def _run_submit(args: argparse.Namespace) -> int:
    from pipelines.kaggle_io import submit_file

    print(submit_file(args.file, args.message, data_root=args.data_root))
    return 0


# ----------------------------------------------------------------------------- run and ensemble


def _add_run(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="every stage, every model, the ensemble and a validated submission "
                                   "(cached stages are reused); prints the submission path last")
    p.add_argument("--data-root", type=Path, required=True, help="any data root in the Kaggle layout")
    p.add_argument("--work-dir", type=Path, default=Path("data/work"))
    p.add_argument("--config", default=None, help="config name (e.g. quick) or TOML file (default: base)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override one config value (repeatable)")
    p.add_argument("--models", default=None,
                   help="comma-separated models to train and blend (default: the config's ensemble.models)")
    p.add_argument("--submissions-dir", type=Path, default=Path("submissions"))
    p.add_argument("--scheduler", default=None, metavar="ADDRESS",
                   help="Dask scheduler address for the training jobs (workers must share this filesystem); "
                        "default: run.scheduler of the config ('local': local processes)")
    p.add_argument("--force", action="store_true", help="recompute every stage even when cached")
    p.set_defaults(handler=_run_run)


def _run_run(args: argparse.Namespace) -> int:
    from pipelines.config import load_config
    from pipelines.run import parse_models, run_pipeline

    config = load_config(args.config, args.overrides)
    result = run_pipeline(config, args.data_root, work_dir=args.work_dir, models=parse_models(args.models),
                          submissions_dir=args.submissions_dir, scheduler=args.scheduler, force=args.force)
    print(result.describe())
    print(result.submission)
    return 0


def _add_ensemble(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ensemble", help="re-blend the saved predictions of earlier runs into a new submission "
                                        "(no training); prints the submission path last")
    p.add_argument("--runs", nargs="+", required=True, metavar="RUN_ID", help="run-ids under --submissions-dir")
    p.add_argument("--method", choices=("minmax", "rank"), default=None,
                   help="per-graph normalisation (default: the first run's)")
    p.add_argument("--models", default=None,
                   help="comma-separated models to keep (gbdt keeps gbdt@<run-id> of every run)")
    p.add_argument("--work-dir", type=Path, default=None, help="where the runs' stages are (default: as recorded)")
    p.add_argument("--data-root", type=Path, default=None, help="data root to validate against (default: as recorded)")
    p.add_argument("--submissions-dir", type=Path, default=Path("submissions"))
    p.set_defaults(handler=_run_ensemble)


def _run_ensemble(args: argparse.Namespace) -> int:
    from pipelines.run import ensemble_runs, parse_models

    result = ensemble_runs(args.runs, submissions_dir=args.submissions_dir, work_dir=args.work_dir,
                           data_root=args.data_root, method=args.method, models=parse_models(args.models))
    print(result.describe())
    print(result.submission)
    return 0


# ----------------------------------------------------------------------------- report


def _add_report(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="write a self-contained HTML report of a run (scores, worst graphs, "
                                      "importances, ensemble weights)")
    p.add_argument("run_id", metavar="RUN_ID", help="a run-id under --submissions-dir")
    p.add_argument("--submissions-dir", type=Path, default=Path("submissions"))
    p.add_argument("--work-dir", type=Path, default=None, help="where the run's stage outputs are "
                                                               "(default: the work dir its manifest records)")
    p.add_argument("--out", type=Path, default=None, help="output file (default: SUBMISSIONS/RUN_ID/report.html)")
    p.set_defaults(handler=_run_report)


def _run_report(args: argparse.Namespace) -> int:
    from pipelines.report import write_report

    print(write_report(args.run_id, submissions_dir=args.submissions_dir, out=args.out, work_dir=args.work_dir))
    return 0


# ----------------------------------------------------------------------------- evaluate


def _add_evaluate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("evaluate", help="score a run's test submission on a synthetic world's hidden labels, "
                                        "next to the best heuristic (floor) and the noise-free ranking (ceiling)")
    p.add_argument("run_id", metavar="RUN_ID", help="a run-id under --submissions-dir")
    p.add_argument("--data-root", type=Path, required=True, help="the synthetic world the run was made on")
    p.add_argument("--submissions-dir", type=Path, default=Path("submissions"))
    p.add_argument("--work-dir", type=Path, default=None,
                   help="where the run's training outputs are (default: as its manifest records)")
    p.add_argument("--no-models", action="store_true", help="score only the submission, not each model alone")
    p.set_defaults(handler=_run_evaluate)


def _run_evaluate(args: argparse.Namespace) -> int:
    from pipelines.evaluate import evaluate_run

    evaluation, path = evaluate_run(args.run_id, args.data_root, submissions_dir=args.submissions_dir,
                                    work_dir=args.work_dir, with_models=not args.no_models)
    print(evaluation.to_text())
    print(path)
    return 0


# ----------------------------------------------------------------------------- tune


def _add_tune(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("tune", help="Optuna search over a model's hyperparameters for one collection "
                                    "(objective: the grouped-CV OOF score); writes the best trial as a config file")
    p.add_argument("--model", required=True, choices=("gbdt", "gnn"))
    p.add_argument("--collection", required=True, metavar="NAME", help="e.g. layout:xla:random")
    p.add_argument("--trials", type=int, required=True, help="trials to add to the study in this call")
    p.add_argument("--data-root", type=Path, required=True)
    p.add_argument("--work-dir", type=Path, default=Path("data/work"))
    p.add_argument("--config", default=None, help="base config name or TOML file (default: base)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override one base config value (repeatable)")
    p.add_argument("--storage", default=None, metavar="URL",
                   help="Optuna storage URL shared by several machines (default: sqlite file WORK_DIR/tune/studies.db)")
    p.add_argument("--study", default=None, help="study name (default: model, collection and a data+config fingerprint)")
    p.add_argument("--out", type=Path, default=None,
                   help="config file for the best trial (default: WORK_DIR/tune/<study>.toml; manifest next to it)")
    p.add_argument("--seed", type=int, default=0, help="seed of the TPE sampler")
    p.set_defaults(handler=_run_tune)


def _run_tune(args: argparse.Namespace) -> int:
    from pipelines.tune import tune

    result = tune(args.config, args.overrides, model=args.model, collection=args.collection, trials=args.trials,
                  data_root=args.data_root, work_dir=args.work_dir, storage=args.storage, study_name=args.study,
                  out=args.out, seed=args.seed)
    print(result.describe())
    print(result.config_file)
    return 0


# ----------------------------------------------------------------------------- entry point

_COMMANDS: tuple[Callable[[argparse._SubParsersAction], None], ...] = (
    _add_synth,
    _add_validate_submission,
    _add_score,
    _add_demo,
    _add_prepare,
    _add_train,
    _add_status,
    _add_config,
    _add_download,
    _add_submit,
    _add_run,
    _add_ensemble,
    _add_report,
    _add_evaluate,
    _add_tune,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m pipelines", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for add in _COMMANDS:
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handler: Handler = args.handler
    try:
        return int(handler(args) or 0)
    except PipelineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        if exc.errno not in _DISK_ERRNOS:
            raise
        # A full or read-only disk outside a stage (e.g. the submissions folder): a message, not a traceback.
        print(f"error: {exc.filename or 'output'}: cannot write: {exc.strerror or exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
