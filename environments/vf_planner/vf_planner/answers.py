"""Reading numbers out of GSM8K gold solutions, problems and worker replies.

Correctness is a number comparison, so every path that turns text into a number lives here:
thousands separators ("1,450,000"), currency and units ("$18", "18 dollars", "50%"), signs
("-10", "-$5", "$-5", "−3"), decimals, and a final answer of 0, which must count as an answer
(never confused with "no answer"). The reward's checks also need the intermediate results of the
reference solution (GSM8K's calculator annotations `<<16-3-4=9>>`); the numbers a text states in
words, fractions or Roman numerals are read in notation.py.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass

# A number not glued to a preceding digit or dot ("5-3" yields 5 and 3, not -3). Thousands
# separators only in groups of three so "3,4" stays two numbers.
_NUMBER = re.compile(
    r"(?<![\d.,])(?P<sign>[-−])?\s?\$?\s?(?P<sign2>-)?"
    r"(?P<digits>(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+)"
)
# Markers after which a solver states its final answer; the last one in a reply wins.
_FINAL_MARKERS = re.compile(
    r"####|final\s+answer\s+is|(?:final\s+)?answer\s*(?:is\s*)?:", re.IGNORECASE
)
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
# GSM8K's calculator annotations: <<expression=result>>.
_CALCULATION = re.compile(r"<<([^<>=]*)=([^<>]*)>>")


def _to_float(match: re.Match[str]) -> float:
    value = float(match.group("digits").replace(",", ""))
    negative = bool(match.group("sign") or match.group("sign2"))
    return -value if negative else value


def numbers_in(text: str) -> list[float]:
    """All numbers in `text`, in order, with separators, currency and signs resolved."""
    return [_to_float(m) for m in _NUMBER.finditer(text)]


@dataclass(frozen=True)
class CalculatorStep:
    """One annotated step of a GSM8K solution: the numbers it combines and its result."""

    operands: tuple[float, ...]
    value: float


def calculator_steps(solution: str) -> list[CalculatorStep]:
    """The solution's `<<expression=result>>` steps in order (none when it has no annotations)."""
    steps = []
    for expression, result in _CALCULATION.findall(solution):
        value = parse_number(result)
        if value is not None:
            steps.append(CalculatorStep(tuple(numbers_in(expression)), value))
    return steps


def intermediate_values(solution: str) -> list[float]:
    """The results a reference solution computes on its way: its calculator annotations, or, in a
    solution without them, every number of its text before `####`."""
    steps = calculator_steps(solution)
    if steps:
        return [step.value for step in steps]
    return numbers_in(solution.rpartition("####")[0] if "####" in solution else solution)


def parse_number(text: str) -> float | None:
    """The first number in `text`, or None when there is none."""
    match = _NUMBER.search(text)
    return _to_float(match) if match else None


def gold_number(solution: str) -> float | None:
    """The gold answer of a GSM8K solution: the number after the last `####` (or the whole text)."""
    _, _, tail = solution.rpartition("####")
    return parse_number(tail)


def final_number(reply: str) -> float | None:
    """The final answer of a solver's reply.

    Order of trust: the first number on the first line with text after the last answer marker
    ("Answer:", "####", "final answer is"), then the last `\\boxed{}`, then the last number in
    the reply. A marker whose line holds no number means the solver declared a non-numeric
    answer: None, not a guess.
    """
    markers = list(_FINAL_MARKERS.finditer(reply))
    if markers:
        tail = reply[markers[-1].end() :].splitlines()
        lines = [line for line in tail if re.search(r"\w", line)]  # skip markup-only lines
        return parse_number(lines[0]) if lines else None
    boxed = _BOXED.findall(reply)
    if boxed:
        return parse_number(boxed[-1])
    numbers = numbers_in(reply)
    return numbers[-1] if numbers else None


def numbers_match(predicted: float | None, gold: float | None) -> bool:
    """True when both numbers exist and agree up to float noise (so 0 == 0, None != 0)."""
    if predicted is None or gold is None:
        return False
    return math.isclose(predicted, gold, rel_tol=1e-6, abs_tol=1e-6)


def among(value: float | None, values: Iterable[float]) -> bool:
    """Whether `value` matches one of `values` (numbers_match: None matches nothing)."""
    return any(numbers_match(value, other) for other in values)


def format_number(value: float) -> str:
    """A number as a solver would write it: 1450000 not 1.45e+06, 2.5 not 2.50."""
    return str(int(value)) if value.is_integer() else repr(value)
