"""Issue 78, item 3: featurize and rank on hostile HLO and hostile options.

* HLO that XLA's parser accepts but its own proto checks refuse (a dim of 2^62, a layout ``{5,0}`` on a
  rank-2 shape, tuples nested 1,000 deep) is a clean error naming the file, never a traceback;
* nesting depth and dims are bounded before the text or proto reaches XLA (tuples nested 20,000 deep
  crashed XLA's parser with SIGSEGV), so the process survives to say what is wrong;
* bad numeric options are usage errors (exit 2): ``--seed -1``, ``--tile-configs -3``, ``--tile-configs 0``
  (which wrote a tile graph the project's own reader refuses);
* one ``--out`` of ``rank`` cannot be shared by two processes (a lock), so one never scores the data
  the other is rebuilding.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

jax = pytest.importorskip("jax")

from pipelines.cli import main  # noqa: E402
from pipelines.core.errors import FormatError  # noqa: E402
from pipelines.hlo import featurize_program  # noqa: E402
from pipelines.hlo.parse import module_from_jax  # noqa: E402
from tests.test_hlo_featurize import _program  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def _nested(depth: int) -> str:
    return "(" * depth + "f32[]" + ")" * depth


def _module(shape: str, layout_shape: str | None = None) -> str:
    return (f"HloModule hostile\n\nENTRY %main (p: {shape}) -> {shape} {{\n"
            f"  ROOT %p = {layout_shape or shape} parameter(0)\n}}\n")


HOSTILE_TEXT = {
    "dim_2_62": _module("f32[4611686018427387904]", "f32[4611686018427387904]{0}"),
    "layout_out_of_rank": _module("f32[2,3]", "f32[2,3]{5,0}"),
    "tuple_1000_deep": _module(_nested(1000)),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_TEXT))
def test_hlo_xla_accepts_then_refuses_is_a_clean_error_naming_the_file(case, tmp_path):
    path = tmp_path / f"{case}.txt"
    path.write_text(HOSTILE_TEXT[case])
    with pytest.raises(FormatError) as err:
        featurize_program(path, tmp_path / "out")
    assert str(path) in str(err.value)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipelines", *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=300)


def test_tuples_nested_20000_deep_are_refused_before_xla_parses_them(tmp_path):
    path = tmp_path / "deep.txt"
    path.write_text(_module(_nested(20_000)))
    done = _cli("featurize", str(path), "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert done.returncode == 1, (done.returncode, done.stderr[-2000:])  # was -11 (SIGSEGV)
    assert str(path) in done.stderr and "nested" in done.stderr and "Traceback" not in done.stderr


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def test_a_proto_with_a_shape_nested_20000_deep_is_refused_before_xla(tmp_path):
    """The same attack as a serialized module: a parameter's shape is a ShapeProto nested in itself."""
    from pipelines.hlo.schema import hlo_message

    fn, args = _program("mlp", False)
    module = hlo_message("HloModuleProto").FromString(module_from_jax(fn, *args).as_serialized_hlo_module_proto())
    shape = b"\x10\x0b"  # element_type F32
    for _ in range(20_000):
        shape = b"\x10\x0d" + _field(4, shape)  # a TUPLE holding the shape so far
    entry = module.computations[-1]
    entry.instructions[0].ClearField("shape")
    instructions = b"".join(_field(2, ins.SerializeToString() + (_field(3, shape) if k == 0 else b""))
                            for k, ins in enumerate(entry.instructions))
    entry.ClearField("instructions")
    computations = [c.SerializeToString() for c in module.computations[:-1]]
    computations.append(entry.SerializeToString() + instructions)
    module.ClearField("computations")
    path = tmp_path / "deep.pb"
    path.write_bytes(module.SerializeToString() + b"".join(_field(3, c) for c in computations))
    done = _cli("featurize", str(path), "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert done.returncode == 1, (done.returncode, done.stderr[-2000:])
    assert str(path) in done.stderr and "Traceback" not in done.stderr


@pytest.fixture
def program(tmp_path: Path) -> Path:
    fn, args = _program("cnn_nhwc", True)
    path = tmp_path / "cnn.pb"
    path.write_bytes(module_from_jax(fn, *args, optimized=True).as_serialized_hlo_module_proto())  # has fusions
    return path


@pytest.mark.parametrize("option", [["--seed", "-1"], ["--seed", str(2**32)], ["--tile-configs", "-3"],
                                    ["--tile-configs", "0"], ["--configs", "0"]])
def test_featurize_refuses_bad_numbers_as_usage_errors(program, tmp_path, capsys, option):
    assert main(["featurize", str(program), "--out", str(tmp_path / "out"), *option]) == 2
    assert option[0] in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("option", [["--seed", "-1"], ["--tile-configs", "-3"], ["--tile-configs", "0"]])
def test_rank_refuses_bad_numbers_as_usage_errors(program, tmp_path, capsys, option):
    code = main(["rank", "--run", "20261201T000000Z-00000000", str(program), "--out", str(tmp_path / "out"),
                 "--submissions-dir", str(tmp_path / "subs"), *option])
    assert code == 2 and option[0] in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_rank_refuses_an_out_folder_another_rank_is_writing(tmp_path, capsys):
    from pipelines.hlo import out_folder_lock

    out = tmp_path / "ranked"
    program = tmp_path / "mlp.txt"
    fn, args = _program("mlp", False)
    program.write_text(module_from_jax(fn, *args).to_string())
    with out_folder_lock(out, "rank"):  # another process holds it (the lock is per open file: as good as a process)
        code = main(["rank", "--run", "20261201T000000Z-00000000", str(program), "--out", str(out),
                     "--submissions-dir", str(tmp_path / "subs")])
        err = capsys.readouterr().err
    assert code == 1 and str(out) in err and "another" in err
    assert sorted(p.name for p in out.iterdir()) == [".rank.lock"]


def test_featurize_refuses_an_out_folder_another_featurize_is_writing(program, tmp_path, capsys):
    from pipelines.hlo import out_folder_lock

    out = tmp_path / "out"
    with out_folder_lock(out, "featurize"):
        assert main(["featurize", str(program), "--out", str(out), "--configs", "3"]) == 1
    assert str(out) in capsys.readouterr().err and [p.name for p in out.iterdir()] == [".featurize.lock"]
    assert main(["featurize", str(program), "--out", str(out), "--configs", "3"]) == 0  # released


@pytest.mark.parametrize("command", ["featurize", "rank", "records"])
def test_no_command_writes_into_a_data_root_it_did_not_make(program, tiny_world, tmp_path, capsys, command):
    import shutil

    root = tmp_path / "data"
    shutil.copytree(tiny_world, root)
    before = sorted(str(p.relative_to(root)) for p in root.rglob("*"))
    args = {"featurize": ["featurize", str(program), "--out", str(root)],
            "rank": ["rank", "--run", "20261201T000000Z-00000000", str(program), "--out", str(root),
                     "--submissions-dir", str(tmp_path / "subs")],
            "records": ["records", str(_tile_record(tmp_path, program)), "--out", str(root)]}[command]
    assert main(args) == 1
    assert str(root) in capsys.readouterr().err
    assert sorted(str(p.relative_to(root)) for p in root.rglob("*")) == before  # not even a lock file


def _tile_record(tmp_path: Path, program: Path) -> Path:
    """A TuningData of one module with two tile runs (the program's bytes as its module)."""
    from pipelines.hlo.schema import tuning_message

    record = tuning_message("ModuleTuningData")(module=program.read_bytes(), fingerprint=7)
    for k in range(2):
        run = record.runs.add(is_default=k == 0)
        run.profile.compute_time_ns = 100 + k
        run.op_config.tile_size_config.output_bounds.extend([8, 8 << k])
    path = tmp_path / "records.pb"
    path.write_bytes(tuning_message("TuningData")(modules=[record]).SerializeToString())
    return path
