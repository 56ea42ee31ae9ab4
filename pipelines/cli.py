"""Command line: ``python -m pipelines <command> ...`` (also the ``tpugraphs`` console script).

Each command has an ``_add_<name>`` function declaring its arguments and a ``_run_<name>`` handler.
Handlers import their modules lazily so ``--help`` and light commands stay fast (torch is heavy).
Expected failures raise :class:`PipelineError` and are printed as one clear message.

Exit codes: 0 success; 1 data or pipeline error (a bad or missing file, a failed stage, Kaggle
refused, a full disk); 2 usage error (unknown command or option, a bad argument or config value);
130 interrupted (Ctrl-C, or SIGTERM).
"""

from __future__ import annotations

import argparse
import errno
import sys
from pathlib import Path
from typing import Callable

from pipelines.core import paths
from pipelines.core.errors import ConfigError, PipelineError, redact_credentials
from pipelines.config.registry import MODELS, tunable_models

_DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EROFS, getattr(errno, "EDQUOT", errno.ENOSPC)})

Handler = Callable[[argparse.Namespace], int | None]

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
EXIT_CODES_HELP = ("exit codes: 0 success, 1 data or pipeline error, 2 usage error (bad option, argument or config "
                   "value), 130 interrupted")


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions and epilogs as written; every option that takes a value shows its default, unless
    its help already says it in words ("default: ...")."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text or not action.option_strings or action.nargs == 0 or action.required \
                or action.default is argparse.SUPPRESS:
            return text
        shown = "none" if action.default in (None, [], "") else "%(default)s"
        return f"{text} (default: {shown})".lstrip()


def _chatter(parser: argparse.ArgumentParser, default: object) -> None:
    """The ``--verbose``/``--quiet`` switches: on the main parser (default 0) and on every command (no
    default of its own, so a switch before the command is not reset after it)."""
    chatter = parser.add_mutually_exclusive_group()
    chatter.add_argument("-v", "--verbose", dest="verbosity", action="store_const", const=1, default=default,
                         help="also print debug messages (e.g. GNN epochs of fold jobs run in this process)")
    chatter.add_argument("-q", "--quiet", dest="verbosity", action="store_const", const=-1, default=default,
                         help="print warnings, errors and the command's result only, no progress")


def _parser(sub: argparse._SubParsersAction, name: str, help_text: str, example: str) -> argparse.ArgumentParser:
    """A subcommand parser whose --help ends with one example (``PROG`` is how it was called), with
    the ``--verbose``/``--quiet`` switches of every command."""
    parser = sub.add_parser(name, help=help_text, description=help_text[:1].upper() + help_text[1:] + ".",
                            epilog=f"example:\n  {_prog()} {example}\n\n{EXIT_CODES_HELP}",
                            formatter_class=_HelpFormatter)
    _chatter(parser, argparse.SUPPRESS)
    return parser


def _seed(text: str) -> int:
    """A ``--seed`` value: an integer in [0, 2^32), as numpy and LightGBM take (issue 71)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if not 0 <= value < 2**32:
        raise argparse.ArgumentTypeError(f"must lie in [0, 2^32), got {text}")
    return value


def _version() -> str:
    from pipelines import __version__

    return f"pipelines {__version__} (Python {sys.version.split()[0]})"


def _prog() -> str:
    """``tpugraphs`` when called through the console script, else ``python -m pipelines``."""
    import os

    name = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    return name if name and not name.endswith((".py", "__main__.py")) and name not in ("-c", "-m") \
        and "pytest" not in name else "python -m pipelines"


# ----------------------------------------------------------------------------- synth


def _add_synth(sub: argparse._SubParsersAction) -> None:
    p = _parser(sub, "synth", "write a synthetic dataset in the exact TpuGraphs on-disk format",
                "synth --out data/synthetic-small --scale small --seed 0")
    p.add_argument("--out", type=Path, required=True, help="data root to create (Kaggle layout)")
    p.add_argument("--scale", choices=("tiny", "small", "medium", "full"), default="small")
    p.add_argument("--seed", type=_seed, default=0)
    p.add_argument("--variant", type=int, default=0,
                   help="cost-model variant: 0 = the original constants, N >= 1 = constants drawn from "
                        "documented ranges (pipelines/synth/costmodel.py)")
    p.add_argument("--family", default="reference",
                   help="cost-model family, the rules the measured runtimes follow: reference (the default, "
                        "pipelines/synth/costmodel.py), mxu_strict, copy_fusion, packed_tiles, heldout "
                        "(pipelines/synth/families/)")
    p.add_argument("--recurrent", action=argparse.BooleanOptionalAction, default=None,
                   help="include the recurrent (LSTM while-loop) programs among the xla layout graphs "
                        "(default: yes for every family but reference, whose default worlds keep their bytes)")
    p.add_argument("--limit", type=int, default=None,
                   help="write at most this many files per collection and split (for benchmarks; default: all)")
    p.add_argument("--collections", default=None, help="comma-separated collection names (default: all)")
    p.add_argument("--jobs", type=int, default=1, help="parallel worker processes")
    p.set_defaults(handler=_run_synth)


def _run_synth(args: argparse.Namespace) -> int:
    from pipelines.synth import generate_world

    summary = generate_world(args.out, scale=args.scale, seed=args.seed, limit=args.limit,
                             collections=args.collections, jobs=args.jobs, variant=args.variant,
                             family=args.family, recurrent=args.recurrent)
    print(summary)
    return 0


# ----------------------------------------------------------------------------- submissions


def _add_validate_submission(sub: argparse._SubParsersAction) -> None:
    p = _parser(sub, "validate-submission", "check a submission CSV against a data root's test files",
                "validate-submission --data-root data/kaggle submissions/RUN_ID/submission.csv")
    p.add_argument("--data-root", type=Path, required=True)
    p.add_argument("--split", default="test", choices=("train", "valid", "test"))
    p.add_argument("file", type=Path, metavar="FILE", help="the submission CSV")
    p.set_defaults(handler=_run_validate_submission)


def _run_validate_submission(args: argparse.Namespace) -> int:
    from pipelines.data.submission import validate_submission

    rows = validate_submission(args.file, args.data_root, split=args.split)
    print(f"{args.file}: valid submission with {rows} rows")
    return 0


def _add_score(sub: argparse._SubParsersAction) -> None:
    p = _parser(sub, "score", "score a submission written for a labelled split (e.g. valid; `predict --split valid` "
                              "writes one)",
                "score --data-root data/synthetic-small --split valid submissions/RUN_ID/submission.csv")
    p.add_argument("--data-root", type=Path, required=True)
    p.add_argument("--split", default="valid", choices=("train", "valid"))
    p.add_argument("file", type=Path, nargs="?", metavar="FILE", help="the submission CSV")
    p.add_argument("--submission", dest="submission_option", type=Path, default=None,
                   help=argparse.SUPPRESS)  # the older spelling, still read
    p.set_defaults(handler=_run_score)


def _run_score(args: argparse.Namespace) -> int:
    from pipelines.core.errors import SubmissionError
    from pipelines.data.submission import score_submission

    if (args.file is None) == (args.submission_option is None):
        raise ConfigError("score takes one submission FILE (as validate-submission and submit do)")
    args.submission = args.file if args.file is not None else args.submission_option
    try:
        report = score_submission(args.submission, args.data_root, split=args.split)
    except SubmissionError as exc:
        unknown = [v for v in exc.violations if "unknown ID" in v]
        if unknown and len(unknown) * 2 >= len([v for v in exc.violations if "missing" not in v]):
            raise PipelineError(
                f"{args.submission}: {len(unknown)} of its IDs are not graphs of the {args.split} split of "
                f"{args.data_root}: it ranks another split. The test submissions `run` writes cannot be scored (the "
                "test split has no runtimes); for a valid-split submission of a run trained with "
                "folds.holdout_valid = true: predict --run RUN_ID --split valid --data-root DIR; the cross-validation "
                "scores of every run: runs list") from None
        raise
    print(report.to_text())
    return 0


# ----------------------------------------------------------------------------- demo


def _add_demo(sub: argparse._SubParsersAction) -> None:
    p = _parser(sub, "demo", "the README's main job on the embedded synthetic world",
                "demo --scale tiny")
    p.add_argument("--data-root", type=Path, default=None,
                   help="where the synthetic world is generated or reused (default: data/synthetic-SCALE)")
    p.add_argument("--scale", choices=("tiny", "small", "full"), default="small")
    p.add_argument("--seed", type=_seed, default=0)
    p.add_argument("--work-dir", type=Path, default=paths.WORK_DIR)
    p.add_argument("--submissions-dir", type=Path, default=paths.SUBMISSIONS_DIR)
    p.add_argument("--config", default=None, help="config name (e.g. quick) or TOML file (default: base)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override one config value (repeatable; default: none)")
    p.set_defaults(handler=_run_demo)


def _run_demo(args: argparse.Namespace) -> int:
    from pipelines.flows.demo import demo_summary, run_demo

    data_root = args.data_root if args.data_root is not None else paths.synthetic_world(args.scale)
    result = run_demo(data_root=data_root, scale=args.scale, seed=args.seed, work_dir=args.work_dir,
                      submissions_dir=args.submissions_dir, config=args.config, overrides=args.overrides)
    _report_new_run(result.run_id, args.submissions_dir)
    print(demo_summary(result, data_root, args.scale, args.seed, args.work_dir))
    print(result.submission)  # last: the command's result, printed (not logged) so --quiet keeps it
    return 0


def _report_new_run(run_id: str, submissions_dir: Path) -> None:
    """Every command that publishes a run draws its report.html (the flows only write run outputs)."""
    from pipelines.reports.report import write_run_report

    write_run_report(run_id, submissions_dir)


# ----------------------------------------------------------------------------- prepare


def _add_prepare(sub: argparse._SubParsersAction) -> None:
    p = _parser(sub, "prepare", "prune graphs, build feature tables, GNN arrays and folds (cached stages)",
                "prepare --data-root data/kaggle --collections layout:xla:default")
    p.add_argument("--data-root", type=Path, required=True)
    p.add_argument("--work-dir", type=Path, default=paths.WORK_DIR)
    p.add_argument("--config", default=None, help="config name (e.g. quick) or TOML file (default: base)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override one config value (repeatable; default: none)")
    p.add_argument("--collections", default=None, help="comma-separated collection names (default: all present)")
    p.add_argument("--force", action="store_true", help="recompute even when a cached output exists")
    p.add_argument("--scheduler", default=None, metavar="ADDRESS",
                   help="Dask scheduler address for the per-file jobs (workers must share this filesystem); "
                        "default: run.scheduler of the config ('local': run.n_jobs local processes)")
    p.set_defaults(handler=_run_prepare)


def _run_prepare(args: argparse.Namespace) -> int:
    from pipelines.core.collection import parse_collections
    from pipelines.config.settings import load_config
    from pipelines.core.parallel import fan_out
    from pipelines.flows.prepare import prepare

    config = load_config(args.config, args.overrides)
    collections = None if args.collections is None else list(parse_collections(args.collections))
    with fan_out(args.scheduler if args.scheduler is not None else config.run.scheduler):
        prepared = prepare(config, args.data_root, args.work_dir, collections, force=args.force)
    for name, item in prepared.items():
        for stage, output in item.stages.items():
            state = "cached" if item.cached.get(stage) else "computed"
            print(f"{name:<20} {stage:<12} {output.key}  {state:<8}  {output.path}")
    return 0


# ----------------------------------------------------------------------------- train


def _add_train(sub: argparse._SubParsersAction) -> None:
    p = _parser(sub, "train", "grouped k-fold training of one model per collection (runs prepare first)",
                "train --model gnn --collection tile:xla --data-root data/synthetic-small --config quick")
    p.add_argument("--model", required=True,
                   help=f"registered model: {', '.join(MODELS)} (feature: the best single f_* "
                        "column; feature:<column> fixes it)")
    p.add_argument("--collection", "--collections", dest="collections", action="append", default=[],
                   metavar="NAME", help="collection name(s), repeatable or comma-separated (default: all present)")
    p.add_argument("--data-root", type=Path, required=True)
    p.add_argument("--work-dir", type=Path, default=paths.WORK_DIR)
    p.add_argument("--config", default=None, help="config name (e.g. quick) or TOML file (default: base)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override one config value (repeatable; default: none)")
    p.add_argument("--force", action="store_true", help="retrain even when a cached output exists (prepare stays cached)")
    p.set_defaults(handler=_run_train)


def _run_train(args: argparse.Namespace) -> int:
    from pipelines.core.collection import parse_collections
    from pipelines.config.settings import load_config
    from pipelines.flows.prepare import prepare
    from pipelines.config.registry import get_adapter
    from pipelines.training.fit import format_summary, train_model

    config = load_config(args.config, args.overrides)
    get_adapter(args.model)  # an unknown model fails before any data is prepared
    names = [n for text in args.collections for n in text.split(",") if n.strip()]
    collections = list(parse_collections(names)) if names else None
    from pipelines.flows.prepare import collections_to_prepare
    from pipelines.flows.run import check_devices

    # a GPU asked for and absent fails before the data stages, as in `run`
    chosen = collections_to_prepare(config, args.data_root, collections)[0]
    check_devices(config, [args.model], chosen)
    from pipelines.training.fit import check_models

    check_models([args.model], chosen)
    prepared = prepare(config, args.data_root, args.work_dir, collections)
    for name, item in prepared.items():
        output = train_model(config, item, model=args.model, work_dir=args.work_dir, force=args.force)
        print(format_summary(output))
    return 0


# ----------------------------------------------------------------------------- status and config


def _add_status(sub: argparse._SubParsersAction) -> None:
    p = _parser(sub, "status", "list cached stage outputs (complete, incomplete, running, interrupted); with "
                               "--explain, the stage DAG: each stage's inputs, code roots, settings and key",
                "status --stage train-gbdt\n  "
                f"{_prog()} status --explain --data-root data/synthetic-small --config demo --collections tile:xla")
    p.add_argument("--work-dir", type=Path, default=paths.WORK_DIR)
    p.add_argument("--stage", action="append", default=[],
                   help="show only this stage (repeatable; default: every stage)")
    p.add_argument("--submissions-dir", type=Path, default=paths.SUBMISSIONS_DIR,
                   help="also clean interrupted publishes here and list incomplete run folders")
    p.add_argument("--explain", action="store_true",
                   help="print the stage DAG instead: per stage and collection its inputs, code roots, the settings "
                        "in its key with their values, and its key where the raw files (--data-root) and the "
                        "outputs of its inputs in the work dir allow")
    p.add_argument("--data-root", type=Path, default=None,
                   help="with --explain: the data root whose raw files key the stages (default: none, no keys)")
    p.add_argument("--config", default=None,
                   help="with --explain: config name (e.g. quick) or TOML file (default: base)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="with --explain: override one config value (repeatable; default: none)")
    p.add_argument("--models", default=None,
                   help="with --explain: comma-separated models (default: the config's ensemble.models)")
    p.add_argument("--collections", default=None, metavar="NAMES",
                   help="with --explain: comma-separated collections (default: those with a train directory "
                        "under --data-root, else all five)")
    p.set_defaults(handler=_run_status)


def _run_status(args: argparse.Namespace) -> int:
    from pipelines.core.engine import format_status, list_stages
    from pipelines.outputs.run_folders import tidy_submissions

    if args.explain:
        return _explain_status(args)
    for item in tidy_submissions(args.submissions_dir):
        print(f"incomplete run folder {item['path']} (no manifest.json: publishing was interrupted; "
              f"not a validated run; holds {', '.join(item['files'])})")
    from pipelines.outputs.cache_gc import folder_size, format_size

    rows = [r for r in list_stages(args.work_dir) if not args.stage or r["stage"] in args.stage]
    if not rows:
        print(f"no stage outputs under {args.work_dir}")
        return 0
    sizes = [folder_size(r["path"]) for r in rows]
    lines = format_status(rows).splitlines()  # a header, then one line per row
    shown = ["SIZE", *(format_size(size) for size in sizes)]
    width = max(len(text) for text in shown)
    print("\n".join(f"{text:>{width}}  {line}" for text, line in zip(shown, lines)))
    print(f"{len(rows)} stage folder(s), {format_size(sum(sizes))} under {args.work_dir}")
    return 0


def _explain_status(args: argparse.Namespace) -> int:
    from pipelines.config.settings import load_config
    from pipelines.core.collection import parse_collections
    from pipelines.flows.explain import explain_pipeline
    from pipelines.flows.run import checked_models, parse_models

    config = load_config(args.config, args.overrides)
    collections = None if args.collections is None else list(parse_collections(args.collections))
    print(explain_pipeline(config, work_dir=args.work_dir, models=checked_models(config, parse_models(args.models)),
                           data_root=args.data_root, collections=collections, only=args.stage))
    return 0


def _add_gc(sub: argparse._SubParsersAction) -> None:
    p = _parser(sub, "gc", "list (or, with --delete, remove) the cached stage outputs that no run references, with "
                           "their sizes; a dry run by default",
                "gc --work-dir data/work --submissions-dir submissions --delete")
    p.add_argument("--work-dir", type=Path, default=paths.WORK_DIR)
    p.add_argument("--submissions-dir", type=Path, action="append", default=None,
                   help="run folders whose manifests keep their stages (repeatable; default: submissions)")
    p.add_argument("--delete", action="store_true", help="remove them (default: only list them)")
    p.set_defaults(handler=_run_gc)


def _run_gc(args: argparse.Namespace) -> int:
    from pipelines.outputs.cache_gc import collect, format_garbage

    dirs = args.submissions_dir or [paths.SUBMISSIONS_DIR]
    missing = [d for d in dirs if not Path(d).is_dir()]
    if missing and not args.delete:
        print(f"note: no run folders at {', '.join(map(str, missing))}: no run keeps a stage there")
    elif missing:  # deleting everything because a path was mistyped would be a loss
        raise PipelineError(f"{', '.join(map(str, missing))}: no such submissions folder; gc --delete keeps the "
                            "stages of the runs there, so it must exist")
    print(format_garbage(collect(args.work_dir, dirs, delete=args.delete), deleted=args.delete))
    return 0


def _add_config(sub: argparse._SubParsersAction) -> None:
    p = _parser(sub, "config", "validate a configuration and print it resolved, as TOML",
                "config --config demo --set gnn.epochs=4")
    p.add_argument("--config", default=None, help="config name (e.g. quick) or TOML file (default: base)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override one config value (repeatable; default: none)")
    p.set_defaults(handler=_run_config)


def _run_config(args: argparse.Namespace) -> int:
    from pipelines.config.settings import config_to_toml, load_config
    from pipelines.core.engine import fingerprint

    config = load_config(args.config, args.overrides)
    from pipelines.flows.prepare import check_feature_exclusions

    check_feature_exclusions(config)  # the rule prepare applies, so `config` validates what a run would
    print(f"# fingerprint {fingerprint(config)}")
    print(config_to_toml(config), end="")
    return 0


# ----------------------------------------------------------------------------- kaggle


def _add_download(sub: argparse._SubParsersAction) -> None:
    p = _parser(sub, "download", "download the competition data from Kaggle into a data root",
                "download --data-root data/kaggle")
    p.add_argument("--data-root", type=Path, required=True,
                   help="folder to receive npz_all/ and sample_submission.csv (other files in it are left alone)")
    p.add_argument("--force", action="store_true", help="download again even if the data root is complete")
    p.set_defaults(handler=_run_download)


def _run_download(args: argparse.Namespace) -> int:
    from pipelines.outputs.kaggle_io import download_competition_data

    print(download_competition_data(args.data_root, force=args.force).describe())
    return 0


def _add_submit(sub: argparse._SubParsersAction) -> None:
    p = _parser(sub, "submit", "upload a run's submission (or a CSV file) to the Kaggle competition",
                "submit 20261122T120000Z-1a2b3c4d        # or: submit FILE -m MESSAGE --data-root DIR")
    p.add_argument("target", metavar="RUN_ID|FILE",
                   help="a run-id under --submissions-dir or a run folder (validated against the data root the "
                        "run recorded; what was sent is recorded in the run folder), or a CSV file")
    p.add_argument("-m", "--message", default=None,
                   help="submission description shown on Kaggle (default for a run: RUN_ID CV <combined score>; "
                        "required for a file)")
    p.add_argument("--data-root", type=Path, default=None,
                   help="validate against this data root's test files (default for a run: the one it recorded)")
    p.add_argument("--submissions-dir", type=Path, default=paths.SUBMISSIONS_DIR)
    p.add_argument("--allow-synthetic", action="store_true",
                   help="upload even a run made on a synthetic world (refused otherwise: Kaggle would score noise)")
    p.set_defaults(handler=_run_submit)


def _run_submit(args: argparse.Namespace) -> int:
    from pipelines.outputs.kaggle_io import submit_file, submit_run

    target = Path(args.target)
    if target.is_file() or target.suffix == ".csv":
        if args.message is None:
            raise ConfigError("submitting a file needs a message: -m MESSAGE (a run-id gets a default one)")
        print(submit_file(target, args.message, data_root=args.data_root, allow_synthetic=args.allow_synthetic))
        return 0
    run_id, submissions_dir = args.target, args.submissions_dir
    if target.is_dir() and (target / "manifest.json").is_file():  # a run folder's path works too
        run_id, submissions_dir = target.name, target.parent
    print(submit_run(run_id, submissions_dir=submissions_dir, message=args.message, data_root=args.data_root,
                     allow_synthetic=args.allow_synthetic))
    return 0


def _add_submissions(sub: argparse._SubParsersAction) -> None:
    p = _parser(sub, "submissions", "Kaggle's side of the submissions: `sync` fetches the public scores of earlier "
                                    "uploads and files them with their runs (runs list shows them beside the CV)",
                "submissions sync")
    actions = p.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True
    sync = actions.add_parser("sync", help="fetch this account's submissions and their scores from Kaggle",
                              epilog=f"example:\n  {_prog()} submissions sync\n\n{EXIT_CODES_HELP}")
    sync.add_argument("--submissions-dir", type=Path, default=paths.SUBMISSIONS_DIR)
    p.set_defaults(handler=_run_submissions)


def _run_submissions(args: argparse.Namespace) -> int:
    from pipelines.outputs.leaderboard import sync_leaderboard

    print(sync_leaderboard(args.submissions_dir).describe())
    return 0


# ----------------------------------------------------------------------------- run and ensemble


def _add_run(sub: argparse._SubParsersAction) -> None:
    p = _parser(sub, "run", "every stage, every model, the ensemble, a validated submission and report.html "
                            "(cached stages are reused); prints the submission path last",
                "run --data-root data/kaggle --config quick --models gbdt,gnn")
    p.add_argument("--data-root", type=Path, required=True, help="any data root in the Kaggle layout")
    p.add_argument("--work-dir", type=Path, default=paths.WORK_DIR)
    p.add_argument("--config", default=None,
                   help="config name (e.g. quick) or TOML file (default: the machine's: gpu, base's schedule, "
                        "where torch sees a CUDA GPU, else cpu; base is sized for a GPU, hours on a CPU)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override one config value (repeatable; default: none)")
    p.add_argument("--models", default=None,
                   help="comma-separated models to train and blend (default: the config's ensemble.models, "
                        "each of which must be one of run.models, the models the config allows)")
    p.add_argument("--submissions-dir", type=Path, default=paths.SUBMISSIONS_DIR)
    p.add_argument("--scheduler", default=None, metavar="ADDRESS",
                   help="Dask scheduler address for the data-stage and training jobs (workers must share this filesystem); "
                        "default: run.scheduler of the config ('local': local processes)")
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
    p.set_defaults(handler=_run_run)


def _run_run(args: argparse.Namespace) -> int:
    import logging

    from pipelines.config.settings import load_config
    from pipelines.flows.run import checked_models, gpu_sized_on_cpu, machine_config, parse_models, run_pipeline
    from pipelines.models.gnn.device import cuda_summary

    log = logging.getLogger(__name__)
    gpu: str | None = None
    if args.config is None:  # the schedule for this machine; an explicit --config always wins
        gpu = cuda_summary()
        name, why = machine_config(gpu)
        log.info(f"config: {name} (no --config given; {why})")
    else:
        name = args.config
        log.info(f"config: {name} (--config)")
    config = load_config(name, args.overrides)
    labels = {k: v for k, v in (("name", args.name), ("note", args.note)) if v}
    models = checked_models(config, parse_models(args.models))
    if args.config is not None and any(m.partition(":")[0] == "gnn" for m in models):
        gpu = cuda_summary()  # torch only where the GNN trains
    if gpu_sized_on_cpu(config, models, gpu):
        log.warning(f"warning: config {name}'s GNN schedule is base's, sized for a GPU, and torch sees none: the GNN "
                    "trains on the CPU (hours at real scale); --config cpu is the CPU's schedule")
    if args.collections is not None:  # some collections: their stages and scores, no submission
        from pipelines.core.collection import parse_collections
        from pipelines.flows.run import check_training_root, format_scores, scores_table, train_and_blend

        check_training_root(args.data_root)
        runs, _ = train_and_blend(config, args.data_root, work_dir=args.work_dir, models=parse_models(args.models),
                                  collections=list(parse_collections(args.collections)), scheduler=args.scheduler,
                                  force=args.force)
        print(format_scores(scores_table(runs)))
        log.info("no submission: it needs all five collections (run without --collections publishes one)")
        return 0
    result = run_pipeline(config, args.data_root, work_dir=args.work_dir, models=parse_models(args.models),
                          submissions_dir=args.submissions_dir, scheduler=args.scheduler, force=args.force,
                          extra=labels)
    _report_new_run(result.run_id, args.submissions_dir)
    if args.track == "mlflow":
        from pipelines.outputs.tracking import track_run

        track_run(result.run_id, submissions_dir=args.submissions_dir, uri=args.track_uri)
    print(result.describe())
    print(result.submission)
    return 0


def _add_ensemble(sub: argparse._SubParsersAction) -> None:
    p = _parser(sub, "ensemble", "re-blend the saved predictions of earlier runs into a new submission "
                                 "(no training); prints the submission path last",
                "ensemble --runs RUN_A RUN_B --method rank")
    p.add_argument("--runs", nargs="+", required=True, metavar="RUN_ID", help="run-ids under --submissions-dir")
    p.add_argument("--method", choices=("minmax", "rank"), default=None,
                   help="per-graph normalisation (default: the first run's)")
    p.add_argument("--min-gain-se", type=float, default=None,
                   help="keep the fitted blend only if its OOF gain over the best single model exceeds this "
                        "many standard errors, else that model alone (default: the first run's; 0: always)")
    p.add_argument("--gain-at", choices=("oof", "test-runs"), default=None,
                   help="test the blend's gain as measured on OOF, or as expected at the test's averaged runs "
                        "(default: the first run's)")
    p.add_argument("--models", default=None,
                   help="comma-separated models to keep (gbdt keeps gbdt@<run-id> of every run; default: all)")
    p.add_argument("--work-dir", type=Path, default=None, help="where the runs' stages are (default: as recorded)")
    p.add_argument("--data-root", type=Path, default=None, help="data root to validate against (default: as recorded)")
    p.add_argument("--submissions-dir", type=Path, default=paths.SUBMISSIONS_DIR)
    p.set_defaults(handler=_run_ensemble)


def _run_ensemble(args: argparse.Namespace) -> int:
    from pipelines.flows.run import ensemble_runs, parse_models

    result = ensemble_runs(args.runs, submissions_dir=args.submissions_dir, work_dir=args.work_dir,
                           data_root=args.data_root, method=args.method, min_gain_se=args.min_gain_se,
                           gain_at=args.gain_at,
                           models=parse_models(args.models))
    _report_new_run(result.run_id, args.submissions_dir)
    print(result.describe())
    print(result.submission)
    return 0


# ----------------------------------------------------------------------------- report


def _add_report(sub: argparse._SubParsersAction) -> None:
    p = _parser(sub, "report", "write a self-contained HTML report of a run (scores, worst graphs, "
                               "importances, ensemble weights)",
                "report 20261122T120000Z-1a2b3c4d --out /tmp/report.html")
    p.add_argument("run_id", metavar="RUN_ID", help="a run-id under --submissions-dir")
    p.add_argument("--submissions-dir", type=Path, default=paths.SUBMISSIONS_DIR)
    p.add_argument("--work-dir", type=Path, default=None, help="where the run's stage outputs are "
                                                               "(default: the work dir its manifest records)")
    p.add_argument("--out", type=Path, default=None, help="output file (default: SUBMISSIONS/RUN_ID/report.html)")
    p.set_defaults(handler=_run_report)


def _run_report(args: argparse.Namespace) -> int:
    from pipelines.reports.report import write_report

    print(write_report(args.run_id, submissions_dir=args.submissions_dir, out=args.out, work_dir=args.work_dir))
    return 0


# ----------------------------------------------------------------------------- runs and predict


def _add_runs(sub: argparse._SubParsersAction) -> None:
    p = _parser(sub, "runs", "list the runs with their CV (and public LB) scores, compare two with a paired test, "
                            "remove one, or log one to MLflow",
                "runs list --sort score      # or: runs compare RUN_A RUN_B")
    actions = p.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True
    listing = actions.add_parser("list", help="one line per run: date, data root, models, CV per collection and "
                                              "combined, seeds, wall time, submitted",
                                 epilog=f"example:\n  {_prog()} runs list --sort score --limit 10\n\n{EXIT_CODES_HELP}")
    listing.add_argument("--sort", choices=("date", "score", "lb", "wall", "id"), default="date",
                         help="date/id: oldest first; score (CV), lb (public leaderboard): best first; wall: fastest "
                              "first")
    listing.add_argument("--reverse", action="store_true", help="reverse the order")
    listing.add_argument("--limit", type=int, default=None, metavar="N", help="show the first N rows only")
    listing.add_argument("--submitted", action="store_true", help="only runs that were submitted to Kaggle")
    listing.add_argument("--data-root", default=None, help="only runs on this data root")
    listing.add_argument("--submissions-dir", type=Path, default=paths.SUBMISSIONS_DIR)
    listing.add_argument("--all", action="store_true",
                         help="a row per run folder (default: one per distinct result; a cached rerun is counted "
                              "in SAME)")
    listing.add_argument("--work-dir", type=Path, default=None,
                         help="also list the train stages no run used and the tune studies of this work dir")
    compare = actions.add_parser("compare", help="CV scores per collection and model side by side, a paired test of "
                                                 "the difference per collection, and the config difference",
                                 epilog=f"example:\n  {_prog()} runs compare 1a2b3c4d 9f8e7d6c\n\n{EXIT_CODES_HELP}")
    compare.add_argument("run_a", metavar="RUN_A", help="a run-id, a unique prefix of it or of its hex part, or a name")
    compare.add_argument("run_b", metavar="RUN_B")
    compare.add_argument("--submissions-dir", type=Path, default=paths.SUBMISSIONS_DIR)
    compare.add_argument("--no-test", action="store_true",
                         help="manifests only: skip the paired tests (they read per-graph scores from the stages)")
    remove = actions.add_parser("rm", help="delete a run folder (its stages stay); asks first; a submitted run "
                                           "only with --force",
                                epilog=f"example:\n  {_prog()} runs rm 1a2b3c4d\n\n{EXIT_CODES_HELP}")
    remove.add_argument("run_id", metavar="RUN_ID")
    remove.add_argument("--submissions-dir", type=Path, default=paths.SUBMISSIONS_DIR)
    remove.add_argument("-y", "--yes", action="store_true", help="do not ask")
    remove.add_argument("--force", action="store_true", help="also remove a run that was submitted to Kaggle")
    track = actions.add_parser("track", help="log a published run to a local MLflow store",
                               epilog=f"example:\n  {_prog()} runs track 1a2b3c4d\n\n{EXIT_CODES_HELP}")
    track.add_argument("run_id", metavar="RUN_ID")
    track.add_argument("--submissions-dir", type=Path, default=paths.SUBMISSIONS_DIR)
    track.add_argument("--uri", default=None, metavar="URI",
                       help="MLflow tracking URI (default: sqlite:///SUBMISSIONS_DIR/mlflow.db)")
    p.set_defaults(handler=_run_runs)


def _run_runs(args: argparse.Namespace) -> int:
    from pipelines.outputs import runs_table as runs

    from pipelines.outputs.run_folders import read_run_manifest, resolve_run_id

    if args.action == "compare":
        a_id, b_id = resolve_run_id(args.submissions_dir, args.run_a), resolve_run_id(args.submissions_dir, args.run_b)
        a = read_run_manifest(args.submissions_dir, a_id)
        b = read_run_manifest(args.submissions_dir, b_id)
        print(runs.compare_runs(a_id, a, b_id, b))
        if not args.no_test:
            from pipelines.outputs import graph_scores as gs

            scores_a, missing_a = gs.graph_scores_of_run(a)
            scores_b, missing_b = gs.graph_scores_of_run(b)
            tests = gs.compare_scores(scores_a, scores_b, gs.seed_scores(a), gs.seed_scores(b))
            print()
            print(gs.format_tests(tests, [f"A {m}" for m in missing_a] + [f"B {m}" for m in missing_b]))
        return 0
    if args.action == "rm":
        from pipelines.outputs.run_folders import check_removable, remove_run_folder

        run_id = resolve_run_id(args.submissions_dir, args.run_id)
        check_removable(args.submissions_dir, run_id)
        if not args.yes:
            if not sys.stdin.isatty():
                raise ConfigError(f"runs rm {run_id}: not asking on a non-interactive input; pass --yes")
            answer = input(f"remove run folder {Path(args.submissions_dir) / run_id}? [y/N] ")
            if answer.strip().lower() not in ("y", "yes"):
                print("kept")
                return 0
        print(f"removed {remove_run_folder(args.submissions_dir, run_id, force=args.force)}")
        return 0
    if args.action == "track":
        from pipelines.outputs.tracking import track_run

        record = track_run(args.run_id, submissions_dir=args.submissions_dir, uri=args.uri)
        print(f"{record['uri']} experiment {record['experiment']} run {record['mlflow_run_id']}")
        return 0
    if args.limit is not None and args.limit < 1:
        raise ConfigError(f"--limit must be at least 1, got {args.limit}")
    rows = runs.load_runs(args.submissions_dir)
    if args.work_dir is not None:
        manifests = [m for m in (runs.read_manifest(Path(args.submissions_dir) / r["run_id"]) for r in rows) if m]
        rows += runs.load_work_results(args.work_dir, rows, manifests)
    rows = runs.collapse_reruns(rows, keep_all=args.all)
    rows = runs.filter_runs(rows, submitted_only=args.submitted, data_root=args.data_root)
    rows = runs.sort_runs(rows, args.sort, args.reverse)
    print(runs.format_runs(rows[:args.limit] if args.limit else rows))
    return 0


def _add_predict(sub: argparse._SubParsersAction) -> None:
    p = _parser(sub, "predict", "rank the test graphs of a data root with a run's saved fold models and blend "
                                "weights, without training; writes a validated submission in a new run folder",
                "predict --run 20261122T120000Z-1a2b3c4d --data-root data/new-graphs")
    p.add_argument("--run", required=True, metavar="RUN_ID", help="a run-id under --submissions-dir")
    p.add_argument("--data-root", type=Path, required=True,
                   help="data root in the Kaggle layout whose test graphs are ranked (train/valid may be absent)")
    p.add_argument("--work-dir", type=Path, default=None,
                   help="where the run's stages are; the new data's stages go there too (default: as recorded)")
    p.add_argument("--submissions-dir", type=Path, default=paths.SUBMISSIONS_DIR)
    p.add_argument("--split", choices=("test", "valid"), default="test",
                   help="rank this split (valid: for `score`, only for runs whose fold models held it out, "
                        "folds.holdout_valid = true)")
    p.add_argument("--threads", type=int, default=0,
                   help="threads per model when predicting (default 0: those the run's fold jobs used, which "
                        "reproduces its scores to the last bit)")
    p.set_defaults(handler=_run_predict)


def _run_predict(args: argparse.Namespace) -> int:
    from pipelines.flows.predict import predict_run

    result = predict_run(args.run, args.data_root, submissions_dir=args.submissions_dir, work_dir=args.work_dir,
                         split=args.split, num_threads=max(0, args.threads))
    _report_new_run(result.run_id, args.submissions_dir)
    print(result.submission)
    return 0


# ----------------------------------------------------------------------------- real programs (XLA HLO)


def _add_featurize(sub: argparse._SubParsersAction) -> None:
    p = _parser(sub, "featurize", "turn an XLA HLO program (a serialized HloModuleProto .pb, or HLO text .txt/.hlo) "
                                  "into TpuGraphs graphs: OUT/<stem>.npz (layout, with candidate configs) and, "
                                  "where the module has fusions, OUT/<stem>-tiles/*.npz (tile); needs the hlo extra",
                "featurize dumps/module_0001.jit_step.before_optimizations.hlo.pb --out data/mine --configs 1000")
    p.add_argument("program", type=Path, metavar="PROGRAM", help="a .pb (HloModuleProto or HloProto) or HLO text file")
    p.add_argument("--out", type=Path, required=True, help="folder for <stem>.npz, <stem>.json and <stem>-tiles/")
    p.add_argument("--configs", type=int, default=1000, help="candidate layout configs to write (default 1000)")
    p.add_argument("--search", choices=("random", "default"), default="random",
                   help="how the candidates are drawn: as the random or as the default collections' search")
    p.add_argument("--tile-configs", type=int, default=100, help="candidate tile configs per fusion (default 100)")
    p.add_argument("--no-tiles", action="store_true", help="write no tile graphs")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(handler=_run_featurize)


def _run_featurize(args: argparse.Namespace) -> int:
    from pipelines.hlo import featurize_program

    result = featurize_program(args.program, args.out, configs=args.configs, search=args.search, seed=args.seed,
                               tiles=not args.no_tiles, tile_configs_per_fusion=args.tile_configs)
    s = result.summary
    print(f"{args.program}: {s['nodes']} nodes, {s['edges']} edges, {s['configurable_nodes']} configurable, "
          f"{s['fusions']} fusion(s)")
    for path in [result.layout_path, *result.tile_paths, result.sidecar]:
        if path is not None:
            print(path)
    return 0


def _add_rank(sub: argparse._SubParsersAction) -> None:
    p = _parser(sub, "rank", "rank candidate layout (and fusion tile) configurations of your own HLO program with a "
                             "run's saved models: per configurable node its predicted best minor_to_major order, "
                             "and the top configs with their predicted relative cost; needs the hlo extra",
                "rank --run 20261122T120000Z-1a2b3c4d dumps/module_0001.jit_step.before_optimizations.txt --configs 500")
    p.add_argument("program", type=Path, metavar="PROGRAM", help="a .pb (HloModuleProto or HloProto) or HLO text file")
    p.add_argument("--run", required=True, metavar="RUN_ID", help="a run-id under --submissions-dir")
    p.add_argument("--out", type=Path, default=None,
                   help="folder for rank.json, rank.txt and the data root built (default: ranks/<stem>-<run>)")
    p.add_argument("--configs", type=int, default=1000, help="candidate layout configs per search (default 1000)")
    p.add_argument("--tile-configs", type=int, default=100, help="candidate tile configs per fusion (default 100)")
    p.add_argument("--top", type=int, default=5, help="configs shown per graph (default 5)")
    p.add_argument("--source", choices=("xla", "nlp"), default="xla",
                   help="whose layout models rank the program: layout:xla:* (default) or layout:nlp:*")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--work-dir", type=Path, default=None,
                   help="where the run's stages are; the new data's stages go there too (default: as recorded)")
    p.add_argument("--submissions-dir", type=Path, default=paths.SUBMISSIONS_DIR)
    p.add_argument("--threads", type=int, default=0, help="threads per model when predicting (0: as the run)")
    p.set_defaults(handler=_run_rank)


def _run_rank(args: argparse.Namespace) -> int:
    from pipelines.flows.rank import format_ranking, rank_program

    if args.configs < 1 or args.top < 1 or args.tile_configs < 1:
        raise ConfigError("--configs, --tile-configs and --top must be at least 1")
    report, out = rank_program(args.run, args.program, out_dir=args.out, configs=args.configs,
                               tile_configs=args.tile_configs, top=args.top, seed=args.seed, source=args.source,
                               submissions_dir=args.submissions_dir, work_dir=args.work_dir,
                               num_threads=max(0, args.threads))
    print(format_ranking(report), end="")
    print(out / "rank.json")
    return 0


# ----------------------------------------------------------------------------- evaluate


def _add_evaluate(sub: argparse._SubParsersAction) -> None:
    p = _parser(sub, "evaluate", "score a run's test submission on a synthetic world's hidden labels, next to the "
                                 "best heuristic (floor) and the noise-free ranking (ceiling)",
                "evaluate 20261122T120000Z-1a2b3c4d --data-root data/synthetic-medium-v1")
    p.add_argument("run_id", metavar="RUN_ID", help="a run-id under --submissions-dir")
    p.add_argument("--data-root", type=Path, required=True, help="the synthetic world the run was made on")
    p.add_argument("--submissions-dir", type=Path, default=paths.SUBMISSIONS_DIR)
    p.add_argument("--work-dir", type=Path, default=None,
                   help="where the run's training outputs are (default: as its manifest records)")
    p.add_argument("--no-models", action="store_true", help="score only the submission, not each model alone")
    p.add_argument("--per-graph", action="store_true",
                   help="also print every test graph: program family and size, each score, share of its ceiling "
                        "(worst first); evaluation.json holds it either way")
    p.set_defaults(handler=_run_evaluate)


def _run_evaluate(args: argparse.Namespace) -> int:
    from pipelines.flows.evaluate import evaluate_run

    evaluation, path = evaluate_run(args.run_id, args.data_root, submissions_dir=args.submissions_dir,
                                    work_dir=args.work_dir, with_models=not args.no_models)
    print(evaluation.to_text())
    from pipelines.flows.evaluate import per_graph_table, per_graph_text, program_family_table, program_family_text
    from pipelines.synth.world import program_families, program_kinds

    print("\nper program family (submission):")
    print(program_family_text(program_family_table(evaluation, program_kinds(args.data_root))))
    if args.per_graph:
        print("\nper test graph (share: submission / ceiling, worst first):")
        print(per_graph_text(per_graph_table(evaluation, program_families(args.data_root))))
    print(path)
    return 0


# ----------------------------------------------------------------------------- tune


def _add_tune(sub: argparse._SubParsersAction) -> None:
    p = _parser(sub, "tune", "Optuna search over a model's hyperparameters for one collection (objective: the "
                             "grouped-CV OOF score); writes the best trial as a config file",
                "tune --model gbdt --collection layout:xla:random --trials 20 --data-root data/synthetic-small")
    p.add_argument("--model", required=True, choices=tunable_models())
    p.add_argument("--collection", required=True, metavar="NAME", help="e.g. layout:xla:random")
    p.add_argument("--trials", type=int, required=True, help="trials to add to the study in this call")
    p.add_argument("--data-root", type=Path, required=True)
    p.add_argument("--work-dir", type=Path, default=paths.WORK_DIR)
    p.add_argument("--config", default=None, help="base config name or TOML file (default: base)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override one base config value (repeatable; default: none)")
    p.add_argument("--storage", default=None, metavar="URL",
                   help="Optuna storage URL shared by several machines (default: sqlite file WORK_DIR/tune/studies.db)")
    p.add_argument("--study", default=None, help="study name (default: model, collection and a data+config fingerprint)")
    p.add_argument("--out", type=Path, default=None,
                   help="config file for the best trial (default: WORK_DIR/tune/<study>.toml; manifest next to it)")
    p.add_argument("--seed", type=_seed, default=0, help="seed of the TPE sampler")
    p.set_defaults(handler=_run_tune)


def _run_tune(args: argparse.Namespace) -> int:
    from pipelines.flows.tune import tune

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
    _add_gc,
    _add_config,
    _add_download,
    _add_submit,
    _add_submissions,
    _add_run,
    _add_ensemble,
    _add_report,
    _add_runs,
    _add_predict,
    _add_featurize,
    _add_rank,
    _add_evaluate,
    _add_tune,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=_prog(), description="TpuGraphs runtime-ranking pipelines: data, training, ensembling, submissions.",
        epilog=f"example:\n  {_prog()} -q run --data-root data/kaggle\n\n'{_prog()} COMMAND --help' shows a "
               f"command's options and an example.\n\n{EXIT_CODES_HELP}",
        formatter_class=_HelpFormatter)
    parser.add_argument("--version", action="version", version=_version())
    _chatter(parser, 0)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for add in _COMMANDS:
        add(sub)
    for command in _subparsers(parser):
        command.formatter_class = _HelpFormatter  # `runs list` and `runs compare` too
        for action in command._actions:  # an option without help text still shows its default
            if action.help is None and action.option_strings and action.nargs != 0:
                action.help = "(default: %(default)s)" if action.default is not None else "(default: none)"
    return parser


def _subparsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """Every command parser under ``parser`` (``runs list`` too), depth first."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in dict.fromkeys(action.choices.values()):
                found += [child, *_subparsers(child)]
    return found


def main(argv: list[str] | None = None) -> int:
    from pipelines.core.logs import console_logging
    from pipelines.core.parallel import terminate_as_interrupt

    args = build_parser().parse_args(argv)
    handler: Handler = args.handler
    try:
        with console_logging(getattr(args, "verbosity", 0)), terminate_as_interrupt():
            return int(handler(args) or 0)
    except ConfigError as exc:  # a bad argument or config value: the caller's usage
        print(redact_credentials(f"error: {exc}"), file=sys.stderr)
        return EXIT_USAGE
    except PipelineError as exc:
        print(redact_credentials(f"error: {exc}"), file=sys.stderr)
        return EXIT_ERROR
    except OSError as exc:
        # A file system refusal outside the checked places (a full disk, a path that is a file, a
        # folder that cannot be created): one message naming the path(s), not a traceback.
        where = " -> ".join(str(f) for f in (exc.filename, exc.filename2) if f) or "output"
        action = "cannot write" if exc.errno in _DISK_ERRNOS else "file system error"
        print(redact_credentials(f"error: {where}: {action}: {exc.strerror or exc}"), file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        # finished stages (and a training stage's finished fold jobs) are kept: the same command resumes
        print("interrupted: rerun the same command to resume (finished stages are cached and reused)",
              file=sys.stderr)
        return EXIT_INTERRUPTED
