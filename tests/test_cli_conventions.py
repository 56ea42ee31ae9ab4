"""The command line's conventions: the config that follows the machine, --version, global -q/-v, a
default and an example in every --help, and the housekeeping commands."""

from __future__ import annotations

import pytest

import pipelines.models.gnn.device as device
from pipelines.cli import main
from pipelines.config.settings import load_config
from pipelines.flows.schedule import gpu_sized_on_cpu, machine_config


def test_the_machine_picks_the_config_and_says_why():
    name, why = machine_config("1 CUDA GPU (NVIDIA H200)")
    assert name == "gpu" and "NVIDIA H200" in why and "base" in why
    name, why = machine_config(None)
    assert name == "cpu" and "no CUDA GPU" in why and "hours" in why


def test_a_gpu_schedule_on_a_cpu_is_told():
    for name in ("base", "gpu"):
        assert gpu_sized_on_cpu(load_config(name), ["gbdt", "gnn"], None)
    assert not gpu_sized_on_cpu(load_config("gpu"), ["gbdt", "gnn"], "1 CUDA GPU (X)")
    assert not gpu_sized_on_cpu(load_config("gpu"), ["gbdt"], None)  # no GNN trained
    assert not gpu_sized_on_cpu(load_config("cpu"), ["gbdt", "gnn"], None)


@pytest.mark.parametrize("gpu, first", [(None, "config: cpu (no --config given; torch sees no CUDA GPU"),
                                         ("1 CUDA GPU (fake)", "config: gpu (no --config given; torch sees 1 CUDA")])
def test_run_names_its_config_in_its_first_line_and_an_explicit_one_wins(gpu, first, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(device, "cuda_summary", lambda: gpu)
    common = ["run", "--data-root", str(tmp_path / "nowhere"), "--work-dir", str(tmp_path / "w"),
              "--submissions-dir", str(tmp_path / "s")]
    assert main(common) == 1  # the missing data root: after the config lines, before any stage
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(first)
    assert main([*common, "--config", "gpu"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "config: gpu (--config)"
    assert any(line.startswith("warning: config gpu's GNN schedule is base's") for line in out) == (gpu is None)


def test_version_and_quiet_or_verbose_before_or_after_the_command(capsys):
    from pipelines.cli import build_parser

    with pytest.raises(SystemExit) as raised:
        main(["--version"])
    assert raised.value.code == 0 and capsys.readouterr().out.startswith("pipelines ")
    parser = build_parser()
    assert parser.parse_args(["config"]).verbosity == 0
    assert parser.parse_args(["-q", "config"]).verbosity == -1
    assert parser.parse_args(["-v", "config"]).verbosity == 1
    assert parser.parse_args(["config", "-q"]).verbosity == -1
    assert parser.parse_args(["runs", "-v", "list"]).verbosity == 1


def test_every_help_has_an_example_and_shows_every_default(monkeypatch):
    import argparse
    import sys

    from pipelines.cli import _subparsers, build_parser

    monkeypatch.setattr(sys, "argv", ["/usr/local/bin/tpugraphs"])
    parser = build_parser()
    commands = [parser, *_subparsers(parser)]
    assert {"runs list", "runs compare", "gc"} <= {c.prog.split(" ", 1)[-1] for c in commands}
    for command in commands:
        text = command.format_help()
        assert "example:\n  tpugraphs " in text, command.prog
        formatter = command._get_formatter()
        for action in command._actions:
            if not action.option_strings or action.nargs == 0 or action.required or \
                    action.help == argparse.SUPPRESS or isinstance(action, argparse._SubParsersAction):
                continue
            assert "default" in formatter._expand_help(action), (command.prog, action.option_strings)


def test_run_collections_scores_some_collections_and_gc_keeps_what_runs_use(tiny_world, tmp_path, capsys):
    import json

    work, subs = tmp_path / "work", tmp_path / "subs"
    assert main(["run", "--data-root", str(tiny_world), "--work-dir", str(work), "--submissions-dir", str(subs),
                 "--config", "smoke", "--models", "gbdt", "--collections", "tile:xla"]) == 0
    out = capsys.readouterr().out
    assert "tile:xla" in out and "no submission" in out and not subs.exists()
    # every stage line names its collection, training and ensemble too; finished stages give the run's ETA
    assert "tile:xla [train-gbdt] done" in out and "stage 6/6: tile:xla [ensemble] computing" in out
    assert "(run ETA " in out
    stages = {p.name: [k.name for k in p.iterdir() if not k.name.startswith(".")] for p in work.iterdir()
              if p.is_dir() and not p.name.startswith(".")}
    assert {"prune", "features", "folds", "train-gbdt", "ensemble"} <= set(stages)

    assert main(["status", "--work-dir", str(work)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].lstrip().startswith("SIZE") and "stage folder(s)," in out

    assert main(["gc", "--work-dir", str(work), "--submissions-dir", str(subs)]) == 0  # no run: all is garbage
    out = capsys.readouterr().out
    assert "dry run: nothing removed" in out and "train-gbdt" in out
    assert all((work / s / k).is_dir() for s, keys in stages.items() for k in keys)

    # a run that uses the ensemble stage keeps it and everything it was made from; the rest goes
    (work / "prune" / "0123456789abcdef").mkdir()  # an incomplete folder no run uses
    (subs / "20261201T000000Z-00000000").mkdir(parents=True)
    (subs / "20261201T000000Z-00000000" / "manifest.json").write_text(json.dumps(
        {"stages": {"tile:xla": {"ensemble": stages["ensemble"][0]}}}))
    assert main(["gc", "--work-dir", str(work), "--submissions-dir", str(subs), "--delete"]) == 0
    out = capsys.readouterr().out
    assert "removed 2 stage folder(s)" in out and not (work / "prune" / "0123456789abcdef").exists()
    # kept: the ensemble and its inputs, down to the raw data; gone: the GNN's arrays, which gbdt never read
    assert all((work / s / k).is_dir() == (s != "node_arrays") for s, keys in stages.items() for k in keys)
