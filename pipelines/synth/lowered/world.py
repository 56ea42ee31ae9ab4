"""A world over lowered programs: the Kaggle layout and the hidden-label sidecar, like ``synth`` writes.

Layout collections hold the catalogue's programs (:mod:`pipelines.synth.lowered.catalogue`) as the
featurizer reads their lowered modules (:mod:`pipelines.hlo`): ``xla`` the convolutional, recurrent,
MLP and mixed image models, ``nlp`` the transformer encoders and decoders. A program is shared by a
source's ``default`` and ``random`` collections (the ``default`` files are the first ones of the
source's pool), as in ``synth``. The tile collection holds the fused kernels XLA makes of a set of
the catalogue's programs when it compiles them for this machine (CPU fusions: loops, reductions, dot
and convolution fusions), each distinct kernel once.

Configs follow what the real tuning records show (``shared/real_tpu``): layout blocks of rank-5
tensors list only their two minor-most dims, rank-4 ones do so for a share of the nodes drawn per
file, lower ranks list every dim; every file holds the all -1 config (every layout left to the
compiler) once, at a random row. The ``random`` collections draw every block at random, the
``default`` ones cluster around the module's own layouts and an autotuned config (the ``synth``
searches, which price candidates with the reference model as the compiler's heuristic). Runtimes
come from the chosen cost family (:mod:`pipelines.synth.families`) on the priced program
(:mod:`pipelines.synth.lowered.convert`: partial blocks completed in the default layout's order),
with ``synth``'s measurement noise, benchmark loop and duplicate handling.

The sidecar: ``labels/npz/...`` as ``synth``'s, ``labels/labels.json`` (``generator``
``pipelines.synth.lowered``), ``labels/programs.json`` (collection -> stem -> program kind and
architecture), which ``evaluate`` reads for its per-family table, and ``labels/defaults.json`` (each
layout graph's row of the all -1 config: the compiler's own choice, :meth:`DataRoot.defaults`). Each file's randomness comes from
``(seed, collection, split, index)``; the programs come from the lowering cache, keyed by package
versions, so the same arguments and packages give the same bytes.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import time
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from pipelines.core.atomic import write_text_atomic
from pipelines.core.collection import ALL_COLLECTIONS, SPLITS, TILE_XLA, Collection, parse_collections
from pipelines.core.engine import fingerprint
from pipelines.core.errors import ConfigError
from pipelines.core.progress import Progress
from pipelines.data.root import DEFAULTS_FILE, DataRoot
from pipelines.data.tpugraphs import LayoutGraph, TileGraph, save_graph
from pipelines.synth import costmodel, searches
from pipelines.synth.families import REFERENCE, CostFamily, load_family
from pipelines.synth.lowered import cache, catalogue, convert
from pipelines.synth.lowered.catalogue import Architecture, ProgramSpec
from pipelines.synth.world import (LABELS_DIR, LABELS_MARKER, SCALES, Labels, Scale, _hex, _loguniform, _read_json,
                                   _rng, label_path, measure_layout, write_labels)

logger = logging.getLogger(__name__)

GENERATOR = "pipelines.synth.lowered"
VERSION = 1
MARKER = "lowered.json"
PARTIAL_MARKER = ".lowered-incomplete.json"
PROGRAMS_FILE = "programs.json"
LISTED_DIMS = 2  # a partial layout block lists the two minor-most dims
PARTIAL_RANK = 5  # blocks of this rank or more are always partial ...
RANK4_PARTIAL = (0.5, 1.0)  # ... rank-4 blocks in a per-file share drawn from this range
TILE_MIN_CONFIGS = 5  # a fused kernel needs this many distinct tile configs to be a tile graph ...
TILE_MIN_NODES = 3  # ... and this many instructions (a lone broadcast or iota is no kernel to tune)
TILE_SOURCES = {"tiny": 4, "small": 16, "medium": 40, "full": 120}  # programs compiled for kernels, at most


@dataclass(frozen=True)
class LayoutFile:
    collection: str
    split: str
    stem: str
    index: int  # the file's RNG key
    program: ProgramSpec
    num_configs: int = 0  # test files: fixed; 0: drawn per file


@dataclass(frozen=True)
class TileFile:
    split: str
    stem: str
    index: int
    program: ProgramSpec
    fusion: str  # the fused computation's name in the program's optimized module
    num_configs: int


# ----------------------------------------------------------------------------- which files


def _choose_programs(rng: np.random.Generator, archs: list[Architecture], total: int) -> list[ProgramSpec]:
    """``total`` distinct variants, several per architecture (about four), in random order."""
    order = rng.permutation(len(archs))
    count = max(2, min(len(archs), -(-total // 4)))
    pools = [[a.variants()[j] for j in rng.permutation(len(a.variants()))] for a in (archs[i] for i in order[:count])]
    picked: list[ProgramSpec] = []
    depth = 0
    while len(picked) < total:
        if depth >= max(len(p) for p in pools):
            raise ConfigError(f"the catalogue has fewer than {total} program variants for these collections")
        picked.extend(p[depth] for p in pools if depth < len(p) and len(picked) < total)
        depth += 1
    return [picked[i] for i in rng.permutation(len(picked))]


def layout_files(scale: Scale, seed: int, collection: Collection,
                 architectures: tuple[Architecture, ...] = catalogue.ARCHITECTURES) -> dict[str, list[LayoutFile]]:
    """The files of one layout collection per split, sorted by stem."""
    source = collection.source
    same_source = [c for c in ALL_COLLECTIONS if c.is_layout and c.source == source]
    sizes = [max(scale.layout_counts[c.name][s] for c in same_source) for s in range(3)]
    rng = _rng(seed, scale.name, "lowered-pool", source)
    chosen = _choose_programs(rng, [a for a in architectures if a.source == source], sum(sizes))
    test_stems = [_hex(rng, 32) for _ in range(sizes[2])]
    own = scale.layout_counts[collection.name]
    out: dict[str, list[LayoutFile]] = {}
    start = 0
    for s, split in enumerate(SPLITS):
        files = []
        for index in range(own[s]):
            program = chosen[start + index]
            stem = test_stems[index] if split == "test" else program.stem()
            count = scale.layout_test_configs if split == "test" else 0
            files.append(LayoutFile(collection.name, split, stem, index, program, count))
        out[split] = sorted(files, key=lambda f: f.stem)
        start += sizes[s]
    return out


def tile_source_programs(scale: Scale, seed: int,
                         architectures: tuple[Architecture, ...] = catalogue.ARCHITECTURES) -> list[ProgramSpec]:
    """The programs whose compiled kernels the tile collection may use (two variants of each architecture
    in a drawn order, at most ``TILE_SOURCES`` of them)."""
    rng = _rng(seed, scale.name, "lowered-tile-sources")
    out = []
    for i in rng.permutation(len(architectures)):
        variants = architectures[i].variants()
        out.extend(variants[j] for j in rng.choice(len(variants), size=2, replace=False))
    return out[:TILE_SOURCES.get(scale.name, 16)]


@dataclass(frozen=True)
class Kernel:
    program: ProgramSpec
    fusion: str
    structure: str  # a digest of the fused computation's graph: equal kernels are one kernel


def tile_files(scale: Scale, seed: int, kernels: list[Kernel]) -> dict[str, list[TileFile]]:
    """Tile files per split from the distinct ``kernels`` (first seen kept), sorted by stem."""
    seen: set[str] = set()
    distinct = [k for k in kernels if not (k.structure in seen or seen.add(k.structure))]
    need = sum(scale.tile_counts)
    if len(distinct) < need:
        raise ConfigError(f"the compiled programs hold {len(distinct)} distinct fused kernels; scale {scale.name} "
                          f"needs {need}")
    rng = _rng(seed, scale.name, "lowered-tile")
    picked = [distinct[i] for i in rng.permutation(len(distinct))[:need]]
    out: dict[str, list[TileFile]] = {}
    start = 0
    for s, split in enumerate(SPLITS):
        files = []
        for index in range(scale.tile_counts[s]):
            kernel = picked[start + index]
            if split == "test":
                stem = _hex(rng, 32)
                low, high = scale.tile_test_configs
                num = int(rng.integers(2, 5)) if index < scale.tile_few_config_tests else _loguniform(rng, low, high)
            else:
                stem = f"{kernel.program.arch}_{kernel.program.mode}_batch_{kernel.program.batch}_{_hex(rng, 16)}"
                num = _loguniform(rng, *scale.tile_configs)
            files.append(TileFile(split, stem, index, kernel.program, kernel.fusion, num))
        out[split] = sorted(files, key=lambda f: f.stem)
        start += scale.tile_counts[s]
    return out


# ----------------------------------------------------------------------------- one program's graphs (pure)


def featurize(module: Any, source: str) -> Any:
    from pipelines.hlo import featurize_module

    return featurize_module(module, source, tile_configs_per_fusion=1)


def partial_blocks(ranks: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """(nc, 3) bool: the blocks a file lists partially (rank >= 5 always, rank 4 for a drawn share)."""
    share = rng.uniform(*RANK4_PARTIAL)
    return (ranks >= PARTIAL_RANK) | ((ranks == 4) & (rng.random(ranks.shape) < share))


def make_layout_graph(featurized: Any, priced: convert.PricedProgram, file: LayoutFile, seed: int, scale: Scale,
                      family: CostFamily) -> tuple[LayoutGraph, Labels]:
    """One layout file of a lowered program and its labels (pure: no I/O)."""
    collection = parse_collections(file.collection)[0]
    params = costmodel.DEFAULT_PARAMS
    model = costmodel.layout_cost_model(priced.program, params)
    space = featurized.layout_space()
    nc = space.num_nodes
    rng = _rng(seed, file.collection, file.split, file.index)
    count = file.num_configs
    if not count:
        cap = scale.max_config_cells // max(nc, 1)
        low, high = scale.layout_configs
        count = max(2, min(_loguniform(rng, low, int(high * 1.5)), high, cap))
    if collection.search == "random":
        priced_configs = searches.random_search(model, count, rng)
    else:
        priced_configs = searches.default_search(model, count, rng, float(rng.choice(list(params.duplicate_shares))),
                                                 float(rng.uniform(*params.mutations)))
    configs = convert.truncate_blocks(priced.stored_blocks(priced_configs, space.defaults),
                                      partial_blocks(space.ranks, rng), LISTED_DIMS)
    configs[int(rng.integers(count))] = -1  # the compiler's own choice everywhere, once per file

    def runtimes(blocks: np.ndarray) -> np.ndarray:
        completed = convert.complete_blocks(blocks, space.defaults)
        return family.layout_runtimes(priced.program, priced.priced_blocks(completed))

    noise = family.noise_range(collection.search)
    measured, noise_free = measure_layout(model, configs, rng, noise, params.remeasured_duplicates, runtimes=runtimes)
    runtime = np.zeros(count, dtype=np.int64) if file.split == "test" else measured
    layout = featurized.layout
    graph = LayoutGraph(file.stem, layout.node_feat, layout.node_opcode, layout.edge_index, featurized.config_ids,
                        configs, runtime, layout.node_splits)
    return graph, Labels(measured, noise_free)


def fused_kernels(featurized: Any) -> list[tuple[str, Any, Any]]:
    """(fused computation name, tile space, TileKernel) of every fusion that can be a tile graph."""
    from pipelines.hlo.configs import tile_space

    shapes = {i.name: i.shape for i in featurized.layout.instructions}
    by_name = {c.name: c for c in featurized.module.computations}
    out = []
    for part in featurized.tiles:
        fused = by_name[part.computation]
        space = tile_space(fused, shapes)
        kernel = convert.tile_kernel(fused, shapes, space)
        if (convert.kernel_ok(kernel) and _space_size(space) >= TILE_MIN_CONFIGS
                and len(fused.instructions) >= TILE_MIN_NODES):
            out.append((part.computation, space, kernel))
    return out


def _space_size(space: Any, at_most: int = TILE_MIN_CONFIGS) -> int:
    """How many distinct tile configs a kernel has (counted up to ``at_most``)."""
    from pipelines.hlo.configs import tile_configs

    return int(tile_configs(space, at_most, 0).shape[0])


def kernel_structure(part: Any) -> str:
    """A digest of a fused computation's stored arrays (two kernels with equal arrays are one graph)."""
    import hashlib

    digest = hashlib.sha256()
    for array in (part.graph.node_feat, part.graph.node_opcode, part.graph.edge_index):
        digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()[:24]


def make_tile_graph(part: Any, space: Any, kernel: Any, file: TileFile, seed: int,
                    family: CostFamily) -> tuple[TileGraph, Labels]:
    """One tile file (a fused kernel of a compiled program) and its labels (pure: no I/O)."""
    from pipelines.hlo.configs import tile_configs

    rng = _rng(seed, TILE_XLA.name, file.split, file.index)
    config_feat = tile_configs(space, file.num_configs, int(rng.integers(2**31)))
    c = config_feat.shape[0]
    costs = family.tile_runtimes(kernel, config_feat)
    sigma = rng.uniform(*family.noise_range("tile"))
    runtime = costmodel.noisy(costs, costmodel.TILE_REPEATS, sigma, rng)
    normalizer = costmodel.noisy(np.full(c, np.median(costs)), costmodel.TILE_REPEATS, 0.01, rng)
    labels = Labels(runtime, costs * costmodel.TILE_REPEATS, normalizer)
    if file.split == "test":
        runtime, normalizer = np.zeros(c, np.int64), np.ones(c, np.int64)
    graph = part.graph
    return TileGraph(file.stem, graph.node_feat, graph.node_opcode, graph.edge_index, config_feat, runtime,
                     normalizer), labels


# ----------------------------------------------------------------------------- jobs (I/O)


@dataclass(frozen=True)
class _Job:
    """Every file of one program (so it is featurized once)."""

    arch: Architecture
    program: ProgramSpec
    layout: tuple[LayoutFile, ...] = ()
    tile: tuple[TileFile, ...] = ()


class Written(NamedTuple):
    """One file a job wrote."""

    collection: str
    split: str
    stem: str
    nodes: int
    configurable: int
    configs: int
    default: int | None  # the row of the compiler's own config (layout: all -1), None where unknown (tile)


def _run_job(out: str, cache_dir: str, scale_name: str, seed: int, family_name: str, job: _Job) -> list[Written]:
    """Write the job's files and labels."""
    family = load_family(family_name)
    arch = job.arch
    rows = []
    if job.layout:
        featurized = featurize(cache.load_module(cache_dir, arch, job.program), job.program.key)
        priced = convert.priced_program(featurized.module, featurized.layout, featurized.config_ids)
        for file in job.layout:
            graph, labels = make_layout_graph(featurized, priced, file, seed, SCALES[scale_name], family)
            collection = parse_collections(file.collection)[0]
            _write(Path(out), collection, file.split, file.stem, graph, labels)
            default = int(np.flatnonzero((np.asarray(graph.node_config_feat) == -1).all(axis=(1, 2)))[0])
            rows.append(Written(file.collection, file.split, file.stem, graph.num_nodes,
                                int(graph.node_config_ids.shape[0]), graph.num_configs, default))
    if job.tile:
        featurized = featurize(cache.load_module(cache_dir, arch, job.program, "optimized"), job.program.key)
        kernels = {name: (space, kernel) for name, space, kernel in fused_kernels(featurized)}
        parts = {p.computation: p for p in featurized.tiles}
        for file in job.tile:
            space, kernel = kernels[file.fusion]
            graph, labels = make_tile_graph(parts[file.fusion], space, kernel, file, seed, family)
            _write(Path(out), TILE_XLA, file.split, file.stem, graph, labels)
            rows.append(Written(TILE_XLA.name, file.split, file.stem, graph.num_nodes, 0, graph.num_configs, None))
    return rows


def _write(out: Path, collection: Collection, split: str, stem: str, graph: Any, labels: Labels) -> None:
    path = DataRoot(out).new_split_dir(collection, split) / f"{stem}.npz"
    save_graph(path, graph)
    write_labels(label_path(out, collection, split, stem), labels)


def _kernels(cache_dir: Path, programs: Iterable[ProgramSpec], by_name: dict[str, Architecture]) -> list[Kernel]:
    found = []
    for program in programs:
        arch = by_name[program.arch]
        featurized = featurize(cache.load_module(cache_dir, arch, program, "optimized"), program.key)
        parts = {p.computation: p for p in featurized.tiles}
        found += [Kernel(program, name, kernel_structure(parts[name])) for name, _, _ in fused_kernels(featurized)]
    return found


# ----------------------------------------------------------------------------- the world


def generate_lowered_world(out: Path | str, *, scale: str, seed: int, family: str = REFERENCE,
                           collections: str | list[str] | None = None, cache_dir: Path | str = cache.DEFAULT_CACHE,
                           jobs: int = 1, architectures: tuple[Architecture, ...] = catalogue.ARCHITECTURES) -> str:
    """Write a world over lowered programs under ``out`` (see the module docstring); returns a summary.

    ``architectures`` (default: the catalogue) are the programs it draws from. Refuses a non-empty
    ``out`` unless it is (part of) a lowered world of the same arguments: a complete one is left alone,
    an interrupted one is written again."""
    if scale not in SCALES:
        raise ConfigError(f"unknown scale {scale!r}; expected one of {', '.join(SCALES)}")
    if jobs < 1:
        raise ConfigError(f"--jobs must be at least 1, got {jobs}")
    load_family(family)
    chosen = parse_collections(collections)
    chosen = tuple(c for c in ALL_COLLECTIONS if c in chosen)
    out, cache_dir = Path(out), Path(cache_dir)
    marker = {"generator": GENERATOR, "version": VERSION, "scale": scale, "seed": seed, "family": family,
              "collections": [c.name for c in chosen], "packages": cache.package_versions(),
              "catalogue": fingerprint(architectures)}
    by_name = {a.name: a for a in architectures}
    if _check_target(out, marker):
        return (f"{out}: lowered world (scale={scale}, seed={seed}, family={family}) is already complete; "
                "nothing written")
    started = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / PARTIAL_MARKER, json.dumps(marker, indent=2))
    (out / MARKER).unlink(missing_ok=True)
    (out / LABELS_DIR / LABELS_MARKER).unlink(missing_ok=True)

    spec = SCALES[scale]
    by_program: dict[ProgramSpec, dict[str, list]] = {}
    programs: dict[str, dict[str, dict[str, str]]] = {}
    for collection in chosen:
        for split in SPLITS:
            DataRoot(out).new_split_dir(collection, split).mkdir(parents=True, exist_ok=True)
        if collection.is_tile:
            sources = tile_source_programs(spec, seed, architectures)
            logger.info(f"lowered world: compiling {len(sources)} programs for their fused kernels")
            files = tile_files(spec, seed, _kernels(cache_dir, sources, by_name))
            for split_files in files.values():
                for f in split_files:
                    by_program.setdefault(f.program, {"layout": [], "tile": []})["tile"].append(f)
        else:
            files = layout_files(spec, seed, collection, architectures)
            for split_files in files.values():
                for f in split_files:
                    by_program.setdefault(f.program, {"layout": [], "tile": []})["layout"].append(f)
        programs[collection.name] = {f.stem: {"kind": by_name[f.program.arch].kind,
                                              "program": f.program.arch}
                                     for split_files in files.values() for f in split_files}
    todo = [_Job(by_name[p.arch], p, tuple(v["layout"]), tuple(v["tile"]))
            for p, v in sorted(by_program.items(), key=lambda kv: kv[0].key)]
    logger.info(f"lowered world: {sum(len(j.layout) + len(j.tile) for j in todo)} files from {len(todo)} programs "
                f"under {out} ({scale}, seed {seed}, family {family}, {jobs} job(s))")
    progress = Progress("lowered", len(todo), every_s=10.0)
    rows: list[Written] = []
    args = (str(out), str(cache_dir), scale, seed, family)
    if jobs == 1:
        for job in todo:
            rows += _run_job(*args, job)
            progress.step()
    else:
        # spawned, not forked: this process has run jax (its threads do not survive a fork)
        with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            for result in pool.map(_run_job, *([a] * len(todo) for a in args), todo, chunksize=1):
                rows += result
                progress.step()
    submission = ["ID,TopConfigs"]
    defaults: dict[str, dict[str, int]] = {}
    for row in sorted(rows):
        if row.default is not None:
            defaults.setdefault(row.collection, {})[row.stem] = row.default
        if row.split == "test":
            collection = parse_collections(row.collection)[0]
            top = range(min(5, row.configs)) if collection.is_tile else range(row.configs)
            submission.append(f"{collection.submission_id(row.stem)},{';'.join(map(str, top))}")
    write_text_atomic(DataRoot(out).sample_submission, "\n".join(submission) + "\n")
    (out / LABELS_DIR).mkdir(exist_ok=True)
    write_text_atomic(out / LABELS_DIR / PROGRAMS_FILE, json.dumps(programs, indent=1, sort_keys=True) + "\n")
    write_text_atomic(out / LABELS_DIR / DEFAULTS_FILE, json.dumps(defaults, indent=1, sort_keys=True) + "\n")
    sidecar = {**marker, "labels_version": 1, "programs": PROGRAMS_FILE,
               "layout": f"{LABELS_DIR}/npz/<collection dir>/<split>/<stem>.npz",
               "arrays": {"runtime": "int64 measured runtimes (train/valid: the file's config_runtime)",
                          "noise_free": "float64 runtimes before measurement noise, same units",
                          "normalizer": "int64 measured normalizers (tile only)"}}
    write_text_atomic(out / LABELS_DIR / LABELS_MARKER, json.dumps(sidecar, indent=2))
    write_text_atomic(out / MARKER, json.dumps(marker, indent=2))
    (out / PARTIAL_MARKER).unlink(missing_ok=True)
    return _summary(out, marker, rows, time.perf_counter() - started)


def _check_target(out: Path, marker: dict) -> bool:
    """True when ``out`` already holds the complete world of ``marker``; a ConfigError when it holds anything
    but that world (complete or interrupted)."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{out}: exists and is not a directory")
    if not out.is_dir() or not any(out.iterdir()):
        return False
    done, partial = _read_json(out / MARKER), _read_json(out / PARTIAL_MARKER)
    if done == marker and (out / LABELS_DIR / LABELS_MARKER).is_file():
        return True
    if marker not in (done, partial):
        found = done or partial
        why = f"its {MARKER} was written with other arguments ({found})" if found else "it is not a lowered world"
        raise ConfigError(f"{out}: refusing to write into a non-empty directory: {why}")
    return False


def _summary(out: Path, marker: dict, rows: list[Written], seconds: float) -> str:
    lines = [f"lowered world at {out} (scale={marker['scale']}, seed={marker['seed']}, family={marker['family']}): "
             f"{len(rows)} files, {seconds:.1f} s"]
    groups: dict[tuple[str, str], list[tuple[int, int, int]]] = {}
    for row in rows:
        groups.setdefault((row.collection, row.split), []).append((row.nodes, row.configurable, row.configs))
    for (collection, split), values in sorted(groups.items()):
        n, nc, c = (np.array(col) for col in zip(*values))
        detail = f"nodes {n.min()}-{n.max()}, configs {c.min()}-{c.max()}"
        if nc.any():
            detail += f", configurable {nc.min()}-{nc.max()}"
        lines.append(f"  {collection:20s} {split:5s} {len(values):5d} files: {detail}")
    return "\n".join(lines)
