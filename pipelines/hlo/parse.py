"""Read an XLA HLO module through XLA's own objects (jaxlib) into plain Python records.

XLA parses the file: :func:`load_module` hands a serialized ``HloModuleProto`` (``.pb``, also the
``HloProto`` wrapper that ``--xla_dump_hlo_as_proto`` writes) or HLO text to jaxlib's
``HloModule``, which validates it. Nodes are numbered as the dataset's own encoder
(``HloEncoder::EncodeHloModule``) numbers them: by position in the serialized module, computations
in the proto's order, then their instructions in its order; ids, opcodes, operands, called
computations and roots are read from that proto by our own decoder (:mod:`pipelines.hlo.schema`).
What the proto subset does not hold (the result shape, the attributes) is read from the text XLA
prints for each instruction (``HloInstruction.to_string()``) by the small parser below.

Before XLA reads a byte, our decoder decides what the file is and bounds its nesting and dims (XLA's
parser recurses, and accepts dims its own proto checks refuse); anything XLA refuses comes back as a
FormatError naming the file, and what XLA's C++ writes to stderr meanwhile is kept off the terminal.

Nothing here writes files. jaxlib is imported lazily, so the package imports without it.
"""

from __future__ import annotations

import logging
import math
import os
import re
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from pipelines.core.errors import FormatError

logger = logging.getLogger(__name__)

TEXT_SUFFIXES = (".txt", ".hlo")
PROTO_SUFFIXES = (".pb",)
# Attributes that name called computations (HLO text syntax), in the order XLA lists them.
CALL_ATTRIBUTES = ("calls", "to_apply", "condition", "body", "select", "scatter", "true_computation",
                   "false_computation", "branch_computations")
MAX_PROGRAM_BYTES = 2 << 30  # a program file above 2 GiB is refused before it is read


class HloUnavailableError(FormatError):
    """jax / jaxlib is not installed (the optional ``hlo`` extra)."""


def hlo_lib() -> Any:
    """jaxlib's HLO bindings (``jaxlib._hlo``), or a clear error naming the extra to install."""
    try:
        from jaxlib import _hlo
    except ImportError:
        raise HloUnavailableError("jaxlib", "reading XLA HLO needs jax and jaxlib: pip install '.[hlo]'") from None
    return _hlo


# ----------------------------------------------------------------------------- records


@dataclass(frozen=True)
class Shape:
    """An instruction's result shape as XLA prints it: ``f32[2,3]{1,0}``, ``(f32[2]{0}, s32[])``."""

    etype: str  # lower-case XLA primitive type ("f32", "pred", "tuple", "token", ...)
    dims: tuple[int, ...] = ()
    minor_to_major: tuple[int, ...] = ()  # () when the text prints no layout
    elements: tuple["Shape", ...] = ()  # tuple elements (top level)

    @property
    def is_tuple(self) -> bool:
        return self.etype == "tuple"

    @property
    def rank(self) -> int:
        return len(self.dims)

    def first_array(self) -> "Shape":
        """The shape itself, or the first array inside a tuple (a multi-output fusion's first output)."""
        shape = self
        while shape.is_tuple and shape.elements:
            shape = shape.elements[0]
        return shape

    def __str__(self) -> str:
        if self.is_tuple:
            return "(" + ", ".join(str(e) for e in self.elements) + ")"
        layout = "{" + ",".join(map(str, self.minor_to_major)) + "}" if self.minor_to_major else ""
        return f"{self.etype}[{','.join(map(str, self.dims))}]{layout}"


@dataclass
class Instruction:
    name: str
    opcode: str  # as HLO text spells it ("get-tuple-element")
    shape: Shape
    operands: tuple[str, ...]  # operand names, in operand order (repeats kept)
    attrs: dict[str, str]  # attribute text by key ("window" -> "{size=3x3 stride=2x2}")
    called: tuple[str, ...]  # called computations' names
    parameter_number: int = 0
    control_predecessors: tuple[str, ...] = ()


@dataclass
class Computation:
    name: str
    instructions: list[Instruction]  # in the proto's order (XLA requires every operand before its users)
    root: str
    is_entry: bool = False
    is_fusion: bool = False  # the body of a fusion instruction


@dataclass
class Module:
    name: str
    computations: list[Computation]  # in the serialized proto's order (XLA writes callees first, the entry last)
    source: str  # file path or "<jax>"
    by_name: dict[str, Instruction] = field(default_factory=dict)

    @property
    def entry(self) -> Computation:
        return next(c for c in self.computations if c.is_entry)

    @property
    def num_instructions(self) -> int:
        return sum(len(c.instructions) for c in self.computations)

    def instructions(self) -> Iterator[tuple[Computation, Instruction]]:
        for computation in self.computations:
            for instruction in computation.instructions:
                yield computation, instruction


# ----------------------------------------------------------------------------- loading


@dataclass(frozen=True)
class HloSource:
    """An XLA ``HloModule`` and the serialized ``HloModuleProto`` whose order numbers its nodes: the
    file's own bytes for a ``.pb``, XLA's serialization for text (what ``--xla_dump_hlo_as_proto``
    would have written for it)."""

    xla: Any  # jaxlib HloModule
    proto: bytes


def read_bounded(path: Path, limit: int, what: str) -> bytes:
    """The bytes of a regular, non-empty file of at most ``limit`` bytes (``what`` names the limit in the
    error); anything else is a FormatError naming the file, before a byte is read."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise FormatError(path, "file not found") from None
    if not path.is_file():
        raise FormatError(path, "not a regular file")
    if size == 0:
        raise FormatError(path, "empty file")
    if size > limit:
        raise FormatError(path, f"{size} bytes: larger than {what} ({limit})")
    return path.read_bytes()


def load_module(path: Path | str) -> HloSource:
    """An XLA module from a serialized proto or HLO text file; anything else is a FormatError naming
    the file. Nesting and dims are checked before XLA reads a byte (its parser recurses)."""
    path = Path(path)
    hlo_lib()
    data = read_bounded(path, MAX_PROGRAM_BYTES, "any program this reader accepts")
    as_text = path.suffix.lower() in TEXT_SUFFIXES or (path.suffix.lower() not in PROTO_SUFFIXES and _looks_textual(data))
    if as_text:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise FormatError(path, "not HLO text (not UTF-8); a serialized HloModuleProto should end in .pb") from None
        return module_from_text(text, path)
    return module_from_proto_bytes(data, path)


def module_from_text(text: str, path: Path | str = "<text>") -> HloSource:
    """Parse HLO text with XLA. Text older XLA printed (PyTorch/XLA dumps) is read as today's XLA reads it
    (:data:`LEGACY_ATTRIBUTES`), with a warning naming what was changed."""
    check_text_bounds(text, path)
    lib = hlo_lib()
    try:
        with quiet_native_stderr():
            xla = lib.hlo_module_from_text(text)
    except Exception as exc:  # jaxlib raises JaxRuntimeError (its own class) on a parse error
        first = _first_line(exc)
        legacy = _legacy_text(text)
        if legacy is None:
            raise FormatError(path, f"not HLO text: {first}") from None
        modern, changes = legacy
        try:
            with quiet_native_stderr():
                xla = lib.hlo_module_from_text(modern)
        except Exception as again:
            raise FormatError(path, f"not HLO text: {_first_line(again)} (read as today's XLA reads it: "
                                    f"{'; '.join(changes)}; as written: {first})") from None
        logger.warning(f"{path}: written by an older XLA; read as today's XLA reads it: {'; '.join(changes)}")
    proto = _serialized(xla, path)
    _validated(proto, path)  # XLA's proto checks (layouts, shape sizes) that its text parser leaves out
    return HloSource(xla, proto)


def module_from_proto_bytes(data: bytes, path: Path | str = "<bytes>") -> HloSource:
    """Deserialize an ``HloModuleProto``, or the ``HloProto`` wrapper XLA's dumps write (field 1). Which of
    the two it is, and its bounds, are decided by our own decoder before XLA reads it."""
    module_bytes = proto_module_bytes(data, path)
    return HloSource(_validated(module_bytes, path), module_bytes)


def proto_module_bytes(data: bytes, path: Path | str = "<bytes>") -> bytes:
    """The ``HloModuleProto`` bytes of ``data`` (itself, or the module inside an ``HloProto``), checked
    against the bounds of :func:`check_proto_bounds`; a FormatError naming ``path`` otherwise."""
    module = _decoded_module(data)
    if module is not None:
        check_proto_bounds(module, path)
        return data
    inner = _hlo_proto_module_field(data)
    if inner is not None and _decoded_module(inner) is not None:
        check_proto_bounds(_decoded_module(inner), path)
        return inner
    raise FormatError(path, "not a serialized HloModuleProto or HloProto (truncated, nested too deep, or a "
                            "different message)")


def _decoded_module(data: bytes) -> Any | None:
    """The partial ``HloModuleProto`` of ``data`` when it reads as one (a printable name, computations
    holding instructions), else None."""
    from pipelines.hlo.schema import decode_error, hlo_message

    try:
        module = hlo_message("HloModuleProto").FromString(data)
    except decode_error():  # also a message nested deeper than the decoder's recursion limit
        return None
    try:
        name = module.name.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if not module.computations or not name.isprintable() or not all(c.instructions for c in module.computations):
        return None
    return module


def _serialized(xla: Any, path: Path | str) -> bytes:
    try:
        with quiet_native_stderr():
            return xla.as_serialized_hlo_module_proto()
    except Exception as exc:
        raise FormatError(path, f"XLA cannot serialize the module: {_first_line(exc)}") from None


def _validated(proto: bytes, path: Path | str) -> Any:
    """XLA's module from ``proto`` (which runs XLA's checks), or a FormatError with XLA's message."""
    lib = hlo_lib()
    try:
        with quiet_native_stderr():
            return lib.HloModule.from_serialized_hlo_module_proto(proto)
    except Exception as exc:
        raise FormatError(path, f"XLA refuses the module: {_first_line(exc)}") from None


def _hlo_proto_module_field(data: bytes) -> bytes | None:
    """The bytes of field 1 (``hlo_module``) when ``data`` starts like an ``HloProto``, else None. Only the
    wrapper's first tag and length are read; the module's own bytes are kept exactly."""
    if not data or data[0] != 0x0A:  # field 1, wire type 2 (length-delimited)
        return None
    length, shift, pos = 0, 0, 1
    while pos < len(data) and pos < 11:
        byte = data[pos]
        length |= (byte & 0x7F) << shift
        pos += 1
        if not byte & 0x80:
            break
        shift += 7
    else:
        return None
    if length <= 0 or pos + length > len(data):
        return None
    return data[pos:pos + length]


def _looks_textual(data: bytes) -> bool:
    head = data[:4096]
    return b"\x00" not in head and (head.lstrip().startswith(b"HloModule") or b"ENTRY" in data[:1 << 20])


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    lines = [line for line in text.splitlines() if line.strip()]
    return " ".join(lines[:3])[:400]


@contextmanager
def quiet_native_stderr() -> Iterator[None]:
    """Keep what XLA's C++ writes to file descriptor 2 while it parses (protobuf and RET_CHECK log lines,
    stack traces) off the user's terminal: every failure comes back as an exception whose message the
    caller reports."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no file descriptor 2 to silence
        yield
        return
    try:
        with tempfile.TemporaryFile() as sink:
            os.dup2(sink.fileno(), 2)
            try:
                yield
            finally:
                os.dup2(saved, 2)
    finally:
        os.close(saved)


# ----------------------------------------------------------------------------- bounds checked before XLA

MAX_NESTING = 64  # brackets (tuples, attribute lists) nested deeper: no XLA program does, and XLA's parser recurses
MAX_DIM = 1 << 40  # one dimension of an array
MAX_ELEMENTS = 1 << 53  # elements of one array (the product stays exact in float64)
_QUOTED = re.compile(r'"(?:[^"\\]|\\.)*"')
_BRACKETS = re.compile(r"[()\[\]{}]")
_TEXT_SHAPE = re.compile(r"(?<![\w.%-])(?:pred|token|opaque|[a-z]+[0-9][a-z0-9]*)\[([^\]]*)\]")


def check_text_bounds(text: str, path: Path | str = "<text>") -> None:
    """Refuse HLO text nested deeper than :data:`MAX_NESTING` or with an array above :data:`MAX_DIM` /
    :data:`MAX_ELEMENTS`, naming the line (quoted strings, such as metadata, are not looked into)."""
    bare = _QUOTED.sub('""', text)
    depth = 0
    for match in _BRACKETS.finditer(bare):
        depth += 1 if match.group() in "([{" else -1
        if depth > MAX_NESTING:
            line = bare.count("\n", 0, match.start()) + 1
            raise FormatError(path, f"line {line}: brackets nested more than {MAX_NESTING} deep (a tuple or "
                                    "attribute nested like that is no program XLA writes)")
    for match in _TEXT_SHAPE.finditer(bare):
        dims = [int(d) for d in re.findall(r"\d+", match.group(1))]
        problem = _dims_problem(dims)
        if problem:
            line = bare.count("\n", 0, match.start()) + 1
            raise FormatError(path, f"line {line}: {match.group(0)[:80]}: {problem}")


def check_proto_bounds(module: Any, path: Path | str = "<bytes>") -> None:
    """:func:`check_text_bounds` for a decoded (partial) ``HloModuleProto``: every instruction's shape."""
    for computation in module.computations:
        for instruction in computation.instructions:
            stack = [(instruction.shape, 1)]
            while stack:
                shape, depth = stack.pop()
                where = f"instruction {instruction.name.decode('utf-8', 'replace')[:80]}"
                if depth > MAX_NESTING:
                    raise FormatError(path, f"{where}: shape nested more than {MAX_NESTING} deep")
                problem = _dims_problem(list(shape.dimensions))
                if problem:
                    raise FormatError(path, f"{where}: {problem}")
                stack.extend((inner, depth + 1) for inner in shape.tuple_shapes)


def _dims_problem(dims: list[int]) -> str | None:
    big = [d for d in dims if d > MAX_DIM]
    if big:
        return f"dimension {big[0]} is above {MAX_DIM} (2^40), beyond any real tensor"
    if math.prod(d for d in dims if d > 0) > MAX_ELEMENTS:
        return f"{math.prod(dims)} elements in one array: above 2^53, beyond any real tensor"
    return None


# ----------------------------------------------------------------------------- text older XLA printed

# (pattern, replacement, what it means); applied only when today's XLA refuses the text as written.
LEGACY_ATTRIBUTES = (
    (re.compile(r",\s*api_version=API_VERSION_UNSPECIFIED\b"), "",
     "api_version=API_VERSION_UNSPECIFIED dropped (a missing api_version is API_VERSION_ORIGINAL, what older XLA "
     "meant by it)"),
    (re.compile(r"\bcustom_call_schedule="), "schedule=", "custom_call_schedule= read as schedule= (its new name)"),
)


def _legacy_text(text: str) -> tuple[str, list[str]] | None:
    """``text`` rewritten by :data:`LEGACY_ATTRIBUTES` with a note per rule applied, or None when none
    applies. Quoted strings are left as they are."""
    pieces = _QUOTED.split(text)
    quotes = _QUOTED.findall(text)
    changes = []
    for pattern, replacement, note in LEGACY_ATTRIBUTES:
        count = 0
        for k, piece in enumerate(pieces):
            pieces[k], n = pattern.subn(replacement, piece)
            count += n
        if count:
            changes.append(f"{note} (x{count})")
    if not changes:
        return None
    out = [pieces[0]]
    for quote, piece in zip(quotes, pieces[1:]):
        out += [quote, piece]
    return "".join(out), changes


def module_from_jax(fn: Any, *example_args: Any, optimized: bool = False) -> Any:
    """The XLA ``HloModule`` of ``jax.jit(fn)`` on ``example_args``: as lowered (before XLA's passes,
    no fusions) or, ``optimized=True``, as XLA compiled it for this machine (fusions, CPU layouts)."""
    try:
        import jax
    except ImportError:
        raise HloUnavailableError("jax", "featurizing a jax function needs jax and jaxlib: pip install '.[hlo]'") from None
    lowered = jax.jit(fn).lower(*example_args)
    if optimized:
        return lowered.compile().runtime_executable().hlo_modules()[0]
    return lowered.compiler_ir("hlo").get_hlo_module()


# ----------------------------------------------------------------------------- reading a module


def read_module(hlo_module: Any, source: str = "<module>", *, max_instructions: int | None = None) -> Module:
    """Plain records of every computation and instruction of a module (an :class:`HloSource`, or an XLA
    ``HloModule``, read through its serialization), numbered as the dataset's ``HloEncoder`` numbers
    them: computations in the serialized proto's order, then their instructions in its order. Ids,
    opcodes, operands, called computations and roots come from the proto; shapes and attributes from
    the text XLA prints for each instruction. A module of more than ``max_instructions`` is refused
    before any record is built."""
    if isinstance(hlo_module, HloSource):
        xla, proto_bytes = hlo_module.xla, hlo_module.proto
    else:
        xla, proto_bytes = hlo_module, _serialized(hlo_module, source)
    proto = _decoded_module(proto_bytes)
    if proto is None:
        raise FormatError(source, "XLA's serialization of the module does not read as an HloModuleProto")
    count = sum(len(c.instructions) for c in proto.computations)
    if max_instructions is not None and count > max_instructions:
        raise FormatError(source, f"{count} instructions: more than a TpuGraphs graph may hold "
                                  f"({max_instructions} nodes)")
    texts = {ins.name: ins for c in xla.computations() for ins in c.instructions()}
    names_by_id = {c.id: c.name.decode("utf-8", "replace") for c in proto.computations}
    entry_id = proto.entry_computation_id if proto.entry_computation_id in names_by_id else next(
        (c.id for c in proto.computations if c.name == proto.entry_computation_name), None)
    computations: list[Computation] = []
    by_name: dict[str, Instruction] = {}
    fusion_bodies: set[str] = set()
    for computation in proto.computations:
        name = names_by_id[computation.id]
        local = {ins.id: ins.name.decode("utf-8", "replace") for ins in computation.instructions}
        records = []
        for ins in computation.instructions:
            ins_name, opcode = local[ins.id], ins.opcode.decode("utf-8", "replace")
            if ins_name not in texts:
                raise FormatError(source, f"instruction {ins_name}: in the proto but not in XLA's module")
            if ins_name in by_name:
                raise FormatError(source, f"instruction {ins_name}: the name is used twice")
            record = parse_instruction(texts[ins_name].to_string(), source)
            if record.opcode != opcode:  # XLA prints an async wrapper as the op it wraps (dot-start ...)
                record.attrs = {}  # whose attributes are not the wrapper's own
                record.opcode = opcode
            try:
                record.operands = tuple(local[i] for i in ins.operand_ids)
                record.control_predecessors = tuple(local[i] for i in ins.control_predecessor_ids)
                record.called = tuple(names_by_id[i] for i in ins.called_computation_ids)
            except KeyError as missing:
                raise FormatError(source, f"instruction {ins_name}: refers to id {missing}, which is not in "
                                          "its computation or module") from None
            if opcode == "fusion":
                fusion_bodies.update(record.called)
            records.append(record)
            by_name[ins_name] = record
        if computation.root_id not in local:
            raise FormatError(source, f"computation {name}: its root id {computation.root_id} is none of its "
                                      "instructions")
        computations.append(Computation(name, records, local[computation.root_id],
                                        is_entry=computation.id == entry_id))
    if not any(c.is_entry for c in computations):
        raise FormatError(source, "the module has no ENTRY computation")
    for computation in computations:
        computation.is_fusion = computation.name in fusion_bodies
    return Module(proto.name.decode("utf-8", "replace"), computations, source, by_name)


# ----------------------------------------------------------------------------- instruction text


_COMMENT = re.compile(r"/\*.*?\*/")
_NAME = re.compile(r"^\s*(?:ROOT\s+)?%?(?P<name>[^\s=]+)\s*=\s*")
_ARRAY_SHAPE = re.compile(r"^(?P<etype>[a-z][a-z0-9]*)\[(?P<dims>[^\]]*)\](?:\{(?P<layout>[^}]*)\})?$")


def parse_instruction(text: str, source: str = "<module>") -> Instruction:
    """One instruction from its HLO text: ``%name = SHAPE opcode(operands), key=value, ...``."""
    text = _COMMENT.sub("", text)  # XLA numbers long lists: /*index=5*/
    match = _NAME.match(text)
    if not match:
        raise FormatError(source, f"cannot read instruction text {text[:120]!r}")
    pos = match.end()
    shape_end = _balanced_end(text, pos) if text.startswith("(", pos) else _token_end(text, pos)
    shape = parse_shape(text[pos:shape_end], source)
    pos = shape_end
    while pos < len(text) and text[pos] == " ":
        pos += 1
    paren = text.find("(", pos)
    if paren < 0:
        raise FormatError(source, f"instruction {match['name']}: no operand list in {text[:120]!r}")
    opcode = text[pos:paren].strip()
    close = _balanced_end(text, paren)
    operand_text = text[paren + 1:close - 1]
    attrs = parse_attributes(text[close:].lstrip(", "))
    called = tuple(name for key in CALL_ATTRIBUTES if key in attrs for name in _names(attrs[key]))
    parameter_number = int(operand_text) if opcode == "parameter" and operand_text.strip().isdigit() else 0
    operands = tuple(_names(operand_text)) if opcode not in ("constant", "parameter", "iota") else ()
    return Instruction(match["name"], opcode, shape, operands, attrs, called, parameter_number,
                       tuple(_names(attrs.get("control-predecessors", ""))))


def _names(text: str) -> list[str]:
    """Names in an operand or computation list: ``%a, f32[2] %b`` -> [a, b] (shapes, if printed, dropped)."""
    out = []
    for part in split_top_level(text.strip().strip("{}")):
        part = part.strip()
        if not part:
            continue
        token = part.split()[-1]
        out.append(token[1:] if token.startswith("%") else token)
    return out


def parse_shape(text: str, source: str = "<module>") -> Shape:
    text = text.strip()
    if text.startswith("("):
        inner = text[1:-1] if text.endswith(")") else text[1:]
        return Shape("tuple", elements=tuple(parse_shape(p, source) for p in split_top_level(inner) if p.strip()))
    match = _ARRAY_SHAPE.match(text)
    if not match:
        raise FormatError(source, f"cannot read shape {text!r}")
    dims = []
    for d in match["dims"].split(","):
        d = d.strip().lstrip("<=")
        if d:
            dims.append(int(d) if d.lstrip("-").isdigit() else -1)  # '?' (unbounded dynamic) -> -1
    layout = ()
    if match["layout"]:
        head = match["layout"].split(":")[0]
        layout = tuple(int(x) for x in head.split(",") if x.strip().lstrip("-").isdigit())
    return Shape(match["etype"], tuple(dims), layout)


def parse_attributes(text: str) -> dict[str, str]:
    """``key=value`` pairs separated by commas outside brackets and quotes."""
    attrs: dict[str, str] = {}
    for part in split_top_level(text):
        key, sep, value = part.strip().partition("=")
        if sep:
            attrs[key.strip()] = value.strip()
    return attrs


def _unquoted(text: str, start: int = 0):
    """``(index, char, depth)`` of every character of ``text`` from ``start`` outside double quotes (a
    backslash escapes the next character inside them); ``depth`` counts the brackets open before it."""
    depth, quote, i = 0, False, start
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == "\\":
                i += 1
            elif ch == '"':
                quote = False
        elif ch == '"':
            quote = True
        else:
            yield i, ch, depth
            if ch in "([{":
                depth += 1
            elif ch in ")]}":
                depth -= 1
        i += 1


def split_top_level(text: str, sep: str = ",") -> list[str]:
    parts, start = [], 0
    for i, ch, depth in _unquoted(text):
        if ch == sep and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def _balanced_end(text: str, start: int) -> int:
    """Index just past the bracket that closes the one at ``start`` (quotes respected)."""
    for i, ch, depth in _unquoted(text, start):
        if ch in ")]}" and depth == 1:
            return i + 1
    return len(text)


def _token_end(text: str, start: int) -> int:
    depth, i = 0, start
    while i < len(text):
        ch = text[i]
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == " " and depth == 0:
            return i
        i += 1
    return len(text)
