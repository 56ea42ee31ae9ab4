"""Real programs in: XLA HLO (from a file or a jax function) as TpuGraphs graphs.

:func:`featurize_program` reads a serialized ``HloModuleProto`` (``.pb``) or HLO text (``.txt`` /
``.hlo``) and writes ``OUT/<stem>.npz`` as a layout graph (the whole module; the convolution, dot and
reshape nodes configurable, with candidate layout configs) and, where the module has fusions,
``OUT/<stem>-tiles/<stem>-<fusion>.npz`` as tile graphs (one fused computation each, with candidate
tile configs), plus ``OUT/<stem>.json`` naming what every configurable node and tile file is.
:func:`featurize_jax` does the same for ``jax.jit(fn)`` on example arguments. Runtimes are unknown:
every file is a test graph (``config_runtime`` all 0; tile normalizers 1).

Nodes are numbered as the dataset's own encoder numbers them (position in the serialized module).
``parse`` reads the module through XLA's own objects (jaxlib, the optional ``hlo`` extra) and our own
proto decoder (``schema``); ``featurize`` and ``configs`` are pure functions over its records;
``records`` reads the dataset's tuning records (``tuning.proto``) into graphs with measured runtimes.
See docs/hlo.md.
"""

from __future__ import annotations

import json
import logging
import re
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from pipelines.core.atomic import write_text_atomic
from pipelines.core.errors import ConfigError, FormatError, PipelineError
from pipelines.hlo.configs import SEARCHES, describe_block, layout_configs, layout_space, tile_configs, tile_space
from pipelines.hlo.featurize import GraphArrays, computation_graph, module_graph
from pipelines.hlo.parse import Module, load_module, module_from_jax, read_module
from pipelines.data.tpugraphs import (LAYOUT_CONFIG_DIM, MAX_CONFIG_NODES, MAX_CONFIGS, MAX_LAYOUT_CONFIG_ITEMS, MAX_NODES,
                                 LayoutGraph, TileGraph, save_graph)

logger = logging.getLogger(__name__)

DEFAULT_CONFIGS = 1000  # as many as a real test file holds
DEFAULT_TILE_CONFIGS = 100
FEATURIZER_VERSION = 1
# Attributes of configurable nodes kept verbatim in the sidecar JSON.
KEPT_ATTRIBUTES = ("lhs_batch_dims", "lhs_contracting_dims", "rhs_batch_dims", "rhs_contracting_dims", "dim_labels",
                   "window", "feature_group_count", "batch_group_count", "operand_precision")

__all__ = ["Featurized", "FeaturizeResult", "featurize_module", "featurize_program", "featurize_jax", "SEARCHES"]


@dataclass
class TilePart:
    fusion: str  # the fusion instruction's name
    computation: str  # its fused computation
    graph: GraphArrays
    config_feat: np.ndarray  # float32 (c, 24)


@dataclass
class Featurized:
    """A module as graphs, in memory (nothing written)."""

    module: Module
    layout: GraphArrays
    config_ids: np.ndarray  # int64 (nc,)
    tiles: list[TilePart] = field(default_factory=list)

    @property
    def config_nodes(self) -> list[Any]:
        return [self.layout.instructions[i] for i in self.config_ids]

    def layout_space(self):
        shapes = {i.name: i.shape for i in self.layout.instructions}
        return layout_space(self.config_nodes, shapes)

    def layout_graph(self, stem: str, configs: np.ndarray) -> LayoutGraph:
        return LayoutGraph(stem, self.layout.node_feat, self.layout.node_opcode, self.layout.edge_index,
                           self.config_ids, configs, np.zeros(configs.shape[0], dtype=np.int64),
                           self.layout.node_splits)

    def tile_graph(self, stem: str, part: TilePart) -> TileGraph:
        c = part.config_feat.shape[0]
        return TileGraph(stem, part.graph.node_feat, part.graph.node_opcode, part.graph.edge_index, part.config_feat,
                         np.zeros(c, dtype=np.int64), np.ones(c, dtype=np.int64))

    def summary(self) -> dict[str, Any]:
        ops = dict(sorted(self.layout.unknown_ops.items()))
        return {"module": self.module.name, "source": self.module.source, "nodes": int(self.layout.node_feat.shape[0]),
                "edges": int(self.layout.edge_index.shape[0]), "computations": len(self.module.computations),
                "configurable_nodes": int(self.config_ids.shape[0]), "fusions": len(self.tiles),
                "unknown_ops": ops}


def featurize_module(hlo_module: Any, source: str = "<module>", *, tile_configs_per_fusion: int = DEFAULT_TILE_CONFIGS,
                     seed: int = 0) -> Featurized:
    """The layout graph of an XLA ``HloModule`` (or a loaded :class:`~pipelines.hlo.parse.HloSource`) and a
    tile graph per fused computation."""
    checked_options(tile_configs=tile_configs_per_fusion, seed=seed)
    module = read_module(hlo_module, source, max_instructions=MAX_NODES)
    n = module.num_instructions
    graph = module_graph(module)
    config_ids = graph.config_ids
    if config_ids.shape[0] > MAX_CONFIG_NODES:
        raise FormatError(source, f"{config_ids.shape[0]} configurable nodes: more than a TpuGraphs graph may hold "
                                  f"({MAX_CONFIG_NODES})")
    if graph.unknown_ops:
        counted = ", ".join(f"{op} x{k}" for op, k in sorted(graph.unknown_ops.items()))
        logger.warning(f"{source}: {sum(graph.unknown_ops.values())} of {n} instructions have opcodes outside the "
                       f"dataset's table (given id 0): {counted}")
    shapes = {i.name: i.shape for i in graph.instructions}
    tiles = []
    fusion_of = {callee: ins.name for _, ins in module.instructions() if ins.opcode == "fusion" for callee in ins.called}
    for k, computation in enumerate(c for c in module.computations if c.is_fusion):
        part_graph = computation_graph(computation, source)
        space = tile_space(computation, shapes)
        tiles.append(TilePart(fusion_of.get(computation.name, computation.name), computation.name, part_graph,
                              tile_configs(space, tile_configs_per_fusion, seed + k)))
    return Featurized(module, graph, config_ids, tiles)


@dataclass
class FeaturizeResult:
    layout_path: Path | None  # None when the module has no configurable node
    tile_paths: list[Path]
    sidecar: Path
    summary: dict[str, Any]


@contextmanager
def out_folder_lock(folder: Path | str, command: str, *, data_root_ok: bool = False) -> Iterator[Path]:
    """Hold ``folder/.<command>.lock`` (created with the folder) while a command writes into ``folder``: a
    second process asking for it meanwhile gets a PipelineError naming the folder, instead of replacing
    files the first one is writing or reading (``rank`` scores the data root it built there). The lock is
    the kernel's (``flock``), so a killed holder releases it; the empty lock file stays. A data root
    (``npz/`` or ``npz_all/`` inside) is refused before anything is created, unless ``data_root_ok``
    (``records``, which checks that the root is its own)."""
    import fcntl

    folder = Path(folder)
    if not data_root_ok and any((folder / name).is_dir() for name in ("npz", "npz_all")):
        raise PipelineError(f"{folder}: a data root (it holds TpuGraphs npz folders); `{command}` writes nothing into "
                            "one: pass an --out folder of its own")
    folder.mkdir(parents=True, exist_ok=True)
    lock = folder / f".{command}.lock"
    handle = open(lock, "a+")
    try:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise PipelineError(f"{folder}: another `{command}` is writing into this folder (it holds {lock.name}); "
                                "wait for it to finish or pass another --out") from None
        yield folder
    finally:
        handle.close()


def safe_stem(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.+-]", "_", name)


def checked_options(*, configs: int = 1, tile_configs: int = 1, seed: int = 0, search: str = "random") -> None:
    """The numeric options of ``featurize`` and ``rank``, checked before any work: a ConfigError (a usage
    error) naming the option otherwise."""
    for option, value, high in (("--configs", configs, MAX_CONFIGS), ("--tile-configs", tile_configs, MAX_CONFIGS),
                                ("--seed", seed, 2**32 - 1)):
        low = 0 if option == "--seed" else 1
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ConfigError(f"{option} must be an integer in [{low}, {high}], got {value!r}")
    if search not in SEARCHES:
        raise ConfigError(f"--search: unknown search {search!r}; expected one of {', '.join(SEARCHES)}")


def checked_config_count(count: int, nc: int, what: str) -> int:
    checked_options(configs=count)
    if count * nc * LAYOUT_CONFIG_DIM > MAX_LAYOUT_CONFIG_ITEMS:
        raise ConfigError(f"{what}: --configs {count} x {nc} configurable nodes exceed what a layout file may hold "
                          f"({MAX_LAYOUT_CONFIG_ITEMS} values); ask for at most "
                          f"{MAX_LAYOUT_CONFIG_ITEMS // (nc * LAYOUT_CONFIG_DIM)} configs")
    return count


def write_featurized(featurized: Featurized, stem: str, out_dir: Path | str, *, configs: int = DEFAULT_CONFIGS,
                     search: str = "random", seed: int = 0, tiles: bool = True) -> FeaturizeResult:
    """Write the layout graph (``configs`` candidates of ``search``), the tile graphs and the sidecar (one
    process at a time per ``out_dir``)."""
    with out_folder_lock(out_dir, "featurize"):
        return _write_featurized(featurized, stem, Path(out_dir), configs=configs, search=search, seed=seed,
                                 tiles=tiles)


def _write_featurized(featurized: Featurized, stem: str, out_dir: Path, *, configs: int, search: str, seed: int,
                      tiles: bool) -> FeaturizeResult:
    source = featurized.module.source
    layout_path = None
    nc = int(featurized.config_ids.shape[0])
    space = featurized.layout_space()
    shapes = {i.name: i.shape for i in featurized.layout.instructions}
    if nc:
        blocks = layout_configs(space, checked_config_count(configs, nc, source), search, seed)
        layout_path = out_dir / f"{stem}.npz"
        save_graph(layout_path, featurized.layout_graph(stem, blocks))
    else:
        logger.warning(f"{source}: no convolution, dot or reshape instruction: no layout graph written")
    tile_paths = []
    if tiles:
        for part in featurized.tiles:
            tile_stem = f"{stem}-{safe_stem(part.fusion)}"
            path = out_dir / f"{stem}-tiles" / f"{tile_stem}.npz"
            save_graph(path, featurized.tile_graph(tile_stem, part))
            tile_paths.append(path)
    summary = featurized.summary() | {
        "featurizer_version": FEATURIZER_VERSION, "search": search, "configs": configs if nc else 0, "seed": seed,
        "layout_file": layout_path.name if layout_path else None,
        "configurable": [{"node": int(i), "name": ins.name, "opcode": ins.opcode, "shape": str(ins.shape),
                          "operand_shapes": [str(shapes[o]) for o in ins.operands if o in shapes],
                          # what node_feat drops (dot dimension numbers) or holds only in part
                          "attributes": {k: ins.attrs[k] for k in KEPT_ATTRIBUTES if k in ins.attrs},
                          "default_layout": [describe_block(space.defaults[k, 6 * b:6 * b + 6],
                                                            space.defaults[k, 6 * b:6 * b + 6])
                                             if space.ranks[k, b] else "-" for b in range(3)]}
                         for k, (i, ins) in enumerate(zip(featurized.config_ids, featurized.config_nodes))],
        "tile_files": [{"file": str(p.relative_to(out_dir)), "fusion": t.fusion, "computation": t.computation,
                        "nodes": int(t.graph.node_feat.shape[0]), "configs": int(t.config_feat.shape[0])}
                       for p, t in zip(tile_paths, featurized.tiles)],
    }
    sidecar = out_dir / f"{stem}.json"
    write_text_atomic(sidecar, json.dumps(summary, indent=1) + "\n")
    return FeaturizeResult(layout_path, tile_paths, sidecar, summary)


def featurize_program(path: Path | str, out_dir: Path | str, *, configs: int = DEFAULT_CONFIGS, search: str = "random",
                      seed: int = 0, tiles: bool = True, tile_configs_per_fusion: int = DEFAULT_TILE_CONFIGS,
                      ) -> FeaturizeResult:
    """Featurize the HLO program file ``path`` into ``out_dir`` (see the module docstring)."""
    path = Path(path)
    checked_options(configs=configs, tile_configs=tile_configs_per_fusion, seed=seed, search=search)
    featurized = featurize_module(load_module(path), str(path), tile_configs_per_fusion=tile_configs_per_fusion,
                                  seed=seed)
    stem = path.name
    for suffix in (".pb", ".txt", ".hlo"):
        stem = stem[: -len(suffix)] if stem.endswith(suffix) else stem
    stem = safe_stem(stem) or "program"
    return write_featurized(featurized, stem, out_dir, configs=configs, search=search, seed=seed, tiles=tiles)


def featurize_jax(fn: Any, *example_args: Any, out_dir: Path | str, name: str | None = None, optimized: bool = False,
                  configs: int = DEFAULT_CONFIGS, search: str = "random", seed: int = 0, tiles: bool = True,
                  tile_configs_per_fusion: int = DEFAULT_TILE_CONFIGS) -> FeaturizeResult:
    """Featurize ``jax.jit(fn)`` lowered on ``example_args`` (``optimized``: as XLA compiled it, with
    fusions) into ``out_dir`` as ``<name>.npz`` (default: the function's name)."""
    checked_options(configs=configs, tile_configs=tile_configs_per_fusion, seed=seed, search=search)
    stem = safe_stem(name or getattr(fn, "__name__", "program"))
    featurized = featurize_module(module_from_jax(fn, *example_args, optimized=optimized), f"<jax:{stem}>",
                                  tile_configs_per_fusion=tile_configs_per_fusion, seed=seed)
    return write_featurized(featurized, stem, out_dir, configs=configs, search=search, seed=seed, tiles=tiles)


