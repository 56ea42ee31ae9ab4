"""Test scores on several cost-model variant worlds: floor, each model, ensemble and ceiling per collection.

For each variant: ``synth --scale SCALE --variant N`` (timed), ``run`` with the given config (timed:
the wall time of one full run), then ``evaluate`` on the world's hidden test labels. Prints (and writes
to ``benchmarks/results/``) the table floor / each model / ensemble / ceiling per collection and
combined, as mean +- spread (standard deviation) over the worlds, the ensemble against the best single
model and that model's run seeds alone (``pipelines.flows.evaluate.seed_checks``), and the wall times.

    python -m benchmarks.evaluation_worlds                          # base config, variants 1,2,3, medium
    python -m benchmarks.evaluation_worlds --variants 1 --config demo --models gbdt
    python -m benchmarks.evaluation_worlds --variants 4 --collections layout:xla:random
    python -m benchmarks.evaluation_worlds --scale small --families reference,mxu_strict --seeds 1,2,3 --config demo
    python -m benchmarks.evaluation_worlds --worlds data/world-a,data/world-b --config demo

``--families`` (default ``reference``) and ``--seeds`` (default ``--seed``) multiply the worlds:
one per family, seed and (for ``reference`` only) variant; non-reference families take variant 0.
Besides the pooled table, each family gets its own ensemble/ceiling per collection, and the
per-(collection, program family) share of ceiling is reported as mean +- spread over each family's
worlds (docs/transfer-protocol.md). Every test graph of every world, with its program, size and
scores (``pipelines.flows.evaluate.per_graph_table``), goes to ``<out>.per-graph.csv`` beside it.
Both files are written again after each world, marked partial until the last, so a stopped run
keeps the worlds it scored, and the same command run again finishes them in place (the scored worlds'
stages come from the cache); any other results file that exists is refused before any world runs.

``--worlds`` scores existing worlds instead (a lowered world, an outside author's world with its
``labels/labels.json`` and ``labels/programs.json``): nothing is generated, and each world's "family"
is its label record's generator (and family, where it names one).

``--collections`` trains, blends and scores those collections only (no submission is published, and
"combined" is then their mean): the same stages a full run computes for them, so their scores are
the ones a full run gives, for a fraction of its time (an idea tried on one collection, or a run that
a time limit cut, finished one collection at a time).

Worlds, the stage cache and the runs go under ``benchmarks/worlds/`` (not committed); a world or a
cached stage made earlier is reused (its generation time is then reported as 0; the stages' own
wall times, read from their manifests, still give the run's compute time).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import polars as pl

from benchmarks.common import RESULTS, WORLDS, machine, markdown_table
from pipelines.core.atomic import write_text_atomic
from pipelines.core.parallel import terminate_as_interrupt


PARTIAL_MARK = "**Partial: "  # opens the line that marks a results file partial


def _spread(values: list[float]) -> str:
    values = [v for v in values if v is not None and not math.isnan(v)]
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.4f}"
    return f"{np.mean(values):.4f} +- {np.std(values):.4f}"


def _partial_report_of(out: Path, command_line: str) -> bool:
    """Whether ``out`` is a results file that a stopped run of this very command (its ``command_line``, as the
    report writes it) left partial: a rerun finishes it in place; any other file there (complete, or another
    command's) is never overwritten."""
    if not out.is_file():
        return False
    text = out.read_text(errors="replace")
    return PARTIAL_MARK in text and command_line in text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", default="medium")
    parser.add_argument("--seed", type=int, default=0, help="world seed (the same graphs under every variant)")
    parser.add_argument("--variants", default="1,2,3", help="comma-separated cost-model variants (reference only)")
    parser.add_argument("--families", default="reference",
                        help="comma-separated cost-model families (pipelines/synth/families)")
    parser.add_argument("--seeds", default=None, help="comma-separated world seeds (default: --seed)")
    parser.add_argument("--recurrent", action=argparse.BooleanOptionalAction, default=None,
                        help="recurrent programs in the worlds (default: in every family's but reference's; "
                             "--recurrent puts them in reference worlds too, so all families share programs)")
    parser.add_argument("--config", default=None, help="run config (default: base)")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--models", default=None, help="comma-separated models (default: the config's)")
    parser.add_argument("--collections", default=None,
                        help="comma-separated collections to train and score (default: all five, as a published run)")
    parser.add_argument("--worlds", default=None,
                        help="comma-separated existing world roots scored as they are (no synth worlds generated)")
    parser.add_argument("--jobs", type=int, default=2, help="synth worker processes")
    parser.add_argument("--root", type=Path, default=WORLDS)
    parser.add_argument("--out", type=Path, default=None, help="results file (default: benchmarks/results/...)")
    args = parser.parse_args(argv)

    from pipelines.core.collection import parse_collections
    from pipelines.config.settings import load_config
    from pipelines.flows.evaluate import (
        CEILING,
        FLOOR,
        SUBMISSION,
        evaluate_collection_runs,
        evaluate_collection_seeds,
        evaluate_rows,
        evaluate_run,
        model_rows,
        per_graph_table,
        program_family_table,
        seed_checks,
    )
    from pipelines.core.logs import setup_logging
    from pipelines.flows.run import parse_models, run_pipeline, stage_index, stages_wall_time, train_and_blend
    from pipelines.synth import generate_world
    from pipelines.synth.families import REFERENCE, load_family
    from pipelines.synth.world import program_families, program_kinds, read_labels_marker

    setup_logging()  # the runs' progress lines, as the command line prints them
    host = machine()
    started = time.perf_counter()
    config = load_config(args.config, args.overrides)
    variants = [int(v) for v in args.variants.split(",") if v.strip()]
    families = [f.strip() for f in args.families.split(",") if f.strip()]
    world_seeds = [int(x) for x in (args.seeds or str(args.seed)).split(",") if x.strip()]
    for family in families:
        load_family(family)  # a missing family module fails before any world is written
    worlds = [(family, seed, variant if family == REFERENCE else 0) for family in families for seed in world_seeds
              for variant in (variants if family == REFERENCE else [0])]
    given: dict[tuple[str, int, int], Path] = {}
    if args.worlds:
        worlds, families = [], []
        for root in (Path(w.strip()) for w in args.worlds.split(",") if w.strip()):
            marker = read_labels_marker(root)
            if marker is None:
                raise SystemExit(f"{root}: no labels/labels.json: not a world with hidden labels")
            family = "/".join(str(marker[k]) for k in ("generator", "family") if marker.get(k))
            key = (family, int(marker["seed"]), len(given))  # the third part keeps two worlds of one record apart
            worlds.append(key)
            given[key] = root
            families += [family] if family not in families else []
    collections = None if args.collections is None else list(parse_collections(args.collections))
    out = args.out or RESULTS / f"{datetime.now(timezone.utc):%Y-%m-%d-%H%M}-evaluation-worlds.md"
    per_graph = out.with_suffix(".per-graph.csv")  # every test graph of every world, for a per-graph look
    command = " ".join(["python -m benchmarks.evaluation_worlds", *(argv if argv is not None else sys.argv[1:])])
    command_line = f"Command: `{command}`"  # the report's line naming the command that wrote it
    resuming = _partial_report_of(out, command_line)
    for target in (out, per_graph):
        if target.exists() and not resuming:  # refused before any world is run, not after it
            raise SystemExit(f"{target} exists; pass another --out (only a partial report of this very command "
                             "is finished in place)")
    if resuming:
        print(f"{out}: a partial report of this command; finishing it (the worlds it scored come from the stage "
              "cache)", flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)

    def report() -> str:
        """The results file's text for the worlds scored so far (marked partial until all are)."""
        entries = [FLOOR, *results[0].model_names, SUBMISSION, CEILING]
        header = ["collection", *[("ensemble" if e == SUBMISSION else e) for e in entries], "ensemble/ceiling"]
        rows = []
        names = list(results[0].collection_scores(CEILING))
        for name in names:
            row = [name]
            for entry in entries:
                row.append(_spread([r.collection_scores(entry).get(name, math.nan) for r in results]))
            row.append(_spread([r.collection_scores(SUBMISSION)[name] / r.collection_scores(CEILING)[name]
                                for r in results]))
            rows.append(row)
        row = ["combined" if collections is None else "combined (these collections)"]
        for entry in entries:
            row.append(_spread([r.reports[entry].combined.value for r in results]))
        row.append(_spread([r.reports[SUBMISSION].combined.value / r.reports[CEILING].combined.value for r in results]))
        rows.append(row)
        floors = {v: r.floor_by_collection for (v, *_), r in zip(timings, results)}
        by_family_rows = []
        for family in families:
            mine = [r for (f, *_), r in zip(worlds, results) if f == family]
            for name in names:
                by_family_rows.append([family, name, _spread([r.collection_scores(SUBMISSION)[name]
                                                              / r.collection_scores(CEILING)[name] for r in mine])])
            by_family_rows.append([family, "combined", _spread([r.reports[SUBMISSION].combined.value
                                                                / r.reports[CEILING].combined.value for r in mine])])
        cells: dict[tuple[str, str, str], list[tuple[float, int]]] = {}
        for family, table in family_tables:
            for row in table.iter_rows(named=True):
                cells.setdefault((family, row["collection"], row["program_family"]), []).append(
                    (row["share_of_ceiling"], row["graphs"]))
        program_rows = [[f, c, k, _spread([v for v, _ in vals]), f"{sum(g for _, g in vals)} in {len(vals)}"]
                        for (f, c, k), vals in cells.items()]

        run_column = "full run s" if collections is None else "run s (these collections)"
        stage_column = "its stages s (computed once, cached or not)"
        lines = [f"# Evaluation worlds {datetime.now(timezone.utc).isoformat(timespec='minutes')}", "",
                 "## Machine", "", *host.describe(), "",
                 (f"## Test scores (worlds {', '.join(str(p) for p in given.values())}; " if given else
                  f"## Test scores ({args.scale} scale, families {', '.join(families)}, "
                  f"seeds {', '.join(map(str, world_seeds))}, "
                  f"variants {', '.join(map(str, variants))} (reference); ") +
                 f"config {args.config or 'base'} {' '.join('--set ' + o for o in args.overrides)}; "
                 + ("" if collections is None else f"collections {', '.join(c.name for c in collections)}; ") +
                 f"mean +- std over {len(results)} world(s))", "",
                 command_line, "",
                 "floor: best heuristic per collection, picked on the test labels; ceiling: configs ranked by their "
                 "noise-free runtime, scored against the measured ones; tile: top-5 slowdown score, layout: "
                 "Kendall tau-b.",
                 "", *markdown_table(header, rows), "",
                 "Floor heuristic per world: " + "; ".join(f"{v}: " + ", ".join(f"{c} {h}" for c, h in f.items())
                                                          for v, f in floors.items()), "",
                 "## Per family: ensemble / ceiling (mean +- std over the family's worlds)", "",
                 *markdown_table(["family", "collection", "ensemble/ceiling"], by_family_rows), "",
                 "## Per program family: ensemble / ceiling (mean +- std over the family's worlds)", "",
                 *markdown_table(["family", "collection", "program family", "ensemble/ceiling",
                                  "test graphs in worlds"],
                                 program_rows), "",
                 "## The ensemble against the best single model", "",
                 "Per world and collection: the model that scores best on test, its run seeds alone (that seed's fold "
                 "models averaged, as the submission averages all), their spread (max - min), and the ensemble's "
                 "distance to that model; issue 17 asks for it to stay within the spread. 'its se': that distance's "
                 "standard error paired over the test graphs (how far the test's own graphs can tell the two "
                 "apart).", "",
                 *markdown_table(["world", "collection", "best single", "its score", "its run seeds", "seed spread",
                                  "ensemble - best", "its se", "within the spread"],
                                 [[v, c.collection, c.best_model, f"{c.best_score:.4f}",
                                   " / ".join(f"{x:.4f}" for x in c.seed_scores), f"{c.spread:.4f}", f"{c.gap:+.4f}",
                                   f"{c.gap_se:.4f}", "yes" if c.within_spread else "no"] for v, c in checks]), "",
                 "## Wall times", "",
                 *markdown_table(["world", "folder", "run-id", "synth s", run_column, stage_column, "evaluate s"],
                                 [[v, str(w), rid, s, r, st, e] for v, w, rid, s, r, st, e in timings]), "",
                 f"'{stage_column}': the sum of the stage manifests' wall times, the run's compute also when it "
                 "resumed from the stage cache (its own wall time then counts only what this call computed); a lower "
                 "bound when a training stage itself was cut and resumed from its finished fold jobs.", "",
                 f"benchmark wall time {(time.perf_counter() - started) / 60:.1f} min"]
        if len(results) < len(worlds):
            lines[1:1] = ["", f"{PARTIAL_MARK}{len(results)} of {len(worlds)} worlds scored** (the run was stopped "
                          "or is still going; rerun the command, the same --out included, to finish this file: "
                          "finished stages come from the cache)."]
        return "\n".join(lines) + "\n"

    def write() -> str:
        text = report()
        write_text_atomic(out, text)
        write_text_atomic(per_graph, pl.concat(graph_tables, how="vertical_relaxed").write_csv())
        return text

    work, submissions = args.root / "work", args.root / "submissions"
    results, timings, checks, family_tables, graph_tables = [], [], [], [], []
    for family, seed, variant in worlds:
        label = f"{family} seed {seed}" + (f" variant {variant}" if family == REFERENCE else "")
        world = given.get((family, seed, variant)) or args.root / (
            (f"{args.scale}-seed{seed}-variant{variant}" if family == REFERENCE
             else f"{args.scale}-seed{seed}-{family}")
            + {None: "", True: "-rnn", False: "-nornn"}[args.recurrent])
        t0 = time.perf_counter()
        if (family, seed, variant) in given:
            label = f"{family} seed {seed} ({world})"
        else:
            print(generate_world(world, scale=args.scale, seed=seed, variant=variant, jobs=args.jobs, family=family,
                                 recurrent=args.recurrent), flush=True)
        synth_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        if collections is None:
            run = run_pipeline(config, world, work_dir=work, models=parse_models(args.models),
                               submissions_dir=submissions)
            run_id, stages, manifest = run.run_id, run.manifest["stages"], run.manifest
        else:
            runs, _ = train_and_blend(config, world, work_dir=work, models=parse_models(args.models),
                                      collections=collections)
            run_id, stages = "(not published)", stage_index(runs)
        run_s = time.perf_counter() - t0
        stage_s = stages_wall_time(stages, work)
        t0 = time.perf_counter()
        if collections is None:
            evaluation, path = evaluate_run(run_id, world, submissions_dir=submissions)
            seeds = evaluate_rows(world, model_rows(manifest, work, per_seed=True))
        else:
            evaluation, path = evaluate_collection_runs(runs, world, method=config.ensemble.method), None
            seeds = evaluate_collection_seeds(runs, world, method=config.ensemble.method)
        checks += [(label, check) for check in seed_checks(evaluation, seeds)]
        family_tables.append((family, program_family_table(evaluation, program_kinds(world))))
        graph_tables.append(per_graph_table(evaluation, program_families(world)).select(
            pl.lit(family).alias("family"), pl.lit(seed).alias("seed"), pl.all()))
        evaluate_s = time.perf_counter() - t0
        print(evaluation.to_text(), flush=True)
        print(f"{label}: synth {synth_s:.0f} s, run {run_s:.0f} s (its stages {stage_s:.0f} s), "
              f"evaluate {evaluate_s:.0f} s"
              + (f"; {path}" if path else ""), flush=True)
        results.append(evaluation)
        timings.append((label, world, run_id, synth_s, run_s, stage_s, evaluate_s))
        if len(results) < len(worlds):
            write()  # a stop mid-list keeps the worlds scored so far

    print(write())
    print(out, per_graph, sep="\n")
    return 0


if __name__ == "__main__":
    with terminate_as_interrupt():  # a killed run stops its fold jobs too
        raise SystemExit(main())
