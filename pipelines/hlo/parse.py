"""Read an XLA HLO module through XLA's own objects (jaxlib) into plain Python records.

XLA parses the file: :func:`load_module` hands a serialized ``HloModuleProto`` (``.pb``, also the
``HloProto`` wrapper that ``--xla_dump_hlo_as_proto`` writes) or HLO text to jaxlib's
``HloModule``, which validates it. The module's computations, instructions and operands come from
XLA's objects; what those objects do not expose in Python (the result shape, the attributes) is read
from the instruction's own text (``HloInstruction.to_string()``) by the small parser below.

Nothing here writes files. jaxlib is imported lazily, so the package imports without it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from pipelines.core.errors import FormatError

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
    instructions: list[Instruction]  # topological: every operand before its users
    root: str
    is_entry: bool = False
    is_fusion: bool = False  # the body of a fusion instruction


@dataclass
class Module:
    name: str
    computations: list[Computation]  # callees before callers (post order), entry last
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


def load_module(path: Path | str) -> Any:
    """An XLA ``HloModule`` from a serialized proto or HLO text file; anything else is a FormatError
    naming the file."""
    path = Path(path)
    lib = hlo_lib()
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise FormatError(path, "file not found") from None
    if not path.is_file():
        raise FormatError(path, "not a regular file")
    if size == 0:
        raise FormatError(path, "empty file")
    if size > MAX_PROGRAM_BYTES:
        raise FormatError(path, f"{size} bytes: larger than any program this reader accepts ({MAX_PROGRAM_BYTES})")
    data = path.read_bytes()
    as_text = path.suffix.lower() in TEXT_SUFFIXES or (path.suffix.lower() not in PROTO_SUFFIXES and _looks_textual(data))
    if as_text:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise FormatError(path, "not HLO text (not UTF-8); a serialized HloModuleProto should end in .pb") from None
        try:
            return lib.hlo_module_from_text(text)
        except Exception as exc:  # jaxlib raises JaxRuntimeError (its own class) on a parse error
            raise FormatError(path, f"not HLO text: {_first_line(exc)}") from None
    return module_from_proto_bytes(data, path)


def module_from_proto_bytes(data: bytes, path: Path | str = "<bytes>") -> Any:
    """Deserialize an ``HloModuleProto``, or the ``HloProto`` wrapper XLA's dumps write (field 1)."""
    lib = hlo_lib()
    errors = []
    for candidate in (data, _hlo_proto_module_field(data)):
        if candidate is None:
            continue
        try:
            return lib.HloModule.from_serialized_hlo_module_proto(candidate)
        except Exception as exc:
            errors.append(_first_line(exc))
    raise FormatError(path, "not a serialized HloModuleProto or HloProto (truncated, or a different message): "
                            f"{errors[0] if errors else 'unreadable'}")


def _hlo_proto_module_field(data: bytes) -> bytes | None:
    """The bytes of field 1 (``hlo_module``) when ``data`` starts like an ``HloProto``, else None. Only the
    wrapper's first tag and length are read; XLA parses (and checks) the module itself."""
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
    """Plain records of every computation and instruction of an XLA ``HloModule``, in the order the
    dataset's featurizer walks a module proto: computations callees first, instructions in
    topological order within each. A module of more than ``max_instructions`` is refused before any
    record is built (memory stays that of XLA's own module)."""
    lib = hlo_lib()
    if max_instructions is not None:
        count = sum(len(c.instructions()) for c in hlo_module.computations())
        if count > max_instructions:
            raise FormatError(source, f"{count} instructions: more than a TpuGraphs graph may hold "
                                      f"({max_instructions} nodes)")
    # Through XLA's proto, the form the dataset's featurizer reads: computations and instructions then
    # come in the order XLA serializes them (post order), whatever the module was built or parsed from.
    hlo_module = lib.HloModule.from_serialized_hlo_module_proto(hlo_module.as_serialized_hlo_module_proto())
    options = lib.HloPrintOptions()
    options.print_metadata = False
    options.print_backend_config = False
    roots, entry = _roots_and_entry(hlo_module.to_string(options))
    computations: list[Computation] = []
    by_name: dict[str, Instruction] = {}
    fusion_bodies: set[str] = set()
    for xla_computation in hlo_module.computations():
        name = xla_computation.name
        records = []
        for xla_instruction in xla_computation.instructions():
            record = parse_instruction(xla_instruction.to_string(), source)
            operands = tuple(o.name for o in xla_instruction.operands())
            if record.name != xla_instruction.name or len(operands) != len(record.operands):
                raise FormatError(source, f"instruction {xla_instruction.name}: its text does not match XLA's object "
                                          f"(text: {record.name} with {len(record.operands)} operands)")
            record.operands = operands  # XLA's own operand list is the authority
            if record.opcode == "fusion":
                fusion_bodies.update(record.called)
            records.append(record)
            by_name[record.name] = record
        if name not in roots:
            raise FormatError(source, f"computation {name}: no ROOT instruction in the module's text")
        computations.append(Computation(name, _topological(records, source), roots[name], is_entry=name == entry))
    if entry is None or not any(c.is_entry for c in computations):
        raise FormatError(source, "the module has no ENTRY computation")
    for computation in computations:
        computation.is_fusion = computation.name in fusion_bodies
    return Module(hlo_module.name, _post_order(computations, source), source, by_name)


_HEADER = re.compile(r"^(ENTRY )?%?(?P<name>[^\s(]+) \(.*\{\s*$")
_ROOT = re.compile(r"^\s+ROOT %?(?P<name>[^\s=]+) = ")


def _roots_and_entry(text: str) -> tuple[dict[str, str], str | None]:
    roots: dict[str, str] = {}
    current, entry = None, None
    for line in text.splitlines():
        header = _HEADER.match(line)
        if header:
            current = header["name"]
            if header.group(1):
                entry = current
            continue
        root = _ROOT.match(line)
        if root and current is not None:
            roots[current] = root["name"]
    return roots, entry


def _topological(records: list[Instruction], source: str) -> list[Instruction]:
    """``records`` in a topological order (operands and control predecessors first), kept as given
    wherever it already is one (XLA lists a computation's instructions in post order)."""
    index = {r.name: i for i, r in enumerate(records)}
    if all(index.get(o, -1) < i for i, r in enumerate(records) for o in (*r.operands, *r.control_predecessors)):
        return records
    order: list[Instruction] = []
    state = [0] * len(records)  # 0 new, 1 on the stack, 2 done
    for start in range(len(records)):
        if state[start]:
            continue
        stack = [(start, 0)]
        state[start] = 1
        while stack:
            i, k = stack.pop()
            deps = [index[d] for d in (*records[i].operands, *records[i].control_predecessors) if d in index]
            if k < len(deps):
                stack.append((i, k + 1))
                j = deps[k]
                if state[j] == 1:
                    raise FormatError(source, f"instruction {records[j].name}: cycle through its operands")
                if state[j] == 0:
                    state[j] = 1
                    stack.append((j, 0))
            else:
                state[i] = 2
                order.append(records[i])
    return order


def _post_order(computations: list[Computation], source: str) -> list[Computation]:
    """Callees before callers (stable), the entry computation last."""
    by_name = {c.name: c for c in computations}
    calls = {c.name: [n for r in c.instructions for n in r.called if n in by_name] for c in computations}
    done: set[str] = set()
    order: list[Computation] = []

    def visit(name: str) -> None:
        stack, on_stack = [(name, 0)], {name}
        while stack:
            current, k = stack.pop()
            if k < len(calls[current]):
                stack.append((current, k + 1))
                callee = calls[current][k]
                if callee in on_stack:
                    raise FormatError(source, f"computation {callee} calls itself")
                if callee not in done:
                    on_stack.add(callee)
                    stack.append((callee, 0))
            else:
                on_stack.discard(current)
                if current not in done:
                    done.add(current)
                    order.append(by_name[current])

    for computation in sorted(computations, key=lambda c: c.is_entry):
        if computation.name not in done:
            visit(computation.name)
    return order


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
