"""The pure part of benchmarks/blend_rules.py: the candidate blend rules of issue 17's seed-spread clause."""
import math

import pytest

from benchmarks.blend_rules import rule_of, rule_weights


def test_rules_keep_the_fit_only_where_its_gain_is_beyond_two_standard_errors():
    fitted = {"gbdt": 0.2, "gnn": 0.8}
    noisy = rule_weights(fitted, "gnn", gain=0.002, sem=0.003)
    assert noisy["oof-fit"] == fitted and noisy["best"] == {"gbdt": 0.0, "gnn": 1.0}
    assert noisy["sig2"] == noisy["sig3"] == noisy["best"]
    assert noisy["half-shrink"] == pytest.approx({"gbdt": 0.1, "gnn": 0.9})
    assert rule_weights(fitted, "gnn", gain=0.02, sem=0.003)["sig2"] == fitted
    between = rule_weights(fitted, "gnn", gain=0.0084, sem=0.003)  # 2.8 standard errors
    assert between["sig2"] == fitted and between["sig3"] == {"gbdt": 0.0, "gnn": 1.0}
    assert rule_weights(fitted, "gnn", gain=0.02, sem=0.003)["sig3"] == fitted
    assert rule_weights(fitted, "gnn", gain=0.02, sem=math.nan)["sig2"] == {"gbdt": 0.0, "gnn": 1.0}
    assert noisy["sig3-avg"] == noisy["best"]
    assert rule_weights(fitted, "gnn", gain=0.02, sem=0.003)["sig3-avg"] == fitted  # no runs_gain: sig3


def test_sig3_avg_judges_the_gain_expected_at_the_test_runs():
    fitted = {"gbdt": 0.15, "gnn": 0.85}
    # 4.1 standard errors with both seeds, but shrinking with averaging: the GNN alone
    shrinking = rule_weights(fitted, "gnn", gain=0.0037, sem=0.0009, runs_gain=0.0015)
    assert shrinking["sig3"] == fitted and shrinking["sig3-avg"] == {"gbdt": 0.0, "gnn": 1.0}
    assert shrinking["sig2-avg"] == {"gbdt": 0.0, "gnn": 1.0}  # 1.7 standard errors expected
    between = rule_weights(fitted, "gnn", gain=0.0037, sem=0.0009, runs_gain=0.0020)  # 2.2 expected
    assert between["sig2-avg"] == fitted and between["sig3-avg"] == {"gbdt": 0.0, "gnn": 1.0}
    assert rule_weights(fitted, "gnn", gain=0.0037, sem=0.0009, runs_gain=0.0030)["sig3-avg"] == fitted


def test_the_rule_an_ensemble_config_applies_is_named_as_its_column():
    assert rule_of(2.0, "test-runs") == "sig2-avg" and rule_of(3, "oof") == "sig3"
    assert rule_of(0.0, "test-runs") == rule_of(0.0, "oof") == "oof-fit"  # no test: the fit as it is
    with pytest.raises(SystemExit, match="min_gain_se = 2.5"):
        rule_of(2.5, "oof")
