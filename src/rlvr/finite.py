"""What counts as a number to average or train on: a finite real, never a bool, NaN or string.

One NaN or None in a mean, a group baseline or a loss poisons everything after it, so the
trainer, the reports and the plots all read values through this one rule and average rubric
metrics with `metric_means`.
"""

from __future__ import annotations

import math
import numbers
import statistics
from collections import defaultdict
from collections.abc import Iterable
from typing import Any


def finite_number(value: Any) -> float | None:
    """`value` as a float when it is a finite real number (Python or NumPy; booleans are not
    numbers here), else None."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def metric_means(metric_dicts: Iterable[Any], prefix: str = "") -> dict[str, float]:
    """Mean of every numeric rubric metric over the rollouts that report it, in the order of
    first appearance, named `prefix/name` (just `name` without a prefix). Entries that are not
    mappings, and values that are not finite numbers (see `finite_number`), are left out. The
    trainer's `env/` means, its evaluations' metrics and the evaluation reports' metric columns
    all come from here."""
    values: dict[str, list[float]] = defaultdict(list)
    for metrics in metric_dicts:
        for name, value in metrics.items() if isinstance(metrics, dict) else ():
            if (number := finite_number(value)) is not None:
                values[name].append(number)
    return {
        f"{prefix}/{name}" if prefix else name: statistics.fmean(v) for name, v in values.items()
    }
