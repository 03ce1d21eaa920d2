"""pass@k: the chance that at least one of k rollouts of an example succeeds, estimated without
bias from n rollouts of which c succeeded (Chen et al., 2021). Used while training (the rollout
worker's evaluations) and after it (`rlvr.eval.report`)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from statistics import fmean

SUCCESS_TOLERANCE = 1e-9
"""A weighted rubric sum meant to be exactly 1.0 can come out as 0.9999999999999999: rounding
must not turn a success into a failure."""


def succeeded(reward: float, bar: float) -> bool:
    """reward >= bar, up to float rounding (`SUCCESS_TOLERANCE`)."""
    return reward >= bar - SUCCESS_TOLERANCE


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased estimate of the chance that at least one of k rollouts drawn without replacement
    from n, of which c succeeded, succeeds: 1 - C(n-c, k) / C(n, k)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def k_values(n: int) -> list[int]:
    """The k reported for n rollouts per example: 1, 2, 4, ... up to n."""
    return [2**i for i in range(n.bit_length())]


def mean_pass_at_k(tallies: Iterable[tuple[int, int]]) -> dict[int, float]:
    """pass@k averaged over examples, each `(rollouts, successes)`; k goes up to the fewest
    rollouts any example has (empty without examples)."""
    tallies = [(n, c) for n, c in tallies if n > 0]
    if not tallies:
        return {}
    fewest = min(n for n, _ in tallies)
    return {k: fmean(pass_at_k(n, c, k) for n, c in tallies) for k in k_values(fewest)}
