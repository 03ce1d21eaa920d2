"""Reading numbers out of GSM8K gold solutions, problems and worker replies.

Correctness is a number comparison, so every path that turns text into a number lives here:
thousands separators ("1,450,000"), currency and units ("$18", "18 dollars", "50%"), signs
("-10", "-$5", "$-5", "−3"), decimals, and a final answer of 0, which must count as an answer
(never confused with "no answer"). The independence term also needs the numbers a problem
states (digits and number words) and the intermediate results of its reference solution (GSM8K's
calculator annotations `<<16-3-4=9>>`).
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
# Number words GSM8K problems use for stated quantities ("She eats three ...", "twice as many").
_SMALL = {
    word: float(value)
    for value, word in enumerate(
        "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
        "fifteen sixteen seventeen eighteen nineteen".split()
    )
}
_SMALL |= {
    w: 10.0 * t
    for t, w in enumerate("x x twenty thirty forty fifty sixty seventy eighty ninety".split())
    if t > 1
}
_SCALES = {"hundred": 100.0, "thousand": 1000.0, "million": 1e6}
_WORD_VALUES = _SMALL | _SCALES | {"dozen": 12.0, "twice": 2.0}
_WORD_VALUES |= {"double": 2.0, "triple": 3.0, "thrice": 3.0}
_WORD = re.compile(r"\b(" + "|".join(_WORD_VALUES) + r")\b", re.IGNORECASE)
# A run of counting words, as in "two hundred sixty", "seventy thousand", "sixty-four".
_COUNTING = "|".join([*_SMALL, *_SCALES])
_AFTER_SCALE = "(?:(?<=hundred)|(?<=thousand)|(?<=million))"  # "one hundred and sixty"
_SPELLED = re.compile(
    rf"\b(?:{_COUNTING})(?:(?:{_AFTER_SCALE}\s+and\s+|[\s-]+)(?:{_COUNTING}))*\b", re.IGNORECASE
)


def _to_float(match: re.Match[str]) -> float:
    value = float(match.group("digits").replace(",", ""))
    negative = bool(match.group("sign") or match.group("sign2"))
    return -value if negative else value


def numbers_in(text: str) -> list[float]:
    """All numbers in `text`, in order, with separators, currency and signs resolved."""
    return [_to_float(m) for m in _NUMBER.finditer(text)]


def _spelled_value(words: list[str]) -> float:
    """The value of a run of counting words ("two hundred sixty" is 260)."""
    total, current = 0.0, 0.0
    for word in words:
        if word == "hundred":
            current = max(current, 1.0) * 100
        elif word in _SCALES:
            total += max(current, 1.0) * _SCALES[word]
            current = 0.0
        else:
            current += _SMALL[word]
    return total + current


def stated_numbers(text: str) -> set[float]:
    """Every number a text states: in digits, as a number word ("three", "twice", "dozen"), or
    spelled out in several words ("two hundred sixty"), so a number cannot hide in its spelling."""
    words = {_WORD_VALUES[m.group(1).lower()] for m in _WORD.finditer(text)}
    runs = (re.findall(r"[a-z]+", m.group().lower()) for m in _SPELLED.finditer(text))
    spelled = {_spelled_value([w for w in run if w != "and"]) for run in runs}
    return set(numbers_in(text)) | words | spelled


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
