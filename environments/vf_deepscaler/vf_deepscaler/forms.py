"""An answer's mathematical form: units, degree signs, percents and set notation made comparable.

math-verify compares values, but some ways of *writing* a value defeat it: a bare unit word
(``245 yd.``), a unicode degree sign, an ordinal suffix (``11^{\\text{th}}``), a thin-space
thousands separator (``1\\,000``), a percent around a mixed number (``33\\frac{1}{3}\\%``),
set-builder notation (``\\{x \\mid 2<x<3\\}``), or an inequality on one side where the other
side is an interval (math-verify accepts ``(2, 3)`` for gold ``2<x<3`` but not the reverse).
``canonical`` rewrites gold and prediction by the same rules, so a form either side may take is
compared as its value; ``readings`` adds the percent rule below.

Percent rule: a percent sign always means "divided by 100" (``50\\%`` is 0.5). A bare number
is read as a percent only where the answer *is* a percent: the gold carries ``%`` or the
problem asks for a percent (``asks_percent``). There, gold ``25`` (or ``25\\%``) accepts
``25``, ``25\\%`` and ``0.25``; elsewhere ``25\\%`` is 0.25 and never equals gold ``25``.
So no single answer is paid for two values (``50\\%`` no longer matches both gold 50 and gold
0.5 in one problem), and an honest percent in any of its forms is paid.

Words: a number spelled out (``\\text{Thirteen}``, ``13 \\text{ (thirteen)}``) is its digits,
and digits beside another number's name (``13 \\text{ (fourteen)}``) are a list of both. Values
joined by "or"/"and" (``x = 9 \\text{ or } x = -7``) are compared as a set with a gold that lists
values (``9, -7``, ``-7 and 9``); with a one-value gold they are a hedge and score 0. ``1
\\text{ to } 3`` is the ratio ``1:3`` where the gold is a ratio written with a colon.

Angles keep their unit: a degree gold accepts the number with or without a degree sign, not
its value in radians. Every rule is a linear-time regular expression on a short string (the
prediction is at most 2,000 characters), and the module uses the standard library only: the
verification worker loads it beside ``verifier.py``.
"""

from __future__ import annotations

import re
from fractions import Fraction

# Units written after a number, as words (plural or abbreviated, optional final period). One
# letter units are only recognised inside \text{}: bare, "2m" may be a product with a variable.
_UNIT_WORDS = (
    r"(?:square |sq\.? |cubic |cu\.? )?"
    r"(?:yards?|yds?|feet|foot|ft|inch(?:es)?|in|miles?|mi|meters?|metres?|centimeters?"
    r"|centimetres?|millimeters?|kilometers?|km|cm|mm|seconds?|secs?|minutes?|mins?|hours?"
    r"|hrs?|days?|weeks?|months?|years?|yrs?|dollars?|cents?|degrees?|units?|mph"
    r"|miles per hour|km/h|pounds?|lbs?|ounces?|oz|grams?|kilograms?|kg|liters?|litres?"
    r"|gallons?)"
)
_TEXT_COMMAND = r"\\(?:text|textrm|mathrm|mbox|rm)\s*"
_SPACING = r"\s*(?:(?:\\[,;: ]|~)\s*)*"
"""Space between a number and its unit: blanks, ``\\,``, ``\\;``, ``\\:``, ``\\ ``, ``~``."""
_TEXT_UNIT = re.compile(
    rf"(?<=[\d}}).]){_SPACING}{_TEXT_COMMAND}\{{\s*(?:{_UNIT_WORDS}|[a-zA-Z])\.?\s*\}}"
    r"(?:\^\{?[23]\}?|[²³])?\s*$"
)
_BARE_UNIT = re.compile(rf"(?<=[\d}}.]){_SPACING}{_UNIT_WORDS}\.?(?:\^\{{?[23]\}}?|[²³])?\s*$")
_DEGREE = re.compile(r"\^\s*\{\s*\\circ\s*\}|\^\s*\\circ|\\degree|°|\^\s*\{\s*°\s*\}")
_ORDINAL = re.compile(
    r"(\d)\s*(?:\^\s*\{\s*(?:\\text\s*\{)?\s*(?:st|nd|rd|th)\s*\}?\s*\}|(?:st|nd|rd|th)\b)"
)
_THIN_SEPARATOR = re.compile(r"(?<=\d)(?:\\[,;! ]|\{,\}|~)(?=\d{3}(?!\d))")
_SPACED_GROUPS = re.compile(r"-?\d{1,3}(?: \d{3})+")
_WHOLE_TEXT = re.compile(r"\\(?:text|textrm|mbox)\s*\{([^{}]*)\}")
_REPEATING = re.compile(r"(?<!\d)(-?)(\d*)\.(\d*)\\overline\s*\{(\d+)\}")
_FINAL_PERIOD = re.compile(r"(?<=[\d}])\s*\.$")
"""A sentence's period boxed with the answer (``26.``)."""
_DOLLAR_WORD = re.compile(r"\\textdollar\s*|\\\$\s*")
_LEFT_RIGHT = re.compile(r"\\(?:left|right|middle|[Bb]igg?[lrm]?)(?![A-Za-z])\s*")
"""Delimiter sizes: ``\\left(``, ``\\Big\\{``, ``\\bigr]``."""
_BRACED_MINUS = re.compile(r"\{\s*-\s*\}")
"""A minus sign in braces (``{-}13.5``, as contest solutions write it after a label)."""
_PERCENT = re.compile(
    r"\s*(?:\\%|%|\\text\s*\{\s*(?:\\?%|percent)\s*\}|\\mathrm\s*\{\s*percent\s*\}|percent)\s*$"
)
_SPACE = r"(?:\s|\\[,;:! ])*"
"""Blanks and LaTeX spacing commands."""
_SET_BUILDER = re.compile(
    rf"^\\\{{{_SPACE}([A-Za-z]){_SPACE}(?:\\in\s*\\mathbb\s*\{{?\s*R\s*\}}?{_SPACE})?"
    rf"(?:\\mid|\\vert|\\colon|\||:){_SPACE}(.+?){_SPACE}\\\}}$"
)
_MEMBERSHIP = re.compile(r"^[A-Za-z]\s*\\in\s*(.+)$")
_LESS = r"\\(?:leqslant|leq|le|lt)(?![A-Za-z])|<=?|≤"
_GREATER = r"\\(?:geqslant|geq|ge|gt)(?![A-Za-z])|>=?|≥"
_RELATION = re.compile(rf"({_LESS}|{_GREATER})")
_BOUND_COMMANDS = re.compile(r"\\(?:[dt]?frac|sqrt|pi|infty|cdot)(?![A-Za-z])")
_PERCENT_QUESTION = re.compile(
    r"\b(?:what|which|find|compute|determine|calculate|by how many)\s+(?:\w+\s+){0,3}?"
    r"percent(?:age)?s?\b|\bthe\s+percent(?:age)?\b|\bnearest\s+(?:whole\s+)?percent\b"
    r"|\bas\s+a\s+percent(?:age)?\b|\bhow\s+many\s+percent\b|\bin\s+percent(?:age)?s?\b",
    re.IGNORECASE,
)
_LABEL_TEXT = r"\\(?:text|textbf|textrm|mathrm|mathbf|mbox|rm|bf)\s*"
_GAP = r"(?:\s|\\[,;:! ]|\\q?quad(?![A-Za-z])|~)*"
"""Blanks, LaTeX spacing commands and ties between a label and the value."""
_CHOICE = r"\(\s*[A-E]\s*\)"
"""An answer-choice letter as contests print it: ``(C)``."""
_CHOICE_LABEL = rf"(?:{_LABEL_TEXT}\{{\s*{_CHOICE}\s*\}}|{_CHOICE})"
_LEADING_CHOICE = re.compile(rf"^{_CHOICE_LABEL}{_GAP}(?=\S)")
_TRAILING_CHOICE = re.compile(rf"(?<=\S){_GAP}{_CHOICE_LABEL}$")
_ANSWER_WORDS = r"(?:the\s+)?(?:final\s+)?answer\s*(?:is\s*:?|:)"
_ANSWER_LABEL = re.compile(
    rf"^(?:{_LABEL_TEXT}\{{\s*{_ANSWER_WORDS}\s*\}}|{_ANSWER_WORDS}){_GAP}(?=\S)", re.IGNORECASE
)
"""``\\text{Answer: }`` (``\\textbf{The answer is}``, a bare ``Answer:``) before the value."""
_ALTERNATIVE = re.compile(r"(?<![A-Za-z])(?:or|either)(?![A-Za-z])", re.IGNORECASE)
"""Words that offer alternatives ("26 or 27"); ``\\lor`` and "for" do not match."""
_NUMBER_ONES = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen"
    " fifteen sixteen seventeen eighteen nineteen"
).split()
_NUMBER_TENS = "twenty thirty forty fifty sixty seventy eighty ninety".split()
_NAME_BESIDE_DIGITS = re.compile(
    rf"(\d+){_SPACING}(?:{_TEXT_COMMAND}\{{\s*\(([A-Za-z\s-]+)\)\s*\}}"
    rf"|\(\s*{_TEXT_COMMAND}\{{([A-Za-z\s-]+)\}}\s*\)|\(([A-Za-z\s-]+)\))"
)
"""Digits and a name in parentheses: ``13 \\text{ (thirteen)}``, ``13\\ (\\text{thirteen})``."""
_LIST_WORD = r"(?<![A-Za-z\\])(?:or|and)(?![A-Za-z])"
_LIST_SEPARATOR = re.compile(
    rf",(?!\d{{3}}(?!\d))|{_LABEL_TEXT}\{{\s*{_LIST_WORD}\s*\}}|{_LIST_WORD}", re.IGNORECASE
)
"""Between listed values: a comma (not a thousands separator), "or", "and" (bare or in text)."""
_SPACING_COMMAND = re.compile(r"\\q?quad(?![A-Za-z])|\\[,;:! ]|~")
_VARIABLE = re.compile(r"^[A-Za-z]\s*=\s*")
_NOT_LISTED = re.compile(r"[()\[\]:]|\\[{}]")
"""A tuple, an interval, a set, a ratio or a time: not one listed number."""
_RATIO_WORD = re.compile(rf"(?<=[\d}}]){_SPACING}{_TEXT_COMMAND}\{{\s*(?:to|:)\s*\}}")
"""``\\text{ to }`` or ``\\text{ : }`` between the terms of a ratio."""


def asks_percent(question: str) -> bool:
    """Does the problem ask for a percent ("What percent of…", "the percent decrease…")?

    A percent mentioned in the data ("a 20% discount… what is the price?") is not asked.
    """
    return bool(_PERCENT_QUESTION.search(question))


def canonical(answer: str) -> str:
    """``answer`` without the forms math-verify does not read as their value: a whole answer in
    ``\\text{}``, an answer label or a choice letter beside the value (``strip_labels``), units,
    degree signs, ordinal suffixes, thin-space separators, dollar words, repeating decimals, a
    final period, set-builder braces, and one-variable inequalities (written as the interval
    they denote). Percent signs stay."""
    text = _spelled_out(_unwrapped(answer))  # \text{thirteen}, 13 \text{ (thirteen)}
    if _SPACED_GROUPS.fullmatch(text):  # 1 000 000
        text = text.replace(" ", "")
    text = _REPEATING.sub(_repeating_fraction, text)
    text = _BRACED_MINUS.sub("-", _LEFT_RIGHT.sub("", text))
    text = _DOLLAR_WORD.sub("", text)
    text = _DEGREE.sub("", text)
    text = _ORDINAL.sub(r"\1", text)
    text = _THIN_SEPARATOR.sub("", text)
    text = _FINAL_PERIOD.sub("", _strip_units(text))
    return _as_interval(_set_condition(text))


def _unwrapped(answer: str) -> str:
    """``answer`` without dollar signs, a label or choice letter (``strip_labels``) and a
    ``\\text{}`` around the whole (``\\text{5 cm}``, ``\\textbf{(D)}\\ \\text{245 yd.}``)."""
    return _unwrap(strip_labels(_unwrap(answer.strip().strip("$").strip())))


def _unwrap(text: str) -> str:
    """The inside of an answer written wholly in ``\\text{}``."""
    whole = _WHOLE_TEXT.fullmatch(text)
    return whole[1].strip() if whole else text


def strip_labels(answer: str) -> str:
    """``answer`` without an answer label before it (``\\text{Answer: } 40``) and an
    answer-choice letter before or after it (``\\textbf{(C) } 40``, ``(C)\\ 40``,
    ``40\\textbf{ (C)}``): contests print a choice as its letter and its value, and the value is
    what is graded. A label is removed only where a value stays beside it, so a letter alone
    (``\\textbf{(C)}``) is still a letter and scores 0 against a value; only one letter goes,
    so ``(C) 26, (D) 27`` stays a list of two values."""
    text = answer.strip()
    if label := _ANSWER_LABEL.match(text):
        text = text[label.end() :]
    if choice := _LEADING_CHOICE.match(text):
        return text[choice.end() :].strip()
    if choice := _TRAILING_CHOICE.search(text):
        return text[: choice.start()].strip()
    return text


def labelled(answer: str) -> bool:
    """Whether ``answer`` carries an answer label or a choice letter beside its value."""
    text = _unwrap(answer.strip().strip("$").strip())
    return strip_labels(text) != text


def _number_name(n: int) -> str:
    """The English name of ``0 <= n < 1000``, words one space apart ("two hundred twenty one")."""
    if n < 20:
        return _NUMBER_ONES[n]
    if n < 100:
        return _NUMBER_TENS[n // 10 - 2] + (f" {_NUMBER_ONES[n % 10]}" if n % 10 else "")
    return f"{_NUMBER_ONES[n // 100]} hundred" + (f" {_number_name(n % 100)}" if n % 100 else "")


_NUMBER_NAMES = {_number_name(n): n for n in range(1000)}


def _named_number(words: str) -> int | None:
    """The number ``words`` name ("Thirteen", "twenty-one", "a hundred and five"), or None."""
    names = [word for word in re.split(r"[\s-]+", words.strip().lower()) if word != "and"]
    if names[:2] == ["a", "hundred"]:
        names[0] = "one"
    return _NUMBER_NAMES.get(" ".join(names))


def _spelled_out(text: str) -> str:
    """``thirteen`` and ``13 \\text{ (thirteen)}`` -> ``13``; digits beside another number's
    name (``13 \\text{ (fourteen)}``) -> both as a list (``13, 14``), which equals no single
    value; anything else unchanged."""
    if (number := _named_number(text)) is not None:
        return str(number)
    beside = _NAME_BESIDE_DIGITS.fullmatch(text)
    named = _named_number(next(filter(None, beside.groups()[1:]))) if beside else None
    if beside is None or named is None:
        return text
    return beside[1] if int(beside[1]) == named else f"{beside[1]}, {named}"


def _spells_number(answer: str) -> bool:
    """Whether ``answer`` names a number in words (``\\text{thirteen}``, ``13 (thirteen)``)."""
    text = _unwrapped(answer)
    return _spelled_out(text) != text


def _repeating_fraction(match: re.Match[str]) -> str:
    """``0.1\\overline{6}`` -> ``\\frac{1}{6}``: a repeating decimal as the fraction it is."""
    sign, whole, fixed, period = match.groups()
    value = Fraction(int(whole or 0)) + Fraction(int(fixed or 0), 10 ** len(fixed))
    value += Fraction(int(period), 10 ** len(fixed) * (10 ** len(period) - 1))
    return f"{sign}\\frac{{{value.numerator}}}{{{value.denominator}}}"


def _strip_units(text: str) -> str:
    """Drop a trailing unit (``245 yd.``, ``5\\text{ cm}``, ``12 \\text{ft}^2``) after a number."""
    for pattern in (_TEXT_UNIT, _BARE_UNIT):
        stripped = pattern.sub("", text).strip()
        if stripped != text and _is_bound(stripped):
            return stripped
    return text


def split_percent(answer: str) -> tuple[str, bool]:
    """``(answer without a trailing percent sign or word, whether it had one)``."""
    stripped = _PERCENT.sub("", answer).strip()
    if stripped and stripped != answer.strip():
        return stripped, True
    return answer.strip(), False


def _set_condition(text: str) -> str:
    """``\\{x \\mid c\\}`` and ``x \\in S`` -> ``c`` and ``S``; anything else unchanged."""
    match = _SET_BUILDER.match(text) or _MEMBERSHIP.match(text)
    return match.group(match.lastindex or 1).strip() if match else text


def _as_interval(text: str) -> str:
    """``a < x \\le b`` -> ``(a, b]``, ``x > a`` -> ``(a, \\infty)``, when the bounds are
    numbers (no letters but \\frac, \\sqrt, \\pi, \\infty); anything else unchanged."""
    parts = [part.strip() for part in _RELATION.split(text)]
    if len(parts) not in (3, 5):
        return text
    values, relations = parts[0::2], parts[1::2]
    less = {bool(re.fullmatch(_LESS, relation)) for relation in relations}
    if len(less) != 1:
        return text  # a < x > b is not an interval
    if less == {False}:  # read b > x > a as a < x < b
        values, relations = values[::-1], relations[::-1]
    variables = [i for i, value in enumerate(values) if re.fullmatch(r"[A-Za-z]", value)]
    bounds = [value for i, value in enumerate(values) if i not in variables]
    if len(variables) != 1 or not all(map(_is_bound, bounds)):
        return text
    brackets = [relation in ("<", ">", r"\lt", r"\gt") for relation in relations]
    opening, closing = "([", ")]"  # strict, inclusive
    if len(values) == 3 and variables == [1]:
        return f"{opening[not brackets[0]]}{values[0]}, {values[2]}{closing[not brackets[1]]}"
    if len(values) == 2 and variables == [0]:  # x < b
        return f"(-\\infty, {values[1]}{closing[not brackets[0]]}"
    if len(values) == 2:  # a < x
        return f"{opening[not brackets[0]]}{values[0]}, \\infty)"
    return text


def _is_bound(value: str) -> bool:
    return bool(value) and not re.search(r"[A-Za-z]", _BOUND_COMMANDS.sub("", value))


def _listed_values(answer: str) -> list[str]:
    """The values ``answer`` lists (``x = 9 \\text{ or } x = -7`` -> ``["9", "-7"]``), each a
    number without letters or brackets; [] when it lists fewer than two, or anything else."""
    parts = _LIST_SEPARATOR.split(_SPACING_COMMAND.sub(" ", answer))
    values = [value for part in parts if (value := _VARIABLE.sub("", part.strip()))]
    plain = all(
        _is_bound(value) and not _NOT_LISTED.search(value) and value.count("{") == value.count("}")
        for value in values
    )
    return values if plain and len(values) > 1 else []


def _value_sets(gold: str, prediction: str) -> list[tuple[str, str]]:
    """For values joined by "or"/"and" and a gold that lists values: the pair of their sets
    (``\\{9, -7\\}``), equal when the values are, in any order; [] otherwise."""
    if not re.search(_LIST_WORD, prediction, re.IGNORECASE):
        return []
    gold_values, values = _listed_values(canonical(gold)), _listed_values(canonical(prediction))
    if not (gold_values and values):
        return []
    return [(f"\\{{{', '.join(gold_values)}\\}}", f"\\{{{', '.join(values)}\\}}")]


def _ratio_words(gold: str, prediction: str) -> str:
    """``prediction`` with ``1 \\text{ to } 3`` or ``1 \\text{ : } 3`` written ``1: 3`` where the
    gold is a ratio with a colon (``1:3``); unchanged elsewhere (a gold ``1/3`` is no ratio)."""
    terms = re.split(r"(?<!\\):", canonical(gold))
    if len(terms) == 2 and all(_is_bound(term.strip()) for term in terms):
        return _RATIO_WORD.sub(":", prediction)
    return prediction


def readings(gold: str, prediction: str, percent_question: bool = False) -> list[tuple[str, str]]:
    """The (gold, prediction) pairs to compare, in canonical form; the answer is right when any
    pair is equal. More than one pair only where a bare number may be a percent (module doc);
    values joined by "or"/"and" against a gold listing values: their sets (``_value_sets``).
    No pair for a hedge: the prediction offers alternatives ("a or b") that the gold does not."""
    prediction = _ratio_words(gold, prediction)
    if sets := _value_sets(gold, prediction):
        return sets
    if _ALTERNATIVE.search(prediction) and not _ALTERNATIVE.search(gold):
        return []
    gold_value, gold_percent = split_percent(canonical(gold))
    value, percent = split_percent(canonical(prediction))
    if not (gold_percent or percent or percent_question):
        if labelled(prediction) or _spells_number(prediction):
            return [(gold_value, value)]  # as written: "(C) 40" is c*40, "13 (fourteen)" is 13
        return list(dict.fromkeys([(gold, prediction), (gold_value, value)]))
    if gold_percent or percent_question:
        pairs = [(gold_value, value)]
        if not percent:  # 25 is 25% or the fraction 0.25
            pairs.append((f"\\frac{{{gold_value}}}{{100}}", value))
        return pairs
    return [(gold_value, f"\\frac{{{value}}}{{100}}")]  # 25% where none is asked: 0.25
