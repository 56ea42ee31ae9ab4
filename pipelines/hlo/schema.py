"""The protobuf messages this package decodes, declared in Python (no ``protoc``, no C++ build).

Two schemas, each the subset of fields we read, with the field numbers of their public ``.proto``
files (unknown fields are kept by the decoder and ignored):

* ``tuning``: the TpuGraphs tuning records, ``tpu_graphs/proto/tuning.proto`` of
  google-research-datasets/tpu_graphs: ``TuningData`` (``modules``), ``ModuleTuningData`` (``module``,
  ``fingerprint``, ``runs``, ``config_index_to_node``), ``ConfigProfile`` (``op_config`` or
  ``module_config``, ``error``, ``profile``, ``is_default``), ``TileSizeConfig``, ``LayoutConfig``; and
  of XLA's ``xla_data.proto`` the ``ExecutionProfile`` times.
* ``hlo``: of XLA's ``hlo.proto`` what fixes the node numbering and bounds a module before XLA sees
  it: ``HloModuleProto`` (name, computations, entry id), ``HloComputationProto`` (name,
  instructions, id, root id), ``HloInstructionProto`` (name, opcode, shape, ids of operands and called
  computations), ``ShapeProto`` and ``HloProto`` (the wrapper ``--xla_dump_hlo_as_proto`` writes).

Three choices keep decoding safe on any input: an embedded ``xla.HloModuleProto`` is declared as
``bytes`` in ``ModuleTuningData`` (XLA parses it, from exactly the bytes of the record); names are
``bytes`` too (a module with a non-UTF-8 name is XLA's to refuse, and the decoder never logs); and the
decoder's own recursion limit bounds nesting (a shape nested deeper raises ``DecodeError``).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

_T = "TYPE_"

# (message, [(field, number, type, label, message type)]); label "repeated" or "" (singular)
_TUNING = [
    ("ExecutionProfile", [("compute_cycle_count", 3, "INT64", "", None), ("compute_time_ns", 4, "INT64", "", None),
                          ("compute_and_transfer_time_ns", 5, "INT64", "", None)]),
    ("TileSizeConfig", [("kernel_bounds", 1, "INT64", "repeated", None), ("output_bounds", 2, "INT64", "repeated", None),
                        ("input_bounds", 3, "INT64", "repeated", None),
                        ("iteration_bounds", 4, "INT64", "repeated", None)]),
    ("HloOpConfig", [("tile_size_config", 1, "MESSAGE", "", "TileSizeConfig")]),
    ("TensorLayoutConfig", [("dims", 1, "INT32", "repeated", None)]),
    ("NodeLayoutConfig", [("tensors", 1, "MESSAGE", "repeated", "TensorLayoutConfig")]),
    ("LayoutConfig", [("nodes", 1, "MESSAGE", "repeated", "NodeLayoutConfig")]),
    ("HloModuleConfig", [("layout_config", 1, "MESSAGE", "", "LayoutConfig")]),
    ("ConfigProfile", [("op_config", 1, "MESSAGE", "", "HloOpConfig"), ("module_config", 2, "MESSAGE", "", "HloModuleConfig"),
                       ("error", 3, "BOOL", "", None), ("profile", 4, "MESSAGE", "", "ExecutionProfile"),
                       ("is_default", 5, "BOOL", "", None)]),
    ("ModuleTuningData", [("module", 1, "BYTES", "", None), ("fingerprint", 2, "UINT64", "", None),
                          ("runs", 3, "MESSAGE", "repeated", "ConfigProfile"),
                          ("config_index_to_node", 4, "UINT64", "repeated", None)]),
    ("TuningData", [("modules", 1, "MESSAGE", "repeated", "ModuleTuningData")]),
]
_ONEOFS = {"ConfigProfile": ("config", ("op_config", "module_config"))}

_HLO = [
    ("LayoutProto", [("minor_to_major", 1, "INT64", "repeated", None)]),
    ("ShapeProto", [("element_type", 2, "INT32", "", None), ("dimensions", 3, "INT64", "repeated", None),
                    ("tuple_shapes", 4, "MESSAGE", "repeated", "ShapeProto"), ("layout", 5, "MESSAGE", "", "LayoutProto")]),
    ("HloInstructionProto", [("name", 1, "BYTES", "", None), ("opcode", 2, "BYTES", "", None),
                             ("shape", 3, "MESSAGE", "", "ShapeProto"), ("id", 35, "INT64", "", None),
                             ("operand_ids", 36, "INT64", "repeated", None),
                             ("control_predecessor_ids", 37, "INT64", "repeated", None),
                             ("called_computation_ids", 38, "INT64", "repeated", None)]),
    ("HloComputationProto", [("name", 1, "BYTES", "", None),
                             ("instructions", 2, "MESSAGE", "repeated", "HloInstructionProto"),
                             ("id", 5, "INT64", "", None), ("root_id", 6, "INT64", "", None)]),
    ("HloModuleProto", [("name", 1, "BYTES", "", None), ("entry_computation_name", 2, "BYTES", "", None),
                        ("computations", 3, "MESSAGE", "repeated", "HloComputationProto"),
                        ("entry_computation_id", 6, "INT64", "", None)]),
    ("HloProto", [("hlo_module", 1, "MESSAGE", "", "HloModuleProto")]),
]


@lru_cache(maxsize=None)
def _classes(package: str) -> dict[str, Any]:
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    messages = {"tuning": _TUNING, "hlo": _HLO}[package]
    file = descriptor_pb2.FileDescriptorProto(name=f"pipelines_{package}.proto", package=f"pipelines_{package}",
                                              syntax="proto3")
    for name, fields in messages:
        message = file.message_type.add(name=name)
        oneof = _ONEOFS.get(name)
        if oneof:
            message.oneof_decl.add(name=oneof[0])
        for field_name, number, kind, label, type_name in fields:
            field = message.field.add(name=field_name, number=number,
                                      type=getattr(descriptor_pb2.FieldDescriptorProto, _T + kind),
                                      label=descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED if label
                                      else descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL)
            if type_name:
                field.type_name = f".pipelines_{package}.{type_name}"
            if oneof and field_name in oneof[1]:
                field.oneof_index = 0
    pool = descriptor_pool.DescriptorPool()  # a private pool: no clash with any other package's xla.* types
    pool.Add(file)
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"pipelines_{package}.{name}"))
            for name, _ in messages}


def tuning_message(name: str) -> Any:
    """The class of one ``tuning.proto`` message (``TuningData``, ``ModuleTuningData``, ...)."""
    return _classes("tuning")[name]


def hlo_message(name: str) -> Any:
    """The class of one message of the partial ``hlo.proto`` (``HloModuleProto``, ``HloProto``, ...)."""
    return _classes("hlo")[name]


def decode_error() -> type[Exception]:
    from google.protobuf.message import DecodeError

    return DecodeError
