"""``rank --run RUN_ID PROGRAM``: rank candidate configurations of a user's own program with a run's saved models.

The program (an HLO file, see :mod:`pipelines.hlo`) is featurized; a data root is built under the
output folder with it as a test graph of ``layout:<source>:random`` and ``layout:<source>:default``,
both holding one candidate set (:func:`layout_candidates`: the module's own layouts, K default-search
and K random-search candidates, each distinct config once), and, where the module has fusions, one
``tile:xla`` test graph per fused computation (its candidate tile sizes). Each collection that the
run has models for is then prepared and scored exactly as ``predict`` does (the run's preparation
config, every saved fold model, the run's normalisation and blend weights); nothing is trained. The
same blend is also made from each fold model alone, for the spread of a predicted gain.

The answer (``rank.json``, ``rank.txt``, printed) is in the program's terms:

* per layout collection: its best config and where it came from, ties as ties (``=N``), the rank of
  the module's own layouts, and the predicted gain of the best over them (blended score difference,
  mean and spread over the fold models, how many favour it; score units, not a time);
* one recommendation: the candidate with the best mean score over the layout collections' models,
  advised over the module's own layouts only when every fold model of every collection predicts it faster
  (they scored the same set), each changed node's output and operand layouts as HLO writes them
  (``f32[2,4,8]{0,2,1}``, with the module's own), what each collection preferred when they disagree,
  and the best candidate that changes one node only;
* per fusion, the top tile sizes (HLO carries no tile choice to compare them with).

HLO lowered for the CPU or GPU is not the TPU compiler's graph before layout assignment; see
docs/hlo.md for what carries over, and for what a jax or XLA user can do with a layout or a tile.
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
from pipelines.core.collection import TILE_XLA, parse_collection
from pipelines.core.errors import ConfigError, PipelineError
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
    layout_origins: np.ndarray | None = None  # per layout candidate: where it came from (CANDIDATE_ORIGINS)


CANDIDATE_ORIGINS = ("the module's own layouts", "default search", "random search")


def layout_candidates(featurized: Any, configs: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """One candidate set for every layout collection: the module's own layouts first, then ``configs``
    default-search and ``configs`` random-search candidates, each distinct config once (an earlier one
    kept). Returns the configs (int8 (c, nc, 18)) and each one's origin (index into CANDIDATE_ORIGINS)."""
    from pipelines.hlo import checked_config_count
    from pipelines.hlo.configs import layout_configs

    space = featurized.layout_space()
    nc = int(featurized.config_ids.shape[0])
    checked_config_count(2 * configs + 1, nc, featurized.module.source)
    parts = [space.defaults[None], layout_configs(space, configs, "default", seed),
             layout_configs(space, configs, "random", seed)]
    origins = np.concatenate([np.full(len(part), k) for k, part in enumerate(parts)])
    blocks = np.concatenate(parts)
    resolved = _resolved(blocks, space.defaults)  # a block left to the compiler is the module's own layout
    _, first = np.unique(resolved.reshape(len(blocks), -1), axis=0, return_index=True)
    keep = np.sort(first)
    return blocks[keep], origins[keep]


def _resolved(blocks: np.ndarray, defaults: np.ndarray) -> np.ndarray:
    """Configs with every all -1 block (the compiler chooses) written as the module's own layouts."""
    shaped = blocks.reshape(blocks.shape[0], -1, 3, 6)
    own = defaults.reshape(1, -1, 3, 6)
    return np.where(np.all(shaped < 0, axis=3, keepdims=True), own, shaped).reshape(blocks.shape)


def build_data_root(featurized: Any, stem: str, root: Path | str, *, configs: int, seed: int = 0,
                    sources: tuple[str, ...] = ("xla",)) -> BuiltRoot:
    """Write ``featurized`` as test graphs of a fresh data root (``root/npz/...``, the Kaggle layout): per
    source both layout collections with one candidate set (:func:`layout_candidates`), and a tile graph
    per fusion."""
    from pipelines.hlo import safe_stem
    from pipelines.data.tpugraphs import save_graph

    root = DataRoot(root)
    layout: dict[str, np.ndarray] = {}
    origins = None
    if int(featurized.config_ids.shape[0]):
        blocks, origins = layout_candidates(featurized, configs, seed)
        for source in sources:
            for search in ("random", "default"):
                collection = parse_collection(f"layout:{source}:{search}")
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
    return BuiltRoot(root.path, stem, layout, tiles, origins)


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


@dataclass
class RankScores:
    """One collection's scores of the rank's candidates: ``blended`` as ``predict`` computes them (graph,
    config_index, score; lower = faster) and ``by_fold`` the same blend made from each fold model alone
    (graph, config_index, fold, score), whose spread says how much the fold models agree."""

    blended: pl.DataFrame
    by_fold: pl.DataFrame


def fold_blends(frame: pl.DataFrame, weights: dict[str, float], method: str) -> pl.DataFrame:
    """The run's blend per fold model: each model's scores normalised per (seed, fold model, graph) as the
    ensemble does, averaged over seeds, then weighted by the run's blend weights fold by fold (pure)."""
    from pipelines.training.ensemble import normalise_scores

    total = sum(weights.values())
    normalised = normalise_scores(frame, method)
    per_fold = normalised.group_by(["model", "graph", "config_index", "fold"]).agg(pl.col("score").mean())
    weighted = per_fold.with_columns(
        (pl.col("score") * pl.col("model").replace_strict(weights, return_dtype=pl.Float64) / total).alias("score"))
    return weighted.group_by(["graph", "config_index", "fold"]).agg(pl.col("score").sum()) \
        .sort("graph", "fold", "config_index")


def blended_scores(run_id: str, data_root: Path, *, submissions_dir: Path | str = SUBMISSIONS_DIR,
                   work_dir: Path | str | None = None, only: set[str] | None = None,
                   num_threads: int = 0) -> dict[str, RankScores]:
    """Per collection of the run (those in ``only``): the scores of every test config of ``data_root``
    (:class:`RankScores`)."""
    from pipelines.config.settings import PipelineConfig, config_from_dict
    from pipelines.core.engine import fingerprint
    from pipelines.training.ensemble import blend, prepare_model_scores
    from pipelines.flows.predict import _source_config, predict_test, prepare_test_graphs
    from pipelines.outputs.run_folders import load_named_stage, read_run_manifest, recorded_folder, training_stage_dir

    source = read_run_manifest(submissions_dir, run_id)
    if source.get("kind") not in (None, "run", "ensemble"):
        raise PipelineError(f"run {run_id} is a {source.get('kind')!r} run; rank needs a run that trained models")
    source_work = recorded_folder(source, "work_dir", work_dir)
    method = ((source.get("config") or {}).get("ensemble") or {}).get("method", "minmax")
    out: dict[str, RankScores] = {}
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
        raw = pl.concat(frames)
        blended = blend(prepare_model_scores(raw, method), weights).select("graph", "config_index", "score") \
            .sort("graph", "config_index")
        out[cname] = RankScores(blended, fold_blends(raw, weights, method))
    return out


# ----------------------------------------------------------------------------- the report


TIE_TOLERANCE = 1e-9  # blended scores closer than this are one score: the models cannot tell the configs apart


def competition_order(scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Config indices best first (ties by index) and each one's rank with ties shared: scores 0, 0, .2 rank
    1, 1, 3 (pure)."""
    order = np.lexsort((np.arange(scores.shape[0]), scores))
    ranks = np.empty(order.shape[0], dtype=np.int64)
    for position, index in enumerate(order):
        tied = position and abs(scores[index] - scores[order[position - 1]]) <= TIE_TOLERANCE
        ranks[position] = ranks[position - 1] if tied else position + 1
    return order, ranks


def _rank_of(config: int, order: np.ndarray, ranks: np.ndarray) -> int:
    return int(ranks[int(np.flatnonzero(order == config)[0])])


def _rank_text(rank: int, tied: bool) -> str:
    return f"={rank}" if tied else str(rank)


def _shape_text(shape: Any, layout: list[int]) -> str:
    return f"{shape.etype}[{','.join(map(str, shape.dims))}]{{{','.join(map(str, layout))}}}"


def node_layouts(featurized: Any, config: np.ndarray) -> list[dict[str, Any]]:
    """Per configurable node the layouts a config gives it, as HLO writes them: the output and each operand
    with its shape and ``{minor,...,major}`` (a block left to the compiler shows the module's own), and
    which of them differ from the module's layouts (pure)."""
    space = featurized.layout_space()
    shapes = {i.name: i.shape for i in featurized.layout.instructions}
    resolved = _resolved(config[None], space.defaults)[0]
    out = []
    for k, (node_id, ins) in enumerate(zip(featurized.config_ids, featurized.config_nodes)):
        tensors = [ins.shape.first_array()] + [shapes[o].first_array() if o in shapes else None for o in ins.operands[:2]]
        parts, changed = {}, []
        for b, part in enumerate(("output", "input", "kernel")):
            rank = int(space.ranks[k, b])
            if not rank or b >= len(tensors) or tensors[b] is None:
                continue
            layout = [int(v) for v in resolved[k, 6 * b:6 * b + rank]]
            own = [int(v) for v in space.defaults[k, 6 * b:6 * b + rank]]
            parts[part] = _shape_text(tensors[b], layout)
            if layout != own:
                changed.append(part)
                parts[f"module_{part}"] = "{" + ",".join(map(str, own)) + "}"
        out.append({"node": int(node_id), "name": ins.name, "opcode": ins.opcode, **parts, "changed": changed})
    return out


def _changed_nodes(featurized: Any, blocks: np.ndarray) -> np.ndarray:
    """(c, nc) bool: where each config leaves the module's own layouts."""
    space = featurized.layout_space()
    resolved = _resolved(blocks, space.defaults).reshape(blocks.shape[0], -1, 18)
    return np.any(resolved != space.defaults[None], axis=2)


def _gain(scores: np.ndarray, by_fold: np.ndarray, own: int, config: int) -> dict[str, Any]:
    """The predicted gain of ``config`` over the module's own layouts ``own``: blended score difference
    (score units, not a time), its mean and spread over the fold models, and how many fold models agree."""
    folds = by_fold[:, own] - by_fold[:, config]
    return {"blended": round(float(scores[own] - scores[config]), 4), "fold_mean": round(float(folds.mean()), 4),
            "fold_spread": round(float(folds.std(ddof=1)) if folds.shape[0] > 1 else 0.0, 4),
            "fold_models": int(folds.shape[0]), "fold_models_in_favour": int((folds > TIE_TOLERANCE).sum())}


def layout_ranking(featurized: Any, blocks: np.ndarray, origins: np.ndarray, scores: np.ndarray,
                   by_fold: np.ndarray, top: int) -> dict[str, Any]:
    """What one layout collection's scores say, in the program's terms (``by_fold``: (folds, c))."""
    order, ranks = competition_order(scores)
    best = int(order[0])
    changed = _changed_nodes(featurized, blocks)
    own = int(np.flatnonzero(~changed.any(axis=1))[0])  # the module's own layouts (candidate 0)
    names = [ins.name for ins in featurized.config_nodes]
    top_rows = []
    for position, index in enumerate(order[:top]):
        tied = ranks[position] in np.delete(ranks, position)
        top_rows.append({"rank": _rank_text(int(ranks[position]), bool(tied)), "config": int(index),
                         "score": round(float(scores[index]), 4), "from": CANDIDATE_ORIGINS[int(origins[index])],
                         "changes": [names[c] for c in np.flatnonzero(changed[index])]})
    return {"configs": int(scores.shape[0]), "best_config": best, "best_from": CANDIDATE_ORIGINS[int(origins[best])],
            "tied_with_best": [int(i) for i in order[1:][ranks[1:] == 1]],
            "own_layouts_rank": _rank_of(own, order, ranks), "gain_over_own": _gain(scores, by_fold, own, best),
            "nodes": node_layouts(featurized, blocks[best]), "top": top_rows}


def recommend(featurized: Any, blocks: np.ndarray, origins: np.ndarray,
              collections: dict[str, tuple[np.ndarray, np.ndarray]]) -> dict[str, Any]:
    """One layout per configurable node: the candidate with the best mean score over the layout
    collections' models (they score one candidate set), where they agree and where they do not (pure)."""
    mean = np.mean([scores for scores, _ in collections.values()], axis=0)
    order, _ = competition_order(mean)
    chosen = int(order[0])
    changed = _changed_nodes(featurized, blocks)
    own = int(np.flatnonzero(~changed.any(axis=1))[0])
    per_collection = {}
    for cname, (scores, by_fold) in collections.items():
        c_order, c_ranks = competition_order(scores)
        per_collection[cname] = {"best_config": int(c_order[0]), "rank_of_recommended": _rank_of(chosen, c_order, c_ranks),
                                 "gain_over_own": _gain(scores, by_fold, own, chosen)}
    single = [int(i) for i in order if changed[i].sum() == 1]
    simplest = None
    if single:
        node = int(np.flatnonzero(changed[single[0]])[0])
        simplest = {"config": single[0], "node": featurized.config_nodes[node].name,
                    "mean_rank": int(np.flatnonzero(order == single[0])[0]) + 1,
                    "layouts": node_layouts(featurized, blocks[single[0]])[node]}
    bests = {v["best_config"] for v in per_collection.values()}
    # The module's own layouts are the anchor: a change is advised only when every fold model of every
    # collection predicts it faster than them, else keeping them is the answer (never worse than now).
    confident = all(v["gain_over_own"]["fold_models_in_favour"] == v["gain_over_own"]["fold_models"] > 0
                    for v in per_collection.values())
    return {"config": chosen, "from": CANDIDATE_ORIGINS[int(origins[chosen])],
            "rule": "best mean score" if len(collections) > 1 else "best score",
            "collections": per_collection, "collections_disagree": len(bests) > 1,
            "own_layouts": chosen == own, "change_advised": chosen != own and confident,
            "nodes_changed": int(changed[chosen].sum()),
            "nodes": [n for n in node_layouts(featurized, blocks[chosen]) if n["changed"]], "simplest": simplest}


def tile_ranking(part: Any, scores: np.ndarray, top: int) -> dict[str, Any]:
    order, ranks = competition_order(scores)
    feat = part.config_feat

    def bounds(row: np.ndarray, start: int) -> list[int]:
        return [int(v) for v in row[start:start + 6] if v > 0]

    root = next(i for i in part.graph.instructions if part.graph.node_feat[part.graph.names.index(i.name), 0] == 1)
    return {"fusion": part.fusion, "computation": part.computation, "nodes": len(part.graph.names),
            "output_shape": str(root.shape.first_array()) + (f" (first of {len(root.shape.elements)} outputs)"
                                                             if root.shape.is_tuple else ""),
            "configs": int(scores.shape[0]), "tied_with_best": [int(i) for i in order[1:][ranks[1:] == 1]],
            "top": [{"rank": _rank_text(int(ranks[p]), bool(ranks[p] in np.delete(ranks, p))), "config": int(i),
                     "score": round(float(scores[i]), 4), "output_tile": bounds(feat[i], 8),
                     "kernel_tile": bounds(feat[i], 0), "input_tile": bounds(feat[i], 16)}
                    for p, i in enumerate(order[:top])]}


def _gain_text(gain: dict[str, Any]) -> str:
    return (f"{gain['fold_mean']:+.3f} +- {gain['fold_spread']:.3f} over {gain['fold_models']} fold model(s), "
            f"{gain['fold_models_in_favour']} in favour")


def _layouts_text(node: dict[str, Any]) -> str:
    parts = []
    for part in ("output", "input", "kernel"):
        if part in node:
            was = f" (module {node['module_' + part]})" if part in node["changed"] else ""
            parts.append(f"{part} {node[part]}{was}")
    return "; ".join(parts)


def format_ranking(report: dict[str, Any]) -> str:
    lines = [f"rank: {report['program']} with run {report['run']} ({report['nodes']} nodes, "
             f"{report['configurable_nodes']} configurable, {report['fusions']} fusion(s))",
             "scores: 0 = predicted fastest of the candidates, 1 = slowest (a model's relative estimate, not a time; "
             "see docs/hlo.md for what carries over from CPU/GPU HLO to a TPU); =N: tied"]
    candidates = report.get("layout_candidates")
    if candidates:
        lines.append(f"layout candidates: {candidates['distinct']} distinct ({candidates['own']} the module's own, "
                     f"{candidates['default search']} from the default search, {candidates['random search']} from "
                     "the random search), one set scored by every layout collection's models")
    for cname, part in report["layout"].items():
        gain = part["gain_over_own"]
        tied = f", tied with {len(part['tied_with_best'])} other(s)" if part["tied_with_best"] else ""
        lines += ["", f"{cname}: best config {part['best_config']} ({part['best_from']}{tied}); the module's own "
                      f"layouts rank {part['own_layouts_rank']} of {part['configs']}",
                  f"  predicted gain over the module's own layouts (score units): {_gain_text(gain)}", "  top configs:"]
        for row in part["top"]:
            changes = ", ".join(row["changes"][:5]) + (f" (+{len(row['changes']) - 5})" if len(row["changes"]) > 5 else "")
            lines.append(f"    {row['rank']:>4}. config {row['config']:>5}  score {row['score']:.4f}  {row['from']:<24} "
                         f"changes: {changes or 'none'}")
    rec = report.get("recommendation")
    if rec:
        lines += ["", f"recommended layouts: config {rec['config']} ({rec['from']}), the {rec['rule']} of "
                      f"{' and '.join(rec['collections'])}"]
        if rec["collections_disagree"]:
            lines.append("  the collections' models disagree: " + "; ".join(
                f"{c} prefers config {v['best_config']} and ranks this one {v['rank_of_recommended']}"
                for c, v in rec["collections"].items()))
        for cname, v in rec["collections"].items():
            lines.append(f"  gain over the module's own layouts by {cname}: {_gain_text(v['gain_over_own'])}")
        if rec["own_layouts"]:
            lines.append("  that is the module's own layouts: no change predicted to help")
        elif not rec["change_advised"]:
            lines.append("  advice: keep the module's own layouts; not every fold model predicts this config faster "
                         "than them (the candidate and its layouts follow, for a measurement):")
        if not rec["own_layouts"]:
            lines.append(f"  changes {rec['nodes_changed']} of {report['configurable_nodes']} configurable nodes "
                         "(the others keep the module's layouts):")
            width = max(len(n["name"]) for n in rec["nodes"])
            for node in rec["nodes"]:
                lines.append(f"    {node['name']:<{width}}  {node['opcode']:<11}  {_layouts_text(node)}")
        if rec["simplest"] and rec["nodes_changed"] > 1:
            simple = rec["simplest"]
            lines.append(f"  simplest change: config {simple['config']} changes {simple['node']} only "
                         f"({_layouts_text(simple['layouts'])}); mean rank {simple['mean_rank']}")
        lines.append("  applying a layout: docs/hlo.md, 'Acting on a ranking'")
    for tile in report["tiles"]:
        tied = f"; {len(tile['tied_with_best'])} tied with the best" if tile["tied_with_best"] else ""
        lines += ["", f"tile:xla {tile['fusion']} ({tile['computation']}, {tile['nodes']} nodes, output "
                      f"{tile['output_shape']}): {tile['configs']} candidate tiles{tied}; HLO carries no tile choice "
                      "of its own to compare with (XLA picks tiles when it compiles)"]
        for row in tile["top"]:
            kernel = f"  kernel {row['kernel_tile']}" if row["kernel_tile"] else ""
            lines.append(f"    {row['rank']:>4}. config {row['config']:>4}  score {row['score']:.4f}  "
                         f"output tile {row['output_tile']}{kernel}")
    if report.get("skipped"):
        lines += ["", "not ranked: " + "; ".join(report["skipped"])]
    return "\n".join(lines) + "\n"


def _graph_scores(scores: RankScores, stem: str, configs: int) -> tuple[np.ndarray, np.ndarray]:
    """One graph's blended scores (c,) and per-fold-model blends (folds, c), in config order."""
    blended = scores.blended.filter(pl.col("graph") == stem).sort("config_index")["score"].to_numpy()
    folds = scores.by_fold.filter(pl.col("graph") == stem).sort("fold", "config_index")
    by_fold = folds["score"].to_numpy().reshape(-1, configs)
    if blended.shape[0] != configs:
        raise PipelineError(f"{stem}: {blended.shape[0]} scores for {configs} candidates")
    return blended, by_fold


def rank_program(run_id: str, program: Path | str, *, out_dir: Path | str | None = None, configs: int = 1000,
                 tile_configs: int = 100, top: int = 5, seed: int = 0, source: str = "xla",
                 submissions_dir: Path | str = SUBMISSIONS_DIR, work_dir: Path | str | None = None,
                 num_threads: int = 0) -> tuple[dict[str, Any], Path]:
    """Featurize ``program``, build its data root, score it with run ``run_id`` and write the ranking;
    returns the report and the folder holding ``rank.json``, ``rank.txt`` and ``data/``."""
    from pipelines.hlo import checked_options, featurize_module, out_folder_lock, safe_stem
    from pipelines.hlo.parse import load_module

    started = time.perf_counter()
    checked_options(configs=configs, tile_configs=tile_configs, seed=seed)
    if isinstance(top, bool) or not isinstance(top, int) or top < 1:
        raise ConfigError(f"--top must be an integer >= 1, got {top!r}")
    program = Path(program)
    featurized = featurize_module(load_module(program), str(program), tile_configs_per_fusion=tile_configs, seed=seed)
    stem = safe_stem(program.name.split(".")[0]) or "program"
    out = Path(out_dir) if out_dir is not None else Path("ranks") / f"{stem}-{run_id}"
    with out_folder_lock(out, "rank"):
        return _rank_into(out, featurized, program, stem, run_id, configs=configs, top=top, seed=seed,
                          source=source, submissions_dir=submissions_dir, work_dir=work_dir,
                          num_threads=num_threads, started=started)


def _rank_into(out: Path, featurized: Any, program: Path, stem: str, run_id: str, *, configs: int, top: int,
               seed: int, source: str, submissions_dir: Path | str, work_dir: Path | str | None, num_threads: int,
               started: float) -> tuple[dict[str, Any], Path]:
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
    scored: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for cname, blocks in built.layout_configs.items():
        if cname in scores:
            scored[cname] = _graph_scores(scores[cname], stem, blocks.shape[0])
            report["layout"][cname] = layout_ranking(featurized, blocks, built.layout_origins, *scored[cname], top)
    if scored:
        blocks = next(iter(built.layout_configs.values()))
        counts = np.bincount(built.layout_origins, minlength=len(CANDIDATE_ORIGINS))
        report["layout_candidates"] = {"distinct": int(blocks.shape[0]), "own": int(counts[0]),
                                       "default search": int(counts[1]), "random search": int(counts[2])}
        report["recommendation"] = recommend(featurized, blocks, built.layout_origins, scored)
    if "tile:xla" in scores:
        for tile_stem, part in built.tile_stems.items():
            blended, _ = _graph_scores(scores["tile:xla"], tile_stem, part.config_feat.shape[0])
            report["tiles"].append(tile_ranking(part, blended, top))
    report["wall_time_s"] = round(time.perf_counter() - started, 3)
    write_text_atomic(out / "rank.json", json.dumps(report, indent=1) + "\n")
    write_text_atomic(out / "rank.txt", format_ranking(report))
    return report, out
