"""``tune``: Optuna over a model's declared search space with the grouped-CV score as objective, on
the tiny world; the study in SQLite (resumable), the best trial as a config file ``run`` accepts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipelines.cli import main
from pipelines.config.settings import load_config, resolve_for_collection
from pipelines.core.errors import ConfigError, PipelineError
from pipelines.flows.tune import search_space, trial_overrides, tune

FAST = ["gbdt.n_estimators=10"]  # on top of the smoke config
COLLECTION = "layout:xla:random"


def test_search_spaces_are_declared_for_both_models_and_fit_their_configs() -> None:
    from pipelines.core.collection import parse_collection

    for model in ("gbdt", "gnn"):
        space = search_space(model)
        assert len(space) >= 5
        # the lowest value of every numeric field and the first choice of every categorical one is a valid config
        values = {k: (v[1][0] if v[0] == "categorical" else v[1]) for k, v in space.items()}
        config = load_config("base", trial_overrides(model, parse_collection(COLLECTION), values))
        section = resolve_for_collection(getattr(config, model), COLLECTION)
        assert all(getattr(section, k) == v for k, v in values.items())
    with pytest.raises(ConfigError, match="no search space"):
        search_space("random")


@pytest.mark.slow
def test_two_trials_write_a_config_that_run_accepts(tiny_world: Path, tmp_path: Path, capsys) -> None:
    work = tmp_path / "work"
    args = ["tune", "--model", "gbdt", "--collection", COLLECTION, "--trials", "2", "--data-root", str(tiny_world),
            "--work-dir", str(work), "--config", "smoke", *[x for o in FAST for x in ("--set", o)]]
    assert main(args) == 0
    out = capsys.readouterr().out
    config_file = Path(out.strip().splitlines()[-1])
    manifest = json.loads(config_file.with_name(config_file.name + ".json").read_text())
    assert manifest["trials_complete"] == 2 and manifest["model"] == "gbdt" and manifest["collection"] == COLLECTION
    assert manifest["storage"] == f"sqlite:///{(work / 'tune' / 'studies.db').resolve()}"
    assert set(manifest["best_params"]) == set(search_space("gbdt"))
    assert config_file.read_text().startswith("# written by pipelines.flows.tune")

    # the file is a complete config: the tuned values for this collection, the base's values elsewhere
    tuned = load_config(str(config_file))
    section = resolve_for_collection(tuned.gbdt, COLLECTION)
    for name, value in manifest["best_params"].items():
        assert getattr(section, name) == value
    assert resolve_for_collection(tuned.gbdt, "tile:xla").objective == "regression"
    assert tuned.folds.k == 2 and tuned.gbdt.n_estimators == 10

    # its best trial is an ordinary cached training stage whose OOF score is the study's best value
    from pipelines.flows.prepare import prepare
    from pipelines.training.fit import train_model

    item = prepare(tuned, tiny_world, work, [COLLECTION])[COLLECTION]
    output = train_model(tuned, item, model="gbdt", work_dir=work)
    assert output.cached and f"{output.stage}/{output.key}" == manifest["best_stage"]
    assert output.metrics["oof_score"] == pytest.approx(manifest["best_value"])

    # the study is resumable: a second call adds trials to the same study and rewrites its own file
    result = tune("smoke", FAST, model="gbdt", collection=COLLECTION, trials=1, data_root=tiny_world, work_dir=work)
    assert result.trials_complete == 3 and result.config_file == config_file
    assert main(["run", "--config", str(config_file), "--data-root", str(tiny_world), "--work-dir", str(work),
                 "--models", "gbdt", "--submissions-dir", str(tmp_path / "subs")]) == 0


def test_tune_never_overwrites_a_file_it_did_not_write(tiny_world: Path, tmp_path: Path) -> None:
    mine = tmp_path / "mine.toml"
    mine.write_text('extends = "base"\n')
    with pytest.raises(PipelineError, match="not written by `tune`"):
        tune("smoke", FAST, model="gbdt", collection=COLLECTION, trials=1, data_root=tiny_world,
             work_dir=tmp_path / "work", out=mine)
    assert mine.read_text() == 'extends = "base"\n'
