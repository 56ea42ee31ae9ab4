"""Lower a program variant once and keep its HLO module: the cache the lowered worlds read.

A variant is lowered by ``jax.jit(fn).lower(...)`` on shape-only arguments; the module as lowered
(before XLA's passes: real dimension numbers, real default layouts, no fusions) is what the layout
collections read. For the tile collection the module is also compiled for this machine, and its
fusions (XLA's own, on the CPU backend) are the fused kernels.

Before lowering, calls to jitted helpers (``jax.nn.relu``, ``jnp.where``, ...) are inlined in the
traced program, as XLA's call inliner does first thing on a real compile; the loops of ``lax.scan``
stay ``while`` loops with their bodies.

Files: ``<cache>/<variant key>.<digest>.lowered.pb`` and ``... .optimized.pb`` (serialized
``HloModuleProto``), written atomically. The digest covers the variant, the architecture's options,
the source of the model definitions, of the catalogue and of this module (``LOWERING_CODE``) and the
installed versions of jax, jaxlib and the model packages: an upgrade or an edit of them lowers again,
never reuses a stale module. Nothing here writes under a data root; the default cache is ``data/lowered/``.
"""

from __future__ import annotations

import functools
import importlib.metadata
import inspect
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

from pipelines.core.atomic import chmod_like_new_file
from pipelines.core.engine import code_fingerprint, fingerprint
from pipelines.core.errors import FormatError
from pipelines.synth.lowered import models
from pipelines.synth.lowered.catalogue import Architecture, ProgramSpec

logger = logging.getLogger(__name__)

DEFAULT_CACHE = Path("data") / "lowered"
CACHE_VERSION = 1
DISTRIBUTIONS = ("jax", "jaxlib", "flax", "dm-haiku", "equinox", "transformers")
STAGES = ("lowered", "optimized")
# The modules whose source shapes a lowered module (hashed without following their imports: an edit to
# the world's writer or the converter does not lower the catalogue again).
LOWERING_CODE = ("pipelines.synth.lowered.models", "pipelines.synth.lowered.cache", "pipelines.synth.lowered.catalogue")
# Primitives whose body is a traced function called in place (inlined before lowering).
_CALLS = frozenset({"jit", "pjit", "closed_call", "core_call", "custom_jvp_call", "custom_vjp_call",
                    "custom_vjp_call_jaxpr", "remat", "checkpoint"})


@functools.lru_cache(maxsize=None)
def package_versions() -> dict[str, str | None]:
    """Installed versions of the packages that shape a lowered module (None where absent)."""
    versions: dict[str, str | None] = {}
    for name in DISTRIBUTIONS:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


@functools.lru_cache(maxsize=None)
def lowering_call_source() -> str:
    """The source of the call that turns a jax function into a module (``hlo.parse.module_from_jax``):
    the one function of the featurizer a cached module depends on, keyed alone so that edits to the
    rest of the parser do not lower the catalogue again."""
    from pipelines.hlo.parse import module_from_jax

    return inspect.getsource(module_from_jax)


def variant_digest(arch: Architecture, spec: ProgramSpec) -> str:
    """What keys a cached module: the variant, its architecture, the model code, the lowering call and
    the package versions."""
    return fingerprint({"version": CACHE_VERSION, "spec": spec, "builder": arch.builder, "options": arch.options,
                        "code": code_fingerprint((), shallow=LOWERING_CODE), "lowering": lowering_call_source(),
                        "packages": package_versions()})[:16]


def cache_path(cache: Path | str, arch: Architecture, spec: ProgramSpec, stage: str) -> Path:
    if stage not in STAGES:
        raise ValueError(f"stage must be one of {STAGES}, got {stage!r}")
    return Path(cache) / f"{spec.key}.{variant_digest(arch, spec)}.{stage}.pb"


def module_bytes(cache: Path | str, arch: Architecture, spec: ProgramSpec, stage: str = "lowered") -> bytes:
    """The serialized ``HloModuleProto`` of a variant at ``stage``, lowered (and compiled) on first use."""
    path = cache_path(cache, arch, spec, stage)
    if path.is_file():
        return path.read_bytes()
    logger.info(f"lowering {spec.key} ({stage})")
    data = lower(arch, spec, optimized=stage == "optimized")
    _write_bytes_atomic(path, data)
    return data


def load_module(cache: Path | str, arch: Architecture, spec: ProgramSpec, stage: str = "lowered") -> Any:
    """XLA's ``HloModule`` of a variant (through the cache)."""
    from pipelines.hlo.parse import module_from_proto_bytes

    path = cache_path(cache, arch, spec, stage)
    data = module_bytes(cache, arch, spec, stage)
    try:
        return module_from_proto_bytes(data, path)
    except FormatError:
        path.unlink(missing_ok=True)  # a damaged cache entry is lowered again next time
        raise


def lower(arch: Architecture, spec: ProgramSpec, *, optimized: bool = False) -> bytes:
    """Lower one variant (pure apart from jax's own caches): its module as serialized proto bytes."""
    from pipelines.hlo.parse import module_from_jax

    program = models.build(arch.builder, spec, arch.options)
    module = module_from_jax(inline_calls(program.fn), *program.args, optimized=optimized)
    return module.as_serialized_hlo_module_proto()


# ----------------------------------------------------------------------------- call inlining


def inline_calls(fn: Any) -> Any:
    """``fn`` re-traced with every call of a jitted helper (and custom-derivative wrapper) evaluated in
    place, inside loop and branch bodies too, so that the lowered module holds no ``call`` of them."""
    jax = models.require("jax")

    def inlined(*args: Any) -> Any:
        closed, shapes = jax.make_jaxpr(fn, return_shape=True)(*args)
        flat = _evaluate(closed.jaxpr, closed.consts, jax.tree.leaves(args))
        return jax.tree.unflatten(jax.tree.structure(shapes), flat)

    return inlined


def _evaluate(jaxpr: Any, consts: Any, args: list[Any]) -> list[Any]:
    from jax.extend.core import Literal

    env: dict[Any, Any] = {}

    def read(var: Any) -> Any:
        return var.val if isinstance(var, Literal) else env[var]

    env.update(zip(jaxpr.constvars, consts))
    env.update(zip(jaxpr.invars, args))
    for eqn in jaxpr.eqns:
        values = [read(v) for v in eqn.invars]
        body = _called_body(eqn)
        if body is not None:
            outs = _evaluate(body.jaxpr, body.consts, values)
        else:
            params = {k: _inline_body(v) for k, v in eqn.primitive.get_bind_params(eqn.params).items()}
            outs = eqn.primitive.bind(*values, **params)
            if not eqn.primitive.multiple_results:
                outs = [outs]
        env.update(zip(eqn.outvars, outs))
    return [read(v) for v in jaxpr.outvars]


def _called_body(eqn: Any) -> Any:
    """The closed jaxpr a call-like equation evaluates, or None for any other primitive."""
    from jax.extend.core import ClosedJaxpr

    if eqn.primitive.name not in _CALLS:
        return None
    for key in ("jaxpr", "call_jaxpr", "fun_jaxpr"):
        body = eqn.params.get(key)
        if isinstance(body, ClosedJaxpr):
            return body
        if body is not None and hasattr(body, "eqns"):
            return ClosedJaxpr(body, ())
    return None


def _inline_body(value: Any) -> Any:
    """A loop or branch body (closed jaxpr, or a tuple of them) with its calls inlined; anything else as is."""
    from jax.extend.core import ClosedJaxpr

    if isinstance(value, ClosedJaxpr):
        jax = models.require("jax")
        avals = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in value.jaxpr.invars]
        return jax.make_jaxpr(lambda *a: _evaluate(value.jaxpr, value.consts, list(a)))(*avals)
    if isinstance(value, tuple) and value and all(isinstance(v, ClosedJaxpr) for v in value):
        return tuple(_inline_body(v) for v in value)
    return value


def _write_bytes_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        chmod_like_new_file(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
