import math

import numpy as np

from benchmarks.in_sample_fit import fold_taus


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
