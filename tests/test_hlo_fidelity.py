"""Issue 77: HLO read as the dataset's own encoder reads it, and real HLO as users have it.

* node numbering: each instruction's position in the serialized module (computations in proto order,
  then their instructions), as ``HloEncoder`` numbers nodes; checked against the official
  ``config_index_to_node`` of the dataset's own tuning record (``../shared/real_tpu``, skipped where
  absent) and between the ``.pb`` and the ``.txt`` of one module;
* PyTorch/XLA dumps (attributes older XLA printed), async wrappers (``async-start`` and the
  ``*-start`` XLA prints for them), and no stray protobuf message on stderr.

The HLO text here is written by the tests themselves or lowered by jax; no third-party file is copied.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

from pipelines.core.collection import LAYOUT_XLA_RANDOM  # noqa: E402
from pipelines.data.tpugraphs import load_graph  # noqa: E402
from pipelines.hlo import featurize_module, featurize_program  # noqa: E402
from pipelines.hlo.featurize import OPCODE_IDS  # noqa: E402
from pipelines.hlo.parse import hlo_lib, load_module, module_from_jax  # noqa: E402
from tests.test_hlo_featurize import _program  # noqa: E402

REAL = Path(__file__).resolve().parents[1] / ".." / "shared" / "real_tpu"
LAYOUT_RECORD = REAL / "module_tuning_data_layout.pb"
needs_real = pytest.mark.skipif(not LAYOUT_RECORD.is_file(), reason="../shared/real_tpu is not here")


def _keys(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as archive:
        return {k: archive[k] for k in archive.files}


def _same_files(a: Path, b: Path) -> None:
    left, right = _keys(a), _keys(b)
    assert sorted(left) == sorted(right)
    for key in left:
        assert left[key].dtype == right[key].dtype and np.array_equal(left[key], right[key]), key


def _real_module_bytes() -> tuple[bytes, list[int]]:
    from pipelines.hlo.schema import tuning_message

    record = tuning_message("ModuleTuningData").FromString(LAYOUT_RECORD.read_bytes())
    return record.module, list(record.config_index_to_node)


@needs_real
def test_the_real_module_gets_the_official_node_ids_from_its_pb_and_its_txt(tmp_path):
    module, official = _real_module_bytes()
    pb = tmp_path / "unet.pb"
    pb.write_bytes(module)
    txt = tmp_path / "unet.txt"
    txt.write_text(hlo_lib().HloModule.from_serialized_hlo_module_proto(module).to_string())
    results = [featurize_program(path, tmp_path / path.suffix[1:], configs=3, tiles=False) for path in (pb, txt)]
    graph = load_graph(results[0].layout_path, LAYOUT_XLA_RANDOM)
    assert len(official) == 62 and graph.node_config_ids.tolist() == official
    assert graph.num_nodes == 3163
    _same_files(results[0].layout_path, results[1].layout_path)


def test_a_pb_and_its_txt_give_identical_files(tmp_path):
    fn, args = _program("lstm", True)  # a while loop: computations of its own, called from the entry
    hlo_module = module_from_jax(fn, *args)
    pb = tmp_path / "lstm.pb"
    pb.write_bytes(hlo_module.as_serialized_hlo_module_proto())
    txt = tmp_path / "lstm.txt"
    txt.write_text(hlo_module.to_string())
    first, second = (featurize_program(p, tmp_path / p.suffix[1:], configs=4, search="default") for p in (pb, txt))
    _same_files(first.layout_path, second.layout_path)


def _proto_order(data: bytes) -> list[str]:
    """Instruction names in the order the serialized module lists them (the official node ids)."""
    from pipelines.hlo.schema import hlo_message

    module = hlo_message("HloModuleProto").FromString(data)
    return [i.name.decode() for c in module.computations for i in c.instructions]


def test_nodes_are_numbered_in_the_serialized_modules_order():
    fn, args = _program("cnn_nhwc", True)
    hlo_module = module_from_jax(fn, *args, optimized=True)  # fusions: computations called from the entry
    featurized = featurize_module(hlo_module, "cnn")
    assert featurized.layout.names == _proto_order(hlo_module.as_serialized_hlo_module_proto())


ASYNC = """HloModule async_program, entry_computation_layout={(f32[2,3]{1,0}, f32[3,2]{1,0})->f32[2,2]{1,0}}

%wrapped_dot (p0: f32[2,3], p1: f32[3,2]) -> f32[2,2] {
  %p0 = f32[2,3]{1,0} parameter(0)
  %p1 = f32[3,2]{1,0} parameter(1)
  ROOT %dot.1 = f32[2,2]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%wrapped_add (q0: f32[2,2]) -> f32[2,2] {
  %q0 = f32[2,2]{1,0} parameter(0)
  ROOT %add.1 = f32[2,2]{1,0} add(%q0, %q0)
}

ENTRY %main (a: f32[2,3], b: f32[3,2]) -> f32[2,2] {
  %a = f32[2,3]{1,0} parameter(0)
  %b = f32[3,2]{1,0} parameter(1)
  %start = ((f32[2,3]{1,0}, f32[3,2]{1,0}), f32[2,2]{1,0}, s32[]) async-start(%a, %b), calls=%wrapped_dot
  %done = f32[2,2]{1,0} async-done(%start)
  %call-start = ((f32[2,2]{1,0}), f32[2,2]{1,0}, s32[]) call-start(%done), to_apply=%wrapped_add
  ROOT %call-done = f32[2,2]{1,0} call-done(%call-start)
}
"""


def test_async_wrappers_featurize_with_their_wrapped_computations(tmp_path):
    path = tmp_path / "async.txt"
    path.write_text(ASYNC)
    featurized = featurize_module(load_module(path), str(path))
    names, opcodes = featurized.layout.names, featurized.layout.node_opcode
    start, dot = names.index("start"), names.index("dot.1")
    assert opcodes[start] == OPCODE_IDS["async-start"] and opcodes[names.index("done")] == OPCODE_IDS["async-done"]
    assert featurized.config_ids.tolist() == [dot]  # the wrapped dot is a configurable node
    edges = set(map(tuple, featurized.layout.edge_index.tolist()))
    assert (start, dot) in edges  # the wrapper sees the root of the computation it runs
    result = featurize_program(path, tmp_path / "out", configs=3)
    assert load_graph(result.layout_path, LAYOUT_XLA_RANDOM).node_config_ids.tolist() == [dot]


PYTORCH_XLA = """HloModule SyncTensorsGraph.12, entry_computation_layout={(f32[4,8]{1,0}, f32[8,2]{1,0})->(f32[4,2]{1,0})}

ENTRY %SyncTensorsGraph.12 (p0.1: f32[4,8], p1.2: f32[8,2]) -> (f32[4,2]) {
  %p1.2 = f32[8,2]{1,0} parameter(1), metadata={op_type="xla__device_data" op_name="xla__device_data"}
  %p0.1 = f32[4,8]{1,0} parameter(0), metadata={op_type="xla__device_data" op_name="xla__device_data"}
  %dot.3 = f32[4,2]{1,0} dot(f32[4,8]{1,0} %p0.1, f32[8,2]{1,0} %p1.2), lhs_contracting_dims={1}, rhs_contracting_dims={0}, operand_precision={default,default}, metadata={op_type="aten__mm" op_name="aten__mm"}
  %custom-call.4 = f32[4,2]{1,0} custom-call(f32[4,2]{1,0} %dot.3), custom_call_target="Sharding", api_version=API_VERSION_UNSPECIFIED, custom_call_schedule=SCHEDULE_NONE
  %reshape.5 = f32[8]{0} reshape(f32[4,2]{1,0} %custom-call.4), metadata={op_type="aten__view" op_name="aten__view"}
  %reshape.6 = f32[4,2]{1,0} reshape(f32[8]{0} %reshape.5)
  ROOT %tuple.7 = (f32[4,2]{1,0}) tuple(f32[4,2]{1,0} %reshape.6)
}
"""


def test_a_pytorch_xla_dump_featurizes_with_a_warning_naming_what_was_read_as_todays_xla(tmp_path, caplog):
    path = tmp_path / "SyncTensorsGraph.12.txt"
    path.write_text(PYTORCH_XLA)
    with caplog.at_level(logging.WARNING, logger="pipelines"):
        result = featurize_program(path, tmp_path / "out", configs=5)
    graph = load_graph(result.layout_path, LAYOUT_XLA_RANDOM)
    assert graph.node_config_ids.shape[0] == 3 and graph.num_nodes == 7  # the dot and the two reshapes
    said = " ".join(r.getMessage() for r in caplog.records)
    assert str(path) in said and "api_version=API_VERSION_UNSPECIFIED" in said and "custom_call_schedule" in said


def test_a_file_xla_refuses_for_another_reason_still_names_the_file_and_xlas_message(tmp_path):
    path = tmp_path / "fragment.txt"
    path.write_text(PYTORCH_XLA.replace("%p0.1, f32[8,2]{1,0} %p1.2", "%p0.1, f32[8,2]{1,0} %p9"))
    with pytest.raises(Exception) as err:
        featurize_program(path, tmp_path / "out")
    assert str(path) in str(err.value) and "p9" in str(err.value)


def test_reading_an_xla_dump_wrapper_prints_nothing_on_stderr(tmp_path, capfd):
    fn, args = _program("mlp", False)
    payload = module_from_jax(fn, *args).as_serialized_hlo_module_proto()
    length, varint = len(payload), bytearray()
    while True:
        byte, length = length & 0x7F, length >> 7
        varint.append(byte | (0x80 if length else 0))
        if not length:
            break
    wrapped = tmp_path / "module_0001.jit_mlp.hlo.pb"  # the HloProto that --xla_dump_hlo_as_proto writes
    wrapped.write_bytes(b"\x0a" + bytes(varint) + payload)
    capfd.readouterr()
    featurize_program(wrapped, tmp_path / "out", configs=3)
    assert capfd.readouterr().err == ""
