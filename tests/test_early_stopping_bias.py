"""The pure part of benchmarks/early_stopping.py: the held-out score early stopping selects on itself."""
import math

import pytest

from benchmarks.early_stopping import fold_inflations


def test_each_fold_is_judged_at_the_epoch_the_other_folds_of_its_seed_choose():
    curves = {
        (0, 0): [0.5, 0.9, 0.55],  # peaks at epoch 2 where the others do not: inflated by 0.35
        (1, 0): [0.6, 0.5, 0.8],
        (2, 0): [0.6, 0.5, 0.9, 0.7],  # ran a fourth epoch: compared over the three every fold ran
        (0, 1): [0.1, 0.2],  # another seed: never mixed in
        (1, 1): [0.3, 0.1],
    }
    by_model = {(f.fold, f.seed): f for f in fold_inflations(curves)}
    assert by_model[(0, 0)].best == 0.9 and by_model[(0, 0)].at_others_choice == 0.55  # others' mean peaks at 3
    assert by_model[(0, 0)].inflation == pytest.approx(0.35) and by_model[(0, 0)].at_last == 0.55
    assert by_model[(1, 0)].at_others_choice == 0.8  # others' mean (0.55, 0.7, 0.725) peaks at 3
    # others' mean (0.55, 0.7, 0.675) peaks at 2; its own best (0.9) counts whatever epoch it ran
    assert by_model[(2, 0)].best == 0.9 and by_model[(2, 0)].inflation == pytest.approx(0.9 - 0.5)
    assert by_model[(0, 1)].at_others_choice == 0.1 and by_model[(1, 1)].at_others_choice == 0.1
    assert all(f.inflation >= 0 for f in by_model.values())  # the best epoch is never below another


def test_unscored_epochs_are_left_out_and_a_lone_fold_is_refused():
    (f0, _) = fold_inflations({(0, 0): [math.nan, 0.4, 0.5], (1, 0): [math.nan, 0.7, 0.2]})
    assert f0.best == 0.5 and f0.at_others_choice == 0.4
    with pytest.raises(ValueError, match="no other fold"):
        fold_inflations({(0, 0): [0.1, 0.2]})
