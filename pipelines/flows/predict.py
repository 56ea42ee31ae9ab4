"""``predict --run RUN_ID --data-root NEW_ROOT``: rank a new data root with a run's saved fold models.

Nothing is trained. For every collection of the run, the test graphs of ``NEW_ROOT`` go through
the same preparation stages the run's models were trained on (prune -> features / node arrays,
with the run's config; cached like any stage, keyed by the new files), every fold model saved in
the run's training stages (``models/`` of each stage output, checked against the SHA-256 its
manifest records) scores them, and the scores are normalised, averaged over fold models and seeds
and blended with the run's ensemble weights exactly as the run's ensemble stage did. The result is
validated against ``NEW_ROOT`` and published as a new run folder (``kind = "predict"``,
``source_run`` = the run). On the run's own data root this reproduces its CSV byte for byte.

:func:`fold_models` and :func:`predict_test` are the reusable parts; :func:`predict_run` is the shell.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import polars as pl

from pipelines.data.root import DataRoot
from pipelines.core.collection import Collection, parse_collection
from pipelines.core.engine import StageOutput, code_version, file_sha256, fingerprint, library_versions, load_stage
from pipelines.core.errors import ConfigError, PipelineError
from pipelines.core.paths import SUBMISSIONS_DIR
from pipelines.flows import dag
from pipelines.core.seeds import model_fit_seed
from pipelines.flows.scores import RunResult, scores_from_manifest
from pipelines.outputs.run_folders import read_run_manifest, recorded_folder, resolve_run_id, training_stage_dirs

logger = logging.getLogger(__name__)

# The data stages predict runs over new graphs: the DAG's, less the training-only ones (folds).
PREPARE_FOR_PREDICTION = tuple(stage.name for stage in dag.data_stages(training=False))


def _source_config(manifest: dict[str, Any], model_name: str) -> dict[str, Any]:
    """The resolved pipeline config that trained ``model_name`` of this run (a re-blended run names
    its models ``<model>@<run-id>`` and keeps each source run's config)."""
    if manifest.get("kind") == "ensemble":
        sources = (manifest.get("config") or {}).get("source_runs") or {}
        run_id = model_name.split("@", 1)[1] if "@" in model_name else next(iter(sources), None)
        config = sources.get(run_id)
        if config is None:
            raise PipelineError(f"run {manifest.get('run_id')}: no recorded config of source run {run_id}")
        return config
    if manifest.get("kind") not in (None, "run"):
        raise ConfigError(f"run {manifest.get('run_id')} is a {manifest.get('kind')!r} run; predict needs a run "
                          "that trained models (kind 'run') or a re-blend of such runs (kind 'ensemble')")
    return manifest["config"]


def fold_models(output: StageOutput, *, num_threads: int = 0) -> list[tuple[int, int, Any, Any]]:
    """``(fold, seed, adapter, ranker)`` of every fold model saved in a training stage output, in the
    order the stage wrote its predictions (seed, then fold). Each file is checked against its hash.

    ``num_threads`` 0: the threads the stage's fold jobs predicted with (its ``threads_per_job``); a
    GNN's last bits depend on the thread count, so that is what reproduces the stage's predictions."""
    from pipelines.config.registry import get_adapter
    from pipelines.training.fit import model_file_name

    config = output.manifest.get("config") or {}
    adapter = get_adapter(config.get("model", ""))
    entries = output.metrics.get("models") or []
    num_threads = num_threads or int(output.metrics.get("threads_per_job") or 1)
    if not entries or any("files" not in e for e in entries):
        raise PipelineError(f"{output.path}: this training output has no saved fold models (it was written before "
                            "models were kept); re-run the run to train and save them")
    out = []
    for entry in sorted(entries, key=lambda e: (e["seed"], e["fold"])):
        for name in entry["files"]:
            path = output.file(name)
            if file_sha256(path) != entry["sha256"][name]:
                raise PipelineError(f"{path}: saved model does not match the SHA-256 its stage manifest records "
                                    "(modified or corrupt)")
        folder = output.path / Path(entry["files"][0]).parent
        ranker = adapter.ranker_class.load(folder, model_file_name(adapter.name, entry["fold"], entry["seed"]),
                                           num_threads=num_threads)
        out.append((int(entry["fold"]), int(entry["seed"]), adapter, ranker))
    return out


def predict_test(output: StageOutput, prepared: Any, *, num_threads: int = 0) -> pl.DataFrame:
    """The ``test`` prediction rows of every saved fold model of ``output`` on ``prepared``'s test graphs,
    in the schema and row order of the training stage's own ``predictions.parquet``."""
    from pipelines.core.predictions import PREDICTION_SCHEMA, prediction_frame
    from pipelines.training.fit import PREDICT_BATCH_GRAPHS, _predict_graphs

    collection: Collection = prepared.collection
    settings = output.manifest["config"]["settings"]
    graphs = list(prepared.graphs("test"))
    frames = []
    for fold, seed, adapter, ranker in fold_models(output, num_threads=num_threads):
        fit_seed = model_fit_seed(seed, fold, settings)
        predicted = _predict_graphs(adapter, ranker, prepared, graphs, settings=settings,
                                    batch=PREDICT_BATCH_GRAPHS[collection.kind], seed=fit_seed)
        frames += [prediction_frame(collection=collection.name, graph=g, split="test", scores=c, fold=fold, seed=seed,
                                    model=adapter.name, config_index=i) for g, i, c in predicted]
    return pl.concat(frames) if frames else pl.DataFrame(schema=PREDICTION_SCHEMA)


def prepare_test_graphs(config: Any, collection: Collection, data_root: Path, work_dir: Path,
                        split: str = "test") -> Any:
    """The data stages that are not training-only (:data:`PREPARE_FOR_PREDICTION`: prune, features, node
    arrays; no folds) over the ``split`` graphs of ``data_root`` only: a
    :class:`pipelines.data.prepared.Prepared` handle for prediction. The graphs are
    prepared as unlabelled ``test`` graphs whatever their split (every config kept, none merged),
    because a submission ranks every config of the file."""
    import dataclasses

    from pipelines.core.collection import SPLITS
    from pipelines.data.prepared import Prepared
    from pipelines.core.stages import RawFiles
    from pipelines.flows.prepare import raw_data_key

    # absolute: the per-file jobs may run in worker processes started in another working directory
    data_root, work_dir = Path(data_root).absolute(), Path(work_dir).absolute()
    refs = {name: [] for name in SPLITS}  # the other splits may be absent from a root of new graphs
    refs["test"] = [dataclasses.replace(ref, split="test") for ref in DataRoot(data_root).graphs(collection, split)]
    if not refs["test"]:
        raise PipelineError(f"{data_root}: no {collection.name} {split} graphs to rank (the run has models for it; "
                            f"the data root must hold its {split} files in the Kaggle layout)")
    stages = dag.run_data_stages(config, collection, work_dir, RawFiles(refs, raw_data_key(data_root, refs)),
                                 training=False)
    return Prepared(collection, stages)


def _first_saved(places: list[Path], ref: dict[str, Any]) -> StageOutput | None:
    """The complete training stage ``ref`` in the first of ``places`` that holds it."""
    for where in places:
        try:
            return load_stage(where, ref["stage"], ref["key"])
        except PipelineError:
            if (where / ref["stage"] / ref["key"]).exists():  # there, but damaged or unfinished: never skipped
                raise
    return None


def _check_split(source: dict[str, Any], run_id: str, split: str) -> None:
    """A labelled split may only be ranked by fold models that never trained on it: with
    ``folds.holdout_valid`` the valid graphs are a holdout of every fold model."""
    if split == "test":
        return
    if split != "valid":
        raise ConfigError(f"predict --split must be test or valid, got {split!r} (every fold model trained on "
                          "train graphs)")
    configs = [source.get("config") or {}] if source.get("kind") != "ensemble" else \
        list(((source.get("config") or {}).get("source_runs") or {}).values())
    if not configs or not all(((c or {}).get("folds") or {}).get("holdout_valid") for c in configs):
        raise ConfigError(f"run {run_id}: its fold models trained on valid graphs (folds.holdout_valid = false), so "
                          "a valid-split score would not be a validation score; run with "
                          "--set folds.holdout_valid=true to keep the valid split out of training")


def predict_run(run_id: str, data_root: Path | str, *, submissions_dir: Path | str = SUBMISSIONS_DIR,
                work_dir: Path | str | None = None, split: str = "test", num_threads: int = 0,
                command: str | None = None) -> RunResult:
    """Rank every ``split`` graph of ``data_root`` with run ``run_id``'s saved models and blend weights, and
    publish a validated submission in a new run folder (see the module docstring). ``split="valid"``
    (only for runs whose fold models held the valid split out) writes a submission that ``score``
    can score."""
    from pipelines.config.settings import PipelineConfig, config_from_dict
    from pipelines.training.ensemble import blend, prepare_model_scores
    from pipelines.flows.run import default_command
    from pipelines.flows.scores import anchored_rows, default_anchor
    from pipelines.outputs.run_folders import publish_submission

    started = time.perf_counter()
    data_root, submissions_dir = Path(data_root), Path(submissions_dir)
    if not data_root.is_dir():
        raise PipelineError(f"{data_root}: no such data root")
    run_id = resolve_run_id(submissions_dir, run_id)  # a unique prefix or a run's name works too
    source = read_run_manifest(submissions_dir, run_id)
    _check_split(source, run_id, split)
    if split == "test":  # the submission is validated against sample_submission.csv: checked before any stage
        from pipelines.data.submission import check_test_files

        check_test_files(data_root)
    source_work = recorded_folder(source, "work_dir", work_dir)
    method = ((source.get("config") or {}).get("ensemble") or {}).get("method", "minmax")
    collections = list(source.get("collections") or source["stages"])
    rows: dict[str, list[int]] = {}
    stages: dict[str, Any] = {}
    defaults = DataRoot(data_root).defaults()  # each graph's compiler default, where the root names it
    prepared_by_config: dict[tuple[str, str], Any] = {}
    for step, cname in enumerate(collections, start=1):
        collection = parse_collection(cname)
        refs = source["stages"][cname]["train"]
        listed = [m for m in (source.get("models") or []) if m in refs]  # the order the ensemble stage used
        models = listed + sorted(m for m in refs if m not in listed)
        weights = (source.get("ensemble_weights") or {}).get(cname)
        if not weights or set(weights) != set(models):
            raise PipelineError(f"run {run_id}: {cname} has no ensemble weights for its models {models}")
        logger.info(f"predict {step}/{len(collections)}: {cname}, models {', '.join(models)}")
        frames, prepare_keys = [], {}
        for model in models:
            ref = refs[model]
            places = training_stage_dirs(ref, source, work_dir)
            try:
                output = _first_saved(places, ref)
            except PipelineError as exc:
                raise PipelineError(f"run {run_id}: the saved {model} models of {cname} cannot be used: {exc}") from None
            if output is None:
                looked = ", ".join(str(w / ref["stage"] / ref["key"]) for w in places)
                raise PipelineError(f"run {run_id}: the saved {model} models of {cname} are gone: looked in "
                                    f"{looked} (pass --work-dir where the run's stages are)")
            refs = {**refs, model: {**ref, "work_dir": str(output.path.parent.parent.resolve())}}
            config_dict = _source_config(source, model)
            cache = (cname, fingerprint(config_dict))
            if cache not in prepared_by_config:
                config = config_from_dict(PipelineConfig, config_dict, f"run {run_id} manifest")
                prepared_by_config[cache] = prepare_test_graphs(config, collection, data_root, source_work, split)
            prepared = prepared_by_config[cache]
            prepare_keys = prepared.stage_keys
            frames.append(predict_test(output, prepared, num_threads=num_threads)
                          .with_columns(pl.lit(model).alias("model")))
        per_fold = pl.concat(frames)
        rows.update(anchored_rows(collection, blend(prepare_model_scores(per_fold, method), weights), lambda: per_fold,
                                  weights, defaults.get(cname, {}), default_anchor(source.get("config"))))
        # the ensemble stage whose weights were applied (the report reads its weight curve)
        stages[cname] = {"prepare": prepare_keys, "train": refs, "ensemble": source["stages"][cname].get("ensemble")}
    manifest = {
        "kind": "predict",
        "source_run": run_id,
        "split": split,
        "command": command if command is not None else default_command(),
        "config": source.get("config"),
        "data_root": str(data_root.resolve()),
        "work_dir": str(source_work.resolve()),
        "models": source.get("models"),
        "collections": collections,
        "stages": stages,
        "ensemble_weights": source.get("ensemble_weights"),
        # the models' cross-validation scores, measured by the source run (nothing is scored here)
        "cv_scores": source.get("cv_scores"),
        "combined_oof": source.get("combined_oof"),
        "code_version": code_version(),
        "library_versions": library_versions(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()),
        "wall_time_s": round(time.perf_counter() - started, 3),
    }
    new_id, path, manifest = publish_submission(rows, manifest, data_root=data_root, submissions_dir=submissions_dir,
                                                split=split)
    return RunResult(new_id, path.parent, path, manifest, scores_from_manifest(manifest), ())
