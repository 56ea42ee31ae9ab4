"""Bad configs and arguments on the command line: each gets a clear message and a non-zero exit, and
nothing is written (neither the work dir nor the submissions dir comes into existence)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipelines.cli import main


def _outputs(tmp_path: Path) -> tuple[Path, Path]:
    return tmp_path / "work", tmp_path / "submissions"


# (command-line arguments after the data/work/submissions options, words the message must contain)
CASES = {
    "unknown collection": (["prepare", "--collections", "layout:xla:nope"], ["layout:xla:nope"]),
    "unknown collection (train)": (["train", "--model", "gbdt", "--collection", "tile:nlp"], ["tile:nlp"]),
    "unknown model (train)": (["train", "--model", "xgboost"], ["unknown model 'xgboost'", "gbdt"]),
    "unknown model (run)": (["run", "--models", "gbdt,xgboost"], ["unknown model 'xgboost'"]),
    "folds larger than the groups": (["run", "--models", "gbdt", "--set", "folds.k=40"],
                                     ["folds.k = 40", "tile:xla"]),
    "override of a missing key": (["run", "--set", "gbdt.num_leafs=7"], ["gbdt.num_leafs", "num_leaves"]),
    "override of a missing section": (["prepare", "--set", "pruning.hops=2"], ["unknown section [pruning]"]),
    "override with a wrong type": (["prepare", "--set", "folds.k=three"], ["folds.k", "expected int"]),
    "override outside the choices": (["prepare", "--set", "data.on_bad_file=ignore"], ["'ignore'", "'skip'"]),
    "unknown config name": (["run", "--config", "quik"], ["unknown config 'quik'", "quick"]),
    "missing data root": (["prepare", "--data-root", "{tmp}/nowhere"], ["nowhere", "does not exist"]),
    "missing data root (run)": (["run", "--data-root", "{tmp}/nowhere"], ["nowhere", "does not exist"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_arguments_give_a_message_a_nonzero_exit_and_write_nothing(case, tiny_world, tmp_path, capsys):
    arguments, expected = CASES[case]
    work, submissions = _outputs(tmp_path)
    command, *rest = [a.replace("{tmp}", str(tmp_path)) for a in arguments]
    common = ["--work-dir", str(work)]
    if "--data-root" not in rest:
        common += ["--data-root", str(tiny_world)]
    if command == "run":
        common += ["--submissions-dir", str(submissions)]
    code = main([command, *common, "--config", "quick", *rest] if "--config" not in rest else [command, *common, *rest])

    err = capsys.readouterr().err
    assert code != 0
    assert err.startswith("error: ") and "Traceback" not in err
    for words in expected:
        assert words in err, f"{words!r} not in {err!r}"
    assert not work.exists() and not submissions.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_argparse_errors_exit_2_with_usage(tmp_path, capsys):
    with pytest.raises(SystemExit) as raised:
        main(["train", "--data-root", str(tmp_path), "--work-dir", str(tmp_path / "work")])  # --model missing
    assert raised.value.code == 2
    assert "--model" in capsys.readouterr().err
    with pytest.raises(SystemExit) as raised:
        main(["synthesise"])
    assert raised.value.code == 2
    assert not (tmp_path / "work").exists()


@pytest.mark.parametrize("seed", ["-1", "4294967296", "1" * 30])
def test_a_seed_outside_0_to_2_32_is_a_usage_error(tmp_path, seed, capsys):
    """Issue 71, class 3: ``synth --seed -1`` ended in numpy's traceback."""
    from pipelines.cli import main
    with pytest.raises(SystemExit) as exit_info:
        main(["synth", "--out", str(tmp_path / "w"), "--scale", "tiny", "--seed", seed])
    assert exit_info.value.code == 2
    assert "2^32" in capsys.readouterr().err and not (tmp_path / "w").exists()


def test_a_gpu_asked_for_on_a_machine_without_one_fails_before_any_stage(tiny_world, tmp_path, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    work, submissions = _outputs(tmp_path)
    code = main(["run", "--data-root", str(tiny_world), "--work-dir", str(work), "--submissions-dir",
                 str(submissions), "--config", "smoke", "--set", 'gnn.device="cuda"'])
    err = capsys.readouterr().err
    assert code == 2 and "gnn.device = 'cuda'" in err and "no CUDA GPU" in err
    assert not work.exists() and not submissions.exists()


def test_run_on_a_root_of_test_graphs_only_points_to_predict(tiny_world, tmp_path, capsys):
    import shutil

    root = tmp_path / "new-graphs"
    shutil.copytree(tiny_world, root, ignore=lambda folder, names: [n for n in names if n in ("train", "valid")])
    work, submissions = _outputs(tmp_path)
    code = main(["run", "--data-root", str(root), "--work-dir", str(work), "--submissions-dir", str(submissions),
                 "--config", "smoke"])
    err = capsys.readouterr().err
    assert code == 1 and "no train graphs" in err and f"predict --run RUN_ID --data-root {root}" in err
    assert not work.exists() and not submissions.exists()


def test_ctrl_c_says_the_same_command_resumes(monkeypatch, capsys):
    import pipelines.commands.config as config_command

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(config_command, "run", interrupted)
    assert main(["config"]) == 130
    assert "rerun the same command to resume" in capsys.readouterr().err


def test_train_checks_the_gpu_before_any_stage_too(tiny_world, tmp_path, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    code = main(["train", "--model", "gnn", "--collection", "tile:xla", "--data-root", str(tiny_world),
                 "--work-dir", str(tmp_path / "work"), "--config", "smoke", "--set", 'gnn.device="cuda"'])
    assert code == 2 and "no CUDA GPU" in capsys.readouterr().err and not (tmp_path / "work").exists()


@pytest.mark.parametrize("argv, hint", [
    (["rnu"], "invalid choice: 'rnu'"),
    (["runs", "lsit"], "did you mean 'list'?"),
    (["run", "--data-root", "x", "--modles", "gbdt"], "unrecognized arguments: --modles gbdt; did you mean --models?"),
    (["runs", "list", "--srot=score"], "did you mean --sort?"),
    (["--versoin", "runs", "list"], "did you mean --version?"),  # the program's own options too
    # a mistyped required option is reported missing: the hint names it
    (["run", "--data-rot", "x"], "required: --data-root; did you mean --data-root?"),
    (["runs", "list", "--sort", "scroe"], "did you mean 'score'?"),  # an option's choices
])
def test_a_mistyped_command_action_or_option_gets_the_closest_suggested(argv, hint, capsys):
    """Issue 79: config keys had "did you mean", commands and flags did not."""
    with pytest.raises(SystemExit) as raised:
        main(argv)
    err = capsys.readouterr().err
    assert raised.value.code == 2 and hint in err, err
    if argv == ["rnu"]:
        assert err.rstrip().endswith("did you mean 'run'?")


def test_no_suggestion_for_an_option_like_none(capsys):
    with pytest.raises(SystemExit):
        main(["runs", "list", "--bogus"])
    assert capsys.readouterr().err.rstrip().endswith("unrecognized arguments: --bogus")
