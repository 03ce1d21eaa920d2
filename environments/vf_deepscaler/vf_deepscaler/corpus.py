"""Honest answers in other forms, and hedges, written by rules from each row's gold answer.

The corpus that measures what every reward rule costs an honest policy: each form rule reads a
gold answer (and, for units and percents, the question) and writes the same value the way
people write it (unit dropped or added, degree sign, mixed number vs improper fraction, decimal,
percent, interval vs set-builder, ``\\dfrac``, thousands separators, the value beside an
answer-choice letter or an answer label, ...); each reply style wraps the form in a complete
reply (reasoning, the row's own reference solution, a think block). Hedges (alternatives,
lists of candidates, several boxes, a choice letter alone) are written the same way. The rules
were written from the gold's notation alone, before any verdict was looked at, so they apply
unchanged to rows they have never seen.

``python -m vf_deepscaler.corpus ROWS.jsonl`` plays the corpus through the environment's own
parser and rubric and prints the honest mean, each rule's false-negative rate and the hedge
means (environments/vf_deepscaler/README.md, "Honest corpus").
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

from vf_deepscaler.forms import asks_percent, readings
from vf_deepscaler.parser import follows_think_format
from vf_deepscaler.rubric import DeepScaleRRubric
from vf_deepscaler.verifier import MAX_ANSWER_CHARS

NUMBER = r"-?\d+(?:\.\d+)?"
FRACTION = re.compile(r"(-?)\\[dt]?frac\s*\{(\d+)\}\s*\{(\d+)\}")
MIXED = re.compile(r"(-?)(\d+)\s*\\[dt]?frac\s*\{?(\d)\}?\s*\{?(\d+)\}?")
UNIT_WORDS = (
    "yards|yard|yd|feet|foot|ft|inches|inch|miles|mile|meters|meter|centimeters|cm|km|seconds|"
    "minutes|hours|days|weeks|months|years|dollars|cents|degrees|units|pounds|ounces|gallons"
)
UNIT_GOLD = re.compile(
    rf"\\?\$?\s*({NUMBER})\s*(?:\\text\s*\{{\s*(?:{UNIT_WORDS})\.?\s*\}}|(?:{UNIT_WORDS})\.?)"
)
ASKED_UNIT = re.compile(rf"\bhow many ({UNIT_WORDS})\b|\bin ({UNIT_WORDS})\b", re.IGNORECASE)
DEGREE_GOLD = re.compile(rf"({NUMBER}|{MIXED.pattern})\s*\^\s*\{{?\s*\\circ\s*\}}?")
PERCENT_GOLD = re.compile(r"(.+?)\s*\\%")
INTERVAL_GOLD = re.compile(r"([\[(])\s*([^,\[\]()]+?)\s*,\s*([^,\[\]()]+?)\s*([\])])")
SET_BUILDER_GOLD = re.compile(r"\\\{\s*([a-z])\s*\\mid\s*(.+?)\s*\\\}")
CHAIN_GOLD = re.compile(r"(\S+)\s*(<|\\le)\s*([a-z])\s*(<|\\le)\s*(\S+)")
FormRule = Callable[[str, str], list[str]]
"""(gold, question) -> the gold's value in other forms (none when the rule does not apply)."""


def _bare(gold: str) -> str:
    """The gold without surrounding ``$``: rows write ``$\\frac{2}{3}$`` as well as ``\\frac23``."""
    return gold.strip().strip("$").strip()


def _exact(gold: str) -> Fraction | None:
    """The gold as an exact rational when it is an integer, decimal, fraction or mixed number."""
    text = _bare(gold)
    if re.fullmatch(NUMBER, text):
        return Fraction(text)
    if match := FRACTION.fullmatch(text):
        return Fraction(int(match[2]), int(match[3])) * (-1 if match[1] else 1)
    if match := MIXED.fullmatch(text):
        value = int(match[2]) + Fraction(int(match[3]), int(match[4]))
        return -value if match[1] else value
    return None


def _latex(value: Fraction) -> str:
    """``\\frac{p}{q}`` (or an integer) for an exact rational."""
    if value.denominator == 1:
        return str(value.numerator)
    sign = "-" if value < 0 else ""
    return f"{sign}\\frac{{{abs(value.numerator)}}}{{{value.denominator}}}"


def _decimal(value: Fraction) -> str | None:
    """The finite decimal of ``value``, or None when it repeats."""
    denominator = value.denominator
    for prime in (2, 5):
        while denominator % prime == 0:
            denominator //= prime
    if denominator != 1:
        return None
    digits = 0
    while (value * 10**digits).denominator != 1:
        digits += 1
    return f"{float(value):.{digits}f}" if digits else str(value.numerator)


def _repeating(value: Fraction) -> str:
    """The decimal of ``value`` with its period under ``\\overline`` (``0.1\\overline{6}``)."""
    whole, remainder = divmod(abs(value.numerator), value.denominator)
    digits: list[str] = []
    seen: dict[int, int] = {}
    while remainder and remainder not in seen:
        seen[remainder] = len(digits)
        digit, remainder = divmod(remainder * 10, value.denominator)
        digits.append(str(digit))
    fixed = "".join(digits[: seen.get(remainder, len(digits))])
    period = "".join(digits[seen.get(remainder, len(digits)) :])
    sign = "-" if value < 0 else ""
    return f"{sign}{whole}.{fixed}" + (f"\\overline{{{period}}}" if period else "")


def _mixed(value: Fraction) -> str | None:
    """``A\\frac{r}{q}`` for a non-integer rational with |value| > 1."""
    if value.denominator == 1 or abs(value) < 1:
        return None
    whole, rest = divmod(abs(value.numerator), value.denominator)
    return f"{'-' if value < 0 else ''}{whole}\\frac{{{rest}}}{{{value.denominator}}}"


def units_dropped(gold: str, question: str) -> list[str]:
    """``245 yd.``, ``9 \\text{ inches}``, ``$87.50`` -> the number alone."""
    text = _bare(gold)
    match = UNIT_GOLD.fullmatch(text) or re.fullmatch(rf"\\?\$\s*({NUMBER})", gold.strip())
    return [match[1]] if match else []


def units_added(gold: str, question: str) -> list[str]:
    """A plain number where the question asks "how many inches" -> ``9 \\text{ inches}``."""
    asked = ASKED_UNIT.search(question)
    if not re.fullmatch(NUMBER, _bare(gold)) or not asked:
        return []
    unit = (asked[1] or asked[2]).lower()
    if unit == "degrees":
        return []  # degree_signs writes those
    return [f"{_bare(gold)} \\text{{ {unit}}}", f"{_bare(gold)} {unit}"]


def degree_signs(gold: str, question: str) -> list[str]:
    """``75^\\circ`` -> ``75``, ``75°``, ``75^{\\circ}``, ``75 \\text{ degrees}``; a plain number
    asked "in degrees" -> the same with a degree sign."""
    text = _bare(gold)
    if match := DEGREE_GOLD.fullmatch(text):
        number = match[1]
        return [number, f"{number}°", f"{number}^{{\\circ}}", f"{number} \\text{{ degrees}}"]
    if re.fullmatch(NUMBER, text) and re.search(r"\bdegrees?\b", question, re.IGNORECASE):
        return [f"{text}^\\circ", f"{text}°"]
    return []


def mixed_and_improper(gold: str, question: str) -> list[str]:
    """A mixed number as an improper fraction, and an improper fraction as a mixed number."""
    text = _bare(gold)
    value = _exact(text)
    if value is None or value.denominator == 1:
        return []
    if MIXED.fullmatch(text):
        return [_latex(value)]
    mixed = _mixed(value)
    return [mixed, mixed.replace("\\frac", " \\tfrac")] if mixed else []


def decimals(gold: str, question: str) -> list[str]:
    """A fraction as its decimal (finite, or repeating with ``\\overline``), a decimal as a
    fraction, an integer as ``n.0``."""
    text = _bare(gold)
    value = _exact(text)
    if value is None:
        return []
    if value.denominator == 1:
        return [f"{value.numerator}.0"] if re.fullmatch(r"-?\d+", text) else []
    if "." in text:
        return [_latex(value)]
    return [_decimal(value) or _repeating(value)]


def _asks_percent(question: str) -> bool:
    """The question's last sentence names a percent (the corpus's own reading of the ask)."""
    sentences = [s for s in re.split(r"(?<=[.?!:])\s+", question.strip()) if s.strip()]
    return bool(sentences) and bool(re.search(r"percent", sentences[-1], re.IGNORECASE))


def percents(gold: str, question: str) -> list[str]:
    """``80\\%`` -> ``80``, ``0.8``, ``\\frac{4}{5}``, ``80 percent``; ``33\\frac13\\%`` ->
    ``\\frac{100}{3}\\%``; a bare number the question asks as a percent -> with ``\\%``."""
    text = _bare(gold)
    if match := PERCENT_GOLD.fullmatch(text):
        number = match[1].strip()
        value = _exact(number)
        if value is None:
            return []
        forms = [number, f"{number} percent", _latex(value / 100)]
        decimal = _decimal(value / 100)
        if decimal:
            forms.append(decimal)
        if value.denominator != 1:
            forms.append(f"{_latex(value)}\\%")
        return forms
    value = _exact(text)
    if value is None or not _asks_percent(question):
        return []
    forms = [f"{text}\\%", f"{text}%"]
    decimal = _decimal(value / 100)
    return forms + ([decimal] if decimal else [])


def _is_range_question(question: str) -> bool:
    return bool(re.search(r"interval|range|set of|solution set|values? of", question, re.I))


def intervals_and_sets(gold: str, question: str) -> list[str]:
    """An interval as set-builder and as an inequality; set-builder or an inequality chain as
    the interval. Parentheses count as an interval only where the question asks for a range."""
    text = _bare(gold)
    brackets = {"(": "<", "[": "\\le", ")": "<", "]": "\\le"}
    if (match := INTERVAL_GOLD.fullmatch(text)) and (
        "[" in text or "]" in text or _is_range_question(question)
    ):
        low, high = match[2], match[3]
        chain = f"{low} {brackets[match[1]]} x {brackets[match[4]]} {high}"
        if "infty" in low or "infty" in high:
            return []
        return [chain, f"\\{{x \\mid {chain}\\}}", f"x \\in {text}"]
    condition = text
    if match := SET_BUILDER_GOLD.fullmatch(text):
        condition = match[2]
    if match := CHAIN_GOLD.fullmatch(condition):
        low, first, var, second, high = match.groups()
        interval = f"{'(' if first == '<' else '['}{low}, {high}{')' if second == '<' else ']'}"
        others = [interval, condition] if condition != text else [interval]
        return [*others, f"\\{{{var} : {condition}\\}}"]
    return []


def fraction_commands(gold: str, question: str) -> list[str]:
    """``\\frac`` written as ``\\dfrac`` and as ``\\tfrac``."""
    text = _bare(gold)
    if "\\frac" not in text:
        return []
    return [text.replace("\\frac", "\\dfrac"), text.replace("\\frac", "\\tfrac")]


def thousands(gold: str, question: str) -> list[str]:
    """``125875000`` -> ``125,875,000``, ``125\\,875\\,000``, ``125{,}875{,}000``; and back."""
    text = _bare(gold)
    if re.fullmatch(r"-?\d{1,3}(?:,\d{3})+", text):
        return [text.replace(",", ""), text.replace(",", "\\,")]
    if re.fullmatch(r"-?\d{4,}", text):
        grouped = f"{int(text):,}"
        spaced = [grouped.replace(",", sep) for sep in ("\\,", "{,}", " ")]
        return [grouped, *spaced]
    return []


def lists(gold: str, question: str) -> list[str]:
    """``9 and -7`` -> ``9, -7``; ``\\pm 8`` -> ``8, -8`` and ``-8, 8`` (the order kept where
    the gold lists values, since some questions ask for them "respectively")."""
    text = _bare(gold)
    if match := re.fullmatch(r"\\pm\s*(\d+)", text):
        return [f"{match[1]}, -{match[1]}", f"-{match[1]}, {match[1]}"]
    parts = re.split(r"\s*(?:\\text\s*\{\s*and\s*\}|\band\b)\s*", text)
    if len(parts) == 2 and all(re.fullmatch(NUMBER, part) for part in parts):
        return [", ".join(parts)]
    return []


LETTERED = (
    "\\textbf{{({letter}) }} {value}",
    "\\textbf{{({letter})}}\\ {value}",
    "({letter}) {value}",
    "\\text{{({letter})}}\\ {value}",
    "\\mathrm{{({letter})}}~{value}",
    "{value} \\textbf{{ ({letter})}}",
)
"""A value with its answer-choice letter, as contest solutions print it (the letter first or
last, bold, in text, in roman)."""
LABELLED = (
    "\\text{{Answer: }} {value}",
    "\\textbf{{Answer:}}\\ {value}",
    "\\text{{The answer is }} {value}",
)
"""A value after an answer label inside the box."""


def _letter(gold: str) -> tuple[str, int]:
    """A choice letter for the row (the value decides, the letter only varies with the gold)
    and the index that picks the forms, both from the gold's characters."""
    key = sum(map(ord, gold))
    return "ABCDE"[key % 5], key


def answer_letters(gold: str, question: str) -> list[str]:
    """``40`` -> ``\\textbf{(C) } 40``, ``(C)\\ 40``, ``40 \\textbf{ (C)}``, ...: one of the
    lettered forms per row, in turn."""
    value = _bare(gold)
    if re.fullmatch(r"[A-E]", value):
        return []  # the gold is itself a letter
    letter, key = _letter(gold)
    return [LETTERED[key % len(LETTERED)].format(letter=letter, value=value)]


def answer_labels(gold: str, question: str) -> list[str]:
    """``40`` -> ``\\text{Answer: } 40`` (or another label, in turn)."""
    value = _bare(gold)
    return [LABELLED[_letter(gold)[1] % len(LABELLED)].format(value=value)]


FORM_RULES: dict[str, FormRule] = {
    "units dropped": units_dropped,
    "units added": units_added,
    "degree signs": degree_signs,
    "mixed vs improper": mixed_and_improper,
    "decimals": decimals,
    "percents": percents,
    "intervals vs set-builder": intervals_and_sets,
    "dfrac/tfrac": fraction_commands,
    "thousands separators": thousands,
    "lists": lists,
    "answer letters": answer_letters,
    "answer labels": answer_labels,
}

Style = Callable[[str, dict[str, Any]], str]
"""(boxed form, row) -> a complete reply."""

STYLES: dict[str, Style] = {
    "short": lambda form, row: (
        f"Working through it step by step.\n\nThe answer is $\\boxed{{{form}}}$."
    ),
    "reference solution": lambda form, row: (
        f"{row.get('solution', '')}\n\nFinal answer: $\\boxed{{{form}}}$"
    ),
    "display": lambda form, row: f"Putting it together:\n\\[\n\\boxed{{{form}}}\n\\]",
    "think": lambda form, row: (
        f"<think>\nLet me solve this.\n{row.get('solution', '')[:400]}\n</think>\n\n"
        f"**Answer:** $\\boxed{{{form}}}$"
    ),
}
"""Reply styles; ``think`` is scored by an environment with ``use_think``."""


def _wrong(gold: str) -> str:
    """A value other than the gold's (the gold plus one when it is a number)."""
    value = _exact(gold)
    return _latex(value + 1) if value is not None else "0"


HEDGES: dict[str, Callable[[str], str]] = {
    "a or b": lambda gold: f"\\boxed{{{_bare(gold)} \\text{{ or }} {_wrong(gold)}}}",
    "a or b, plain": lambda gold: f"\\boxed{{{_wrong(gold)} or {_bare(gold)}}}",
    "candidates in one box": lambda gold: f"\\boxed{{{_wrong(gold)}, {_bare(gold)}}}",
    "a set of candidates": lambda gold: f"\\boxed{{\\{{{_bare(gold)}, {_wrong(gold)}\\}}}}",
    "several boxes, last wrong": lambda gold: (
        f"Either $\\boxed{{{_bare(gold)}}}$ or, finally, $\\boxed{{{_wrong(gold)}}}$."
    ),
    "units around two values": lambda gold: (
        f"\\boxed{{{_bare(gold)} \\text{{ cm or }} {_wrong(gold)} \\text{{ cm}}}}"
    ),
    "answer letter alone": lambda gold: f"\\boxed{{\\textbf{{({_letter(gold)[0]})}}}}",
    "two lettered values": lambda gold: (
        f"\\boxed{{\\textbf{{(C)}}\\ {_bare(gold)}, \\textbf{{(D)}}\\ {_wrong(gold)}}}"
    ),
    "answer label, two values": lambda gold: (
        f"\\boxed{{\\text{{Answer: }} {_bare(gold)}, {_wrong(gold)}}}"
    ),
    "lettered value or another": lambda gold: (
        f"\\boxed{{(C)\\ {_wrong(gold)} \\text{{ or }} (D)\\ {_bare(gold)}}}"
    ),
}
"""Replies that offer more than one answer: each must score 0 (the gold is among them)."""


@dataclass(frozen=True)
class Item:
    """One corpus reply: the rule (or hedge) that wrote it, its style, row, gold and question."""

    rule: str
    style: str
    row: int
    gold: str
    question: str
    form: str
    reply: str


def honest_items(rows: Sequence[dict[str, Any]]) -> list[Item]:
    """Every form of every row, its style chosen in turn (so each rule meets every style)."""
    items: list[Item] = []
    styles = list(STYLES)
    for index, row in enumerate(rows):
        gold, question = str(row["answer"]), str(row["problem"])
        for rule, write in FORM_RULES.items():
            for form in dict.fromkeys(write(gold, question)):
                style = styles[len(items) % len(styles)]
                reply = STYLES[style](form, row)
                items.append(Item(rule, style, index, gold, question, form, reply))
    return items


def hedge_items(rows: Sequence[dict[str, Any]]) -> list[Item]:
    """Every hedge on every row whose gold is a single value (not itself a list or a range)."""
    items = []
    for index, row in enumerate(rows):
        gold = str(row["answer"])
        if re.search(r",|\band\b|\bor\b|\\pm|<|\\le|\\mid", gold) or re.fullmatch(r"[A-E]", gold):
            continue  # a list, a range, or a choice letter
        for name, write in HEDGES.items():
            items.append(Item(name, "hedge", index, gold, str(row["problem"]), "", write(gold)))
    return items


ZEROING_RULES = ("last box", "answer length", "hedge guard", "time limit", "equivalence")
"""The rules that can zero an answer, in the order they apply."""
CUTTING_RULES = ("think format",)
"""The rule that cuts a correct answer (by ``think_format_weight``, with ``use_think``)."""


async def _zeroed_by(rubric: DeepScaleRRubric, item: Item, percent: bool) -> str | None:
    """The first rule that zeroes this reply, or None when it is paid."""
    prediction = rubric.parser.parse(item.reply)
    if prediction != item.form.strip():
        return "last box"
    if len(prediction) > MAX_ANSWER_CHARS:
        return "answer length"
    if not readings(item.gold, prediction, percent):
        return "hedge guard"
    verdict = await rubric.pool.check(item.gold, prediction, percent)
    if verdict.status != "ok":
        return "time limit"
    return None if verdict.correct else "equivalence"


async def score(rubric: DeepScaleRRubric, items: Sequence[Item]) -> list[Result]:
    """Each item's reward from the rubric (``score_reply``, with the problem as the prompt),
    the rule that zeroed it (for honest forms) and whether the think format cut it."""

    async def one(item: Item) -> Result:
        completion = [{"role": "assistant", "content": item.reply}]
        prompt = [{"role": "user", "content": item.question}]
        reward = await rubric.score_reply(completion, item.gold, prompt)
        zeroed = None
        if item.form and reward == 0:  # which rule zeroed this honest reply
            zeroed = await _zeroed_by(rubric, item, asks_percent(item.question))
        cut = rubric.use_think and not follows_think_format(item.reply)
        return Result(item, reward, zeroed, "think format" if cut else None)

    return list(await asyncio.gather(*(one(item) for item in items)))


@dataclass(frozen=True)
class Result:
    """One scored reply: its reward, the rule that zeroed it and the rule that cut it."""

    item: Item
    reward: float
    zeroed_by: str | None
    cut_by: str | None


def mean_reward(results: Sequence[Result]) -> float:
    return sum(r.reward for r in results) / max(len(results), 1)


def false_negative_rates(results: Sequence[Result]) -> dict[str, float]:
    """Per rule that zeroes or cuts: the share of these (honest) replies it zeroed or cut."""
    n = max(len(results), 1)
    rates = {rule: sum(r.zeroed_by == rule for r in results) / n for rule in ZEROING_RULES}
    think = [r for r in results if r.item.style == "think"]
    rates["think format"] = sum(r.cut_by is not None for r in think) / max(len(think), 1)
    return rates


async def score_honest(
    rows: Sequence[dict[str, Any]], plain: DeepScaleRRubric, think: DeepScaleRRubric
) -> list[Result]:
    """The honest corpus of ``rows`` through the environment's rubrics, replies in the think
    style scored by the one with ``use_think``."""
    items = honest_items(rows)
    honest = await score(plain, [i for i in items if i.style != "think"])
    return honest + await score(think, [i for i in items if i.style == "think"])


async def measure(
    rows: Sequence[dict[str, Any]], plain: DeepScaleRRubric, think: DeepScaleRRubric
) -> tuple[list[Result], list[Result]]:
    """(honest results, hedge results) on ``rows``."""
    honest = await score_honest(rows, plain, think)
    return honest, await score(plain, hedge_items(rows))


def report(honest: Sequence[Result], hedges: Sequence[Result]) -> str:
    """The table the README quotes: honest means per rule and style, false-negative rates,
    hedge means."""
    lines = [f"honest replies: {len(honest)}, mean reward {mean_reward(honest):.3f}"]
    for label, key in (("form rule", "rule"), ("style", "style")):
        for name in dict.fromkeys(getattr(r.item, key) for r in honest):
            group = [r for r in honest if getattr(r.item, key) == name]
            lines.append(f"  {label} {name:26} n={len(group):4}  mean {mean_reward(group):.3f}")
    lines.append("false-negative rate on the honest corpus, per rule that zeroes or cuts:")
    for rule, rate in false_negative_rates(honest).items():
        lines.append(f"  {rule:26} {rate:.3f}")
    lines.append(f"hedges (gold among the answers): {len(hedges)} replies")
    for name in HEDGES:
        group = [r for r in hedges if r.item.rule == name]
        lines.append(f"  {name:26} n={len(group):4}  mean {mean_reward(group):.3f}")
    misses = [r for r in honest if r.reward < 1]
    lines.extend(f"  unpaid: {r.item.rule}: {r.item.gold!r} as {r.item.form!r}" for r in misses)
    return "\n".join(lines)


def own_rubric(environment: Any) -> DeepScaleRRubric:
    """The environment's own rubric inside the group verifiers builds around it."""
    rubrics = getattr(environment.rubric, "rubrics", [environment.rubric])
    return next(r for r in rubrics if isinstance(r, DeepScaleRRubric))


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m vf_deepscaler.corpus ROWS.jsonl``: print ``report`` for those rows."""
    from vf_deepscaler import load_environment

    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        raise SystemExit("usage: python -m vf_deepscaler.corpus ROWS.jsonl")
    path = Path(args[0])
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    plain, think = (
        own_rubric(load_environment(data_files=str(path), max_examples=1, use_think=use))
        for use in (False, True)
    )

    async def run() -> tuple[list[Result], list[Result]]:
        try:
            return await measure(rows, plain, think)
        finally:
            plain.pool.close()
            think.pool.close()

    print(report(*asyncio.run(run())))


if __name__ == "__main__":
    main()
