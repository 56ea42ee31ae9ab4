import math

import numpy as np
import pytest

from benchmarks.in_sample_fit import fold_taus, taus_on_test


def test_each_fold_model_is_scored_on_its_own_graphs_apart_from_its_held_out_fold():
    runtimes = [np.array([1.0, 2.0, 3.0]), np.array([3.0, 1.0, 2.0]), np.array([5.0, 5.0, 5.0])]
    folds = [0, 1, 1]
    right = [r.copy() for r in runtimes]  # costs in the runtimes' order: tau 1
    backwards = [-r for r in runtimes]  # tau -1
    taus = fold_taus({0: [backwards[0], right[1], right[2]],   # fold 0's model: own graphs 1, 2; held out 0
                      1: [right[0], backwards[1], backwards[2]]}, runtimes, folds)
    # own: model 0 on graph 1 (+1), graph 2 (constant runtimes: NaN, left out); model 1 on graph 0 (+1)
    assert taus["own"] == 1.0
    # held out: model 0 on graph 0 (-1); model 1 on graphs 1 (-1) and 2 (NaN)
    assert taus["held_out"] == -1.0
    assert math.isnan(fold_taus({}, runtimes, folds)["own"])
    # a holdout graph (fold -1) is no model's own graph nor any fold's held-out one
    with_holdout = fold_taus({0: [backwards[0], right[1], right[2], backwards[0]],
                              1: [right[0], backwards[1], backwards[2], backwards[0]]},
                             [*runtimes, runtimes[0]], [*folds, -1])
    assert with_holdout == taus


def test_test_graphs_are_scored_per_fold_model_and_by_the_fold_models_mean_score():
    runtimes = [np.array([1.0, 2.0, 3.0, 4.0]), np.array([4.0, 3.0, 1.0, 2.0])]
    right = [r.copy() for r in runtimes]  # tau 1
    half_backwards = [-0.5 * r for r in runtimes]  # tau -1, with a smaller spread than the right costs
    taus = taus_on_test({0: right, 1: half_backwards}, runtimes)
    assert taus["test_one"] == 0.0  # one model right, one backwards on both graphs
    assert taus["test_mean"] == 1.0  # their mean, 0.5 x the runtimes, is in the runtimes' order
    assert math.isnan(taus_on_test({}, runtimes)["test_mean"])


def test_a_stage_is_traced_to_the_world_it_was_prepared_from_among_worlds_that_share_graph_names(tiny_world, tmp_path):
    import os
    import shutil

    from benchmarks.in_sample_fit import stage_world
    from pipelines.config.settings import load_config
    from pipelines.core.collection import parse_collection
    from pipelines.flows.prepare import collection_refs, prepare_collection

    collection = parse_collection("layout:xla:random")
    source, twin = tmp_path / "source", tmp_path / "twin"
    shutil.copytree(tiny_world, source)
    shutil.copytree(source, twin)  # the same graph names and bytes, as worlds over one program set have
    prepared = prepare_collection(load_config("smoke"), collection, source, tmp_path / "work")
    key = prepared.stages["node_arrays"].key
    with pytest.raises(SystemExit, match="2 .* of --worlds hold"):  # identical files: either could be it
        stage_world(tmp_path / "work", key, collection.name, [twin, source])
    first = collection_refs(twin, collection)["train"][0].path
    os.utime(first, (first.stat().st_atime, first.stat().st_mtime + 60))  # now the twin's files differ
    assert stage_world(tmp_path / "work", key, collection.name, [twin, source]) == source
    with pytest.raises(SystemExit, match="none of --worlds hold"):
        stage_world(tmp_path / "work", key, collection.name, [twin])
