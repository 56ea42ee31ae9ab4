"""The command line's conventions: the config that follows the machine, --version, global -q/-v, a
default and an example in every --help, and the housekeeping commands."""

from __future__ import annotations

import pytest

import pipelines.models.gnn.device as device
from pipelines.cli import main
from pipelines.config.settings import load_config
from pipelines.flows.run import gpu_sized_on_cpu, machine_config


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
