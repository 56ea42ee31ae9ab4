"""The tile anchor: the compiler's default stays among the five picks unless every fold model ranks it
outside its own five."""

from __future__ import annotations

import numpy as np
import pytest
import polars as pl

from pipelines.core.collection import parse_collection
from pipelines.training.anchor import anchor_row, anchor_rows, default_votes

TILE = parse_collection("tile:xla")


def predictions(scores_by_fold: list[list[float]], graph: str = "g", model: str = "gbdt") -> pl.DataFrame:
    rows = [{"collection": "tile:xla", "graph": graph, "split": "test", "config_index": i, "fold": fold, "seed": 0,
             "model": model, "score": float(s)} for fold, scores in enumerate(scores_by_fold) for i, s in enumerate(scores)]
    return pl.DataFrame(rows)


def test_votes_count_the_fold_models_that_put_the_default_in_their_top_five():
    # config 7 is the default: fold 0 ranks it 2nd, fold 1 ranks it 8th, fold 2 ties it with 5 faster-indexed
    scores = [[5, 6, 7, 8, 9, 10, 11, 1, 12, 13], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], [0, 0, 0, 0, 0, 0, 1, 0, 2, 3]]
    assert default_votes(predictions(scores), {"g": 7}) == {"g": (1, 3)}
    assert default_votes(predictions(scores), {"other": 7}) == {}


def test_the_default_replaces_the_fifth_pick_unless_no_fold_model_voted_for_it():
    assert anchor_row([3, 1, 4, 0, 2], 9, (1, 10)) == [3, 1, 4, 0, 9]
    assert anchor_row([3, 1, 4, 0, 2], 9, (0, 10)) == [3, 1, 4, 0, 2]  # confident: every fold model leaves it out
    assert anchor_row([3, 1, 4, 0, 2], 4, (0, 10)) == [3, 1, 4, 0, 2]  # already in
    assert anchor_row([3, 1, 4, 0, 2], 9, None) == [3, 1, 4, 0, 9]  # no votes known: anchored
    rows = {"tile:xla:g": [3, 1, 4, 0, 2], "tile:xla:h": [0, 1, 2, 3, 4]}
    assert anchor_rows(rows, TILE, {"g": 9}, {"g": (2, 5)}) == {"tile:xla:g": [3, 1, 4, 0, 9], "tile:xla:h": [0, 1, 2, 3, 4]}
    layout = {"layout:xla:default:g": [2, 0, 1]}
    assert anchor_rows(layout, parse_collection("layout:xla:default"), {"g": 1}, {}) == layout


def test_an_anchored_row_scores_at_least_the_default_and_loses_only_when_the_fifth_pick_was_best():
    from pipelines.core.metric import tile_score

    runtime = np.array([10.0, 9.0, 8.0, 7.0, 3.0, 5.0, 6.0])  # config 4 fastest; the default is 5
    base = [0, 1, 2, 3, 4]
    assert tile_score(anchor_row(base, 5, None), runtime) < tile_score(base, runtime)  # the fifth pick was best
    missed = [0, 1, 2, 3, 6]  # the fastest missed: the default in place of the fifth pick helps
    assert tile_score(anchor_row(missed, 5, None), runtime) > tile_score(missed, runtime)


@pytest.mark.slow
def test_a_run_keeps_the_named_defaults_in_its_tile_picks_and_predict_repeats_it(tiny_world, tmp_path):
    """On a root whose defaults.json names each tile test graph's default (a config outside the plain
    run's picks, so the anchor has work), a run with the anchor on holds the default in every
    tile row where a fold model voted for it, and `predict` with the run's saved models writes the same
    rows."""
    import json
    import shutil

    from pipelines.config.settings import load_config
    from pipelines.data.root import DataRoot
    from pipelines.data.submission import read_submission
    from pipelines.flows.predict import predict_run
    from pipelines.data.tpugraphs import load_ref
    from pipelines.flows.run import run_pipeline

    root = tmp_path / "root"
    shutil.copytree(tiny_world, root)
    tests = {ref.stem: ref for ref in DataRoot(root).graphs(TILE, "test")}
    config = load_config("smoke", ['ensemble.default_anchor="unless-confident"', "run.seeds=[0]"])
    plain = run_pipeline(load_config("smoke", ["run.seeds=[0]"]), root, work_dir=tmp_path / "work",
                         submissions_dir=tmp_path / "subs", models=["gbdt"])
    before = read_submission(plain.submission)
    # each graph's default: a config outside the plain run's five picks
    defaults = {stem: next(i for i in range(load_ref(ref).num_configs) if i not in before[TILE.submission_id(stem)])
                for stem, ref in tests.items() if load_ref(ref).num_configs > 5}
    (root / "defaults.json").write_text(json.dumps({"tile:xla": defaults}))
    anchored = run_pipeline(config, root, work_dir=tmp_path / "work", submissions_dir=tmp_path / "subs",
                            models=["gbdt"])
    after = read_submission(anchored.submission)
    assert defaults
    for stem, default in defaults.items():
        sid = TILE.submission_id(stem)
        assert after[sid][:4] == before[sid][:4] and len(after[sid]) == len(before[sid])
        assert default in after[sid] or after[sid] == before[sid]
    assert any(default in after[TILE.submission_id(stem)] for stem, default in defaults.items())
    again = predict_run(anchored.run_id, root, submissions_dir=tmp_path / "subs")
    assert again.submission.read_bytes() == anchored.submission.read_bytes()
    always = read_submission(run_pipeline(load_config("smoke", ['ensemble.default_anchor="always"', "run.seeds=[0]"]),
                                          root, work_dir=tmp_path / "work", submissions_dir=tmp_path / "subs",
                                          models=["gbdt"]).submission)
    assert all(always[TILE.submission_id(stem)] == [*before[TILE.submission_id(stem)][:4], default]
               for stem, default in defaults.items())


@pytest.mark.slow
def test_the_real_records_smoke_benchmark_ranks_them_next_to_the_default_first_baselines(tiny_world, tmp_path):
    """benchmarks.real_records: the real records through records and predict with a run's models; the
    default-first rows hold each graph's default first, and every entry is scored."""
    from benchmarks import real_records
    from pipelines.config.settings import load_config
    from pipelines.flows.run import run_pipeline

    if not (real_records.REAL / "op_tuning_data.pb").is_file():
        pytest.skip("../shared/real_tpu is not here")
    run = run_pipeline(load_config("smoke", ["run.seeds=[0]"]), tiny_world, work_dir=tmp_path / "work",
                       submissions_dir=tmp_path / "subs", models=["gbdt"])
    out = tmp_path / "real.md"
    assert real_records.main(["--run", run.run_id, "--submissions-dir", str(tmp_path / "subs"), "--out", str(out)]) == 0
    text = out.read_text()
    assert "| tile:xla, 8 kernels > 5 configs |" in text and "| layout:xla:default |" in text
    root = real_records.real_records_root(tmp_path / "root")
    defaults = root.defaults()
    published = {TILE.submission_id(stem): [0, 1, 2, 3, 4] for stem in defaults["tile:xla"]}
    rows = real_records.baseline_rows(published, {"tile:xla": {s: 4 for s in defaults["tile:xla"]}})
    assert all(row[0] == 4 for row in rows["default_first"].values())
    assert rows["default_in_five"] == published  # 4 is among the five already
