"""Two arms of one model that differ in one setting, paired per (fold, seed) cell, on a world with hidden labels.

Usage: python -m benchmarks.paired_arms --data-root WORLD --work-dir WORK --model gnn --key config_layers
                                        --base 1 --candidate 0 [--collections ...] [--out FILE]
       python -m benchmarks.paired_arms --data-root WORLD --work-dir WORK --model gnn
                                        --stages COLLECTION=BASE_KEY,CANDIDATE_KEY [...] [--out FILE]

Run each arm first with ``python -m pipelines train --model M --data-root WORLD --work-dir WORK
--set run.seeds=[...] --set M.KEY=VALUE``. For each collection this reads the two training stages
under WORK whose resolved settings give KEY the two values (TOML literals) and agree on every other
setting (where several pairs match, the candidate stage with the most seeds, then the newest, among those
that have a base stage; a setting a stage's manifest lacks, from before it existed, is compared at its
default) and reports:

* OOF per arm: the mean over its out-of-fold graphs per seed, mean +- std over the seeds;
* the paired OOF gain: per (fold, seed) cell present in both arms, the candidate's mean held-out
  score minus the base's (mean +- standard error over the cells, and how many cells went up);
* test / ceiling per arm: the submission-style average of every fold model, scored on the world's
  hidden test labels (``pipelines.flows.evaluate``), over the ceiling; and the candidate's gain on test, paired
  over the test graphs with its standard error (same units): how far the test's own few graphs can tell
  the arms apart;
* the fit seconds of all fold models and their mean epochs (GBDT: trees kept by early stopping; compare
  them only from an idle machine).

Arms that differ in code but not in settings (a fix between them) are told apart only by recency:
the stage keys are printed. Arms that differ in several settings (a config file against another) are
named by their training stages' keys instead: ``--stages`` pairs them per collection, same report.
"""

from __future__ import annotations

import argparse
import json
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import polars as pl

from benchmarks.common import emit, markdown_table
from pipelines.training.ensemble import paired_gain

if TYPE_CHECKING:
    from pipelines.flows.evaluate import Evaluation

LAYOUT = ("layout:xla:default", "layout:xla:random", "layout:nlp:default", "layout:nlp:random")


@dataclass
class Arm:
    key: str  # the training stage's key
    cells: pl.DataFrame  # fold, seed, score: mean held-out score per cell
    per_seed: np.ndarray  # OOF score per seed
    fit_seconds: float
    epochs: float


def toml_value(text: str) -> Any:
    return tomllib.loads(f"v = {text}")["v"]


def default_settings(model: str, collection: str) -> dict[str, Any]:
    """The model's default settings for ``collection``, as a stage manifest stores them (JSON values)."""
    from pipelines.core.collection import parse_collection
    from pipelines.config.settings import PipelineConfig
    from pipelines.config.registry import get_adapter

    return json.loads(json.dumps(get_adapter(model).settings(PipelineConfig(), parse_collection(collection))))


def finished_stages(work: Path, model: str, collection: str) -> list[dict[str, Any]]:
    """The manifests of the finished training stages of ``collection`` under ``work``."""
    found = []
    for path in (work / f"train-{model}").glob("*/manifest.json"):
        manifest = json.loads(path.read_text())
        if "metrics" in manifest and (manifest.get("config") or {}).get("collection") == collection:
            found.append(manifest)
    return found


def matching_stages(manifests: Sequence[dict[str, Any]], defaults: dict[str, Any], wanted: dict[str, Any] | None,
                    key: str, value: Any) -> list[dict[str, Any]]:
    """Those of ``manifests`` whose setting ``key`` is ``value`` and whose other settings equal ``wanted``'s
    (any, with None); those with the most seeds first, then the newest. A stage written before a setting
    existed ran it at its default value: on both sides, a setting missing from the settings takes its
    default (``defaults``) before they are compared."""
    wanted = None if wanted is None else {**defaults, **wanted, key: None}
    found = []
    for manifest in manifests:
        settings = {**defaults, **(manifest["config"].get("settings") or {})}
        if settings.get(key) == value and (wanted is None or {**settings, key: None} == wanted):
            found.append(manifest)
    return sorted(found, key=lambda m: (len(m["config"]["seeds"]), m["finished"]), reverse=True)


def find_arms(work: Path, model: str, collection: str, key: str, base: Any,
              candidate: Any) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The (base, candidate) stages: the first candidate stage (most seeds, then newest) for which a base
    stage with the same settings but ``key`` exists, and that base's first stage (the manifests read once)."""
    manifests, defaults = finished_stages(work, model, collection), default_settings(model, collection)
    for candidate_stage in matching_stages(manifests, defaults, None, key, candidate):
        bases = matching_stages(manifests, defaults, candidate_stage["config"]["settings"], key, base)
        if bases:
            return bases[0], candidate_stage
    return None


def load_arm(work: Path, model: str, manifest: dict[str, Any]) -> Arm:
    scores = pl.read_parquet(work / f"train-{model}" / manifest["key"] / "scores.parquet")
    scores = scores.filter(pl.col("split") == "oof")
    cells = scores.group_by(["fold", "seed"]).agg(pl.col("score").mean()).sort(["seed", "fold"])
    per_seed = scores.group_by("seed").agg(pl.col("score").mean()).sort("seed")["score"].to_numpy()
    fits = manifest["metrics"]["models"]
    # the GNN records its training time apart from setup and its epochs; a GBDT fit only its fold job's
    # wall time and the trees early stopping kept
    seconds = sum(m["train_seconds"] if "train_seconds" in m else m["wall_s"] for m in fits)
    length = np.mean([m["epochs_run"] if "epochs_run" in m else m["best_iteration"] for m in fits])
    return Arm(manifest["key"], cells, per_seed, float(seconds), float(length))


def paired_cells(base: Arm, candidate: Arm) -> tuple[float, float, int, int]:
    """Mean and standard error of ``candidate - base`` over the (fold, seed) cells both ran, the cells
    where the candidate is higher, and the number of cells."""
    paired = base.cells.join(candidate.cells, on=["fold", "seed"], suffix="_new")
    gain, se = paired_gain(paired["score_new"].to_numpy(), paired["score"].to_numpy())
    return gain, se, int((paired["score_new"] > paired["score"]).sum()), paired.height


@dataclass(frozen=True)
class HiddenTestPair:
    """Two arms on the test split, in units of the ceiling's score."""

    base: float  # test score / ceiling
    candidate: float
    gain: float  # candidate minus base, mean per test graph / ceiling
    se: float  # its standard error, paired over the test graphs

    def describe(self) -> str:
        return f"{self.base:.4f} -> {self.candidate:.4f} ({self.gain:+.4f} +- {self.se:.4f})"


def hidden_test_pair(evaluation: Evaluation, collection: str, base: str, candidate: str) -> HiddenTestPair:
    """:class:`HiddenTestPair` of two entries of an ``Evaluation`` on one collection (pure)."""
    from pipelines.flows.evaluate import CEILING

    ceiling = evaluation.reports[CEILING].collection_score(collection)
    gain, se = evaluation.graph_gap(candidate, base, collection)
    return HiddenTestPair(evaluation.reports[base].collection_score(collection) / ceiling,
                          evaluation.reports[candidate].collection_score(collection) / ceiling,
                          gain / ceiling, se / ceiling)


def hidden_test_scores(data_root: Path, work: Path, model: str, collection: str, base: Arm,
                       candidate: Arm) -> HiddenTestPair:
    """Each arm's fold models averaged, scored on the world's hidden labels (one pass over the test
    graphs for both arms)."""
    from pipelines.core.collection import parse_collection
    from pipelines.core.engine import load_stage
    from pipelines.flows.evaluate import evaluate_rows, trained_rows

    entries = {"base": base, "candidate": candidate}
    rows = trained_rows([(entry, load_stage(work, f"train-{model}", arm.key)) for entry, arm in entries.items()],
                        "minmax")
    evaluation = evaluate_rows(data_root, rows, collections=[parse_collection(collection)])
    return hidden_test_pair(evaluation, collection, "base", "candidate")


def stage_pair(text: str) -> tuple[str, str, str]:
    """``COLLECTION=BASE_KEY,CANDIDATE_KEY`` -> (collection, base key, candidate key)."""
    collection, _, keys = text.partition("=")
    pair = keys.split(",")
    if not collection or len(pair) != 2 or not all(pair):
        raise argparse.ArgumentTypeError(f"expected COLLECTION=BASE_KEY,CANDIDATE_KEY, got {text!r}")
    return collection, pair[0], pair[1]


def stage_manifest(work: Path, model: str, collection: str, key: str) -> dict[str, Any]:
    """The manifest of the complete training stage ``key`` of ``collection`` (the engine's check of a
    complete output; a clear error naming the stage otherwise)."""
    from pipelines.core.engine import load_stage
    from pipelines.core.errors import PipelineError

    try:
        stage = load_stage(work, f"train-{model}", key)
    except PipelineError as error:
        raise SystemExit(str(error)) from None
    trained = (stage.manifest.get("config") or {}).get("collection")
    if trained != collection:
        raise SystemExit(f"{stage.path}: the stage trained {trained}, not {collection}")
    return stage.manifest


def arm_rows(data_root: Path, work: Path, model: str,
             pairs: Sequence[tuple[str, dict[str, Any], dict[str, Any]]]) -> list[list[str]]:
    """One table row per (collection, base stage, candidate stage)."""
    rows = []
    for collection, *stages in pairs:
        arms = [load_arm(work, model, stage) for stage in stages]
        gain, se, up, cells = paired_cells(*arms)
        test = hidden_test_scores(data_root, work, model, collection, *arms)
        rows.append([collection, *(f"{a.per_seed.mean():.4f} +- {a.per_seed.std():.4f}" for a in arms),
                     f"{gain:+.4f} +- {se:.4f}", f"{up}/{cells}",
                     test.describe(), f"{arms[0].fit_seconds:.0f} -> {arms[1].fit_seconds:.0f}",
                     f"{arms[0].epochs:.1f} -> {arms[1].epochs:.1f}", f"{arms[0].key} / {arms[1].key}"])
    return rows


def report(title: str, base_label: str, candidate_label: str, rows: list[list[str]]) -> list[str]:
    header = ["collection", f"OOF {base_label}", f"OOF {candidate_label}", "paired cells", "cells up",
              "test/ceiling (paired gain +- se over test graphs)", "fit s", "epochs (GBDT: trees)", "stages"]
    return [title, "", *markdown_table(header, rows)]


def compare(data_root: Path, work: Path, model: str, key: str, base: Any, candidate: Any,
            collections: Sequence[str]) -> list[str]:
    pairs = [(collection, *stages) for collection in collections
             if (stages := find_arms(work, model, collection, key, base, candidate))]
    return report(f"# {model}: {key} = {candidate!r} against {base!r} ({data_root})", f"{key} = {base!r}",
                  f"{key} = {candidate!r}", arm_rows(data_root, work, model, pairs))


def compare_stages(data_root: Path, work: Path, model: str, pairs: Sequence[tuple[str, str, str]]) -> list[str]:
    manifests = [(collection, stage_manifest(work, model, collection, base),
                  stage_manifest(work, model, collection, candidate)) for collection, base, candidate in pairs]
    return report(f"# {model}: the second stage of each pair against the first ({data_root})", "base stage",
                  "candidate stage", arm_rows(data_root, work, model, manifests))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-root", type=Path, required=True, help="a synthetic world (with labels/)")
    parser.add_argument("--work-dir", type=Path, required=True)
    parser.add_argument("--model", default="gnn")
    parser.add_argument("--key", help="the setting the arms differ in, e.g. config_layers")
    parser.add_argument("--base", type=toml_value, help="its value in the base arm (TOML literal)")
    parser.add_argument("--candidate", type=toml_value, help="its value in the other arm")
    parser.add_argument("--collections", default=",".join(LAYOUT))
    parser.add_argument("--stages", nargs="+", type=stage_pair, metavar="COLLECTION=BASE_KEY,CANDIDATE_KEY",
                        help="instead of --key: the two training stages of each collection, by key")
    parser.add_argument("--out", type=Path, default=None, help="also write the table to this file")
    args = parser.parse_args(argv)
    by_key = (args.key, args.base, args.candidate)
    if args.stages and any(v is not None for v in by_key):
        parser.error("--stages names the arms itself: leave out --key, --base and --candidate")
    if args.stages:
        emit(compare_stages(args.data_root, args.work_dir, args.model, args.stages), args.out)
        return
    if any(v is None for v in by_key):
        parser.error("--key, --base and --candidate are required (or --stages)")
    emit(compare(args.data_root, args.work_dir, args.model, args.key, args.base, args.candidate,
                 args.collections.split(",")), args.out)


if __name__ == "__main__":
    main()
