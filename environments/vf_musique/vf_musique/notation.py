"""Answers as canonical words: one notation for dates, numbers and units.

MuSiQue's official normalisation (SQuAD's: lower case, no punctuation, no articles) leaves a
date, a number or a measure written in another notation a different string: "1895-03-14",
"3/14/1895" and "Mar. 14, 1895" for "March 14, 1895"; "273 282" for "273,282"; "thirty-five"
for "35"; "1,400 meters" for "1,400 metres". `canonical_tokens` puts them in one form, on both
sides of every comparison (the answer, the golds and the documents), so no rule has to know the
notation of either:

- a date as day, month, year: ISO (1895-03-14), numeric with slashes (US month first, 3/14/1895,
  or day first where the first number cannot be a month, 14/3/1895) or dots (day first,
  14.3.1895), the month written out or abbreviated (Mar. 14, 1895; 14 Mar 1895), in either
  order, with an ordinal day (14th of March 1895);
- a number as digits: number words however written ("thirty-five", "thirty five", "one hundred
  and twenty", "eleven thousand nine hundred"), thousands separated by spaces ("273 282");
- a unit in one spelling: "metre" for metres/meters/metre/meter, "km" for kilometres, "ft" for
  feet, "percent" for "%" and "per cent", "km2" for "square kilometres", ...;
- hyphens and dashes as spaces ("Hewlett-Packard" = "Hewlett Packard");
- letters without their diacritics ("Björk" = "Bjork", "Kraków" = "Krakow", "Straßburg" =
  "Strassburg"), as people type a name on a keyboard without accents.

"m" after a number stays "m": it is metres or millions, and "in" is inches or a preposition,
which only the gold can tell (`resolve_units`).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from functools import lru_cache

from .scoring import normalize_answer

MONTHS = (
    "january february march april may june july august september october november december"
).split()
_MONTH_SET = frozenset(MONTHS)
_MONTH_ABBREVIATIONS = {m[:3]: m for m in MONTHS} | {"sept": "september"}
_DAY = re.compile(r"^(\d{1,2})(st|nd|rd|th)?$")
_YEAR = re.compile(r"^\d{3,4}$")

_ISO_DATE = re.compile(r"(?<![\d/.\-])(\d{4})-(\d{1,2})-(\d{1,2})(?![\d/\-])")
_NUMERIC_DATE = re.compile(r"(?<![\d/.\-])(\d{1,2})([/.])(\d{1,2})\2(\d{3,4})(?![\d/.])")
# Thousands separated by (thin or no-break) spaces: "273 282", "1 400 000".
_SPACED_THOUSANDS = re.compile(r"(?<![\d.,])\d{1,3}(?:[ \u00a0\u2009\u202f]\d{3})+(?![\d,]|\.\d)")
_DASHES = re.compile(r"[\-\u2010-\u2015\u2212]")

_SMALL_NUMBERS = {
    word: value
    for value, word in enumerate(
        "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
        "fifteen sixteen seventeen eighteen nineteen".split()
    )
}
_TENS = {
    word: 10 * value
    for value, word in enumerate(
        "twenty thirty forty fifty sixty seventy eighty ninety".split(), start=2
    )
}
_SCALE_WORDS = {"thousand": 1_000, "million": 1_000_000}

# One spelling per unit (after SQuAD normalisation: lower case, no punctuation).
_UNIT_SPELLINGS = {
    "metre": "metre metres meter meters",
    "km": "km kms kilometre kilometres kilometer kilometers",
    "cm": "cm centimetre centimetres centimeter centimeters",
    "mm": "mm millimetre millimetres millimeter millimeters",
    "ft": "ft foot feet",
    "mile": "mile miles mi",
    "inch": "inch inches",
    "kg": "kg kgs kilogram kilograms kilo kilos",
    "lb": "lb lbs pound pounds",
    "tonne": "tonne tonnes",
    "ha": "ha hectare hectares",
    "acre": "acre acres",
    "percent": "percent pct",
    "square": "square sq",
    "mph": "mph",
    "kmh": "kmh kph",
}
_UNITS = {spelling: unit for unit, words in _UNIT_SPELLINGS.items() for spelling in words.split()}
UNIT_WORDS = frozenset(_UNIT_SPELLINGS) | {"km2", "mi2", "m2", "ft2", "m"}
"""The canonical unit words."""
_AREAS = {"km": "km2", "mile": "mi2", "metre": "m2", "ft": "ft2"}
_AREA_SPELLINGS = {"sqkm": "km2", "sqmi": "mi2", "mi2": "mi2", "km2": "km2", "m2": "m2"}
# Abbreviations that mean a unit only beside a gold in that unit: "1,400 m" is 1,400 metres
# against "1,400 metres", and 1,400 million against "1,400 million"; "6.8 in" is 6.8 inches
# against "6.8 inches".
_AMBIGUOUS_UNITS = {"m": "metre", "in": "inch"}
# Speeds written out: "miles per hour" is "mph", "kilometres per hour" is "kmh".
_SPEEDS = {"mile": "mph", "km": "kmh"}
# Letters that keep no diacritic when decomposed.
_PLAIN_LETTERS = str.maketrans(
    {"ł": "l", "Ł": "L", "ø": "o", "Ø": "O", "ß": "ss", "đ": "d", "Đ": "D", "ı": "i", "æ": "ae",
     "Æ": "AE", "œ": "oe", "Œ": "OE", "ð": "d", "þ": "th"}
)  # fmt: skip


def _date_words(day: int, month: int, year: str) -> str | None:
    if 1 <= month <= 12 and 1 <= day <= 31:
        return f" {day} {MONTHS[month - 1]} {year} "
    return None


def _iso(found: re.Match[str]) -> str:
    year, month, day = found.group(1), int(found.group(2)), int(found.group(3))
    return _date_words(day, month, year) or found.group(0)


def _numeric(found: re.Match[str]) -> str:
    """US order (month first) with slashes unless the first number cannot be a month; day
    first with dots (the European notation) unless the second cannot be."""
    first, sep, second, year = found.groups()
    a, b = int(first), int(second)
    day_first = (sep == "." and b <= 12) or a > 12
    day, month = (a, b) if day_first else (b, a)
    return _date_words(day, month, year) or found.group(0)


def _number_at(words: Sequence[str], i: int) -> tuple[int, int] | None:
    """(value, words used) for number words starting at word i ("one hundred and twenty",
    "eleven thousand nine hundred"), or None."""
    total, current, last, j = 0, 0, None, i
    while j < len(words):
        word = words[j]
        if word in _SMALL_NUMBERS and (
            last in (None, "hundred", "scale") or (last == "tens" and 0 < _SMALL_NUMBERS[word] < 10)
        ):
            current += _SMALL_NUMBERS[word]
            last = "units"
        elif word in _TENS and last in (None, "hundred", "scale"):
            current += _TENS[word]
            last = "tens"
        elif word == "hundred" and last in (None, "units", "tens") and current % 100 == current:
            current = (current or 1) * 100
            last = "hundred"
        elif word in _SCALE_WORDS and last in ("units", "tens", "hundred"):
            total += current * _SCALE_WORDS[word]
            current, last = 0, "scale"
        elif (
            word == "and"
            and last in ("hundred", "scale")
            and j + 1 < len(words)
            and (words[j + 1] in _SMALL_NUMBERS or words[j + 1] in _TENS)
        ):
            pass
        else:
            break
        j += 1
    if last is None:
        return None
    return total + current, j - i


def _numbers_as_digits(words: Sequence[str]) -> list[str]:
    out: list[str] = []
    i = 0
    while i < len(words):
        number = _number_at(words, i)
        if number is None:
            out.append(words[i])
            i += 1
        else:
            out.append(str(number[0]))
            i += number[1]
    return out


def _units(words: Sequence[str]) -> list[str]:
    """One spelling per unit; "per cent" is "percent", "square km" and "km2" are "km2"."""
    out: list[str] = []
    i = 0
    while i < len(words):
        word = words[i]
        if word == "per" and i + 1 < len(words) and words[i + 1] == "cent":
            out.append("percent")
            i += 2
            continue
        unit = _AREA_SPELLINGS.get(word) or _UNITS.get(word, word)
        if unit in _SPEEDS and words[i + 1 : i + 3] == ["per", "hour"]:
            out.append(_SPEEDS[unit])
            i += 3
            continue
        if out and out[-1] == "square" and unit in _AREAS:
            out[-1] = _AREAS[unit]
        else:
            out.append(unit)
        i += 1
    return out


def _date_at(words: Sequence[str], i: int) -> tuple[str, str, str, int] | None:
    """(day, month, year, words used) for "3 march 1847", "3rd of march 1847" or
    "march 3 1847" (the month written out or abbreviated) starting at word i."""
    window = [_MONTH_ABBREVIATIONS.get(w, w) for w in words[i : i + 4]]
    for order in ((0, 1, 2), (0, 2, 3), (1, 0, 2)):  # d m y, d of m y, m d y
        if max(order) >= len(window):
            continue
        day, month, year = (window[k] for k in order)
        if order == (0, 2, 3) and window[1] != "of":
            continue
        day_match = _DAY.match(day)
        if day_match and month in _MONTH_SET and _YEAR.match(year):
            return str(int(day_match.group(1))), month, year, max(order) + 1
    return None


def _dates(words: Sequence[str]) -> list[str]:
    out: list[str] = []
    i = 0
    while i < len(words):
        word = words[i]
        starts_date = word in _MONTH_SET or word in _MONTH_ABBREVIATIONS or word[:1].isdigit()
        date = _date_at(words, i) if starts_date else None
        if date is not None:
            day, month, year, width = date
            out += [day, month, year]
            i += width
        else:
            out.append(word)
            i += 1
    return out


def without_diacritics(text: str) -> str:
    """The text with its letters' diacritics dropped ("Björk" -> "Bjork")."""
    if text.isascii():
        return text
    decomposed = unicodedata.normalize("NFKD", text.translate(_PLAIN_LETTERS))
    return "".join(ch for ch in decomposed if not unicodedata.combining(ch))


def canonical_tokens(text: str) -> list[str]:
    """Normalised words (SQuAD's normalisation) with dates as day, month, year; numbers as
    digits; one spelling per unit; hyphens and dashes as spaces; no diacritics (module
    docstring)."""
    return list(_canonical(text)) if len(text) <= MAX_CACHED_CHARS else _words(text)


MAX_CACHED_CHARS = 300  # answers and golds: compared again and again; documents: once


@lru_cache(maxsize=8192)
def _canonical(text: str) -> tuple[str, ...]:
    return tuple(_words(text))


def _words(text: str) -> list[str]:
    text = without_diacritics(text)
    text = _ISO_DATE.sub(_iso, text)
    text = _NUMERIC_DATE.sub(_numeric, text)
    text = _SPACED_THOUSANDS.sub(lambda m: re.sub(r"\D", "", m.group(0)), text)
    text = _DASHES.sub(" ", text.replace("%", " percent "))
    words = normalize_answer(text).split()
    return _dates(_units(_numbers_as_digits(words)))


def resolve_units(words: Sequence[str], gold: Sequence[str]) -> list[str]:
    """The answer's words with an ambiguous unit abbreviation read as the gold's unit where
    the gold has it ("1,400 m" against "1,400 metres")."""
    out = list(words)
    for k in range(1, len(out)):
        unit = _AMBIGUOUS_UNITS.get(out[k])
        if unit is not None and out[k - 1].isdigit() and unit in gold:
            out[k] = unit
    return out
