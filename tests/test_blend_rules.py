"""The pure part of benchmarks/blend_rules.py: the candidate blend rules of issue 17's seed-spread clause."""
import math

import pytest

from benchmarks.blend_rules import RULES, Cell, report, rule_of, rule_weights


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


def test_the_report_puts_every_other_rule_against_the_landed_one_with_its_test_se():
    weights = rule_weights({"gbdt": 0.25, "gnn": 0.75}, "gnn", gain=0.0032, sem=0.0009, runs_gain=0.0021)
    test = {"gbdt": 0.22, "gnn": 0.28, **{r: 0.25 for r in RULES}, "best": 0.28, "sig3-avg": 0.28, "ceiling": 0.25}
    gaps = {r: (0.03, 0.0233) if weights[r] == weights["best"] else (0.0, 0.0) for r in RULES if r != "sig2-avg"}
    cell = Cell("w", "layout:nlp:default", weights, 0.0032, 0.0009, 0.0021, test, "gnn", 0.0, 0.0,
                -0.03, 0.0233, gaps, 18)
    lines = report([cell], "sig2-avg")
    header = next(line for line in lines if line.startswith("| world | collection | oof-fit | best"))
    assert header.split(" | ")[2:] == ["oof-fit", "best", "sig2", "sig3", "sig3-avg", "half-shrink |"]
    row = lines[lines.index(header) + 2].split(" | ")
    assert row[2:] == ["0", "+0.0300 (0.0233)", "0", "0", "+0.0300 (0.0233)", "0 |"]  # sig3: 3.6 se on OOF
