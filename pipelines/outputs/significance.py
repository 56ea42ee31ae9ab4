"""Is a difference between two runs real? Paired tests on per-graph scores, and a test over seeds.

Pure functions only (arrays in, a :class:`Difference` out); the I/O that finds the scores is in
:mod:`pipelines.outputs.graph_scores`.

Over graphs (:func:`paired_difference`): ``d_g = b_g - a_g`` on the graphs both runs scored. Under
"no difference" A and B are exchangeable on every graph, so each ``d_g`` is as likely to carry either
sign: the sign-flip (randomisation) test compares the observed weighted mean of ``d`` with its value
under every sign vector (all ``2^n`` of them up to :data:`EXACT_MAX_GRAPHS` graphs, else
:data:`RANDOM_FLIPS` drawn with an explicit seed). The 95% interval is the set of shifts ``delta`` the
same test does not reject for ``d - delta``, so the interval holds 0 exactly when the test does not
reject: the verdict and the interval never disagree. With fewer than 6 graphs no sign vector is rare
enough (2/2^5 > 5%) and the verdict says so. Exact ties (``d_g = 0``: tile graphs whose top-5 both
runs got alike) carry no sign at shift 0 but do at any other shift, so the shifts the test does not
reject can be a range beside 0 plus 0 itself; the interval is the smallest one holding them all (0
included whenever the p-value at 0 is at least the level), so interval, p-value and verdict come from
one computation and agree. Weights make it stratified: the combined score (mean of the collection
means) gives each graph ``1 / (collections * graphs of its collection)``.

Every test takes its level ``alpha`` (default 5%): ``runs compare`` tests its secondary rows at a
Bonferroni-corrected level, and the interval is then the ``1 - alpha`` one.

Over seeds (:func:`seed_difference`): the per-seed scores of the two runs are independent samples;
Welch's interval of the difference of their means (2 seeds or more on each side).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

ALPHA = 0.05
EXACT_MAX_GRAPHS = 14  # up to 2^14 sign vectors enumerated; beyond, RANDOM_FLIPS drawn
RANDOM_FLIPS = 20_000
_TOLERANCE = 1e-12

B_BETTER, A_BETTER, NO_DIFFERENCE = "B better", "A better", "no detectable difference"


@dataclass(frozen=True)
class Difference:
    """B - A: mean difference, its 95% interval, the test's p-value, how many pairs, the verdict."""

    mean: float
    low: float
    high: float
    p_value: float
    n: int
    verdict: str
    method: str  # "sign-flip (graphs)" or "Welch (seeds)"

    def to_dict(self) -> dict[str, float | int | str]:
        return {"mean": self.mean, "low": self.low, "high": self.high, "p_value": self.p_value, "n": self.n,
                "verdict": self.verdict, "method": self.method}

    def text(self) -> str:
        if self.n == 0 or math.isnan(self.mean):
            return "no pairs to compare"
        interval = "-" if math.isnan(self.low) else f"[{self.low:+.4f}, {self.high:+.4f}]"
        return f"{self.mean:+.4f} 95% {interval} p={self.p_value:.3f} n={self.n}: {self.verdict}"


def _verdict(low: float, high: float, rejectable: bool, p_value: float, alpha: float = ALPHA) -> str:
    if not rejectable:
        return f"{NO_DIFFERENCE} (too few pairs to detect any" + (")" if alpha == ALPHA else f" at {alpha:.2%})")
    if p_value < alpha and low > 0:
        return B_BETTER
    if p_value < alpha and high < 0:
        return A_BETTER
    return NO_DIFFERENCE


def sign_matrix(n: int, seed: int = 0) -> np.ndarray:
    """Rows of +-1: every sign vector of length ``n`` (n <= EXACT_MAX_GRAPHS), else RANDOM_FLIPS drawn
    with ``seed`` plus the identity (so the observed statistic is always one of them)."""
    if n <= EXACT_MAX_GRAPHS:
        return np.array(list(itertools.product((1.0, -1.0), repeat=n)), dtype=np.float64).reshape(-1, n)
    rng = np.random.default_rng(seed)
    flips = rng.choice(np.array([1.0, -1.0]), size=(RANDOM_FLIPS, n))
    return np.vstack([np.ones((1, n)), flips])


def paired_difference(a: Sequence[float], b: Sequence[float], weights: Sequence[float] | None = None, *,
                      seed: int = 0, alpha: float = ALPHA) -> Difference:
    """Sign-flip test at level ``alpha`` and inverted-test ``1 - alpha`` interval of the (weighted) mean
    of ``b - a`` (see module).

    ``a``, ``b``: per-graph scores, aligned; pairs with a NaN are left out. ``weights`` (default equal)
    are renormalised over the pairs kept. ``seed`` only matters above EXACT_MAX_GRAPHS pairs.
    """
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"paired scores must be aligned, got {a.shape} and {b.shape}")
    w = np.ones_like(a) if weights is None else np.asarray(weights, dtype=np.float64)
    keep = np.isfinite(a) & np.isfinite(b) & np.isfinite(w) & (w > 0)
    d, w = (b - a)[keep], w[keep]
    n = int(d.shape[0])
    if n == 0:
        nan = math.nan
        return Difference(nan, nan, nan, nan, 0, "no pairs to compare", "sign-flip (graphs)")
    w = w / w.sum()
    signs = sign_matrix(n, seed)
    s_wd, s_w = signs @ (w * d), signs @ w  # statistic at shift delta: s_wd - delta * s_w
    observed = float(w @ d)

    def p_at(delta: float) -> float:
        stats = np.abs(s_wd - delta * s_w)
        return float(np.mean(stats >= abs(observed - delta) - _TOLERANCE * (1 + abs(observed - delta))))

    p_value = p_at(0.0)
    rejectable = (2.0 if n <= EXACT_MAX_GRAPHS else 1.0) / signs.shape[0] < alpha  # the smallest p-value there is
    if not rejectable:
        return Difference(observed, math.nan, math.nan, p_value, n, _verdict(0, 0, False, p_value, alpha),
                          "sign-flip (graphs)")
    spread = float(np.max(np.abs(d - observed))) or 0.0

    def edge(direction: float) -> float:
        """The interval's end on one side: bisection between the mean (never rejected) and a shift
        every sign vector but the two constant ones reject."""
        inside, outside = observed, observed + direction * (spread + 1e-12)
        if p_at(outside) >= alpha:  # cannot happen once rejectable, kept for safety
            return outside
        for _ in range(60):
            middle = (inside + outside) / 2
            if p_at(middle) >= alpha:
                inside = middle
            else:
                outside = middle
            if abs(outside - inside) <= 1e-9 * (1 + spread):
                break
        return inside

    low, high = edge(-1.0), edge(+1.0)
    if p_value >= alpha:  # 0 is not rejected: it belongs to the interval (ties can leave it beside the range)
        low, high = min(low, 0.0), max(high, 0.0)
    return Difference(observed, low, high, p_value, n, _verdict(low, high, True, p_value, alpha),
                      "sign-flip (graphs)")


def seed_difference(a: Sequence[float], b: Sequence[float], alpha: float = ALPHA) -> Difference:
    """Welch's ``1 - alpha`` interval and two-sided p-value of ``mean(b) - mean(a)`` over independent
    per-seed scores; fewer than 2 seeds on a side: no test (verdict says so)."""
    from scipy import stats

    a = np.asarray([v for v in a if v is not None and math.isfinite(v)], dtype=np.float64)
    b = np.asarray([v for v in b if v is not None and math.isfinite(v)], dtype=np.float64)
    n = int(min(a.shape[0], b.shape[0]))
    if a.shape[0] == 0 or b.shape[0] == 0:
        return Difference(math.nan, math.nan, math.nan, math.nan, 0, "no pairs to compare", "Welch (seeds)")
    mean = float(b.mean() - a.mean())
    if n < 2:
        return Difference(mean, math.nan, math.nan, math.nan, n, f"{NO_DIFFERENCE} (fewer than 2 seeds on a side)",
                          "Welch (seeds)")
    va, vb = a.var(ddof=1) / a.shape[0], b.var(ddof=1) / b.shape[0]
    se = math.sqrt(va + vb)
    if se == 0:
        verdict = NO_DIFFERENCE if mean == 0 else (B_BETTER if mean > 0 else A_BETTER)
        return Difference(mean, mean, mean, 0.0 if mean else 1.0, n, verdict, "Welch (seeds)")
    dof = (va + vb) ** 2 / ((va ** 2 / (a.shape[0] - 1)) + (vb ** 2 / (b.shape[0] - 1)))
    half = float(stats.t.ppf(1 - alpha / 2, dof)) * se
    p_value = float(2 * stats.t.sf(abs(mean) / se, dof))
    low, high = mean - half, mean + half
    return Difference(mean, low, high, p_value, n, _verdict(low, high, True, p_value, alpha), "Welch (seeds)")
