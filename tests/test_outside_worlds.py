"""``evaluate`` on a world written by another generator: its label record and ``labels/programs.json``.

The world is the tiny synthetic world's graph and label files under a sidecar written here by hand, as
an outside author's generator writes it (docs/evaluation.md): a record whose ``generator`` is not
``pipelines.synth`` and the program kind of every graph.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from pipelines.cli import main
from pipelines.core.collection import ALL_COLLECTIONS
from pipelines.core.errors import FormatError
from pipelines.data.root import DataRoot
from pipelines.data.submission import read_submission
from pipelines.flows.evaluate import SUBMISSION, evaluate_rows, per_graph_table, program_family_table
from pipelines.synth.world import ProgramLabel, program_families, program_kinds, read_labels_marker

KIND_OF = {"tile:xla": "mlp", "layout:xla:default": "cnn", "layout:xla:random": "rnn",
           "layout:nlp:default": "transformer", "layout:nlp:random": "transformer"}


def _record(world: Path) -> dict:
    return {c.name: {ref.stem: {"kind": KIND_OF[c.name], "program": f"hand_{c.source}"}
                     for split in ("train", "valid", "test") for ref in DataRoot(world).graphs(c, split)}
            for c in ALL_COLLECTIONS}


@pytest.fixture()
def outside(tiny_world: Path, tmp_path: Path) -> Path:
    root = tmp_path / "outside"
    shutil.copytree(tiny_world / "npz_all", root / "npz_all")
    shutil.copytree(tiny_world / "labels" / "npz", root / "labels" / "npz")
    shutil.copy(tiny_world / "sample_submission.csv", root)
    (root / "labels" / "labels.json").write_text(json.dumps({"generator": "blind-b", "version": 1, "seed": 5,
                                                             "scale": "pocket",
                                                             "collections": [c.name for c in ALL_COLLECTIONS]}))
    (root / "labels" / "programs.json").write_text(json.dumps(_record(root)))
    return root


def test_an_outside_world_is_scored_with_its_own_program_kinds(outside: Path) -> None:
    assert read_labels_marker(outside)["generator"] == "blind-b"
    families = program_families(outside)
    assert all(isinstance(p, ProgramLabel) for p in families.values())
    evaluation = evaluate_rows(outside, {SUBMISSION: read_submission(outside / "sample_submission.csv")})
    table = program_family_table(evaluation, program_kinds(outside))
    assert {(r["collection"], r["program_family"]) for r in table.iter_rows(named=True)} == set(KIND_OF.items())
    graphs = per_graph_table(evaluation, families)
    assert set(graphs["program"].to_list()) == {"hand_xla", "hand_nlp"}
    assert graphs.height == sum(len(DataRoot(outside).graphs(c, "test")) for c in ALL_COLLECTIONS)


@pytest.mark.parametrize("record, problem", [
    ("[1, 2]", "expected a JSON object of collections"),
    ('{"layout:xla:sometimes": {}}', "is not one of the world's"),
    ('{"tile:xla": {"abc": {"kind": "gnn", "program": "x"}}}', "kind 'gnn' is not one of"),
    ('{"tile:xla": {"abc": {"kind": "cnn"}}}', "program None is not a name"),
    ("{not json", "unreadable program record"),
])
def test_a_malformed_program_record_is_refused_naming_it(outside: Path, record: str, problem: str) -> None:
    path = outside / "labels" / "programs.json"
    path.write_text(record)
    with pytest.raises(FormatError, match=problem) as error:
        program_families(outside)
    assert str(path) in str(error.value)


def test_a_missing_program_record_is_refused_naming_it(outside: Path) -> None:
    (outside / "labels" / "programs.json").unlink()
    with pytest.raises(FormatError, match="programs.json.*missing"):
        program_kinds(outside)


@pytest.mark.parametrize("change, problem", [
    ({"version": 2}, "version 2 is not 1"),
    ({"seed": -1}, "seed -1"),
    ({"generator": ""}, "generator"),
    ({"collections": ["tile:xla", "layout:xyz"]}, "collections"),
])
def test_a_malformed_outside_label_record_is_refused(outside: Path, change: dict, problem: str) -> None:
    path = outside / "labels" / "labels.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **change}))
    with pytest.raises(FormatError, match=problem):
        read_labels_marker(outside)


@pytest.mark.slow
def test_the_evaluate_command_reads_an_outside_world(outside: Path, tmp_path: Path, capsys) -> None:
    from pipelines.config.settings import load_config
    from pipelines.flows.run import run_pipeline

    run = run_pipeline(load_config("smoke", ["gbdt.n_estimators=5"]), outside, work_dir=tmp_path / "work",
                       models=["gbdt"], submissions_dir=tmp_path / "submissions")
    args = ["evaluate", run.run_id, "--data-root", str(outside), "--submissions-dir", str(tmp_path / "submissions"),
            "--per-graph"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "hand_xla" in out and "rnn" in out
    record = json.loads((tmp_path / "submissions" / run.run_id / "evaluation.json").read_text())
    assert record["world"]["generator"] == "blind-b"
    assert {row["program"] for row in record["per_graph"]} == {"hand_xla", "hand_nlp"}


@pytest.mark.slow
def test_the_evaluation_worlds_benchmark_scores_given_worlds(outside: Path, tmp_path: Path) -> None:
    from benchmarks import evaluation_worlds

    out = tmp_path / "result.md"
    assert evaluation_worlds.main(["--worlds", str(outside), "--config", "smoke", "--set", "gbdt.n_estimators=5",
                                   "--models", "gbdt", "--collections", "layout:xla:random", "--root", str(tmp_path),
                                   "--out", str(out)]) == 0
    text = out.read_text()
    assert f"worlds {outside}" in text and "| blind-b | layout:xla:random | rnn |" in text
    assert "Partial" not in text
    per_graph = out.with_suffix(".per-graph.csv").read_text()
    assert "hand_xla" in per_graph and "blind-b" in per_graph


ANOTHER_COMMANDS_PARTIAL_REPORT = ("# Evaluation worlds\n\n**Partial: 1 of 2 worlds scored** (...)\n\n"
                                   "Command: `python -m benchmarks.evaluation_worlds --worlds elsewhere`\n")


@pytest.mark.parametrize(("taken", "earlier"), [(".per-graph.csv", "earlier,results\n"),
                                                (".md", ANOTHER_COMMANDS_PARTIAL_REPORT)])
def test_the_evaluation_worlds_benchmark_refuses_a_used_results_file_before_any_run(
        outside: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, taken: str, earlier: str) -> None:
    from benchmarks import evaluation_worlds
    from pipelines.flows import run

    def no_run(*args, **kwargs):
        raise AssertionError("a world was run although the results file was taken")

    monkeypatch.setattr(run, "train_and_blend", no_run)
    out = tmp_path / "result.md"
    out.with_suffix(taken).write_text(earlier)
    with pytest.raises(SystemExit, match=f"result{re.escape(taken)} exists"):
        evaluation_worlds.main(["--worlds", str(outside), "--collections", "layout:xla:random",
                                "--root", str(tmp_path), "--out", str(out)])
    assert out.with_suffix(taken).read_text() == earlier
    assert [p.name for p in tmp_path.glob("result*")] == [f"result{taken}"]


@pytest.mark.slow
def test_the_evaluation_worlds_benchmark_keeps_the_worlds_scored_before_a_stop(
        outside: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from benchmarks import evaluation_worlds
    from pipelines.flows import run

    real_train_and_blend, calls = run.train_and_blend, []

    def stopped_on_the_second_world(*args, **kwargs):
        calls.append(args)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real_train_and_blend(*args, **kwargs)

    monkeypatch.setattr(run, "train_and_blend", stopped_on_the_second_world)
    out = tmp_path / "result.md"
    command = ["--worlds", f"{outside},{outside}", "--config", "smoke", "--set", "gbdt.n_estimators=5",
               "--models", "gbdt", "--collections", "layout:xla:random", "--root", str(tmp_path), "--out", str(out)]
    with pytest.raises(KeyboardInterrupt):
        evaluation_worlds.main(command)
    text = out.read_text()
    assert "**Partial: 1 of 2 worlds scored**" in text and "| blind-b | layout:xla:random | rnn |" in text
    per_graph = out.with_suffix(".per-graph.csv").read_text().splitlines()
    assert per_graph[0].startswith("family,seed,") and len(per_graph) > 1

    # the same command again finishes the file in place, the first world's stages from the cache
    monkeypatch.setattr(run, "train_and_blend", real_train_and_blend)
    caplog.clear()
    assert evaluation_worlds.main(command) == 0
    text = out.read_text()
    assert "Partial" not in text and "over 2 world(s)" in text
    assert len(out.with_suffix(".per-graph.csv").read_text().splitlines()) == 2 * len(per_graph) - 1
    assert "[train-gbdt] cached" in caplog.text and "[train-gbdt] computing" not in caplog.text
