"""Blend rules on held-out test: the landed OOF fit against the alternatives, per world and collection.

Usage: python -m benchmarks.blend_rules ROOT [ROOT ...] [--out FILE]

ROOT is an ``evaluation_worlds --root`` folder: one world with hidden labels (``synth.json`` and
``labels/`` in a sub-folder) and the stage cache ``work/`` of its run. Every ensemble stage found
there is recomputed from its training stages' predictions (the weights must equal the stage's:
checked), then each rule's weights are applied to the test predictions and scored on the hidden
labels, as ``evaluate`` scores a submission.

Rules (``w`` = weights, ``best`` = the model with the best OOF score alone):
* ``oof-fit``: the grid weights that maximise the OOF metric (``pipelines.training.ensemble`` with
  ``ensemble.min_gain_se = 0``; the landed rule until 2026-11-26);
* ``best``: the best single model alone;
* ``sig2``: ``oof-fit`` only if the blend's OOF gain over ``best`` exceeds 2 standard errors of the
  per-graph gain (paired over the OOF graphs), else ``best``: a gain the OOF cannot tell from noise
  is not taken (the ensemble stage with ``ensemble.min_gain_se = 2``, the base config from then
  until the v8 plan);
* ``sig3``: the same at 3 standard errors: a candidate named after v4-v6 were seen (it would take the
  GNN alone where v4 xla:default and v6 nlp:default kept blends at 2.8-3.0 standard errors and fell
  below it), so only worlds from v7 on can speak for it
  (``benchmarks/results/2026-11-26-evaluation-worlds-medium-v7.md``); the base config
  (``ensemble.min_gain_se = 3``) from the v8 plan until v9
  (``2026-11-26-evaluation-worlds-medium-v8.md``, ``-v9.md``);
* ``sig3-avg``: ``sig3`` on the OOF gain expected at the test's number of averaged runs. OOF rows
  average one fold model per seed, test rows every fold model of every seed; where part of the
  blend's gain is variance reduction, the test-time average already gives it (v8 xla:default). The
  gain is modelled as ``a + b / n`` in the runs ``n`` averaged per graph, through the mean gain with
  one seed's predictions alone (``n = 1``) and the gain with all ``S`` seeds (``n = S``), and taken at
  ``n = folds x S``; the blend only if that exceeds 3 standard errors of the all-seeds gain (one seed:
  ``sig3``). A candidate fixed before v8's other ensemble stages existed
  (``2026-11-26-evaluation-worlds-medium-v8.md``); ``ensemble.gain_at = "test-runs"`` in the pipeline;
* ``sig2-avg``: the same at 2 standard errors, the blend rule of ``min_gain_se = 2`` with
  ``gain_at = "test-runs"``, the base config since v9; added after v9's first two cells were read, to
  report the combination of the v9 plan's two decisions, so only worlds after v9 can speak for it;
* ``half-shrink``: halfway between ``oof-fit`` and ``best``.

Beside the rules, each cell reports the single model best on test, its gap over the OOF's best and
that gap's standard error paired over the test graphs: where OOF and test disagree about the best
model, this tells whether the test's own graph sample can tell the two apart (a rule that reads only
OOF cannot be asked to follow a gap within that noise). A last table gives every other rule's gain over
the landed one with the same standard error: the v11 plan judges ``sig3-avg`` against ``sig2-avg`` by it.

Issue 17 asks that the ensemble never fall below the best single model by more than the seed spread;
these are the candidate rules for that clause (``benchmarks/results/2026-11-23-ensemble-weights-small-variants.md``
compared them on three ``small`` worlds, ``2026-11-26-evaluation-worlds-medium-v6.md`` on v6 and chose ``sig2``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import polars as pl

from benchmarks.common import emit, markdown_table, parse_roots

RULES = ("oof-fit", "best", "sig2", "sig3", "sig2-avg", "sig3-avg", "half-shrink")


def rule_of(min_gain_se: float, gain_at: str) -> str:
    """The rule of RULES that an ensemble config (``min_gain_se``, ``gain_at``) applies (pure)."""
    name = "oof-fit" if min_gain_se == 0 else f"sig{min_gain_se:g}" + ("-avg" if gain_at == "test-runs" else "")
    if name not in RULES:
        raise SystemExit(f"no rule here for min_gain_se = {min_gain_se:g}, gain_at = {gain_at!r} "
                         f"(rules: {', '.join(RULES)})")
    return name


def landed_rule() -> str:
    """The rule the base config's ensemble applies (``sig2-avg`` since v9)."""
    from pipelines.config.settings import load_config

    ensemble = load_config().ensemble
    return rule_of(ensemble.min_gain_se, ensemble.gain_at)


@dataclass(frozen=True)
class Cell:
    """One (world, collection): the rules' weights, the OOF evidence and each entry's test score."""

    world: str
    collection: str
    weights: dict[str, dict[str, float]]  # rule -> model -> weight
    oof_gain: float  # mean per-graph OOF gain of oof-fit over the best single model
    oof_gain_sem: float  # its standard error (paired over graphs)
    runs_gain: float  # that gain expected at the test's runs per graph (``pipelines.training.ensemble.gain_at_runs``)
    test: dict[str, float]  # each model alone, each rule, "ceiling"
    test_best: str  # the single model best on test
    test_gap: float  # its mean per-graph gain over the OOF-best model (0 where they agree)
    test_gap_se: float  # the gap's standard error, paired over the test graphs (``Evaluation.graph_gap``)
    landed_gap: float  # the landed rule's (``landed_rule``) mean per-graph gain over the test's best single model
    landed_gap_se: float  # its standard error, paired over the test graphs
    rule_gaps: dict[str, tuple[float, float]]  # rule -> its mean per-graph gain over the landed rule, that gain's se
    test_graphs: int


def rule_weights(fitted: dict[str, float], best: str, gain: float, sem: float,
                 runs_gain: float | None = None) -> dict[str, dict[str, float]]:
    """Each rule's weights from the OOF-fitted ones, the best single model, the OOF gain and that gain
    at the test's runs per graph (``pipelines.training.ensemble.gain_at_runs``; None: ``gain``) (pure)."""
    alone = {m: float(m == best) for m in fitted}
    beyond = {k: dict(fitted) if gain > k * sem else alone for k in (2, 3)}  # NaN sem: never beyond
    at_runs = gain if runs_gain is None else runs_gain
    return {"oof-fit": dict(fitted), "best": alone, "sig2": beyond[2], "sig3": beyond[3],
            **{f"sig{k}-avg": dict(fitted) if at_runs > k * sem else alone for k in (2, 3)},
            "half-shrink": {m: (fitted[m] + alone[m]) / 2 for m in fitted}}


def world_of(root: Path) -> Path:
    worlds = sorted(p.parent for p in root.glob("*/synth.json") if (p.parent / "labels").is_dir())
    if len(worlds) != 1:
        raise SystemExit(f"{root}: expected one world with hidden labels (*/synth.json + labels/), found {len(worlds)}")
    return worlds[0]


def cells_of(root: Path, landed: str) -> list[Cell]:
    from pipelines.core.collection import parse_collection
    from pipelines.core.engine import load_stage
    from pipelines.training.ensemble import (
        blend,
        fit_blend_weights,
        gain_at_runs,
        load_blend_inputs,
        prepare_model_scores,
        runs_per_test_graph,
        seed_gains,
    )
    from pipelines.flows.evaluate import CEILING, evaluate_rows
    from pipelines.core.metric import best_scoring
    from pipelines.flows.scores import submission_rows

    world, work = world_of(root), root / "work"
    cells = []
    seen: set[str] = set()
    for path in sorted((work / "ensemble").glob("*/manifest.json")):
        manifest = json.loads(path.read_text(encoding="utf-8"))
        if "metrics" not in manifest:
            continue  # an unfinished stage
        config, inputs, metrics = manifest["config"], manifest["inputs"], manifest["metrics"]
        name, method, grid = config["collection"], config["method"], config["grid"]
        blended = json.dumps([name, method, grid, config["models"], inputs], sort_keys=True)
        if blended in seen:
            continue  # a stage of the same inputs with another min_gain_se: the same cell
        seen.add(blended)
        collection = parse_collection(name)
        models = list(config["models"])
        trained = {m: load_stage(work, stage, inputs[f"model:{m}"]) for m, stage in config["models"].items()}
        table, raw_oof, _, truths = load_blend_inputs(collection, load_stage(work, "prune", inputs["prune"]), trained)
        oof = prepare_model_scores(raw_oof, method)
        test = prepare_model_scores(table.filter(pl.col("split") == "test"), method)
        frames = {m: oof.filter(pl.col("model") == m) for m in models}
        fit = fit_blend_weights(frames, truths, name, grid=grid)  # the grid optimum, whatever its margin
        stage_fit = metrics.get("fitted_weights", metrics["weights"])  # stages before ensemble.min_gain_se
        if fit.weights != stage_fit or fit.best_single != metrics["best_single_model"]:
            raise SystemExit(f"{path}: recomputed weights {fit.weights} (best single {fit.best_single}) differ "
                             f"from the stage's {stage_fit} ({metrics['best_single_model']}) (other code?)")
        gain, sem = fit.gain, fit.gain_se
        runs = runs_per_test_graph(table.filter(pl.col("split") == "test"), fit.best_single)
        runs_gain = gain_at_runs(seed_gains(raw_oof, truths, name, fit, method), gain, runs)
        weights = rule_weights(fit.weights, fit.best_single, gain, sem, runs_gain)
        rows = {m: submission_rows(test.filter(pl.col("model") == m)) for m in models}
        rows.update({rule: submission_rows(blend(test, w)) for rule, w in weights.items()})
        evaluation = evaluate_rows(world, rows, collections=[collection])
        scores = {e: evaluation.reports[e].collection_score(name) for e in [*rows, CEILING]}
        test_best = best_scoring({m: scores[m] for m in models})
        gap, gap_se = evaluation.graph_gap(test_best, fit.best_single, name)
        landed_gap, landed_gap_se = evaluation.graph_gap(landed, test_best, name)
        rule_gaps = {rule: evaluation.graph_gap(rule, landed, name) for rule in RULES if rule != landed}
        graphs = evaluation.reports[CEILING].per_graph.filter(pl.col("collection") == name).height
        cells.append(Cell(world.name, name, weights, gain, sem, runs_gain, scores, test_best, gap, gap_se,
                          landed_gap, landed_gap_se, rule_gaps, graphs))
    return cells


def report(cells: Sequence[Cell], landed: str) -> list[str]:
    models = sorted({m for c in cells for m in c.weights["oof-fit"]})
    header = ["world", "collection", *[f"w({m}) oof-fit" for m in models], "OOF gain (sem)", "at test runs",
              *models, *RULES, "ceiling"]
    rows = [[c.world, c.collection, *[f"{c.weights['oof-fit'][m]:.2f}" for m in models],
             f"{c.oof_gain:+.4f} ({c.oof_gain_sem:.4f})", f"{c.runs_gain:+.4f}",
             *[f"{c.test[e]:.4f}" for e in (*models, *RULES, "ceiling")]]
            for c in cells]
    ratio = {e: np.mean([c.test[e] / c.test["ceiling"] for c in cells]) for e in (*models, *RULES)}
    gaps = [[c.world, c.collection, str(c.test_graphs), max(c.weights["best"], key=c.weights["best"].get),
             c.test_best, f"{c.test_gap:+.4f}", f"{c.test_gap_se:.4f}",
             f"{c.test_gap / c.test_gap_se:.1f}" if c.test_gap_se > 0 else "-",
             f"{c.landed_gap:+.4f}", f"{c.landed_gap_se:.4f}"]
            for c in cells]
    others = [r for r in RULES if r != landed]
    against_landed = [[c.world, c.collection, *[_gap_cell(*c.rule_gaps[r]) for r in others]] for c in cells]
    return [*markdown_table(header, rows), "",
            "Best single model by OOF and on test, the test gap, and the landed rule's distance to the test's "
            "best; standard errors paired over the test graphs:", "",
            *markdown_table(["world", "collection", "test graphs", "OOF best", "test best", "test gap",
                             "its se", "gap / se", f"{landed} - test best", "its se"], gaps), "",
            f"Each rule minus the landed rule ({landed}) on test: mean per-graph gain (its se, paired over the "
            "test graphs); 0 where both apply the same weights:", "",
            *markdown_table(["world", "collection", *others], against_landed), "",
            "mean test/ceiling over the cells: " + ", ".join(f"{e} {v:.4f}" for e, v in ratio.items()),
            "rule - oof-fit per cell: " + "; ".join(
                f"{c.collection} " + " ".join(f"{r} {c.test[r] - c.test['oof-fit']:+.4f}" for r in RULES[1:])
                for c in cells)]


def _gap_cell(gap: float, se: float) -> str:
    return f"{gap:+.4f} ({se:.4f})" if gap != 0 or se != 0 else "0"


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_roots(__doc__, argv)
    landed = landed_rule()
    cells = [cell for root in args.roots for cell in cells_of(root, landed)]
    if not cells:
        raise SystemExit("no finished ensemble stage under " + ", ".join(str(r / "work" / "ensemble") for r in args.roots))
    emit(report(cells, landed), args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
