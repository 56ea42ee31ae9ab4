"""Scales, naming and writing of a synthetic TpuGraphs world (the I/O shell around the generators).

A world is written exactly like the Kaggle download (``npz_all/npz/...`` plus
``sample_submission.csv``), through :func:`pipelines.data.tpugraphs.save_graph`.

Scales (graphs per split and sizes):

========  =====================  ======================================  ==========================
scale     tile train/valid/test  layout train/valid/test per collection  sizes
========  =====================  ======================================  ==========================
tiny      16 / 4 / 4             6 / 2 / 2                               layout ~20-170 nodes,
                                                                         30-100 configs (test 8);
                                                                         tile 2-40 configs
small     240 / 40 / 40          xla 24/5/5 (random 26/5/5),             layout ~100-900 nodes,
                                 nlp 28/6/6 (random 30/6/6)              10-90 configurable, 300-2000
                                                                         configs (test 200);
                                                                         tile 10-300 configs
medium    720 / 120 / 120        xla 72/15/15 (random 78/15/15),         layout ~200-2300 nodes,
                                 nlp 84/18/18 (random 90/18/18)          300-2000 configs (test 200);
                                                                         tile 10-400 configs
full      5709 / 676 / 844       xla:default 61/7/8, xla:random 69/7/8,  layout up to ~44k nodes
                                 nlp:default 198/20/17,                  (xla mean ~13k, nlp ~6k),
                                 nlp:random 207/20/17                    up to 100,040 configs
                                                                         (c * nc <= 100,040 * 121),
                                                                         test 1000 (two with 1001);
                                                                         tile 5-80 nodes, 2-10k configs
========  =====================  ======================================  ==========================

Tile test splits hold graphs with fewer than 5 configs (16 at full scale, 1-2 otherwise).

Names. Tile train/valid stems are ``<model>_<train|inference>_batch_<b>_<signed 16-hex>``; layout
xla stems follow one of the real patterns per family (``resnet50.4x4.fp16``,
``inception_v3_batch_128_train``, ``mlperf_bert_batch_24_2x2``, ...); nlp stems are
``<model>_batch_size_<b>_<train|test>``; test stems are anonymous 32-hex. The family (the stem
without batch, precision, topology, mode and hash parts, see :func:`pipelines.data.folds.program_family`) fixes a program's
skeleton; its variants change sizes and add backward passes.

Hidden labels. Next to ``npz_all/`` (never inside it) a world holds ``labels/``: per graph of
every split, test included, ``labels/npz/<collection dir>/<split>/<stem>.npz`` with ``runtime``
(int64, the measured runtimes; for train/valid exactly the file's ``config_runtime``),
``noise_free`` (float64, the cost model's runtime before measurement noise, same units) and, for
tile, ``normalizer`` (int64, measured); and ``labels/labels.json`` (scale, seed, variant and the
cost-model constants of the world). ``pipelines.flows.evaluate`` reads them; the reader never does, and
the real-format files are the same bytes with or without them.

Variants. ``variant`` picks the cost model's constants (:func:`costmodel.variant_params`; 0 is
the original model). The programs, the tile configs and the random-search layout configs of a seed
are the same under every variant; the ``default`` search's configs follow the variant's search mix.

Families. ``family`` (:mod:`pipelines.synth.families`) picks the rules the measured runtimes
follow; the searches keep pricing candidates with the reference model (the compiler's heuristic),
so under one seed every family holds the same programs and configs with other runtimes. A
non-reference family is recorded in ``synth.json`` and ``labels.json`` (the reference's markers
stay as they were). ``recurrent`` adds the recurrent programs (``RNN_FAMILIES``) to the xla
catalogue; it defaults to on for every family but the reference (whose default worlds keep their
bytes), and ``synth --recurrent`` turns it on there too, so that reference worlds hold the same
programs as the other families' worlds of a seed; a non-default choice is recorded in the marker. Each
graph's program kind (cnn, rnn, transformer, mlp) is a pure function of the world's arguments:
:func:`program_kinds` rebuilds it from ``labels.json``, so no label file changed for it.

Determinism. Each file's randomness comes from ``SeedSequence((seed, collection, split, index))``
(programs shared by a source's default and random collections from the source's key), so
``--limit`` and ``--jobs`` never change a file. Files are listed in stem order and ``--limit N``
writes the first N, which are byte-identical to those of an unlimited run.
"""

from __future__ import annotations

import json
import logging
import math
import os
import tempfile
import time
import zipfile
import zlib
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipelines.core.atomic import chmod_like_new_file, write_text_atomic
from pipelines.core.collection import ALL_COLLECTIONS, SPLITS, TILE_XLA, Collection, parse_collections
from pipelines.core.errors import ConfigError, FormatError
from pipelines.core.progress import Progress
from pipelines.synth import costmodel, searches
from pipelines.synth.families import REFERENCE, REGISTRY, CostFamily, family_module, load_family
from pipelines.synth.programs import Family, Variant, build_program, build_tile_kernel
from pipelines.data.root import DataRoot
from pipelines.data.tpugraphs import LayoutGraph, TileGraph, save_graph

SYNTH_VERSION = 1
MARKER = "synth.json"
PARTIAL_MARKER = ".synth-incomplete.json"
LABELS_DIR = "labels"  # the hidden-label sidecar, a sibling of npz_all/
LABELS_MARKER = "labels.json"
LABELS_VERSION = 1
SYNTH_GENERATOR = "pipelines.synth"
RECORDS_GENERATOR = "pipelines.records"  # the label record of a data root `records` wrote (real measurements)
OUTSIDE_VERSION = 1  # the label-record version a world of another generator writes
PROGRAMS_FILE = "programs.json"  # such a world's program kind per graph, next to labels.json
PROGRAM_KINDS = ("cnn", "rnn", "transformer", "mlp")


# ----------------------------------------------------------------------------- scales


@dataclass(frozen=True)
class Scale:
    name: str
    tile_counts: tuple[int, int, int]
    layout_counts: dict[str, tuple[int, int, int]]
    tile_nodes: tuple[int, int]
    tile_configs: tuple[int, int]  # log-uniform range for labelled files
    tile_test_configs: tuple[int, int]
    tile_few_config_tests: int  # test graphs with 2-4 configs
    layout_budget: dict[str, tuple[float, float, int]]  # source -> (median, log-sd, max) forward nodes
    layout_configs: tuple[int, int]  # log-uniform range for labelled layout files
    layout_test_configs: int
    max_config_cells: int  # cap on configs * configurable nodes per file
    extra_config_tests: tuple[str, ...] = ()  # collections whose first test graph gets one more config


SCALES: dict[str, Scale] = {
    "tiny": Scale(
        "tiny", (16, 4, 4),
        {"layout:xla:default": (6, 2, 2), "layout:xla:random": (6, 2, 2),
         "layout:nlp:default": (6, 2, 2), "layout:nlp:random": (6, 2, 2)},
        tile_nodes=(5, 30), tile_configs=(10, 40), tile_test_configs=(5, 12), tile_few_config_tests=1,
        layout_budget={"xla": (20, 0.2, 30), "nlp": (20, 0.2, 30)},
        layout_configs=(30, 100), layout_test_configs=8, max_config_cells=100 * 200),
    "small": Scale(
        "small", (240, 40, 40),
        {"layout:xla:default": (24, 5, 5), "layout:xla:random": (26, 5, 5),
         "layout:nlp:default": (28, 6, 6), "layout:nlp:random": (30, 6, 6)},
        tile_nodes=(5, 60), tile_configs=(10, 300), tile_test_configs=(10, 200), tile_few_config_tests=2,
        layout_budget={"xla": (260, 0.5, 600), "nlp": (150, 0.4, 400)},
        layout_configs=(300, 2000), layout_test_configs=200, max_config_cells=2000 * 60),
    "medium": Scale(
        "medium", (720, 120, 120),
        {"layout:xla:default": (72, 15, 15), "layout:xla:random": (78, 15, 15),
         "layout:nlp:default": (84, 18, 18), "layout:nlp:random": (90, 18, 18)},
        tile_nodes=(5, 70), tile_configs=(10, 400), tile_test_configs=(10, 250), tile_few_config_tests=4,
        layout_budget={"xla": (550, 0.5, 1400), "nlp": (320, 0.4, 900)},
        layout_configs=(300, 2000), layout_test_configs=200, max_config_cells=2000 * 100),
    "full": Scale(
        "full", (5709, 676, 844),
        {"layout:xla:default": (61, 7, 8), "layout:xla:random": (69, 7, 8),
         "layout:nlp:default": (198, 20, 17), "layout:nlp:random": (207, 20, 17)},
        tile_nodes=(5, 80), tile_configs=(2, 10_000), tile_test_configs=(2, 10_000), tile_few_config_tests=16,
        layout_budget={"xla": (7000, 0.7, 16000), "nlp": (3000, 0.6, 12000)},
        layout_configs=(500, 100_040), layout_test_configs=1000, max_config_cells=100_040 * 121,
        extra_config_tests=("layout:xla:random", "layout:nlp:default")),
}


# ----------------------------------------------------------------------------- families and names

# (family, kind, width, stem pattern, extra Family fields)
XLA_FAMILIES: tuple[tuple[str, str, int, str, dict], ...] = (
    ("resnet50", "cnn", 64, "dot", {"layout_style": "feature_minor"}),
    ("resnet_v1_50_official", "cnn", 64, "batch_prec", {}),
    ("resnet_v2_101", "cnn", 64, "batch_mode", {"layout_style": "feature_minor"}),
    ("inception_v3", "cnn", 32, "batch_mode", {}),
    ("efficientnet_b7", "cnn", 32, "batch_mode", {"filler": 3}),
    ("mnasnet_a1", "cnn", 16, "batch_mode", {"filler": 2}),
    ("mobilenet_v2", "cnn", 16, "batch_prec", {}),
    ("retinanet", "cnn", 64, "dot", {"image": 512}),
    ("mask_rcnn", "cnn", 64, "batch_topo", {"image": 512, "layout_style": "feature_minor"}),
    ("shapemask", "cnn", 64, "dot", {"image": 384}),
    ("unet_3d", "cnn", 32, "dot", {"spatial_rank": 3, "image": 64}),
    ("densenet121", "cnn", 32, "batch_prec", {"filler": 2}),
    ("mlperf_bert", "transformer", 1024, "batch_topo", {"heads": 16, "seq": 512}),
    ("bert_pretraining", "transformer", 768, "dot", {"heads": 12, "seq": 128}),
    ("transformer_tf2", "transformer", 512, "batch_mode", {"heads": 8, "seq": 256}),
    ("magenta_music_transformer", "transformer", 256, "batch_mode", {"heads": 4, "seq": 1024}),
    ("trax_lsh_attention", "transformer", 512, "batch_topo", {"heads": 8, "seq": 2048}),
    ("ncf", "mlp", 64, "dot", {}),
    ("dlrm", "mlp", 128, "batch_mode", {"filler": 2}),
    ("brax_es", "mlp", 32, "batch_topo", {}),
)

# Recurrent programs (a while loop over time steps, as an LSTM under lax.scan); only in the worlds
# of a family other than reference (see layout_specs).
RNN_FAMILIES: tuple[tuple[str, str, int, str, dict], ...] = (
    ("lstm_lm", "rnn", 512, "batch_mode", {"seq": 64}),
    ("gnmt_lstm", "rnn", 1024, "batch_topo", {"seq": 48}),
    ("deepspeech2_rnn", "rnn", 256, "batch_prec", {"seq": 128}),
)

_NLP_NAMED = (
    ("bert_en_cased_L-12_H-768_A-12", 12, 768, 12), ("bert_en_uncased_L-12_H-768_A-12", 12, 768, 12),
    ("bert_en_uncased_L-24_H-1024_A-16", 24, 1024, 16), ("bert_multi_cased_L-12_H-768_A-12", 12, 768, 12),
    ("albert_en_base", 12, 768, 12), ("albert_en_large", 24, 1024, 16), ("albert_en_xlarge", 24, 2048, 32),
    ("electra_small", 12, 256, 4), ("electra_base", 12, 768, 12), ("experts_pubmed", 12, 768, 12),
    ("experts_wiki_books", 12, 768, 12), ("talking-heads_base", 12, 768, 12), ("talking-heads_large", 24, 1024, 16),
    ("mobilebert_en_uncased", 24, 512, 4), ("lambert_en_uncased_L-24_H-1024_A-16", 24, 1024, 16),
)
NLP_FAMILIES: tuple[tuple[str, int, int, int], ...] = _NLP_NAMED + tuple(
    (f"small_bert_bert_en_uncased_L-{layers}_H-{hidden}_A-{hidden // 64}", layers, hidden, hidden // 64)
    for layers in (2, 4, 6, 8, 10, 12) for hidden in (128, 256, 512, 768))

TILE_MODELS: tuple[tuple[str, str, int], ...] = (
    ("alexnet", "cnn", 64), ("resnet50", "cnn", 64), ("resnet_v1_50", "cnn", 64), ("inception_v3", "cnn", 32),
    ("inception_v4", "cnn", 32), ("vgg16", "cnn", 64), ("vgg19", "cnn", 64), ("mobilenet_v1", "cnn", 16),
    ("mobilenet_v2", "cnn", 16), ("efficientnet_b0", "cnn", 16), ("densenet121", "cnn", 32),
    ("unet", "cnn", 32), ("ssd_resnet34", "cnn", 64), ("yolov3", "cnn", 32), ("mask_rcnn", "cnn", 64),
    ("deeplab_v3", "cnn", 64), ("wavenet", "cnn", 32), ("bert", "transformer", 128),
    ("albert", "transformer", 128), ("transformer", "transformer", 128), ("gpt2", "transformer", 128),
    ("t5_small", "transformer", 64), ("ncf", "mlp", 64), ("dlrm", "mlp", 64),
)
_TILE_KINDS = {"cnn": ("conv", "conv", "conv", "reduce", "eltwise", "eltwise", "dot"),
               "transformer": ("dot", "dot", "dot", "reduce", "reduce", "eltwise", "eltwise"),
               "mlp": ("dot", "dot", "eltwise", "reduce")}
_PRECISION = {"fp16": "f16", "fp32": "f32", "bf16": "bf16"}
_TOPOLOGIES = ("2x2", "4x4", "8x8")


def _variants(pattern: str) -> list[tuple[str, Variant]]:
    """Every (stem suffix, variant) of a stem pattern."""
    out: list[tuple[str, Variant]] = []
    batches = (8, 16, 32, 64, 128, 256)
    if pattern == "dot":
        for topo in _TOPOLOGIES:
            for prec, etype in _PRECISION.items():
                chips = math.prod(int(t) for t in topo.split("x"))
                out.append((f".{topo}.{prec}", Variant(256, etype, True, chips)))
    elif pattern == "batch_mode":
        for b in batches:
            for mode in ("train", "eval"):
                out.append((f"_batch_{b}_{mode}", Variant(b, "bf16", mode == "train")))
    elif pattern == "batch_prec":
        for b in batches:
            for prec, etype in _PRECISION.items():
                out.append((f"_batch_{b}_{prec}", Variant(b, etype, True)))
    elif pattern == "batch_topo":
        for b in (8, 12, 16, 24, 32, 48):
            for topo in _TOPOLOGIES:
                chips = math.prod(int(t) for t in topo.split("x"))
                out.append((f"_batch_{b}_{topo}", Variant(b * chips, "bf16", True, chips)))
    elif pattern == "nlp":
        for b in (16, 32, 64, 128):
            for mode in ("train", "test"):
                train = mode == "train"
                out.append((f"_batch_size_{b}_{mode}", Variant(b, "f32" if train else "bf16", train)))
    else:
        raise ValueError(f"unknown stem pattern {pattern!r}")
    return out


def _hex(rng: np.random.Generator, digits: int) -> str:
    return "".join(f"{int(x):x}" for x in rng.integers(0, 16, size=digits))


# ----------------------------------------------------------------------------- specs (what each file holds)


@dataclass(frozen=True)
class FileSpec:
    """One file to write; everything needed to generate it (picklable for worker processes)."""

    collection: str
    split: str
    stem: str
    index: int  # pool index: the file's (and its program's) RNG key
    family: Family
    variant: Variant
    kind: str = ""  # tile kernel kind
    nodes: int = 0  # tile kernel node target
    num_configs: int = 0  # tile and test files: fixed count; 0: drawn per file


def _seq(seed: int, *keys: str | int) -> np.random.SeedSequence:
    return np.random.SeedSequence([seed, *(zlib.crc32(k.encode()) if isinstance(k, str) else k for k in keys)])


def _rng(seed: int, *keys: str | int) -> np.random.Generator:
    return np.random.default_rng(_seq(seed, *keys))


def _loguniform(rng: np.random.Generator, low: int, high: int) -> int:
    return int(round(math.exp(rng.uniform(math.log(low), math.log(high)))))


def _layout_family(scale: Scale, seed: int, source: str, name: str, kind: str, width: int, extra: dict,
                   layers: int = 0, heads: int = 4) -> Family:
    """Family constants (node budget, filler, layout style) from the family's own RNG key."""
    rng = _rng(seed, scale.name, "family", source, name)
    median, sd, cap = scale.layout_budget[source]
    budget = int(min(cap, max(8, median * math.exp(sd * rng.standard_normal()))))
    fields = {"filler": int(rng.integers(1, 4)), "layout_style": str(rng.choice(["default", "feature_minor"])),
              "heads": heads}
    fields.update(extra)
    if kind == "transformer" and layers:  # a fixed depth: grow the per-layer elementwise work instead
        fields["filler"] = int(np.clip(round((budget / layers - 90) / 4), 1, 100))
    return Family(name, kind, budget, width, layers=layers, **fields)


def _choose_variants(rng: np.random.Generator, catalog: list[tuple[Family, list[tuple[str, Variant]]]],
                     total: int) -> list[tuple[Family, str, Variant]]:
    """``total`` distinct (family, stem, variant), several variants per family, in random order."""
    order = rng.permutation(len(catalog))
    families = max(2, min(len(catalog), -(-total // 4)))
    chosen = [catalog[i] for i in order[:families]]
    pools = [(fam, [variants[j] for j in rng.permutation(len(variants))]) for fam, variants in chosen]
    picked: list[tuple[Family, str, Variant]] = []
    depth = 0
    while len(picked) < total:
        progress = False
        for fam, variants in pools:
            if depth < len(variants) and len(picked) < total:
                suffix, variant = variants[depth]
                picked.append((fam, fam.name + suffix, variant))
                progress = True
        if not progress:
            raise ConfigError(f"not enough distinct layout variants for {total} graphs")
        depth += 1
    return [picked[i] for i in rng.permutation(len(picked))]


def layout_specs(scale: Scale, seed: int, collection: Collection,
                 recurrent: bool = False) -> dict[str, list[FileSpec]]:
    """Files of one layout collection per split, sorted by stem (the order ``--limit`` keeps).

    ``recurrent`` adds the recurrent program families (``RNN_FAMILIES``) to the xla catalogue; the
    reference family's worlds leave them out, so their files stay those written before they existed."""
    source = collection.source
    searches_of_source = [c for c in ALL_COLLECTIONS if c.is_layout and c.source == source]
    sizes = [max(scale.layout_counts[c.name][s] for c in searches_of_source) for s in range(3)]
    rng = _rng(seed, scale.name, "pool", source)
    if source == "xla":
        catalog = [(_layout_family(scale, seed, source, name, kind, width, extra), _variants(pattern))
                   for name, kind, width, pattern, extra in XLA_FAMILIES + (RNN_FAMILIES if recurrent else ())]
    else:
        catalog = [(_layout_family(scale, seed, source, name, "transformer", hidden, {"heads": heads},
                                   layers=layers), _variants("nlp"))
                   for name, layers, hidden, heads in NLP_FAMILIES]
    chosen = _choose_variants(rng, catalog, sum(sizes))
    test_stems = [_hex(rng, 32) for _ in range(sizes[2])]
    own = scale.layout_counts[collection.name]
    out: dict[str, list[FileSpec]] = {}
    start = 0
    for s, split in enumerate(SPLITS):
        specs = []
        for index in range(own[s]):  # a search's files are the first ones of the source's pool
            family, stem, variant = chosen[start + index]
            num = 0
            if split == "test":
                stem = test_stems[index]
                extra = 1 if collection.name in scale.extra_config_tests and index == 0 else 0
                num = scale.layout_test_configs + extra
            specs.append(FileSpec(collection.name, split, stem, index, family, variant, num_configs=num))
        out[split] = sorted(specs, key=lambda spec: spec.stem)
        start += sizes[s]
    return out


def tile_specs(scale: Scale, seed: int) -> dict[str, list[FileSpec]]:
    """Tile kernel files per split, sorted by stem."""
    rng = _rng(seed, scale.name, "pool", "tile")
    units = [(Family(name, kind, 0, width), f"_{mode}_batch_{b}", Variant(b, str(rng.choice(["bf16", "f32"]))))
             for name, kind, width in TILE_MODELS for mode in ("train", "inference") for b in (1, 8, 16, 32, 64, 128)]
    total = sum(scale.tile_counts)
    seen: set[str] = set()
    specs: list[tuple[Family, str, Variant, str, int]] = []
    while len(specs) < total:
        family, suffix, variant = units[rng.integers(len(units))]
        stem = f"{family.name}{suffix}_{'-' if rng.random() < 0.5 else ''}{_hex(rng, 16)}"
        if stem in seen:
            continue
        seen.add(stem)
        kind = str(rng.choice(_TILE_KINDS[family.kind]))
        specs.append((family, stem, variant, kind, int(rng.integers(scale.tile_nodes[0], scale.tile_nodes[1] + 1))))
    out: dict[str, list[FileSpec]] = {}
    start = 0
    for s, split in enumerate(SPLITS):
        files = []
        count = scale.tile_counts[s]
        for index in range(count):
            family, stem, variant, kind, nodes = specs[start + index]
            if split == "test":
                stem = _hex(rng, 32)
                low, high = scale.tile_test_configs
                num = int(rng.integers(2, 5)) if index < scale.tile_few_config_tests else _loguniform(rng, low, high)
            else:
                num = _loguniform(rng, *scale.tile_configs)
            files.append(FileSpec(TILE_XLA.name, split, stem, index, family, variant, kind, nodes, num))
        out[split] = sorted(files, key=lambda spec: spec.stem)
        start += count
    return out


# ----------------------------------------------------------------------------- generating one file


@dataclass(frozen=True)
class Labels:
    """The hidden labels of one graph (see the module docstring, "Hidden labels")."""

    runtime: np.ndarray  # int64 (c,) measured
    noise_free: np.ndarray  # float64 (c,) before measurement noise, same units
    normalizer: np.ndarray | None = None  # int64 (c,) tile only

    def arrays(self) -> dict[str, np.ndarray]:
        out = {"runtime": self.runtime, "noise_free": self.noise_free}
        if self.normalizer is not None:
            out["normalizer"] = self.normalizer
        return out


def make_tile_graph(spec: FileSpec, seed: int, params: costmodel.CostParams = costmodel.DEFAULT_PARAMS,
                    family: CostFamily | None = None) -> tuple[TileGraph, Labels]:
    """The tile graph of ``spec`` and its labels (pure: no I/O). Test files hold no runtimes.

    ``family`` prices the configs (default: the reference family under ``params``)."""
    family = family if family is not None else CostFamily(REFERENCE, family_module(REFERENCE), params)
    rng = _rng(seed, spec.collection, spec.split, spec.index)
    program, kernel = build_tile_kernel(spec.family, spec.variant, spec.kind, spec.nodes, rng)
    minimum = 1 if spec.num_configs < 5 else 5
    config_feat = searches.tile_configs(kernel, max(spec.num_configs, minimum), rng)
    c = config_feat.shape[0]
    costs = family.tile_runtimes(kernel, config_feat)
    sigma = rng.uniform(*family.noise_range("tile"))
    runtime = costmodel.noisy(costs, costmodel.TILE_REPEATS, sigma, rng)
    normalizer = costmodel.noisy(np.full(c, np.median(costs)), costmodel.TILE_REPEATS, 0.01, rng)
    labels = Labels(runtime, costs * costmodel.TILE_REPEATS, normalizer)
    if spec.split == "test":  # measured after everything the file holds was drawn: the file is unchanged
        runtime, normalizer = np.zeros(c, np.int64), np.ones(c, np.int64)
    graph = TileGraph(spec.stem, program.node_feat, program.node_opcode, program.edge_index, config_feat,
                      runtime, normalizer)
    return graph, labels


def make_layout_graph(spec: FileSpec, seed: int, scale: Scale, params: costmodel.CostParams = costmodel.DEFAULT_PARAMS,
                      family: CostFamily | None = None) -> tuple[LayoutGraph, Labels]:
    """The layout graph of ``spec`` and its labels (pure: no I/O). Its program is shared by both searches.

    The searches price candidates with the reference model under ``params`` (the compiler's own
    heuristic); ``family`` (default: the reference) gives the measured runtimes."""
    collection = parse_collections(spec.collection)[0]
    program = build_program(spec.family, spec.variant, _rng(seed, "layout", collection.source, spec.split, spec.index))
    model = costmodel.layout_cost_model(program, params)
    rng = _rng(seed, spec.collection, spec.split, spec.index)
    count = spec.num_configs  # fixed for test files
    if not count:
        cap = scale.max_config_cells // max(model.num_configurable, 1)
        low, high = scale.layout_configs
        # drawn past the maximum and clipped, so some files hold exactly the maximum (as in the real data)
        count = max(2, min(_loguniform(rng, low, int(high * 1.5)), high, cap))
    if collection.search == "random":
        configs = searches.random_search(model, count, rng)
        search = "random"
    else:
        duplicate_share = float(rng.choice(list(params.duplicate_shares)))
        configs = searches.default_search(model, count, rng, duplicate_share, float(rng.uniform(*params.mutations)))
        search = "default"
    if family is None or family.name == REFERENCE:  # priced by the searches' own model, under ``params``
        noise = params.random_noise if search == "random" else params.default_noise
        measured, noise_free = measure_layout(model, configs, rng, noise, params.remeasured_duplicates)
    else:
        measured, noise_free = measure_layout(model, configs, rng, family.noise_range(search),
                                              params.remeasured_duplicates,
                                              runtimes=lambda blocks: family.layout_runtimes(program, blocks))
    # test files: measured after everything the file holds was drawn, so the file is unchanged
    runtime = np.zeros(count, dtype=np.int64) if spec.split == "test" else measured
    graph = LayoutGraph(spec.stem, program.node_feat, program.node_opcode, program.edge_index, program.config_ids,
                        configs, runtime, program.node_splits)
    return graph, Labels(measured, noise_free)


def measure_layout(model: costmodel.LayoutCostModel, configs: np.ndarray, rng: np.random.Generator,
                   noise: tuple[float, float], remeasured: float,
                   runtimes: Callable[[np.ndarray], np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Measured (int64) and noise-free (float64) runtimes of configs, both over the benchmark loop.

    Duplicates share a measurement, except a ``remeasured`` share that was measured again; the
    noise width is drawn per file from ``noise``. ``runtimes`` (distinct config rows -> noise-free
    ns) is a family's pricing; by default ``model``'s own (the reference).
    """
    hashes = searches.row_hashes(configs)
    _, first, inverse = np.unique(hashes, return_index=True, return_inverse=True)
    if runtimes is not None:
        costs = np.asarray(runtimes(configs[first]), dtype=np.float64)
    else:
        costs = np.empty(first.shape[0], dtype=np.float64)
        rows = max(1, 1_000_000 // max(model.num_configurable, 1))
        for start in range(0, first.shape[0], rows):
            costs[start:start + rows] = costmodel.layout_costs(model, configs[first[start:start + rows]])
    sigma = rng.uniform(*noise)
    runtime = costmodel.noisy(costs, costmodel.LAYOUT_REPEATS, sigma, rng)[inverse]
    duplicate = np.arange(len(configs)) != first[inverse]
    repeated = np.flatnonzero(duplicate & (rng.random(len(configs)) < remeasured))
    runtime[repeated] = costmodel.noisy(costs[inverse[repeated]], costmodel.LAYOUT_REPEATS, sigma, rng)
    return runtime, costs[inverse] * costmodel.LAYOUT_REPEATS


def _write_file(out: str, scale_name: str, seed: int, variant: int, spec: FileSpec,
                family_name: str = REFERENCE) -> tuple[str, str, int, int, int]:
    """Generate one graph, write its file (unless present) and its labels; returns
    (collection, split, nodes, configurable, configs)."""
    collection = parse_collections(spec.collection)[0]
    path = DataRoot(out).new_split_dir(collection, spec.split) / f"{spec.stem}.npz"
    params = costmodel.variant_params(variant)
    family = load_family(family_name, variant)
    if collection.is_tile:
        graph, labels = make_tile_graph(spec, seed, params, family)
        nc = 0
    else:
        graph, labels = make_layout_graph(spec, seed, SCALES[scale_name], params, family)
        nc = int(graph.node_config_ids.shape[0])
    if not path.is_file():
        save_graph(path, graph)
    write_labels(label_path(Path(out), collection, spec.split, spec.stem), labels)
    return spec.collection, spec.split, graph.num_nodes, nc, graph.num_configs


# ----------------------------------------------------------------------------- the label sidecar


def label_path(root: Path, collection: Collection, split: str, stem: str) -> Path:
    """Where the hidden labels of one graph live (outside ``npz_all/``)."""
    return root.joinpath(LABELS_DIR, "npz", *collection.relative_dir.parts, split, f"{stem}.npz")


def write_labels(path: Path, labels: Labels) -> None:
    """Write one graph's labels atomically (a temporary file renamed into place)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=".npz", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            np.savez(handle, **labels.arrays())
        chmod_like_new_file(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def labels_marker(root: Path | str) -> dict | None:
    """The sidecar's ``labels.json`` of a world root, or None when the root has no (complete) sidecar."""
    return _read_json(Path(root) / LABELS_DIR / LABELS_MARKER)


def read_labels_marker(root: Path | str) -> dict | None:
    """The sidecar's ``labels.json`` for a reader that trusts its fields (``evaluate``,
    :func:`program_kinds`): None when absent, a FormatError naming it when it is unreadable or not a
    record ``synth`` writes (another type, an unknown scale, collection or family, a bad seed).

    A world of another generator (``generator`` other than ``pipelines.synth``: the lowered worlds, an
    outside author's) holds ``generator``, ``version`` 1, ``seed``, ``scale`` (its own word) and
    ``collections``; its programs are in ``labels/programs.json`` (:func:`read_program_record`)."""
    path = Path(root) / LABELS_DIR / LABELS_MARKER
    if not path.exists() and not path.is_symlink():
        return None
    try:
        marker = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise FormatError(path, f"unreadable label record ({type(exc).__name__}: {exc})") from None
    if is_outside_world(marker):
        problem = _outside_marker_problem(marker)
        if problem is not None:
            raise FormatError(path, f"not a label record of a world generator ({problem})")
        return marker
    problem = _marker_problem(marker)
    if problem is not None:
        raise FormatError(path, f"not a label record written by `synth` ({problem})")
    return marker


def is_outside_world(marker: object) -> bool:
    """Whether a label record comes from a world generator other than ``synth`` (its programs are then
    listed in ``labels/programs.json`` rather than rebuilt from the record); ``records``' data roots of
    real measurements are no such world."""
    return isinstance(marker, dict) and marker.get("generator", SYNTH_GENERATOR) not in (SYNTH_GENERATOR,
                                                                                         RECORDS_GENERATOR)


def _outside_marker_problem(marker: dict) -> str | None:
    generator, version, seed, scale = (marker.get(k) for k in ("generator", "version", "seed", "scale"))
    if not isinstance(generator, str) or not generator.strip():
        return f"generator {generator!r} is not a name"
    if version != OUTSIDE_VERSION or isinstance(version, bool):
        return f"version {version!r} is not {OUTSIDE_VERSION}"
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        return f"seed {seed!r} is not an integer >= 0"
    if not isinstance(scale, str) or not scale:
        return f"scale {scale!r} is not a word"
    if (problem := _collections_problem(marker.get("collections"))) is not None:
        return problem
    return None


@dataclass(frozen=True)
class ProgramLabel:
    """A graph's program as a world generator other than ``synth`` records it (``labels/programs.json``)."""

    name: str  # the architecture
    kind: str  # one of PROGRAM_KINDS


def read_program_record(root: Path | str, marker: dict) -> dict[tuple[str, str], ProgramLabel]:
    """(collection, stem) -> program of every graph ``labels/programs.json`` lists:
    ``{"<collection>": {"<stem>": {"kind": "cnn|rnn|transformer|mlp", "program": "<architecture>"}}}``.
    A missing or malformed record is a FormatError naming it; collections outside the label record's are
    refused."""
    path = Path(root) / LABELS_DIR / PROGRAMS_FILE
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FormatError(path, "missing: a world of another generator lists each graph's program kind here") from None
    except (OSError, ValueError) as exc:
        raise FormatError(path, f"unreadable program record ({type(exc).__name__}: {exc})") from None
    if not isinstance(record, dict):
        raise FormatError(path, f"expected a JSON object of collections, got {type(record).__name__}")
    allowed = set(marker["collections"])
    out: dict[tuple[str, str], ProgramLabel] = {}
    for collection, graphs in record.items():
        if collection not in allowed:
            raise FormatError(path, f"collection {collection!r} is not one of the world's "
                                    f"({', '.join(sorted(allowed))})")
        if not isinstance(graphs, dict):
            raise FormatError(path, f"{collection}: expected an object of graph stems, got {type(graphs).__name__}")
        for stem, entry in graphs.items():
            kind = entry.get("kind") if isinstance(entry, dict) else None
            name = entry.get("program") if isinstance(entry, dict) else None
            if kind not in PROGRAM_KINDS:
                raise FormatError(path, f"{collection} {stem}: kind {kind!r} is not one of {', '.join(PROGRAM_KINDS)}")
            if not isinstance(name, str) or not name:
                raise FormatError(path, f"{collection} {stem}: program {name!r} is not a name")
            out[(collection, stem)] = ProgramLabel(name, kind)
    return out


def _collections_problem(names: object) -> str | None:
    """Why a label record's ``collections`` is not a list of collection names, or None."""
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        return f"collections {names!r} is not a list of collection names"
    try:
        parse_collections(names)
    except ConfigError as exc:
        return f"collections: {exc}"
    return None


def _marker_problem(marker: object) -> str | None:
    def whole(value: object, low: int, high: int) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and low <= value < high

    if not isinstance(marker, dict):
        return f"expected a JSON object, got {type(marker).__name__}"
    if marker.get("generator") == RECORDS_GENERATOR:  # measured labels of tuning records (pipelines.flows.records)
        names = marker.get("collections")
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            return f"collections {names!r} is not a list of collection names"
        try:
            parse_collections(names) if names else None
        except ConfigError as exc:
            return f"collections: {exc}"
        return None
    if marker.get("scale") not in SCALES:
        return f"scale {marker.get('scale')!r} is not one of {', '.join(SCALES)}"
    if not whole(marker.get("seed"), 0, 2**32):
        return f"seed {marker.get('seed')!r} is not an integer in [0, 2^32)"
    if (problem := _collections_problem(marker.get("collections"))) is not None:
        return problem
    if marker.get("limit") is not None and not whole(marker.get("limit"), 1, 2**63):
        return f"limit {marker.get('limit')!r} is not a positive integer or null"
    if not whole(marker.get("variant", 0), 0, 2**31):
        return f"variant {marker.get('variant')!r} is not an integer >= 0"
    if marker.get("family", REFERENCE) not in REGISTRY:
        return f"family {marker.get('family')!r} is not one of {', '.join(REGISTRY)}"
    if marker.get("recurrent") not in (None, True, False):
        return f"recurrent {marker.get('recurrent')!r} is not true, false or null"
    return None


def read_labels(root: Path | str, collection: Collection, split: str, stem: str) -> Labels:
    """The hidden labels of one graph; a missing or malformed file raises FormatError naming it."""
    path = label_path(Path(root), collection, split, stem)
    try:
        with np.load(path, allow_pickle=False) as archive:
            arrays = {name: archive[name] for name in archive.files}
    except FileNotFoundError:
        raise FormatError(path, "no hidden labels for this graph (sidecar incomplete?)") from None
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise FormatError(path, f"unreadable label file ({exc})") from None
    runtime, noise_free = arrays.get("runtime"), arrays.get("noise_free")
    if runtime is None or noise_free is None or runtime.ndim != 1 or runtime.shape != noise_free.shape:
        raise FormatError(path, "expected 1-D arrays 'runtime' and 'noise_free' of one length")
    normalizer = arrays.get("normalizer")
    if collection.is_tile and (normalizer is None or normalizer.shape != runtime.shape):
        raise FormatError(path, "a tile label file needs 'normalizer' of the runtimes' length")
    # What the metric divides and ranks by: a string, boolean, complex, NaN or non-positive label
    # would be scored as something else (or crash the metric) rather than refused.
    for name, array, kinds in (("runtime", runtime, "iu"), ("normalizer", normalizer, "iu"),
                               ("noise_free", noise_free, "iuf")):
        if array is None:
            continue
        if array.dtype.kind not in kinds:
            wanted = "integers" if kinds == "iu" else "real numbers"
            raise FormatError(path, f"'{name}' holds {array.dtype} values, expected {wanted}")
        if not np.isfinite(array).all():
            raise FormatError(path, f"'{name}' holds NaN or infinite values")
        if name != "noise_free" and (array <= 0).any():
            raise FormatError(path, f"'{name}' holds {int((array <= 0).sum())} value(s) <= 0 (hidden labels are measured "
                                    "runtimes and their normalisers: positive)")
        if array.dtype.kind in "iu" and array.max(initial=0) > np.iinfo(np.int64).max:
            raise FormatError(path, f"'{name}' holds values beyond int64")
    return Labels(runtime.astype(np.int64), noise_free.astype(np.float64),
                  None if normalizer is None else normalizer.astype(np.int64))


# ----------------------------------------------------------------------------- the world


def world_specs(scale: Scale, seed: int, collections: tuple[Collection, ...],
                limit: int | None, recurrent: bool = False) -> list[FileSpec]:
    """Every file of the world, collection by collection, split by split, in stem order."""
    files: list[FileSpec] = []
    for collection in collections:
        by_split = (tile_specs(scale, seed) if collection.is_tile
                    else layout_specs(scale, seed, collection, recurrent=recurrent))
        for split in SPLITS:
            files.extend(by_split[split][:limit])
    return files


def program_families(root: Path | str) -> dict[tuple[str, str], Family | ProgramLabel]:
    """(collection, stem) -> the program architecture every file of a world was built from, rebuilt
    from its label record (a pure function of the world's arguments, so the files and labels stay the
    bytes they were before it was asked for); for a world of another generator, as its
    ``labels/programs.json`` lists them (:func:`read_program_record`). Either has ``name`` and ``kind``."""
    marker = read_labels_marker(root)
    if marker is None:
        raise FormatError(Path(root) / LABELS_DIR / LABELS_MARKER, "no label record: not a synthetic world")
    if marker.get("generator") == RECORDS_GENERATOR:
        return {}  # a data root of tuning records: its programs are no synthetic family
    if is_outside_world(marker):
        return read_program_record(root, marker)
    chosen = parse_collections(marker["collections"])
    specs = world_specs(SCALES[marker["scale"]], int(marker["seed"]), chosen, marker.get("limit"),
                        _recurrent(marker.get("family", REFERENCE), marker.get("recurrent")))
    return {(spec.collection, spec.stem): spec.family for spec in specs}


def program_kinds(root: Path | str) -> dict[tuple[str, str], str]:
    """(collection, stem) -> program family kind (``cnn``, ``rnn``, ``transformer``, ``mlp``) of every
    file of a world (:func:`program_families`)."""
    return {key: family.kind for key, family in program_families(root).items()}


def _recurrent(family: str, recurrent: bool | None) -> bool:
    """Whether a world holds the recurrent programs: by default every family's but the reference's."""
    return family != REFERENCE if recurrent is None else bool(recurrent)


def _marker(scale: str, seed: int, limit: int | None, collections: tuple[Collection, ...], variant: int = 0,
            family: str = REFERENCE, recurrent: bool | None = None) -> dict:
    marker = {"generator": SYNTH_GENERATOR, "version": SYNTH_VERSION, "scale": scale, "seed": seed,
              "limit": limit, "collections": [c.name for c in collections]}
    if variant:  # variant 0 keeps the marker worlds had before variants existed
        marker["variant"] = variant
    if family != REFERENCE:  # likewise the reference family
        marker["family"] = family
    if recurrent is not None and recurrent != _recurrent(family, None):  # only a non-default choice
        marker["recurrent"] = recurrent
    return marker


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def submission_rows(out: Path, specs: list[FileSpec]) -> list[str]:
    """Sample-submission rows for the test files: tile ``0;1;2;3;4`` (fewer if c<5), layout identity."""
    rows = []
    for spec in specs:
        if spec.split != "test":
            continue
        collection = parse_collections(spec.collection)[0]
        path = DataRoot(out).new_split_dir(collection, "test") / f"{spec.stem}.npz"
        with np.load(path) as archive:
            count = int(archive["config_runtime"].shape[0])
        top = range(min(5, count)) if collection.is_tile else range(count)
        rows.append(f"{collection.submission_id(spec.stem)},{';'.join(map(str, top))}")
    return rows


logger = logging.getLogger(__name__)
PROGRESS_EVERY_S = 10.0  # at most one progress line this often while files are written


def generate_world(out: Path | str, *, scale: str, seed: int, limit: int | None = None,
                   collections: str | list[str] | None = None, jobs: int = 1, variant: int = 0,
                   family: str = REFERENCE, recurrent: bool | None = None) -> str:
    """Write a synthetic world and its hidden-label sidecar under ``out``; returns a printable summary.

    Refuses a non-empty ``out`` unless it is (part of) a world of the same arguments: a complete
    one is left alone, an interrupted one is completed (a world written before the sidecar existed
    gets its labels; its files are left as they are).
    """
    if scale not in SCALES:
        raise ConfigError(f"unknown scale {scale!r}; expected one of {', '.join(SCALES)}")
    if variant < 0:
        raise ConfigError(f"--variant must be 0 or more, got {variant}")
    if limit is not None and limit < 1:
        raise ConfigError(f"--limit must be at least 1, got {limit}")
    if jobs < 1:
        raise ConfigError(f"--jobs must be at least 1, got {jobs}")
    load_family(family, variant)  # an unknown family, or a registered one whose module is missing, fails here
    chosen = parse_collections(collections)
    chosen = tuple(c for c in ALL_COLLECTIONS if c in chosen)  # canonical order
    out = Path(out)
    marker = _marker(scale, seed, limit, chosen, variant, family, recurrent)
    specs = world_specs(SCALES[scale], seed, chosen, limit, _recurrent(family, recurrent))
    submission = DataRoot(out).sample_submission
    paths = [DataRoot(out).new_split_dir(parse_collections(s.collection)[0], s.split) / f"{s.stem}.npz" for s in specs]
    labels = [label_path(out, parse_collections(s.collection)[0], s.split, s.stem) for s in specs]
    sidecar = {**marker, "labels_version": LABELS_VERSION, "variant": variant,
               "cost_params": costmodel.params_dict(costmodel.variant_params(variant)),
               "layout": f"{LABELS_DIR}/npz/<collection dir>/<split>/<stem>.npz",
               "arrays": {"runtime": "int64 measured runtimes (train/valid: the file's config_runtime)",
                          "noise_free": "float64 runtimes before measurement noise, same units",
                          "normalizer": "int64 measured normalizers (tile only)"}}
    if family != REFERENCE:  # the reference's sidecar stays as it was
        sidecar["cost_params_role"] = (f"constants of the reference model the searches priced candidates with; the "
                                       f"runtimes follow family {family!r} (rules: {REGISTRY[family]})")

    if out.exists() and not out.is_dir():
        raise ConfigError(f"{out}: exists and is not a directory")
    if out.is_dir() and any(out.iterdir()):
        done, partial = _read_json(out / MARKER), _read_json(out / PARTIAL_MARKER)
        if (done == marker and submission.is_file() and labels_marker(out) == sidecar
                and all(p.is_file() for p in paths + labels)):
            return f"{out}: synthetic world (scale={scale}, seed={seed}) is already complete; nothing written"
        if marker not in (done, partial):
            found = done or partial
            why = f"its {MARKER} was written with other arguments ({found})" if found else "it is not a synth world"
            raise ConfigError(f"{out}: refusing to write into a non-empty directory: {why}")
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / PARTIAL_MARKER, json.dumps(marker, indent=2))
    (out / MARKER).unlink(missing_ok=True)  # only the partial marker may exist while writing

    started = time.perf_counter()
    (out / LABELS_DIR / LABELS_MARKER).unlink(missing_ok=True)  # present only while the sidecar is complete
    todo = [s for s, p, q in zip(specs, paths, labels) if not (p.is_file() and q.is_file())]
    for collection in chosen:
        for split in SPLITS:
            DataRoot(out).new_split_dir(collection, split).mkdir(parents=True, exist_ok=True)
    logger.info(f"synth: writing {len(todo)} of {len(specs)} files under {out} ({scale}, seed {seed}, "
                f"variant {variant}, {jobs} job(s))")
    progress = Progress("synth", len(todo), every_s=PROGRESS_EVERY_S)  # i/N files, rate, ETA
    results = []
    if jobs == 1:
        for spec in todo:
            results.append(_write_file(str(out), scale, seed, variant, spec, family))
            progress.step()
    else:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            n = len(todo)
            for result in pool.map(_write_file, [str(out)] * n, [scale] * n, [seed] * n, [variant] * n,
                                   todo, [family] * n, chunksize=1):
                results.append(result)
                progress.step()
    header = "ID,TopConfigs"
    write_text_atomic(submission, "\n".join([header, *submission_rows(out, specs)]) + "\n")
    (out / LABELS_DIR).mkdir(exist_ok=True)
    write_text_atomic(out / LABELS_DIR / LABELS_MARKER, json.dumps(sidecar, indent=2))
    write_text_atomic(out / MARKER, json.dumps(marker, indent=2))
    (out / PARTIAL_MARKER).unlink(missing_ok=True)
    return _summary(out, marker, specs, results, len(specs) - len(todo), time.perf_counter() - started)


def _summary(out: Path, marker: dict, specs: list[FileSpec], results: list[tuple[str, str, int, int, int]],
             skipped: int, seconds: float) -> str:
    lines = [f"synthetic world at {out} (scale={marker['scale']}, seed={marker['seed']}, "
             f"variant={marker.get('variant', 0)}, family={marker.get('family', 'reference')}, "
             f"limit={marker['limit']}): "
             f"{len(specs)} files, {len(results)} written, {skipped} already present, {seconds:.1f} s"]
    groups: dict[tuple[str, str], list[tuple[int, int, int]]] = {}
    for collection, split, n, nc, c in results:
        groups.setdefault((collection, split), []).append((n, nc, c))
    for (collection, split), rows in groups.items():
        n, nc, c = (np.array(col) for col in zip(*rows))
        detail = f"nodes {n.min()}-{n.max()}, configs {c.min()}-{c.max()}"
        if nc.any():
            detail += f", configurable {nc.min()}-{nc.max()}"
        lines.append(f"  {collection:20s} {split:5s} {len(rows):5d} files: {detail}")
    return "\n".join(lines)

