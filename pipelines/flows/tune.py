"""``python -m pipelines tune --model M --collection C --trials N``: Optuna over a model's hyperparameters.

Each trial is one ordinary training stage (:func:`pipelines.training.fit.train_model`: the grouped k-fold
CV over the shared folds, every seed of ``run.seeds``) of the config with the trial's values set as
per-collection overrides (``[<model>.collections."<C>"]``); its objective is the stage's OOF score
(mean over seeds of the mean over graphs of the competition metric), maximised. Trials are cached
stages like any other, so a repeated trial costs nothing. The search space of a model is its registry
entry's (:mod:`pipelines.config.registry`; the built-in ones are ``SEARCH_SPACE`` next to each config).

The study lives in an Optuna storage: by default the SQLite file ``<work dir>/tune/studies.db``;
``--storage URL`` takes any database Optuna supports (``postgresql://...``, ``mysql://...``), so
several machines can add trials to one study (they must see the same data root and work dir paths
for the cache to be shared, or each trains its own). The default study name joins model,
collection and a fingerprint of the data and the base config, so a study never mixes objectives
measured on different data or settings. The TPE sampler is seeded (``--seed``).

The best trial is written as a self-contained config file (the whole resolved config, with the
trial's values as per-collection overrides) that ``run --config FILE`` takes, and next to it
``FILE.json``: the tune manifest (study name and storage, best trial number, value and params,
trial counts, base config and overrides, data root, code and library versions). A file this
module did not write is never replaced.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pipelines.core.atomic import write_text_atomic
from pipelines.core.collection import Collection
from pipelines.config.registry import search_space
from pipelines.core.errors import ConfigError, PipelineError
from pipelines.core.logs import silenced

TUNE_DIR = "tune"
STUDIES_DB = "studies.db"
HEADER = "# written by pipelines.flows.tune"
MANIFEST_SUFFIX = ".json"

logger = logging.getLogger(__name__)


def suggest(trial: Any, space: Mapping[str, tuple]) -> dict[str, Any]:
    """The trial's values for every field of ``space`` (Optuna ``suggest_*``)."""
    values: dict[str, Any] = {}
    for name, spec in space.items():
        kind = spec[0]
        if kind == "int":
            values[name] = trial.suggest_int(name, int(spec[1]), int(spec[2]), log=bool(spec[3]))
        elif kind == "float":
            values[name] = trial.suggest_float(name, float(spec[1]), float(spec[2]), log=bool(spec[3]))
        elif kind == "categorical":
            values[name] = trial.suggest_categorical(name, list(spec[1]))
        else:
            raise ConfigError(f"search space field {name!r}: unknown kind {kind!r} (int, float or categorical)")
    return values


def _toml_literal(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ConfigError(f"cannot write {value!r} as a config value")
        return repr(value)
    return json.dumps(value)  # int, str


def trial_overrides(model: str, collection: Collection, values: Mapping[str, Any]) -> list[str]:
    """``--set`` overrides putting ``values`` under ``<model>.collections."<collection>"``."""
    return [f'{model}.collections."{collection.name}".{k}={_toml_literal(v)}' for k, v in values.items()]


@dataclass(frozen=True)
class TuneResult:
    study_name: str
    storage: str
    best_number: int
    best_value: float
    best_params: dict[str, Any]
    trials_complete: int
    config_file: Path
    manifest_file: Path

    def describe(self) -> str:
        params = ", ".join(f"{k}={v}" for k, v in self.best_params.items())
        return (f"study {self.study_name} ({self.storage}): {self.trials_complete} complete trials; best #"
                f"{self.best_number} OOF {self.best_value:.4f} with {params}\nconfig: {self.config_file}\n"
                f"manifest: {self.manifest_file}")


def default_storage(work_dir: Path) -> str:
    folder = work_dir / TUNE_DIR
    folder.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{(folder / STUDIES_DB).resolve()}"


def tune(config_ref: str | None, overrides: Sequence[str], *, model: str, collection: str, trials: int,
         data_root: Path | str, work_dir: Path | str, storage: str | None = None, study_name: str | None = None,
         out: Path | str | None = None, seed: int = 0) -> TuneResult:
    """Run ``trials`` more trials of the study and write the best one as a config file (module doc)."""
    import optuna

    from pipelines.core.collection import parse_collection
    from pipelines.config.settings import apply_overrides, config_to_dict, load_config
    from pipelines.core.engine import fingerprint
    from pipelines.flows.prepare import prepare
    from pipelines.config.registry import get_adapter
    from pipelines.training.fit import train_model

    if trials < 1:
        raise ConfigError(f"--trials must be at least 1, got {trials}")
    space = search_space(model)
    get_adapter(model)
    target = parse_collection(collection)
    base = load_config(config_ref, overrides)
    work_dir, data_root = Path(work_dir), Path(data_root)
    prepared = prepare(base, data_root, work_dir, [target])[target.name]
    data_keys = {stage: output.key for stage, output in prepared.stages.items()}
    if study_name is None:
        digest = fingerprint({"data": data_keys, "config": config_to_dict(base)})[:12]
        study_name = f"{model}:{target.name}:{digest}"
    storage = storage or default_storage(work_dir)
    out_path = Path(out) if out is not None else work_dir / TUNE_DIR / f"{study_name.replace(':', '_')}.toml"
    manifest_path = out_path.with_name(out_path.name + MANIFEST_SUFFIX)
    for path in (out_path, manifest_path):
        _check_ours(path)

    def objective(trial: Any) -> float:
        values = suggest(trial, space)
        config = apply_overrides(base, trial_overrides(model, target, values))
        with silenced("pipelines.core.engine", "pipelines.training.fit"):  # one line per trial, below, says enough
            output = train_model(config, prepared, model=model, work_dir=work_dir)
        score = output.metrics.get("oof_score")
        trial.set_user_attr("stage", f"{output.stage}/{output.key}")
        trial.set_user_attr("oof_score_std", output.metrics.get("oof_score_std"))
        logger.info(f"[tune {study_name}] trial {trial.number}: OOF {score if score is None else round(score, 4)} "
                    f"({'cached' if output.cached else 'trained'}) {values}")
        return math.nan if score is None else float(score)  # NaN: Optuna records the trial as failed

    optuna.logging.set_verbosity(logging.WARNING)
    try:
        study = optuna.create_study(study_name=study_name, storage=storage, direction="maximize",
                                    sampler=optuna.samplers.TPESampler(seed=seed), load_if_exists=True)
    except Exception as exc:  # a bad URL or an unreachable database: one clear message
        raise PipelineError(f"optuna storage {storage!r}: cannot open study {study_name!r} ({exc})") from None
    study.optimize(objective, n_trials=trials)
    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    if not complete:
        raise PipelineError(f"study {study_name}: no trial completed (every OOF score was undefined)")
    best = study.best_trial
    tuned = apply_overrides(base, trial_overrides(model, target, best.params))
    record = {
        "generator": "pipelines.flows.tune", "study_name": study_name, "storage": storage, "direction": "maximize",
        "objective": "oof_score (grouped k-fold CV, mean over seeds of the mean over graphs of the competition metric)",
        "model": model, "collection": target.name, "best_trial": best.number, "best_value": best.value,
        "best_params": best.params, "best_stage": best.user_attrs.get("stage"),
        "trials_complete": len(complete), "trials_total": len(study.trials), "trials_this_call": trials,
        "search_space": {k: list(v) if isinstance(v, tuple) else v for k, v in space.items()},
        "base_config": config_ref or "base", "overrides": list(overrides), "data_root": str(data_root.resolve()),
        "work_dir": str(work_dir.resolve()), "data_stages": data_keys, "config_file": str(out_path),
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"), "sampler_seed": seed,
    }
    from pipelines.core.engine import code_version, library_versions

    record |= {"code_version": code_version(), "library_versions": library_versions()}
    _write_text(out_path, _config_text(tuned, record))
    _write_text(manifest_path, json.dumps(record, indent=2, sort_keys=True, default=str) + "\n")
    return TuneResult(study_name, storage, best.number, float(best.value), dict(best.params), len(complete),
                      out_path, manifest_path)


def _config_text(config: Any, record: Mapping[str, Any]) -> str:
    from pipelines.config.settings import config_to_toml

    params = ", ".join(f"{k} = {_toml_literal(v)}" for k, v in record["best_params"].items())
    header = [
        HEADER,
        f"# Optuna study {record['study_name']!r} in {record['storage']}",
        f"# best trial #{record['best_trial']} of {record['trials_complete']} complete: OOF "
        f"{record['best_value']:.6f} ({record['model']} on {record['collection']})",
        f"# tuned values (under [{record['model']}.collections.\"{record['collection']}\"]): {params}",
        f"# base: {record['base_config']} {' '.join('--set ' + o for o in record['overrides'])}".rstrip(),
        f"# manifest: {Path(record['config_file']).name}{MANIFEST_SUFFIX}",
        "# The whole resolved config follows: `python -m pipelines run --config THIS_FILE` takes it as is.",
        "",
    ]
    return "\n".join(header) + config_to_toml(config)


def _check_ours(path: Path) -> None:
    """Only a file this module wrote may be replaced (a better trial rewrites it)."""
    if not path.exists():
        return
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        text = ""
    if not (text.startswith(HEADER) or '"generator": "pipelines.flows.tune"' in text):
        raise PipelineError(f"{path}: exists and was not written by `tune`; refusing to overwrite it (pass --out)")


def _write_text(path: Path, text: str) -> None:
    _check_ours(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, text)
