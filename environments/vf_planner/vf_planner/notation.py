"""The numbers a text states, in every notation people write them, and the numbers a problem gives.

Both reward checks that read plans compare numbers, so both must read a number however it is
written: digits ("1,450", "$2.50", "60%"), words ("three", "two hundred sixty", "sixty-four"),
multiplier and fraction words ("twice", "triples", "half", "three quarters", "two dozen"),
fractions ("3/4"), and Roman numerals ("XVIII"). A number that could hide in its spelling would
let a plan dictate the answer; a number the reader misses in the problem ("half" is 2, "60%" is
0.6) would make an honest plan that restates it look as if it computed it.

`stated_numbers` is what a text says (used on plans, subproblems and problems alike);
`given_numbers` adds what a problem implies without writing a number ("every second glass",
"a week") and is only ever used for the problem, where reading too much costs nothing. Both
are cached: the rubric reads the same problem and plan texts once per check.
"""

from __future__ import annotations

import re
from functools import lru_cache

from vf_planner.answers import numbers_in

_ONES = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
    "fifteen sixteen seventeen eighteen nineteen"
).split()
_TENS = "twenty thirty forty fifty sixty seventy eighty ninety".split()
_SMALL = {word: float(value) for value, word in enumerate(_ONES)}
_SMALL |= {word: 10.0 * (t + 2) for t, word in enumerate(_TENS)}
_SCALES = {"hundred": 100.0, "thousand": 1000.0, "million": 1e6}
_COUNTING = "|".join([*_SMALL, *_SCALES])
_AFTER_SCALE = "(?:(?<=hundred)|(?<=thousand)|(?<=million))"  # "one hundred and sixty"
_SPELLED = re.compile(
    rf"\b(?:{_COUNTING})(?:(?:{_AFTER_SCALE}\s+and\s+|\s+|-)(?:{_COUNTING}))*\b", re.IGNORECASE
)
# Words that state a multiplier or a fraction: each stands for the values listed.
_MULTIPLIERS = {
    r"twice|doubles?|doubled|doubling": (2.0,),
    r"thrice|triples?|tripled|tripling|triplets?": (3.0,),
    r"quadruples?|quadrupled": (4.0,),
    r"halves|half|halved|halving": (2.0, 0.5),
    r"quarters?|quartered": (4.0, 0.25),
    r"dozens?": (12.0,),
}
_MULTIPLIER = re.compile(r"\b(" + "|".join(_MULTIPLIERS) + r")\b", re.IGNORECASE)
# Denominators spelled as ordinals, for "a third", "two fifths", "three quarters".
_DENOMINATORS = {
    "half": 2,
    "halves": 2,
    "third": 3,
    "quarter": 4,
    "fourth": 4,
    "fifth": 5,
    "sixth": 6,
    "seventh": 7,
    "eighth": 8,
    "ninth": 9,
    "tenth": 10,
}
_ONE_TO_SIX = "(?:one|two|three|four|five|six)"
_DENOMINATOR_WORDS = "|".join(f"{word}s?" for word in _DENOMINATORS if word != "halves")
_COUNT = rf"(?:a|an|one|\d+|{'|'.join(_SMALL)})"
_FRACTION_WORDS = re.compile(rf"\b({_COUNT})[\s-]+({_DENOMINATOR_WORDS}|halves)\b", re.IGNORECASE)
_TIMES_DOZEN = re.compile(rf"\b({_COUNT}|half\s+a)\s+dozens?\b", re.IGNORECASE)
# "3/4" read as the fraction it is; "80/2" in a plan is a division to do, not a value stated.
_FRACTION = re.compile(r"(?<![\d./])(\d+)/(\d+)(?![\d/]|\.\d)")
# Roman numerals of two letters or more, upper case ("XVIII"; not "I", not "MM" or "CD").
_ROMAN_TOKEN = re.compile(r"\b[MDCLXVI]{2,}\b")
_ROMAN = re.compile(r"M{0,3}(?:CM|CD|D?C{0,3})(?:XC|XL|L?X{0,3})(?:IX|IV|V?I{0,3})")
_ROMAN_VALUES = {"M": 1000, "D": 500, "C": 100, "L": 50, "X": 10, "V": 5, "I": 1}
_NOT_ROMAN = {"CD", "CM", "MM", "MD", "DC", "CC", "CL", "ML", "MC", "LI", "DI", "CI", "MI", "XL"}
_PERCENT_AFTER = re.compile(r"\s*(?:%|percent\b|per\s+cent\b)", re.IGNORECASE)
_PERCENT = re.compile(r"(\d[\d,]*(?:\.\d+)?|\.\d+)\s*(?:%|percent\b|per\s+cent\b)", re.IGNORECASE)
# Words that name the plan's own items, not quantities of the problem.
_ITEMS = r"(?:steps?|parts?|sub-?problems?|sub-?questions?|questions?|results?|answers?|values?)"
# Items a plan counts ("the two results"); "3 steps" may be stairs.
_COUNTED = r"(?:results?|parts?|sub-?problems?|sub-?questions?|answers?|values?)"
# "Step 3", "part two", "steps 1 and 2", "line 3", "the two results", "#2", "(2)" or "2." opening
# a line: labels, cross-references and counts of the plan's own items, not quantities.
_LABEL = re.compile(
    rf"\b(?:step|part|sub-?problem|sub-?question|result|question|line|item)\s*#?\s*"
    rf"(?:\d+|{_ONE_TO_SIX})\b"
    rf"|\b(?:{_ITEMS}|lines|items)\s+\d+(?:\s*(?:,|and|&|or)\s*\d+)+\b"
    rf"|\b(?:\d|{_ONE_TO_SIX}|both)\s+(?:of\s+the\s+)?{_COUNTED}\b"
    r"|#\d+\b|(?m:^\s*\(?\d+[.):](?!\d))",
    re.IGNORECASE,
)
# "1) ... 2) ..." inside a line: a list's labels, unless the parenthesis closes one opened before
# ("(costs 2)" states 2).
_INLINE_LABEL = re.compile(r"(?<![\w(.,$/])[1-9]\)")


def _unlabelled(text: str) -> str:
    """The text without the labels and cross-references of the plan's own items."""
    text = _LABEL.sub(" ", text)
    pieces, start, read, depth = [], 0, 0, 0
    for match in _INLINE_LABEL.finditer(text):
        between = text[read : match.start()]
        depth += between.count("(") - between.count(")")
        read = match.end()
        if depth <= 0:  # no parenthesis open: a label
            pieces.append(text[start : match.start()] + " ")
            start, depth = match.end(), 0
        else:  # the parenthesis closes one opened before
            depth -= 1
    return "".join(pieces) + text[start:]


# What a problem implies without writing a number.
_IMPLIED = {
    r"every\s+(?:other|second)|each\s+other|pairs?|couples?|both|twins?": (2.0,),
    r"every\s+third": (3.0,),
    r"weeks?|weekly": (7.0,),
    r"hours?|hourly|minutes?|seconds": (60.0,),
    r"days?|daily": (24.0,),
    r"years?|yearly|annual(?:ly)?": (12.0, 52.0, 365.0),
    r"months?|monthly": (30.0, 4.0),
    r"percent|%": (100.0, 0.01),
    r"cents?|centimeters?|meters?|dollars?": (100.0,),
    r"kilo\w*|grams?|liters?|millili\w*": (1000.0,),
    r"feet|foot|inch(?:es)?": (12.0,),
    r"decades?": (10.0,),
    r"centur(?:y|ies)": (100.0,),
}
_IMPLICATION = [
    (re.compile(rf"(?<!\w)(?:{words})(?!\w)", re.IGNORECASE), values)
    for words, values in _IMPLIED.items()
]
# Given with any problem: 0, 1 and the 100 of a percentage; other unit constants come with the
# words that imply them (_IMPLIED: 60 with "hours", 7 with "week", ...).
UNIT_CONSTANTS = frozenset({0.0, 1.0, 100.0})


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


def _count_value(word: str) -> float:
    """The value of the count before a fraction word or "dozen" ("a", "two", "3", "half a")."""
    word = " ".join(word.lower().split())
    if word in ("a", "an", "one"):
        return 1.0
    if word == "half a":
        return 0.5
    return _SMALL[word] if word in _SMALL else float(word)


def _singular(word: str) -> str:
    word = word.lower()
    return word if word in _DENOMINATORS else word.removesuffix("s")


def roman_value(numeral: str) -> int:
    """The value of a Roman numeral ("XVIII" is 18; "" is 0)."""
    values = [_ROMAN_VALUES[letter] for letter in numeral]
    return sum(-v if v < nxt else v for v, nxt in zip(values, [*values[1:], 0], strict=False))


def _word_numbers(text: str) -> set[float]:
    """Numbers written in words: counting words, multipliers, fractions and dozens."""
    found = set()
    for match in _SPELLED.finditer(text):
        words = re.findall(r"[a-z]+", match.group().lower())
        value = _spelled_value([w for w in words if w != "and"])
        percent = _PERCENT_AFTER.match(text, match.end())
        found |= {value, value / 100} if percent else {value}
    for match in _MULTIPLIER.finditer(text):
        key = next(k for k in _MULTIPLIERS if re.fullmatch(k, match.group(1), re.IGNORECASE))
        found |= set(_MULTIPLIERS[key])
    for count, word in _FRACTION_WORDS.findall(text):
        denominator = _DENOMINATORS[_singular(word)]
        found |= {_count_value(count) / denominator, float(denominator)}
    found |= {_count_value(count) * 12 for count in _TIMES_DOZEN.findall(text)}
    return found


def _proper_fraction(match: re.Match[str]) -> float | None:
    numerator, denominator = int(match.group(1)), int(match.group(2))
    return numerator / denominator if 0 < numerator < denominator else None


def _symbol_numbers(text: str) -> set[float]:
    """Numbers written with symbols: digits, proper fractions (as their value: "3/5" states 0.6,
    not 3 and 5), percentages (also as fractions), Roman numerals."""
    fractions = {m.span(): _proper_fraction(m) for m in _FRACTION.finditer(text)}
    found = {value for value in fractions.values() if value is not None}
    for (start, end), value in sorted(fractions.items(), reverse=True):
        if value is not None:
            text = f"{text[:start]} {text[end:]}"
    found |= {number for n in numbers_in(text) for number in (n, abs(n))}  # "x - 14" states 14
    found |= {float(p.replace(",", "")) / 100 for p in _PERCENT.findall(text)}
    tokens = (m.group() for m in _ROMAN_TOKEN.finditer(text))
    numerals = (t for t in tokens if _ROMAN.fullmatch(t) and t not in _NOT_ROMAN)
    found |= {float(roman_value(n)) for n in numerals}
    return found


@lru_cache(maxsize=4096)
def stated_numbers(text: str) -> frozenset[float]:
    """Every number `text` states, in any notation: digits (a percentage also as its fraction,
    "60%" is 60 and 0.6), words, multipliers and fraction words, fractions, Roman numerals.
    Labels that number the plan's own parts ("Step 3", "part 2", "1." opening a line, "1) ...
    2) ..." inside one, "the number from line 3") are not quantities and are not read."""
    text = _unlabelled(text)
    return frozenset(_symbol_numbers(text) | _word_numbers(text))


MASK = "N"
"""What `mask_numbers` writes in place of each number."""
_DIGITS = re.compile(
    r"[-−]?\$?(?:\d+(?:,\d{3})*(?:\.\d+)?|\.\d+)(?:\s*(?:%|percent\b|per\s+cent\b))?", re.IGNORECASE
)
# Longest notations first: "two thirds" before "two", "3/5" and "60%" before "3", "5", "60".
_MASKED = (
    _FRACTION_WORDS,
    _TIMES_DOZEN,
    _SPELLED,
    _MULTIPLIER,
    _FRACTION,
    _DIGITS,
    _ROMAN_TOKEN,
)


def mask_numbers(text: str) -> str:
    """`text` with every number it states, in any notation `stated_numbers` reads, written as
    `MASK` ("Janet's ducks lay N eggs; she eats N"): its words stay, its numbers are gone, so
    nothing can be computed from it. The decoy counterfactuals show the subproblems this way."""
    for pattern in _MASKED:
        text = pattern.sub(MASK, text)
    return text


@lru_cache(maxsize=4096)
def given_numbers(question: str) -> frozenset[float]:
    """The numbers a problem gives a solver: those it states (a fraction's parts too), those its
    words imply ("every second", "a week": 2, 7), the unit constants, and each decimal as a
    percentage (0.6 is the 60 of "60%", $1.25 is 125 cents)."""
    parts = numbers_in(_unlabelled(question))  # with a fraction's parts
    stated = stated_numbers(question) | set(parts)
    implied = {v for pattern, values in _IMPLICATION if pattern.search(question) for v in values}
    scaled = {n * 100 for n in stated if not float(n).is_integer()}
    return frozenset(stated | implied | scaled | UNIT_CONSTANTS)
