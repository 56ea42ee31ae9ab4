"""One-command runs: prepare -> train every model -> ensemble per collection -> validated submission.

:func:`run_pipeline` chains the cached stages for every collection of a data root in the Kaggle
layout (ours or the real one): the four preparation stages, one training stage per model, and an
``ensemble`` stage that blends the models' out-of-fold predictions with weights fitted on them
alone and applies the weights to the test predictions. Every stage goes through
:func:`pipelines.core.engine.run_stage`, so a second run with the same config reuses all of them.

The ``ensemble`` stage lives in :mod:`pipelines.training.ensemble` (its pure functions, I/O shell and reader).

The submission goes to ``<submissions_dir>/<run-id>/`` (created exclusively, never reused):
``submission.csv``, validated against the data root before it is published, and ``manifest.json``
(resolved config, every upstream stage key per collection, code and library versions, OOF scores
per model and for the ensemble, weights, data root, run-id, command). The CSV depends only on the
predictions, so the same config run from scratch yields the same bytes.

:func:`ensemble_runs` re-blends the saved training outputs of earlier runs (found through their
manifests) without training anything.

Training jobs (fold x seed of a model) run through joblib: local loky processes by default, or a
Dask cluster when ``scheduler`` is its address. Dask workers must see the same filesystem (the
work dir and the data root at the same paths) and the same Python environment as this process.
"""

from __future__ import annotations

import logging
import os
import shlex
import sys
import time
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import polars as pl

from pipelines.data.root import DataRoot
from pipelines.core import paths
from pipelines.core.collection import Collection, parse_collection
from pipelines.config.settings import PipelineConfig, config_to_dict
from pipelines.core.engine import (
    StageOutput,
    code_version,
    library_versions,
    load_stage,
)
from pipelines.core.stages import StageCall
from pipelines.flows import dag
from pipelines.flows.schedule import StageCounter, check_devices, stage_history, train_models
from pipelines.flows.scores import (CollectionRun, RunResult, anchored_rows, combined_by_model, default_anchor,
                                    scores_table)
from pipelines.training.ensemble import ENSEMBLE_STAGE, ensemble_stage, load_blended_test
from pipelines.core.errors import ConfigError, FormatError, PipelineError
from pipelines.core.logs import tagged
from pipelines.core.parallel import fan_out
from pipelines.outputs.run_folders import (check_trained, publish_submission, read_run_manifest, recorded_folder,
                                         resolve_run_id, training_stage_dir)

logger = logging.getLogger(__name__)


# ----------------------------------------------------------------------------- models


def resolve_models(config: PipelineConfig, models: Sequence[str] | None) -> list[str]:
    """The models a run trains and blends: ``models`` when given, else the config's ensemble models
    (which must all be among ``run.models``, the models the config trains)."""
    if models is not None:
        chosen = list(dict.fromkeys(m.strip() for m in models if m.strip()))
        if not chosen:
            raise ConfigError("--models names no model")
        return chosen
    missing = [m for m in config.ensemble.models if m not in config.run.models]
    if missing:
        raise ConfigError(f"ensemble.models names {', '.join(missing)}, which run.models does not train "
                          f"(run.models = {config.run.models})")
    return list(config.ensemble.models)


def checked_models(config: PipelineConfig, models: Sequence[str] | None) -> list[str]:
    """:func:`resolve_models`, each of them a registered model: an unknown name fails before any work."""
    from pipelines.config.registry import get_adapter

    names = resolve_models(config, models)
    for name in names:
        get_adapter(name)
    return names


def check_training_root(data_root: Path) -> None:
    """A data root a run can train on: it exists, holds TpuGraphs files, and has train graphs. A root of
    test graphs only is for the models of an earlier run (``predict --run``), which this says."""
    # .collections(): "data root does not exist" / "no TpuGraphs data here", naming the folder
    if not DataRoot(data_root).collections():
        raise FormatError(data_root, "no train graphs (a root of test graphs only?): a run trains on train graphs; "
                                     f"to rank these test graphs with the fold models of an earlier run: "
                                     f"predict --run RUN_ID --data-root {data_root} (runs list shows the runs)")


# ----------------------------------------------------------------------------- publishing


def stage_index(runs: Sequence[CollectionRun]) -> dict[str, dict]:
    """Per collection, the stages behind it, as a run manifest records them under ``stages``; a
    ``companions`` entry only where its models also train on other collections' graphs."""
    return {r.collection.name: {
        "prepare": r.prepare_keys,
        "train": {name: {"stage": out.stage, "key": out.key, "work_dir": str(out.path.parent.parent.resolve())}
                  for name, out in r.trained.items()},
        ENSEMBLE_STAGE: r.ensemble.key,
    } | ({"companions": r.companion_keys} if r.companion_keys else {}) for r in runs}


def indexed_stage_count(stages: Mapping[str, dict]) -> int:
    """How many stages a run's ``stages`` index names, each once (a companion's data stages may also
    be a chosen collection's)."""
    return len(_indexed_stages(stages, ""))


def _indexed_stages(stages: Mapping[str, dict], work_dir: Path | str) -> dict[tuple[str, str], Path | str]:
    """(stage, key) -> the work dir it lies in, for every stage of a run's ``stages`` index."""
    where: dict[tuple[str, str], Path | str] = {}
    for entry in stages.values():
        prepared = [entry["prepare"], *entry.get("companions", {}).values()]
        where |= {(stage, key): work_dir for keys in prepared for stage, key in keys.items()}
        where |= {(ref["stage"], ref["key"]): ref.get("work_dir") or work_dir for ref in entry["train"].values()}
        where[ENSEMBLE_STAGE, entry[ENSEMBLE_STAGE]] = work_dir
    return where


def stages_wall_time(stages: Mapping[str, dict], work_dir: Path | str) -> float:
    """Seconds the stages of a run's ``stages`` index took when they were computed, each stage once.

    A run's compute time also when it was made in several calls: the run's own wall time counts only
    what its call computed, so a run resumed from the stage cache (after a time limit or a Ctrl-C)
    shows only its tail. A training stage that was itself cut and resumed from its finished fold
    jobs records only its last attempt, so the sum is then a lower bound.
    """
    return sum(float(load_stage(Path(where), stage, key).manifest.get("wall_time_s") or 0.0)
               for (stage, key), where in _indexed_stages(stages, work_dir).items())


def _manifest(*, kind: str, config: Any, data_root: Path, work_dir: Path, runs: Sequence[CollectionRun],
              table: pl.DataFrame, command: str | None, wall_s: float, extra: dict[str, Any] | None = None) -> dict:
    combined = combined_by_model(table)
    return {
        "kind": kind,
        "command": command if command is not None else default_command(),
        "config": config,
        "data_root": str(data_root.resolve()),
        "work_dir": str(work_dir.resolve()),
        "models": list(runs[0].trained) if runs else [],
        "collections": [r.collection.name for r in runs],
        "stages": stage_index(runs),
        "cv_scores": {r.collection.name: {
            "training": {name: {k: out.metrics.get(k) for k in ("oof_score", "oof_score_std", "oof_score_by_seed")}
                         for name, out in r.trained.items()},
            "blend": r.ensemble.metrics["oof_scores"],
        } for r in runs},
        "ensemble_weights": {r.collection.name: r.weights for r in runs},
        "combined_oof": {m: {"value": s.value, "complete": s.complete} for m, s in combined.items()},
        "code_version": code_version(),
        "library_versions": library_versions(),
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "wall_time_s": round(wall_s, 3),
        **(extra or {}),
    }


# ----------------------------------------------------------------------------- run


def run_pipeline(config: PipelineConfig, data_root: Path | str, *, work_dir: Path | str,
                 models: Sequence[str] | None = None, collections: Sequence[Collection | str] | None = None,
                 submissions_dir: Path | str = paths.SUBMISSIONS_DIR, scheduler: str | None = None,
                 force: bool = False, command: str | None = None,
                 extra: Mapping[str, Any] | None = None) -> RunResult:
    """Prepare, train ``models`` (default: the config's), ensemble and submit; see the module docstring.

    ``scheduler`` overrides ``run.scheduler``; ``collections`` defaults to every collection with a
    train directory (a submission needs all five). ``extra``: entries added to the run manifest as
    they are (``run --name/--note``: ``name``, ``note``), never part of the run-id or a stage key.
    Returns the published run.
    """
    from pipelines.data.submission import check_test_files
    from pipelines.flows.prepare import check_apart, check_output_dir

    started = time.perf_counter()
    data_root, work_dir, submissions_dir = Path(data_root), Path(work_dir), Path(submissions_dir)
    models = checked_models(config, models)  # an unknown model is the first error, as it was before the split
    check_training_root(data_root)
    # A submission needs every collection and exactly the official test IDs: checked before any stage runs.
    check_test_files(data_root)
    check_output_dir(submissions_dir, data_root, "--submissions-dir")
    check_output_dir(work_dir, data_root)  # a data root inside the work dir too, before the first stage
    check_apart(work_dir, submissions_dir)
    runs, computed = train_and_blend(config, data_root, work_dir=work_dir, models=models, collections=collections,
                                     scheduler=scheduler, force=force)
    return _finish(runs, kind="run", config=config_to_dict(config), data_root=data_root, work_dir=work_dir,
                   submissions_dir=submissions_dir, command=command, started=started, computed=computed,
                   extra=dict(extra or {}))


def train_and_blend(config: PipelineConfig, data_root: Path | str, *, work_dir: Path | str,
                    models: Sequence[str] | None = None, collections: Sequence[Collection | str] | None = None,
                    scheduler: str | None = None, force: bool = False) -> tuple[list[CollectionRun], list[str]]:
    """The stages of a run without its submission: prepare, train every model, ensemble, per collection.

    Returns each collection's run and the "stage/key" of every stage this call computed. On its own it
    serves work on some collections only (scoring one collection on a world with hidden labels, see
    :func:`pipelines.flows.evaluate.evaluate_collection_runs`); its stages are the ones a full run reuses.
    """
    from pipelines.flows.prepare import collections_to_prepare, prepare

    # absolute: fold jobs may run in worker processes started in another working directory
    data_root, work_dir = Path(data_root).absolute(), Path(work_dir).absolute()
    names = checked_models(config, models)
    computed: list[str] = []
    # prepare, train per model and ensemble per chosen collection; only the data stages of the others
    # their models train on (gnn.extra_train_collections)
    chosen, companions = collections_to_prepare(config, data_root, collections)
    check_devices(config, names, chosen)  # a GPU asked for and absent fails before the data stages
    from pipelines.training.fit import check_models

    check_models(names, chosen)  # e.g. feature:<column> naming no column: before the data stages
    stages = dag.pipeline(names)  # data stages, a training stage per model, the ensemble
    data_names = {stage.name for stage in dag.data_stages()}
    plan: dict[str, int] = {}
    for stage in stages:
        plan[stage.name] = plan.get(stage.name, 0) + len(chosen) + (len(companions) if stage.name in data_names else 0)
    trainers, blend = tuple(stage for stage in stages[:-1] if stage.name not in data_names), stages[-1]
    counter = StageCounter(sum(plan.values()), plan, stage_history(work_dir))

    def track(output: StageOutput) -> StageOutput:
        if not output.cached:
            computed.append(f"{output.stage}/{output.key}")
        return output

    # Connect first: an unreachable scheduler fails before any work.
    with counter.counting():
        with fan_out(scheduler if scheduler is not None else config.run.scheduler) as backend:
            prepared = prepare(config, data_root, work_dir, collections, force=force)
            # every prepared collection once: a companion may be a chosen collection too
            every = {name: c for p in prepared.values() for name, c in p.companions.items()} | prepared
            for item in every.values():
                computed += [f"{stage}/{key}" for stage, key in item.stage_keys.items() if not item.cached.get(stage)]
            trained = train_models(config, prepared, names, work_dir=work_dir, backend=backend, force=force,
                                   stages=trainers)
        for outputs in trained.values():
            for output in outputs.values():
                track(output)
        runs = []
        for cname, item in prepared.items():
            with tagged(cname):
                output = track(blend.run(StageCall(config, item.collection, work_dir,
                                                   upstream={name: item.stages[name] for name in blend.inputs
                                                             if name in item.stages},
                                                   options={"trained": trained[cname]}, force=force)))
            runs.append(CollectionRun(item.collection, item.stage_keys, trained[cname], output,
                                      {name: c.stage_keys for name, c in item.companions.items()}))
    log_epoch_caps([output for outputs in trained.values() for output in outputs.values()])
    return runs, computed


def log_epoch_caps(outputs: Sequence[StageOutput]) -> None:
    """Say once, for all the training stages of a command, which fold models stopped at their epoch cap
    and what that means under this config (:func:`pipelines.training.fit.epoch_cap_notes`)."""
    from pipelines.config.settings import load_config, resolve_for_collection
    from pipelines.training.fit import epoch_cap_notes

    if not any(output.metrics.get("epoch_cap", {}).get("at_cap") for output in outputs):
        return
    try:  # read when the training is done: a base.toml edited since the run started must not fail it now
        base = load_config("base")
    except ConfigError as exc:
        logger.warning("epoch-cap notes skipped: the base config no longer reads (%s)", exc)
        return

    def base_epochs(model: str, collection: str) -> int | None:
        section = getattr(base, model.partition(":")[0], None)
        return getattr(resolve_for_collection(section, collection), "epochs", None) if section is not None else None

    for level, message in epoch_cap_notes(outputs, base_epochs):
        logger.log(level, message)


def _trained_test(item: CollectionRun) -> pl.DataFrame:
    """The test predictions of every model of one collection's run, one row per fold model and config."""
    from pipelines.training.fit import load_predictions

    return pl.concat([load_predictions(out).filter(pl.col("split") == "test").with_columns(pl.lit(name).alias("model"))
                      for name, out in item.trained.items()])


def _finish(runs: Sequence[CollectionRun], *, kind: str, config: Any, data_root: Path, work_dir: Path,
            submissions_dir: Path, command: str | None, started: float, computed: list[str],
            extra: dict[str, Any] | None = None) -> RunResult:
    rows: dict[str, list[int]] = {}
    defaults = DataRoot(data_root).defaults()
    for item in runs:
        rows.update(anchored_rows(item.collection, load_blended_test(item.ensemble), lambda item=item: _trained_test(item),
                                  item.weights, defaults.get(item.collection.name, {}), default_anchor(config)))
    table = scores_table(runs)
    manifest = _manifest(kind=kind, config=config, data_root=data_root, work_dir=work_dir, runs=runs, table=table,
                         command=command, wall_s=time.perf_counter() - started,
                         extra={"stages_computed": list(computed), **(extra or {})})
    run_id, path, manifest = publish_submission(rows, manifest, data_root=data_root,
                                                submissions_dir=submissions_dir)
    return RunResult(run_id, path.parent, path, manifest, table, tuple(computed))


# ----------------------------------------------------------------------------- re-ensemble


def _model_matches(name: str, wanted: Sequence[str]) -> bool:
    return name in wanted or name.split("@", 1)[0] in wanted


def ensemble_runs(run_ids: Sequence[str], *, submissions_dir: Path | str = paths.SUBMISSIONS_DIR,
                  work_dir: Path | str | None = None, data_root: Path | str | None = None,
                  method: str | None = None, min_gain_se: float | None = None, gain_at: str | None = None,
                  models: Sequence[str] | None = None, force: bool = False, command: str | None = None) -> RunResult:
    """Blend the saved training outputs of earlier runs into a new submission, training nothing.

    Training outputs are found in the work dir recorded by each run (or ``work_dir``); with several
    runs, a model is named ``<model>@<run-id>``. The runs must share the prune and folds stages of
    every collection, so their out-of-fold predictions are comparable. ``models`` keeps models by
    name or by the part before ``@``; ``method``, ``min_gain_se`` and ``gain_at`` default to the first
    run's (``min_gain_se`` 0, the fitted blend always, and ``gain_at`` "oof" for runs made before
    these settings existed).
    """
    from pipelines.training.ensemble import GAIN_AT_CHOICES, NORMALISE_METHODS

    started = time.perf_counter()
    submissions_dir = Path(submissions_dir)
    run_ids = list(dict.fromkeys(resolve_run_id(submissions_dir, r) for r in run_ids))
    if not run_ids:
        raise ConfigError("ensemble needs at least one run-id")
    manifests = {r: read_run_manifest(submissions_dir, r) for r in run_ids}
    for run_id, manifest in manifests.items():
        check_trained(manifest, run_id, "ensemble --runs")  # a predict run has no OOF predictions to blend
    first = manifests[run_ids[0]]
    method = method or first.get("config", {}).get("ensemble", {}).get("method", "minmax")
    if method not in NORMALISE_METHODS:
        raise ConfigError(f"unknown ensemble method {method!r}; expected one of {', '.join(NORMALISE_METHODS)}")
    if min_gain_se is None:
        min_gain_se = float(first.get("config", {}).get("ensemble", {}).get("min_gain_se", 0.0))
    gain_at = gain_at or first.get("config", {}).get("ensemble", {}).get("gain_at", "oof")
    if gain_at not in GAIN_AT_CHOICES:
        raise ConfigError(f"unknown gain_at {gain_at!r}; expected one of {', '.join(GAIN_AT_CHOICES)}")
    data_root = recorded_folder(first, "data_root", data_root)
    out_dir = recorded_folder(first, "work_dir", work_dir)
    collections = list(first.get("collections") or first["stages"])  # "stages" is key-sorted JSON
    for run_id, manifest in manifests.items():
        if sorted(manifest["stages"]) != sorted(collections):
            raise PipelineError(f"run {run_id} covers {sorted(manifest['stages'])}, "
                                f"run {run_ids[0]} {sorted(collections)}")

    runs = []
    for cname in collections:
        prepare_keys = first["stages"][cname]["prepare"]
        for run_id, manifest in manifests.items():
            theirs = manifest["stages"][cname]["prepare"]
            for stage in ("prune", "folds"):
                if theirs.get(stage) != prepare_keys.get(stage):
                    raise PipelineError(f"{cname}: runs {run_ids[0]} and {run_id} use different {stage} stages "
                                        f"({prepare_keys.get(stage)} vs {theirs.get(stage)}); their out-of-fold "
                                        "predictions cannot be blended")
        trained: dict[str, StageOutput] = {}
        seen: set[tuple[str, str]] = set()
        for run_id, manifest in manifests.items():
            for model, ref in manifest["stages"][cname]["train"].items():
                name = model if len(run_ids) == 1 else f"{model}@{run_id}"
                if (ref["stage"], ref["key"]) in seen or (models is not None and not _model_matches(name, models)):
                    continue
                seen.add((ref["stage"], ref["key"]))
                trained[name] = _load_saved(training_stage_dir(ref, manifest, work_dir), ref["stage"], ref["key"],
                                            run_id, model, cname)
        if not trained:
            raise ConfigError(f"{cname}: no model of runs {', '.join(run_ids)} matches "
                              f"--models {', '.join(models or [])}")
        prune = _load_saved(out_dir, "prune",
                            prepare_keys["prune"], run_ids[0], "prune", cname)
        output = ensemble_stage(parse_collection(cname), prune, trained, method=method, min_gain_se=min_gain_se,
                                gain_at=gain_at, work_dir=out_dir, force=force)
        runs.append(CollectionRun(parse_collection(cname), dict(prepare_keys), trained, output,
                                  dict(first["stages"][cname].get("companions", {}))))
    computed = [f"{r.ensemble.stage}/{r.ensemble.key}" for r in runs if not r.ensemble.cached]
    config = {"ensemble": {"method": method, "min_gain_se": min_gain_se, "gain_at": gain_at,
                           "models": list(models) if models is not None else None},
              "source_runs": {r: manifests[r].get("config") for r in run_ids}}
    return _finish(runs, kind="ensemble", config=config, data_root=data_root, work_dir=out_dir,
                   submissions_dir=submissions_dir, command=command, started=started, computed=computed,
                   extra={"source_runs": run_ids})


def _load_saved(work_dir: Path, stage: str, key: str, run_id: str, what: str, collection: str) -> StageOutput:
    from pipelines.outputs.run_folders import load_named_stage  # "gone" only when absent; else why not usable

    return load_named_stage(work_dir, stage, key, f"run {run_id}: the saved {what} output of {collection}")


# ----------------------------------------------------------------------------- command line helpers


def parse_models(text: str | None) -> list[str] | None:
    """``"gbdt,gnn"`` -> ``["gbdt", "gnn"]``; None stays None (use the config's models)."""
    if text is None:
        return None
    return [m.strip() for m in text.split(",") if m.strip()]


def default_command() -> str:
    return shlex.join([os.path.basename(sys.executable), "-m", "pipelines", *sys.argv[1:]])
