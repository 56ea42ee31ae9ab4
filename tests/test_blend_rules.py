"""The pure parts of benchmarks/blend_rules.py: the candidate blend rules of issue 17's seed-spread clause."""
import math

import numpy as np
import pytest

from benchmarks.blend_rules import paired_gain, rule_weights


def test_paired_gain_is_the_mean_and_standard_error_of_per_graph_differences():
    blend = np.array([0.5, 0.7, np.nan, 0.9])
    single = np.array([0.4, 0.7, 0.2, 0.6])
    gain, sem = paired_gain(blend, single)
    diffs = np.array([0.1, 0.0, 0.3])  # the undefined graph is left out
    assert gain == pytest.approx(diffs.mean())
    assert sem == pytest.approx(diffs.std(ddof=1) / math.sqrt(3))
    assert math.isnan(paired_gain(np.array([0.5]), np.array([0.4]))[1])  # one graph: no error estimate


def test_rules_keep_the_fit_only_where_its_gain_is_beyond_two_standard_errors():
    fitted = {"gbdt": 0.2, "gnn": 0.8}
    noisy = rule_weights(fitted, "gnn", gain=0.002, sem=0.003)
    assert noisy["oof-fit"] == fitted and noisy["best"] == {"gbdt": 0.0, "gnn": 1.0}
    assert noisy["sig2"] == noisy["best"]
    assert noisy["half-shrink"] == pytest.approx({"gbdt": 0.1, "gnn": 0.9})
    assert rule_weights(fitted, "gnn", gain=0.02, sem=0.003)["sig2"] == fitted
    assert rule_weights(fitted, "gnn", gain=0.02, sem=math.nan)["sig2"] == {"gbdt": 0.0, "gnn": 1.0}
