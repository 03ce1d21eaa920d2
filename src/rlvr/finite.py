"""What counts as a number to average or train on: a finite real, never a bool, NaN or string.
One NaN or None in a mean, a group baseline or a loss poisons everything after it, so the
trainer, the reports and the plots all read values through this one rule.
"""

from __future__ import annotations

import math
import numbers
from typing import Any


def finite_number(value: Any) -> float | None:
    """`value` as a float when it is a finite real number (Python or NumPy; booleans are not
    numbers here), else None."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    number = float(value)
    return number if math.isfinite(number) else None
