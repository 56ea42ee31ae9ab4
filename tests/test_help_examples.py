"""Every ``example:`` of every ``--help`` runs as shown (issue 79: ``demo --help``'s example failed).

Each example is run through :func:`pipelines.cli.main`, exactly the arguments ``python -m pipelines``
would get, in a scratch folder (its relative paths land there), in one of three ways:

* **as shown** (``AS_SHOWN``): every data root an example names (``data/kaggle``,
  ``data/synthetic-small``, ...) is the tiny synthetic world, and the run-ids an example shows stand for
  runs made in the scratch folder (``RUN_IDS``). It must exit 0.
* **on the tiny world** (``ON_TINY``): examples that generate a larger world run with the same
  arguments at ``--scale tiny`` (a ``small`` world takes minutes to generate).
* **parse + first validation** (``FIRST_CHECK``): examples that need Kaggle (credentials, the network),
  a user's own HLO dumps or tuning records, or hours of training, run in an empty folder without Kaggle credentials: they
  must parse, then stop at their first check with exit 1 and one error line naming what is missing,
  no traceback.

A new example fails :func:`test_every_example_is_checked` until it is given one of the three.
"""

from __future__ import annotations

import io
import re
import shlex
import sys
from pathlib import Path

import pytest

from pipelines.cli import _subparsers, build_parser, main

pytestmark = pytest.mark.slow

# The data roots the examples name; each is the tiny world here (demo --scale tiny finds it complete and
# reuses it, so every run shares its data stages and `ensemble` can blend them).
DATA_ROOTS = ("data/synthetic-tiny", "data/kaggle", "data/synthetic-small", "data/new-graphs",
              "data/synthetic-medium-v1")
# run-id placeholders -> the scratch folder's run they stand for (see the `runs` fixture)
RUN_IDS = {"RUN_ID": "demo", "RUN_A": "demo", "20261122T120000Z-1a2b3c4d": "demo", "1a2b3c4d": "demo",
           "RUN_B": "run", "9f8e7d6c": "run", "PREDICT_RUN_ID": "valid"}
# per example, placeholders that stand for another run than RUN_IDS says
RUN_IDS_OF = {"runs rm 1a2b3c4d": {"1a2b3c4d": "spare"}}

# example (as --help prints it, less the program and any "# ..." comment) -> why it is checked so
AS_SHOWN = (
    "demo --scale tiny",
    "run --data-root data/kaggle --config quick --models gbdt",
    "validate-submission --data-root data/kaggle submissions/RUN_ID/submission.csv",
    "score --data-root data/synthetic-small --split valid submissions/PREDICT_RUN_ID/submission.csv",
    "prepare --data-root data/kaggle --collections tile:xla",
    "train --model gnn --collection tile:xla --data-root data/synthetic-small --config quick",
    "status --stage train-gbdt",
    "status --explain --data-root data/synthetic-small --config demo --collections tile:xla",
    "config --config demo --set gnn.epochs=4",
    "ensemble --runs RUN_A RUN_B --method rank",
    "report 20261122T120000Z-1a2b3c4d --out report.html",
    "runs list --sort score",
    "runs list --sort score --limit 10",
    "runs compare 1a2b3c4d 9f8e7d6c",
    "runs track 1a2b3c4d",
    "runs rm 1a2b3c4d",
    "predict --run 20261122T120000Z-1a2b3c4d --data-root data/new-graphs",
    "evaluate 20261122T120000Z-1a2b3c4d --data-root data/synthetic-medium-v1",
    "gc --work-dir data/work --submissions-dir submissions --delete",
)
ON_TINY = {
    "synth --out data/synthetic-small --scale small --seed 0": ("--scale", "small", "tiny"),
}
FIRST_CHECK = {  # example -> what its error names
    "-q run --data-root data/kaggle": "data/kaggle",  # no --config: the machine's schedule, hours
    "download --data-root data/kaggle": "Kaggle credentials",
    "submit 20261122T120000Z-1a2b3c4d": "20261122T120000Z-1a2b3c4d",
    "submissions sync": "submissions",
    "featurize dumps/module_0001.jit_step.before_optimizations.hlo.pb --out data/mine --configs 1000":
        "dumps/module_0001.jit_step.before_optimizations.hlo.pb",
    "rank --run 20261122T120000Z-1a2b3c4d dumps/module_0001.jit_step.before_optimizations.txt --configs 500":
        "dumps/module_0001.jit_step.before_optimizations.txt",
    "records tuning/op_tuning_data.pb tuning/module_tuning_data_layout.pb --out data/mine":
        "tuning/op_tuning_data.pb",  # the user's own XLA autotuning records
    "tune --model gbdt --collection layout:xla:random --trials 20 --data-root data/synthetic-small":
        "data/synthetic-small",  # 20 trials of base's GBDT
}


def help_examples() -> list[str]:
    """Every example line of every --help (the main parser's and each command's), as typed after the
    program name, without a trailing ``# ...`` comment."""
    saved = sys.argv[:]
    sys.argv[:] = ["tpugraphs"]
    try:
        parser = build_parser()
    finally:
        sys.argv[:] = saved
    found = []
    for command in (parser, *_subparsers(parser)):
        match = re.search(r"example:\n(.*?)(?:\n\n|$)", command.epilog or "", re.S)
        assert match, f"{command.prog}: no example in --help"
        for line in match.group(1).splitlines():
            text = line.split("#", 1)[0].strip()
            assert text.startswith("tpugraphs "), line
            found.append(text[len("tpugraphs "):])
    return list(dict.fromkeys(found))


def test_every_example_is_checked() -> None:
    examples = help_examples()
    known = [*AS_SHOWN, *ON_TINY, *FIRST_CHECK]
    assert sorted(examples) == sorted(known), (f"not checked: {sorted(set(examples) - set(known))}; "
                                               f"no longer in --help: {sorted(set(known) - set(examples))}")


def argv_of(example: str, runs: dict[str, str]) -> list[str]:
    """The example's arguments with its run-id placeholders replaced by the scratch folder's runs."""
    stands_for = {**RUN_IDS, **RUN_IDS_OF.get(example, {})}
    out = []
    for word in shlex.split(example):
        for placeholder, run in sorted(stands_for.items(), key=lambda item: -len(item[0])):  # PREDICT_RUN_ID first
            if placeholder in word and run in runs:
                word = word.replace(placeholder, runs[run])
                break
        out.append(word)
    return out


def run_example(argv: list[str], capsys: pytest.CaptureFixture) -> tuple[int, str, str]:
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse: a usage error, or --help
        code = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


class _Answers(io.StringIO):
    """stdin of a terminal whose user answers ``y`` (``runs rm`` asks first)."""

    def isatty(self) -> bool:
        return True


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory, tiny_world: Path) -> Path:
    folder = tmp_path_factory.mktemp("examples")
    (folder / "data").mkdir()
    for root in DATA_ROOTS:
        (folder / root).symlink_to(tiny_world, target_is_directory=True)
    return folder


@pytest.fixture(scope="module")
def runs(scratch: Path) -> dict[str, str]:
    """The runs the examples' run-ids stand for, made in ``scratch`` by the examples themselves where
    one makes a run: ``demo`` (demo --scale tiny), ``run`` (the run example), ``spare`` (demo again:
    for runs rm), ``valid`` (a run holding the valid split out, and its valid-split predictions: what
    score's example scores)."""
    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.chdir(scratch)
    made: dict[str, str] = {}

    def new_run(argv: list[str]) -> str:
        before = set(Path("submissions").glob("2*")) if Path("submissions").is_dir() else set()
        assert main(argv) == 0, argv
        (after,) = set(Path("submissions").glob("2*")) - before
        return after.name

    try:
        made["demo"] = new_run(shlex.split(AS_SHOWN[0]))
        made["run"] = new_run(shlex.split(AS_SHOWN[1]))
        made["spare"] = new_run(shlex.split(AS_SHOWN[0]))
        holdout = new_run(["run", "--data-root", "data/kaggle", "--config", "smoke", "--models", "random",
                           "--set", "folds.holdout_valid=true"])
        made["valid"] = new_run(["predict", "--run", holdout, "--split", "valid", "--data-root", "data/kaggle"])
    finally:
        monkeypatch.undo()
    return made


@pytest.mark.parametrize("example", AS_SHOWN[2:])
def test_example_runs_as_shown(example: str, scratch: Path, runs: dict[str, str], monkeypatch, capsys) -> None:
    monkeypatch.chdir(scratch)
    monkeypatch.setattr(sys, "stdin", _Answers("y\n"))
    code, out, err = run_example(argv_of(example, runs), capsys)
    assert code == 0, f"{example}:\n{out[-2000:]}\n{err[-2000:]}"
    assert "Traceback" not in out + err


def test_examples_that_make_runs_ran(runs: dict[str, str], scratch: Path) -> None:
    """``demo --scale tiny`` and the ``run`` example (run by the ``runs`` fixture) each published a run."""
    for name in ("demo", "run"):
        assert (scratch / "submissions" / runs[name] / "submission.csv").is_file(), name


@pytest.mark.parametrize("example", sorted(ON_TINY))
def test_example_runs_on_the_tiny_world(example: str, tmp_path: Path, monkeypatch, capsys) -> None:
    option, shown, used = ON_TINY[example]
    argv = shlex.split(example)
    assert argv[argv.index(option) + 1] == shown
    argv[argv.index(option) + 1] = used
    monkeypatch.chdir(tmp_path)
    code, out, err = run_example(argv, capsys)
    assert code == 0, f"{example}:\n{out[-2000:]}\n{err[-2000:]}"


@pytest.mark.parametrize("example", sorted(FIRST_CHECK))
def test_example_parses_and_stops_at_its_first_check(example: str, tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))  # no Kaggle credentials: nothing reaches the network
    for name in ("KAGGLE_USERNAME", "KAGGLE_KEY", "KAGGLE_API_TOKEN", "KAGGLE_CONFIG_DIR"):
        monkeypatch.delenv(name, raising=False)
    code, out, err = run_example(shlex.split(example), capsys)
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert code == 1, f"{example}: exit {code}\n{out[-2000:]}\n{err[-2000:]}"
    assert errors and FIRST_CHECK[example] in err, err
    assert "Traceback" not in out + err
