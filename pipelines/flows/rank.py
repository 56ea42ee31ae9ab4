"""``rank --run RUN_ID PROGRAM``: rank candidate configurations of a user's own program with a run's saved models.

The program (an HLO file, see :mod:`pipelines.hlo`) is featurized; a data root is built under the
output folder with it as a test graph of ``layout:<source>:random`` (K random-search candidates) and
``layout:<source>:default`` (K default-search candidates), and, where the module has fusions, one
``tile:xla`` test graph per fused computation (its candidate tile sizes). Each collection that the
run has models for is then prepared and scored exactly as ``predict`` does (the run's preparation
config, every saved fold model, the run's normalisation and blend weights); nothing is trained.

The result is written as ``rank.json`` and ``rank.txt`` and printed in the program's terms: per
configurable node its HLO name, shape and the layouts of the best-ranked config, then the top
configs with their blended score (0 = predicted fastest of the candidates, 1 = slowest; a model's
relative estimate, not a time), and the same for each fusion's tiles.

HLO lowered for the CPU or GPU is not the TPU compiler's graph before layout assignment; see
docs/hlo.md for what carries over.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from pipelines.core.atomic import write_text_atomic
from pipelines.core.collection import TILE_XLA, Collection, parse_collection
from pipelines.core.errors import PipelineError
from pipelines.core.paths import SUBMISSIONS_DIR
from pipelines.data.root import DataRoot

logger = logging.getLogger(__name__)

BUILT_MARKER = ".built-by-rank"  # in a data root rank made (and may therefore delete and rebuild)

@dataclass
class BuiltRoot:
    root: Path
    stem: str
    layout_configs: dict[str, np.ndarray]  # collection name -> int8 (c, nc, 18)
    tile_stems: dict[str, Any]  # tile stem -> TilePart


def build_data_root(featurized: Any, stem: str, root: Path | str, *, configs: int, seed: int = 0,
                    sources: tuple[str, ...] = ("xla",)) -> BuiltRoot:
    """Write ``featurized`` as test graphs of a fresh data root (``root/npz/...``, the Kaggle layout)."""
    from pipelines.hlo import checked_config_count, safe_stem
    from pipelines.hlo.configs import layout_configs
    from pipelines.data.tpugraphs import save_graph

    root = DataRoot(root)
    layout: dict[str, np.ndarray] = {}
    nc = int(featurized.config_ids.shape[0])
    if nc:
        space = featurized.layout_space()
        count = checked_config_count(configs, nc, featurized.module.source)
        for source in sources:
            for search in ("random", "default"):
                collection = parse_collection(f"layout:{source}:{search}")
                blocks = layout_configs(space, count, search, seed)
                save_graph(root.new_split_dir(collection, "test", kaggle=False) / f"{stem}.npz",
                           featurized.layout_graph(stem, blocks))
                layout[collection.name] = blocks
    tiles: dict[str, Any] = {}
    for part in featurized.tiles:
        tile_stem = f"{stem}-{safe_stem(part.fusion)}"
        save_graph(root.new_split_dir(TILE_XLA, "test", kaggle=False) / f"{tile_stem}.npz",
                   featurized.tile_graph(tile_stem, part))
        tiles[tile_stem] = part
    write_sample_submission(root)
    return BuiltRoot(root.path, stem, layout, tiles)


def write_sample_submission(root: DataRoot) -> Path:
    """``root/sample_submission.csv`` listing every test graph of the root (the list of test IDs that
    ``predict`` validates a submission against), each with its first configs in index order."""
    from pipelines.core.collection import ALL_COLLECTIONS
    from pipelines.data.tpugraphs import count_configs

    lines = ["ID,TopConfigs"]
    for collection in ALL_COLLECTIONS:
        folder = root.new_split_dir(collection, "test", kaggle=False)
        for path in sorted(folder.glob("*.npz")) if folder.is_dir() else []:
            shown = min(5, count_configs(path, collection))
            lines.append(f"{collection.submission_id(path.name[:-len('.npz')])},{';'.join(map(str, range(shown)))}")
    path = root.sample_submission
    write_text_atomic(path, "\n".join(lines) + "\n")
    return path


def blended_scores(run_id: str, data_root: Path, *, submissions_dir: Path | str = SUBMISSIONS_DIR,
                   work_dir: Path | str | None = None, only: set[str] | None = None,
                   num_threads: int = 0) -> dict[str, pl.DataFrame]:
    """Per collection of the run (those in ``only``): the blended score of every test config of
    ``data_root``, as ``predict`` computes it (``graph``, ``config_index``, ``score``; lower = faster)."""
    from pipelines.config.settings import PipelineConfig, config_from_dict
    from pipelines.core.engine import fingerprint
    from pipelines.training.ensemble import blend, prepare_model_scores
    from pipelines.flows.predict import _source_config, predict_test, prepare_test_graphs
    from pipelines.outputs.run_folders import load_named_stage, read_run_manifest, training_stage_dir

    source = read_run_manifest(submissions_dir, run_id)
    if source.get("kind") not in (None, "run", "ensemble"):
        raise PipelineError(f"run {run_id} is a {source.get('kind')!r} run; rank needs a run that trained models")
    source_work = Path(work_dir if work_dir is not None else source["work_dir"])
    method = ((source.get("config") or {}).get("ensemble") or {}).get("method", "minmax")
    out: dict[str, pl.DataFrame] = {}
    prepared_by_config: dict[tuple[str, str], Any] = {}
    for cname in source.get("collections") or source["stages"]:
        if only is not None and cname not in only:
            continue
        collection = parse_collection(cname)
        refs = source["stages"][cname]["train"]
        listed = [m for m in (source.get("models") or []) if m in refs]
        models = listed + sorted(m for m in refs if m not in listed)
        weights = (source.get("ensemble_weights") or {}).get(cname)
        if not weights or set(weights) != set(models):
            raise PipelineError(f"run {run_id}: {cname} has no ensemble weights for its models {models}")
        frames = []
        for model in models:
            ref = refs[model]
            where = training_stage_dir(ref, source, work_dir)
            output = load_named_stage(where, ref["stage"], ref["key"],
                                      f"run {run_id}: the saved {model} models of {cname}")
            config_dict = _source_config(source, model)
            cache = (cname, fingerprint(config_dict))
            if cache not in prepared_by_config:
                config = config_from_dict(PipelineConfig, config_dict, f"run {run_id} manifest")
                prepared_by_config[cache] = prepare_test_graphs(config, collection, data_root, source_work)
            frames.append(predict_test(output, prepared_by_config[cache], num_threads=num_threads)
                          .with_columns(pl.lit(model).alias("model")))
        out[cname] = blend(prepare_model_scores(pl.concat(frames), method), weights) \
            .select("graph", "config_index", "score").sort("graph", "config_index")
    return out


# ----------------------------------------------------------------------------- the report


def _block_text(block: np.ndarray, default: np.ndarray, rank: int) -> str:
    if rank == 0:
        return "-"
    values = "{" + ",".join(str(int(v)) for v in (default if np.all(block < 0) else block) if v >= 0) + "}"
    return f"{values} (compiler default)" if np.all(block < 0) else values


def layout_ranking(featurized: Any, blocks: np.ndarray, scores: np.ndarray, top: int) -> dict[str, Any]:
    """What a layout collection's scores say, in the program's terms."""
    space = featurized.layout_space()
    order = np.lexsort((np.arange(scores.shape[0]), scores))
    best = int(order[0])
    nodes = []
    for k, (node_id, ins) in enumerate(zip(featurized.config_ids, featurized.config_nodes)):
        blocks_k = blocks[best, k].reshape(3, 6)
        defaults_k = space.defaults[k].reshape(3, 6)
        nodes.append({"node": int(node_id), "name": ins.name, "opcode": ins.opcode, "shape": str(ins.shape),
                      **{part: _block_text(blocks_k[b], defaults_k[b], int(space.ranks[k, b]))
                         for b, part in enumerate(("output", "input", "kernel"))}})
    top_rows = []
    for position, index in enumerate(order[:top], start=1):
        resolved = np.where(np.all(blocks[index].reshape(-1, 3, 6) < 0, axis=2, keepdims=True),
                            space.defaults.reshape(-1, 3, 6), blocks[index].reshape(-1, 3, 6))
        changed = np.flatnonzero(np.any(resolved != space.defaults.reshape(-1, 3, 6), axis=(1, 2)))
        top_rows.append({"rank": position, "config": int(index), "score": round(float(scores[index]), 4),
                         "nodes_off_default": [featurized.config_nodes[c].name for c in changed]})
    default_rows = np.flatnonzero(np.all(np.where(np.all(blocks.reshape(blocks.shape[0], -1, 3, 6) < 0, axis=3,
                                                         keepdims=True), space.defaults.reshape(1, -1, 3, 6),
                                                  blocks.reshape(blocks.shape[0], -1, 3, 6))
                                         == space.defaults.reshape(1, -1, 3, 6), axis=(1, 2, 3)))
    where_default = [int(np.flatnonzero(order == r)[0]) + 1 for r in default_rows]
    return {"configs": int(scores.shape[0]), "best_config": best, "nodes": nodes, "top": top_rows,
            "default_layout_rank": min(where_default) if where_default else None}


def tile_ranking(part: Any, scores: np.ndarray, top: int) -> dict[str, Any]:
    order = np.lexsort((np.arange(scores.shape[0]), scores))
    feat = part.config_feat

    def bounds(row: np.ndarray, start: int) -> list[int]:
        return [int(v) for v in row[start:start + 6] if v > 0]

    root = next(i for i in part.graph.instructions if part.graph.node_feat[part.graph.names.index(i.name), 0] == 1)
    return {"fusion": part.fusion, "computation": part.computation, "nodes": len(part.graph.names),
            "output_shape": str(root.shape.first_array()) + (f" (first of {len(root.shape.elements)} outputs)"
                                                             if root.shape.is_tuple else ""),
            "configs": int(scores.shape[0]),
            "top": [{"rank": p, "config": int(i), "score": round(float(scores[i]), 4),
                     "output_tile": bounds(feat[i], 8), "kernel_tile": bounds(feat[i], 0),
                     "input_tile": bounds(feat[i], 16)} for p, i in enumerate(order[:top], start=1)]}


def format_ranking(report: dict[str, Any]) -> str:
    lines = [f"rank: {report['program']} with run {report['run']} ({report['nodes']} nodes, "
             f"{report['configurable_nodes']} configurable, {report['fusions']} fusion(s))",
             "scores: 0 = predicted fastest of the candidates, 1 = slowest (a model's relative estimate, not a time; "
             "see docs/hlo.md for what carries over from CPU/GPU HLO to a TPU)"]
    for cname, part in report["layout"].items():
        lines += ["", f"{cname}: {part['configs']} candidate configs; best is config {part['best_config']}"
                      + (f"; the module's own layouts rank {part['default_layout_rank']}"
                         if part["default_layout_rank"] else "")]
        width = max([len(n["name"]) for n in part["nodes"]] + [4])
        shape_width = max([len(n["shape"]) for n in part["nodes"]] + [5])
        lines.append(f"  {'name':<{width}}  {'opcode':<11}  {'shape':<{shape_width}}  best minor_to_major: "
                     "output | input | kernel")
        for n in part["nodes"]:
            lines.append(f"  {n['name']:<{width}}  {n['opcode']:<11}  {n['shape']:<{shape_width}}  "
                         f"{n['output']} | {n['input']} | {n['kernel']}")
        lines.append("  top configs:")
        for row in part["top"]:
            off = ", ".join(row["nodes_off_default"][:6]) + (" ..." if len(row["nodes_off_default"]) > 6 else "")
            lines.append(f"    {row['rank']:>3}. config {row['config']:>5}  score {row['score']:.4f}  "
                         f"off the default at: {off or 'none (the default layouts)'}")
    for tile in report["tiles"]:
        lines += ["", f"tile:xla {tile['fusion']} ({tile['computation']}, {tile['nodes']} nodes, output "
                      f"{tile['output_shape']}): {tile['configs']} candidate tiles"]
        for row in tile["top"]:
            kernel = f"  kernel {row['kernel_tile']}" if row["kernel_tile"] else ""
            lines.append(f"    {row['rank']:>3}. config {row['config']:>4}  score {row['score']:.4f}  "
                         f"output tile {row['output_tile']}{kernel}")
    if report.get("skipped"):
        lines += ["", "not ranked: " + "; ".join(report["skipped"])]
    return "\n".join(lines) + "\n"


def rank_program(run_id: str, program: Path | str, *, out_dir: Path | str | None = None, configs: int = 1000,
                 tile_configs: int = 100, top: int = 5, seed: int = 0, source: str = "xla",
                 submissions_dir: Path | str = SUBMISSIONS_DIR, work_dir: Path | str | None = None,
                 num_threads: int = 0) -> tuple[dict[str, Any], Path]:
    """Featurize ``program``, build its data root, score it with run ``run_id`` and write the ranking;
    returns the report and the folder holding ``rank.json``, ``rank.txt`` and ``data/``."""
    from pipelines.hlo import safe_stem, featurize_module
    from pipelines.hlo.parse import load_module

    started = time.perf_counter()
    program = Path(program)
    featurized = featurize_module(load_module(program), str(program), tile_configs_per_fusion=tile_configs, seed=seed)
    stem = safe_stem(program.name.split(".")[0]) or "program"
    out = Path(out_dir) if out_dir is not None else Path("ranks") / f"{stem}-{run_id}"
    data = out / "data"
    if data.exists():
        if not (data / BUILT_MARKER).is_file():
            raise PipelineError(f"{data}: exists and was not built by rank; pass an --out folder of its own")
        import shutil

        shutil.rmtree(data)  # rebuilt from the program: a stale candidate file must not be scored
    data.mkdir(parents=True)
    write_text_atomic(data / BUILT_MARKER, f"built by `rank` from {program}; rebuilt on every rank into this folder\n")
    built = build_data_root(featurized, stem, data, configs=configs, seed=seed, sources=(source,))
    wanted = set(built.layout_configs) | ({"tile:xla"} if built.tile_stems else set())
    from pipelines.outputs.run_folders import read_run_manifest

    run_collections = set(read_run_manifest(submissions_dir, run_id).get("collections") or [])
    skipped = [f"{c} (the run has no models for it)" for c in sorted(wanted - run_collections)]
    if not wanted & run_collections:
        raise PipelineError(f"run {run_id} has models for none of {', '.join(sorted(wanted)) or 'nothing'}: "
                            f"{program} has {int(featurized.config_ids.shape[0])} configurable nodes and "
                            f"{len(featurized.tiles)} fusion(s)")
    scores = blended_scores(run_id, data, submissions_dir=submissions_dir, work_dir=work_dir,
                            only=wanted & run_collections, num_threads=num_threads)
    summary = featurized.summary()
    report: dict[str, Any] = {"program": str(program), "run": run_id, "nodes": summary["nodes"],
                              "configurable_nodes": summary["configurable_nodes"], "fusions": summary["fusions"],
                              "unknown_ops": summary["unknown_ops"], "layout": {}, "tiles": [], "skipped": skipped,
                              "seed": seed}
    for cname, blocks in built.layout_configs.items():
        if cname in scores:
            frame = scores[cname].filter(pl.col("graph") == stem)
            report["layout"][cname] = layout_ranking(featurized, blocks, frame["score"].to_numpy(), top)
    if "tile:xla" in scores:
        for tile_stem, part in built.tile_stems.items():
            frame = scores["tile:xla"].filter(pl.col("graph") == tile_stem)
            report["tiles"].append(tile_ranking(part, frame["score"].to_numpy(), top))
    report["wall_time_s"] = round(time.perf_counter() - started, 3)
    write_text_atomic(out / "rank.json", json.dumps(report, indent=1) + "\n")
    write_text_atomic(out / "rank.txt", format_ranking(report))
    return report, out
