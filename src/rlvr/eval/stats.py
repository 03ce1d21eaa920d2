"""Estimates with honest uncertainty for evaluation results: means with confidence intervals whose
independent unit is the example (rollouts of one example share its difficulty), with Student's t
(evaluations often have few examples). pass@k is `rlvr.pass_at_k`; `percentile` serves the
benchmarks' latency summaries.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from scipy.stats import t as student_t

LEVEL = 0.95


@dataclass(frozen=True)
class Estimate:
    """A mean with its 95% confidence interval over `n` independent units (examples).

    `low` and `high` are None when `n` < 2: one unit says nothing about the spread.
    """

    mean: float
    low: float | None
    high: float | None
    n: int


def clustered_mean(clusters: Sequence[Sequence[float]]) -> Estimate:
    """The mean over all values with a 95% CI clustered by example (`clusters[i]`: example
    i's rollout rewards): the cluster-robust (CR1) standard error, t on G-1 degrees of freedom.
    It equals the standard error of per-example means when every example has equal counts."""
    clusters = [list(c) for c in clusters if len(c)]
    if not clusters:
        raise ValueError("no values to estimate a mean from")
    values = [v for c in clusters for v in c]
    mean = math.fsum(values) / len(values)
    g = len(clusters)
    if g < 2:
        return Estimate(mean, None, None, g)
    squares = math.fsum(math.fsum(v - mean for v in c) ** 2 for c in clusters)
    se = math.sqrt(g / (g - 1) * squares) / len(values)
    half = float(student_t.ppf(0.5 + LEVEL / 2, g - 1)) * se
    return Estimate(mean, mean - half, mean + half, g)


def mean_with_ci(values: Sequence[float]) -> Estimate:
    """The mean of independent values (e.g. paired per-example differences) with a 95% t CI."""
    return clustered_mean([[v] for v in values])


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100), interpolating linearly between the closest ranks (numpy's
    default; q=50 is the median). NaN when there are no values."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    position = min(max(q, 0.0), 100.0) / 100 * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)
