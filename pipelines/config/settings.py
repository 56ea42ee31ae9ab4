"""Typed, validated pipeline configuration, loaded from TOML files shipped in ``pipelines/configs/``.

``base.toml`` sets every knob (with comments); an experiment file starts with ``extends = "base"``
(a config name, or a path relative to the extending file) and sets only what differs; command-line
``--set section.key=value`` overrides come last. Every file and override is checked against the
dataclasses below before any work starts: unknown sections or keys, wrong types (a bool is not an
int; an int is accepted for a float), non-finite floats, values outside ``metadata={"choices": ...}``
or the bounds ``metadata={"min"/"max"/"below": ...}`` (see :mod:`pipelines.config.fields`) raise a
:class:`ConfigError` naming the file or override and the key. Cross-field rules live in a section's
``__post_init__``; their errors are reported the same way.

The checker is generic over dataclass fields (nested dataclasses, ``list[...]``, ``tuple[...]``,
``dict[str, ...]``, ``X | None``, ``Literal[...]``), so model configs can grow freely. A section
field named ``collections`` holds per-collection overrides, e.g. ``[gbdt.collections."tile:xla"]``
with a subset of the section's keys; :func:`resolve_for_collection` applies them. Later sources win:
a file or override that sets a section key replaces that key in the per-collection tables it
inherits (see :func:`_layer`).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import math
import re
import tomllib
import types
import typing
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal, Mapping, Sequence, TypeVar, Union

from pipelines.core.collection import Collection, parse_collection
from pipelines.core.engine import to_jsonable
from pipelines.core.errors import ConfigError
from pipelines.config import registry

# Every seed: numpy, torch and LightGBM take [0, 2^32); a larger one aliases a smaller one (2**40 trains seed 0).
SEED_BOUNDS = {"min": 0, "below": 2**32}
# Files an ``extends`` chain may hold (the loader recurses once per file).
MAX_EXTENDS = 64
# A section field with this name maps collection names to overrides of the section's other fields.
PER_COLLECTION_FIELD = "collections"
BASE_NAME = "base"

T = TypeVar("T")


# ----------------------------------------------------------------------------- sections


@dataclass
class DataConfig:
    """How the raw files of the data root are read."""

    # A corrupt, truncated or foreign .npz graph file: "error" stops with an error naming it;
    # "skip" leaves that graph out, prints a warning and records it in the prune stage's manifest.
    on_bad_file: str = field(default="error", metadata={"choices": ("error", "skip")})


@dataclass
class PruneConfig:
    """How each graph is reduced before features and models see it."""

    # mode "khop": keep every node within this many edges of a configurable node (ignored by "config_only").
    hops: int = field(default=1, metadata={"min": 0})
    # khop: keep configurable nodes and every node within `hops` edges of one;
    # config_only: keep configurable nodes only (hops ignored).
    mode: str = field(default="khop", metadata={"choices": ("khop", "config_only")})
    # How identical config rows of TRAINING graphs are merged (test rows are never merged):
    # first: keep the first row; mean/min: one row with the mean/min runtime; none: keep all.
    dedup: str = field(default="first", metadata={"choices": ("first", "mean", "min", "none")})
    # How pruned layout configs are stored (pipelines.data.prune.save_pruned): auto: zstd where it shrinks them
    # >= 20x (default-search layouts), a plain memory-mapped .npy elsewhere (fastest); always: zstd for every
    # graph (random-search configs take several times less disk, for a slower prune).
    # Tile configs are small and always inside the graph's zstd-compressed file.
    compress_configs: str = field(default="auto", metadata={"choices": ("auto", "always")})


@dataclass
class FeaturesConfig:
    """Feature tables for the GBDT."""

    # Cap of configs kept per TRAINING graph (sampled with `seed`); test graphs are never capped.
    max_configs_per_graph: int = field(default=20000, metadata={"min": 1})
    # Seed of that sample.
    seed: int = field(default=0, metadata=SEED_BOUNDS)


@dataclass
class FoldsConfig:
    """Graph-level cross-validation folds, assigned once and shared by every model."""

    # Number of folds; every graph of one program family lands in the same fold.
    k: int = field(default=5, metadata={"min": 2})
    # Seed of the assignment of families to folds.
    seed: int = field(default=0, metadata=SEED_BOUNDS)
    # False: CV over train+valid graphs together; True: CV over train only, valid kept as a holdout.
    holdout_valid: bool = False


@dataclass
class EnsembleConfig:
    """How per-model predictions are blended."""

    # minmax: per-graph min-max scaled scores, averaged; rank: per-graph ranks, averaged.
    method: str = field(default="minmax", metadata={"choices": ("minmax", "rank")})
    # Keep the OOF-fitted blend only if its gain over the best single model exceeds this many
    # standard errors of the per-graph OOF gain, else use that model alone; 0: always the fitted blend.
    min_gain_se: float = field(default=2.0, metadata={"min": 0})
    # oof: test the blend's gain as measured on the OOF rows (one fold model per seed); test-runs: the
    # gain expected at the test's average over every fold model and seed (``ensemble.gain_at_runs``).
    gain_at: str = field(default="test-runs", metadata={"choices": ("oof", "test-runs")})
    # Where the data root names a tile graph's compiler default (defaults.json: tuning records, some
    # worlds), keep it among the submission's five picks: "always", "unless-confident" (unless every fold
    # model ranks it outside its own five), or "off" (pipelines.training.anchor).
    default_anchor: str = field(default="always", metadata={"choices": ("off", "unless-confident", "always")})
    # The models a run trains and blends, each one of run.models (`run --models` overrides it).
    models: list[str] = field(
        default_factory=registry.default_models,
        metadata={"choices": registry.configurable_models, "min_items": 1, "unique": True},
    )


@dataclass
class RunConfig:
    """What a full run trains and how it is scheduled."""

    # Every model is trained once per seed; the submission averages the seeds' normalised predictions.
    seeds: list[int] = field(default_factory=lambda: [0, 1], metadata={"min_items": 1, "unique": True, **SEED_BOUNDS})
    # The models the config allows (ensemble.models and `run --models` pick among them).
    models: list[str] = field(
        default_factory=registry.default_models,
        metadata={"choices": registry.configurable_models, "min_items": 1, "unique": True},
    )
    # Parallel worker processes: training jobs and per-file data-stage jobs (on Dask: jobs in flight).
    n_jobs: int = field(default=2, metadata={"min": 1})
    scheduler: str = "local"  # "local", or the address of a Dask scheduler (tcp://HOST:8786)


SECTIONS_BEFORE_MODELS = (("data", DataConfig), ("prune", PruneConfig), ("features", FeaturesConfig),
                          ("folds", FoldsConfig))
SECTIONS_AFTER_MODELS = (("ensemble", EnsembleConfig), ("run", RunConfig))


@functools.lru_cache(maxsize=None)
def _config_class(model_sections: tuple[tuple[str, type], ...]) -> type:
    sections = (*SECTIONS_BEFORE_MODELS, *model_sections, *SECTIONS_AFTER_MODELS)
    return dataclasses.make_dataclass(
        "PipelineConfig", [(name, cls, field(default_factory=cls)) for name, cls in sections],
        namespace={"__doc__": "The whole resolved configuration: one field per TOML section (the models' "
                              "sections come from pipelines.config.registry).", "__module__": __name__})


def pipeline_config_class() -> type:
    """The config class for the models registered now: the fixed sections plus one per model with settings."""
    return _config_class(registry.model_sections())


PipelineConfig = pipeline_config_class()  # the built-in models' config


# ----------------------------------------------------------------------------- public API


def load_config(path_or_name: str | Path | None = None, overrides: Sequence[str] = ()) -> PipelineConfig:
    """Load a named config (``"quick"``) or a TOML file, resolving ``extends``, then apply overrides.

    ``None`` loads ``base``; a name is a file in ``pipelines/configs/``; anything ending in ``.toml``
    or containing a slash is a file path. Each file of the ``extends`` chain is validated on top of
    its (already valid) parents, so an error names the file that introduced it.
    """
    chain = _load_chain(BASE_NAME if path_or_name is None else path_or_name)
    merged: dict = {}
    for source, data in chain:
        merged = _layer(merged, data)
        config = _build(pipeline_config_class(), merged, source, "")
    return apply_overrides(config, overrides)


def apply_overrides(config: T, overrides: Sequence[str]) -> T:
    """Apply ``"section.key=value"`` overrides in order; each value is a TOML literal (a bare word
    that is not one is taken as a string) and is type-checked against its field."""
    for text in overrides:
        where = f"override {text!r}"
        keys, value = parse_override(text, where)
        nested: Any = value
        for key in reversed(keys):
            nested = {key: nested}
        config = _build(type(config), _layer(config_to_dict(config), nested), where, "")
    return config


def resolve_for_collection(section_config: T, collection_name: str | Collection) -> T:
    """The section with its overrides for ``collection_name`` applied and ``collections`` emptied.

    Emptying it keeps the result (and fingerprints of it) independent of other collections' overrides.
    """
    name = collection_name.name if isinstance(collection_name, Collection) else parse_collection(collection_name).name
    plain = config_to_dict(section_config)
    if PER_COLLECTION_FIELD not in plain:
        return section_config
    overrides = plain[PER_COLLECTION_FIELD].get(name, {})
    plain[PER_COLLECTION_FIELD] = {}
    section = type(section_config).__name__
    return _build(type(section_config), _deep_merge(plain, overrides), f"overrides for {name}", section)


def model_settings(config: Any, model: str, collection_name: str | Collection) -> dict[str, Any]:
    """The settings a model trains ``collection_name`` with: its section with that collection's overrides
    applied, as plain data (what a training stage's key and its saved models record)."""
    return config_to_dict(resolve_for_collection(getattr(config, model), collection_name))


def config_to_dict(config: Any) -> dict:
    """Plain nested dict of a config (JSON/TOML-ready: paths as strings, tuples as lists)."""
    return to_jsonable(config)


def config_from_dict(cls: type[T], data: Mapping[str, Any], source: str = "<dict>") -> T:
    """Build and validate ``cls`` from plain data (the inverse of :func:`config_to_dict`)."""
    return _build(cls, data, source, "")


def available_configs() -> list[str]:
    """Names of the configs shipped in ``pipelines/configs/``."""
    return sorted(p.name[: -len(".toml")] for p in _configs_dir().iterdir() if p.name.endswith(".toml"))


def config_to_toml(config: Any) -> str:
    """TOML text of a config that :func:`load_config` reads back to an equal config."""
    lines: list[str] = []
    _emit_table(lines, [], config_to_dict(config))
    return "\n".join(lines).strip() + "\n"


# ----------------------------------------------------------------------------- files


def _configs_dir() -> Any:
    return resources.files("pipelines") / "configs"


def _load_chain(ref: str | Path, relative_to: Path | None = None, seen: tuple[str, ...] = ()) -> list[tuple[str, dict]]:
    """``[(source, data), ...]`` from the root of the ``extends`` chain to ``ref``."""
    source, identity, text, folder = _read_source(ref, relative_to)
    if identity in seen:
        raise ConfigError(f"{source}: 'extends' cycle: {' -> '.join(seen + (identity,))}")
    if len(seen) >= MAX_EXTENDS:
        raise ConfigError(f"{source}: 'extends' chain longer than {MAX_EXTENDS} files")
    data = parse_toml(text, source)
    parent = data.pop("extends", None)
    if parent is None:
        return [(source, data)]
    if not isinstance(parent, str) or not parent:
        raise ConfigError(f"{source}: 'extends' must be a config name or a file path, got {parent!r}")
    return _load_chain(parent, folder, seen + (identity,)) + [(source, data)]


def _read_source(ref: str | Path, relative_to: Path | None) -> tuple[str, str, str, Path | None]:
    """(name for messages, identity for cycle checks, TOML text, folder relative ``extends`` start from)."""
    text_ref = str(ref)
    is_path = isinstance(ref, Path) or text_ref.endswith(".toml") or "/" in text_ref or "\\" in text_ref
    if is_path:
        path = Path(ref)
        if relative_to is not None and not path.is_absolute():
            path = relative_to / path
        return str(path), str(path.resolve()), _read_config_file(path), path.parent
    resource = _configs_dir() / f"{text_ref}.toml"
    if not resource.is_file():
        raise ConfigError(
            f"unknown config {text_ref!r}; shipped configs: {', '.join(available_configs())} "
            "(or give a path to a .toml file)"
        )
    return f"configs/{text_ref}.toml", f"configs/{text_ref}.toml", resource.read_text(encoding="utf-8"), None


MAX_CONFIG_BYTES = 1 << 20  # a config is a few KB; /dev/zero or a huge file is refused, not read


def _read_config_file(path: Path) -> str:
    """The text of a config file: a regular file of at most MAX_CONFIG_BYTES in UTF-8, else ConfigError."""
    try:
        if not path.is_file():
            what = "not found" if not path.exists() else "not a regular file"
            raise ConfigError(f"{path}: cannot read config file ({what})")
        with open(path, "rb") as handle:
            data = handle.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config file ({exc.strerror or exc})") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: config file larger than {MAX_CONFIG_BYTES} bytes; not a config")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: config file is not UTF-8 text (byte {exc.start})") from None


def parse_override(text: str, where: str = "override") -> tuple[list[str], Any]:
    """``"section.key=value"`` -> (``["section", "key"]``, the TOML value, or the bare word as a string)."""
    if "=" not in text or "\n" in text:
        raise ConfigError(f"{where}: expected section.key=value")
    key_text, value_text = text.split("=", 1)
    keys = _split_dotted(key_text.strip(), where)
    if len(keys) < 2:
        raise ConfigError(f"{where}: expected section.key=value")
    value_text = value_text.strip()
    try:
        value = parse_toml(f"v = {value_text}", where)["v"]
    except _NotToml:
        value = value_text  # a bare word such as khop or tcp://host:8786
    return keys, value


class _NotToml(ConfigError):
    """Text that is not TOML at all (a bare word of an override is taken as a string)."""


def parse_toml(text: str, where: str) -> dict[str, Any]:
    """``tomllib.loads`` whose every failure is a ConfigError naming ``where``: invalid TOML, arrays or
    tables nested past the interpreter's recursion limit, an integer of more digits than Python
    converts (4300)."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise _NotToml(f"{where}: invalid TOML: {exc}") from None
    except RecursionError:
        raise ConfigError(f"{where}: arrays or tables nested too deep") from None
    except ValueError as exc:  # int('1' * 5000): "Exceeds the limit (4300 digits) for integer string conversion"
        raise ConfigError(f"{where}: a number of too many digits ({exc})") from None


_KEY_PART = re.compile(r"\s*(?:\"([^\"]*)\"|'([^']*)'|([^.\"'\s]+))\s*(?:\.|$)")


def _split_dotted(text: str, where: str) -> list[str]:
    """``gbdt.collections."tile:xla".num_leaves`` -> ``["gbdt", "collections", "tile:xla", "num_leaves"]``."""
    parts, pos = [], 0
    while pos < len(text):
        match = _KEY_PART.match(text, pos)
        if match is None or match.end() == pos:
            raise ConfigError(f"{where}: cannot parse the key {text!r}")
        parts.append(next(g for g in match.groups() if g is not None))
        pos = match.end()
    return parts


def _layer(merged: Mapping[str, Any], layer: Mapping[str, Any]) -> dict:
    """A later file or override (``layer``) on top of what came before (``merged``).

    A section key that the layer sets also drops that key from the per-collection tables it
    inherits, so a later setting reaches every collection (``--set gnn.epochs=3`` trains every
    collection 3 epochs, whatever base.toml sets per collection); the layer's own per-collection
    tables then apply on top, so within one file a per-collection value wins over the section's.
    """
    cleared = dict(merged)
    for section, table in layer.items():
        inherited = merged.get(section)
        if not isinstance(table, Mapping) or not isinstance(inherited, Mapping):
            continue
        per_collection = inherited.get(PER_COLLECTION_FIELD)
        keys = set(table) - {PER_COLLECTION_FIELD}
        if not keys or not isinstance(per_collection, Mapping):
            continue
        kept = {name: {k: v for k, v in values.items() if k not in keys} for name, values in per_collection.items()}
        cleared[section] = {**inherited, PER_COLLECTION_FIELD: {name: values for name, values in kept.items() if values}}
    return _deep_merge(cleared, layer)


def _deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict:
    """``over`` on top of ``base``: tables merge key by key, anything else is replaced."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


# ----------------------------------------------------------------------------- validation


def _build(cls: type[T], data: Any, where: str, path: str) -> T:
    """Instantiate dataclass ``cls`` from a (possibly partial) table, checking every key and value."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: {path or 'config'}: expected a table, got {_describe(data)}")
    known = {f.name: f for f in dataclasses.fields(cls) if f.init}
    hints = typing.get_type_hints(cls)
    for key in data:
        if key not in known:
            raise ConfigError(f"{where}: {_unknown_key(key, path, list(known))}")
    kwargs = {
        key: _check_value(hints[key], value, known[key].metadata, where, _join(path, key))
        for key, value in data.items()
        if key != PER_COLLECTION_FIELD
    }
    obj = _construct(cls, kwargs, where, path)
    if PER_COLLECTION_FIELD in data:
        # Overrides are checked on top of this section's own values (cross-field checks need them).
        kwargs[PER_COLLECTION_FIELD] = _check_collection_overrides(
            cls, config_to_dict(obj), data[PER_COLLECTION_FIELD], where, _join(path, PER_COLLECTION_FIELD)
        )
        obj = _construct(cls, kwargs, where, path)
    return obj


def _construct(cls: type[T], kwargs: dict[str, Any], where: str, path: str) -> T:
    try:
        return cls(**kwargs)
    except (ConfigError, TypeError, ValueError) as exc:  # the dataclass's own __post_init__ checks
        raise ConfigError(f"{where}: {path or 'config'}: {exc}") from None


def _unknown_key(key: str, path: str, known: list[str]) -> str:
    close = difflib.get_close_matches(key, known, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    if not path:
        return f"unknown section [{key}]{hint}; sections: {', '.join(known)}"
    return f"unknown key {_join(path, key)!r}{hint}; [{path}] has: {', '.join(known)}"


def _check_collection_overrides(
    cls: type, section: dict[str, Any], value: Any, where: str, path: str
) -> dict[str, dict]:
    """Validate ``{collection name: partial table of cls}`` against ``section`` (the plain section
    it overrides); keep only the given keys, normalised, under canonical collection names."""
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where}: {path}: expected a table of collection name -> overrides, got {_describe(value)}")
    base = {k: v for k, v in section.items() if k != PER_COLLECTION_FIELD}
    out: dict[str, dict] = {}
    for name, table in value.items():
        sub = f'{path}."{name}"'
        try:
            collection = parse_collection(name)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {sub}: {exc}") from None
        if not isinstance(table, Mapping):
            raise ConfigError(f"{where}: {sub}: expected a table of overrides, got {_describe(table)}")
        if PER_COLLECTION_FIELD in table:
            raise ConfigError(f"{where}: {sub}: per-collection overrides cannot contain {PER_COLLECTION_FIELD!r}")
        full = config_to_dict(_build(cls, _deep_merge(base, table), where, sub))
        out[collection.name] = _restrict(full, table)
    return out


def _restrict(full: dict, given: Mapping[str, Any]) -> dict:
    """The normalised values of ``full`` for just the keys (recursively) present in ``given``."""
    return {
        k: _restrict(full[k], v) if isinstance(v, Mapping) and isinstance(full[k], dict) else full[k]
        for k, v in given.items()
    }


def field_choices(meta: Mapping[str, Any]) -> tuple:
    """A field's allowed values: a tuple, or a function giving them now (the registered models)."""
    choices = meta["choices"]
    return tuple(choices() if callable(choices) else choices)


def _check_value(tp: Any, value: Any, meta: Mapping[str, Any], where: str, path: str) -> Any:
    value = _coerce(tp, value, where, path)
    items = value if isinstance(value, (list, tuple)) else [value]
    if "choices" in meta:
        choices = field_choices(meta)
        for item in items:
            if item not in choices:
                allowed = ", ".join(repr(c) for c in choices)
                raise ConfigError(f"{where}: {path}: {item!r} is not one of {allowed}")
    for bound, relation, bad in (("min", ">=", lambda x, b: x < b), ("max", "<=", lambda x, b: x > b),
                                 ("below", "<", lambda x, b: x >= b)):
        if bound in meta:
            for item in items:
                if isinstance(item, (int, float)) and bad(item, meta[bound]):
                    raise ConfigError(f"{where}: {path}: must be {relation} {meta[bound]}, got {item!r}")
    if "min_items" in meta and len(value) < meta["min_items"]:
        raise ConfigError(f"{where}: {path}: needs at least {meta['min_items']} item(s), got {len(value)}")
    if meta.get("unique") and len({json.dumps(to_jsonable(v)) for v in value}) != len(value):
        raise ConfigError(f"{where}: {path}: items must be distinct, got {value!r}")
    return value


def _coerce(tp: Any, value: Any, where: str, path: str) -> Any:
    """``value`` checked against type ``tp`` (int widened to float, str to Path, list to tuple)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any or tp is object:
        return value
    if origin is Union or origin is types.UnionType:
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(arg, value, where, path)
            except ConfigError:
                continue
        raise _type_error(tp, value, where, path)
    if origin is Literal:
        if any(value == a and type(value) is type(a) for a in args):
            return value
        raise ConfigError(f"{where}: {path}: {value!r} is not one of {', '.join(repr(a) for a in args)}")
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, where, path)
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(value):  # nan and inf pass every bound check: reject them here
                raise ConfigError(f"{where}: {path}: must be a finite number, got {value!r}")
            return float(value)
    elif tp is str:
        if isinstance(value, str):
            return value
    elif tp is Path:
        if isinstance(value, (str, Path)):
            return Path(value)
    elif tp in (list, tuple) or origin in (list, tuple):
        if isinstance(value, (list, tuple)):
            return _coerce_sequence(tp, origin or tp, args, value, where, path)
    elif tp is dict or origin is dict:
        if isinstance(value, Mapping):
            value_tp = args[1] if args else Any
            for key in value:
                if not isinstance(key, str):
                    raise ConfigError(f"{where}: {path}: keys must be strings, got {key!r}")
            return {k: _coerce(value_tp, v, where, _join(path, k)) for k, v in value.items()}
    else:
        raise TypeError(f"config field {path}: unsupported field type {tp!r}")
    raise _type_error(tp, value, where, path)


def _coerce_sequence(tp: Any, kind: type, args: tuple, value: Sequence, where: str, path: str) -> Any:
    if kind is tuple and args and not (len(args) == 2 and args[1] is Ellipsis):
        if len(value) != len(args):
            raise ConfigError(f"{where}: {path}: expected {len(args)} items, got {len(value)}")
        item_types = list(args)
    else:
        item_types = [args[0] if args else Any] * len(value)
    items = [_coerce(t, v, where, f"{path}[{i}]") for i, (t, v) in enumerate(zip(item_types, value))]
    return tuple(items) if kind is tuple else items


def _type_error(tp: Any, value: Any, where: str, path: str) -> ConfigError:
    return ConfigError(f"{where}: {path}: expected {_type_name(tp)}, got {_describe(value)}")


def _type_name(tp: Any) -> str:
    if dataclasses.is_dataclass(tp):
        return "a table"
    if isinstance(tp, type) and not typing.get_args(tp):
        return tp.__name__
    return str(tp).replace("typing.", "").replace("pathlib.", "")


def _describe(value: Any) -> str:
    return f"{type(value).__name__} {value!r:.60}"


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


# ----------------------------------------------------------------------------- TOML writer

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def _emit_table(lines: list[str], path: list[str], table: Mapping[str, Any]) -> None:
    scalars = {k: v for k, v in table.items() if not (isinstance(v, Mapping) and v)}
    tables = {k: v for k, v in table.items() if isinstance(v, Mapping) and v}
    if path and (scalars or not tables):
        lines.extend(["", f"[{'.'.join(_toml_key(p) for p in path)}]"])
    for key, value in scalars.items():
        if value is None:
            lines.append(f"# {_toml_key(key)} is unset (None)")
        else:
            lines.append(f"{_toml_key(key)} = {_toml_value(value)}")
    for key, value in tables.items():
        _emit_table(lines, path + [key], value)


def _toml_key(key: str) -> str:
    return key if _BARE_KEY.fullmatch(key) else json.dumps(key, ensure_ascii=False)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"cannot write {value!r} as TOML")
