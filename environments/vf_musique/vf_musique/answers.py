"""Which submitted answers are the gold: the forms a correct answer takes, and refusals.

People and models write a correct answer in more forms than the gold string: "in 2003",
"Pittsburgh, Pennsylvania", "Charles Carroll of Carrollton" (for "Charles Carroll"),
"1,400 meters" (for "1400"), "3 March 1847" (for "March 3, 1847"). `matching_gold` treats such
an answer as the gold when it holds the gold (or an alias) and nothing else: the words around
the gold may be a preposition, a title, a kind ("the city of"), an era or a unit, one qualifier
after a comma or in brackets that the row's documents write beside the gold or that names a
country, state or province (pycountry's names and the short ones people write), or a longer
name the documents use. Words that add a candidate never pass: a connective or hedge ("or", "and",
"maybe"), another hop's answer, a second separator, a phrase the documents do not hold. So a
list of guesses or a long answer holding the gold among other candidates stays a wrong answer
(scored by token F1 alone).

`is_refusal` recognises "unanswerable" in its common phrasings ("not answerable", "cannot be
determined", "the documents do not say", "insufficient information", ...): the whole answer
must be the refusal, so an answer that hedges with a refusal is not one.

Both work on MuSiQue's official normalisation (SQuAD's: lower case, no punctuation, no
articles, single spaces), with number words and dates put in one form.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from functools import cache, cached_property
from typing import Any

import pycountry

from .scoring import normalize_answer

_NUMBER_WORDS = {
    word: str(value)
    for value, word in enumerate(
        "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
        "fifteen sixteen seventeen eighteen nineteen twenty".split()
    )
} | {"thirty": "30", "forty": "40", "fifty": "50", "hundred": "100"}
_MONTHS = frozenset(
    "january february march april may june july august september october november december".split()
)
_DAY = re.compile(r"^(\d{1,2})(st|nd|rd|th)?$")
_YEAR = re.compile(r"^\d{3,4}$")
# Words around the gold that add no candidate.
_PREPOSITIONS = frozenset("in on at by from during near around within inside into to of".split())
_APPROXIMATE = frozenset("about approximately around roughly circa c some nearly almost".split())
_TITLES = frozenset(
    "sir dame lord lady king queen prince princess emperor empress pope saint st dr doctor mr "
    "mrs ms miss president general gen admiral adm captain capt colonel col professor prof "
    "rev reverend bishop archbishop count countess duke duchess baron baroness".split()
)
# Kinds of named thing ("the city of", "Bohol island"): they frame a name without naming
# anything. With the kinds of time ("the 18th century"), they may frame a gold answer.
KIND_WORDS = frozenset(
    "city town village county state province country island islands river lake mountain "
    "mountains mount district region team club band group company university college school "
    "party film movie album song novel book show series language dynasty empire kingdom "
    "capital municipality parish borough".split()
)
_FRAMING_KINDS = KIND_WORDS | {"year", "season", "century", "decade", "era"}
_ERAS_AND_SUFFIXES = frozenset("ad bc bce ce jr sr ii iii iv".split())
# Words that add or weigh a candidate.
_HEDGES = frozenset(
    "and or nor either neither but maybe perhaps possibly probably likely unlikely not no vs "
    "versus also plus instead except unless if guess unsure uncertain alternatively otherwise "
    "might could".split()
)
_LIST_SEPARATORS = (";", "/", "|", "&", "+")
_COMMA = re.compile(r",(?!\s?\d)")  # a comma, not in "1,400" or "July 1, 2008"
_QUALIFIER = re.compile(
    r"^(?P<head>[^,()]+?)\s*(?:,\s*(?P<comma>[^()]+?)|\((?P<paren>[^()]+)\))\s*\.?$"
)
MAX_QUALIFIERS = 2  # "Pittsburgh, Pennsylvania, United States"
# Longer answers are no form of a gold (the gold and a few words) nor a common refusal, and the
# form and refusal patterns are not meant for them: they get SQuAD's scores alone.
MAX_FORM_CHARS = 300
MAX_EXTRA_WORDS = 4
MAX_QUALIFIER_WORDS = 4

# Regions a place is qualified by from general knowledge ("Moscow, Russia"), beside the names
# pycountry gives: the short names people write where pycountry has only the official one.
_SHORT_PLACE_NAMES = (
    "Russia, Iran, Syria, Vietnam, South Korea, North Korea, Korea, Bolivia, Venezuela, "
    "Tanzania, Moldova, Laos, Czech Republic, Czechia, Taiwan, Palestine, Macedonia, Brunei, "
    "USA, US, United States of America, America, UK, Britain, Great Britain, Holland, "
    "Soviet Union, USSR, Ivory Coast, Vatican City, Congo, Micronesia"
).split(", ")
_QUALIFYING_SUBDIVISIONS = {
    "US": {"State", "District"},
    "CA": {"Province", "Territory"},
    "AU": {"State", "Territory"},
    "GB": {"Country", "Province"},
    "IN": {"State", "Union territory"},
}
_CONTEXT = (
    r"(?: (?:from|in|based on|given|according to|with|using|within)"
    r"(?: provided| available| retrieved| given| these| those| this)?"
    r" (?:documents?|docs|sources?|texts?|context|passages?|paragraphs?|search results?|results"
    r"|information|evidence|data))?"
)
_SUBJECT = r"(?:(?:question|answer|it|this|that|this question|information)(?: is| was)? )?"
_REFUSAL = re.compile(
    "^(?:"
    + "|".join(
        [
            _SUBJECT + r"(?:un ?answerable|not answerable|unknown|not known|unknowable"
            r"|undeterminable|indeterminable|indeterminate|not determinable|undetermined|unclear"
            r"|not (?:stated|given|specified|mentioned|provided|available|found|clear|possible"
            r"(?: to (?:determine|answer|tell|know|say))?))",
            _SUBJECT + r"(?:cannot|can not|cant|could not|couldnt) be (?:determined|answered"
            r"|found|known|established|identified|inferred|verified|said|told)",
            r"(?:i |we )?(?:cannot|can not|cant|could not|couldnt|am unable to|was unable to"
            r"|unable to|do not|dont|did not|didnt) (?:determine|answer|tell|find|know|say"
            r"|identify|verify)(?: (?:it|this|that|answer|this question|question))?",
            r"(?:documents?|docs|sources?|texts?|context|passages?|paragraphs?|search results?"
            r"|results|retrieved documents?|provided documents?|evidence|information)"
            r" (?:do not|dont|does not|doesnt|did not|didnt) (?:say|mention|contain|specify"
            r"|state|provide|include|answer|give|tell|show|support)"
            r"(?: (?:it|this|that|answer|this information|that information|information"
            r"|this question|question))?",
            r"(?:there is )?(?:not enough|insufficient|no|not sufficient|inadequate|lack of"
            r"|missing) (?:information|info|evidence|data|context|details)"
            r"(?: (?:available|provided|given|found))?"
            r"(?: to (?:answer|determine|tell|say|know)(?: (?:it|this|question|this question))?)?",
            r"(?:no answer|none found|no answer found|answer not found|not found"
            r"|(?:answer|information) (?:is )?not (?:in|available in|found in) (?:documents?"
            r"|sources?|texts?|context)"
            r"|none of (?:documents?|sources?|texts?|passages?) (?:says?|mentions?|answers?"
            r"|contains?)(?: (?:it|this|that|answer))?)",
        ]
    )
    + ")"
    + _CONTEXT
    + "$"
)


def is_refusal(answer: str | None, unanswerable: str = "unanswerable") -> bool:
    """Whether the whole answer says the question cannot be answered, in any common phrasing
    (`unanswerable` itself, "not answerable", "the documents do not say", ...)."""
    if answer is None or len(answer) > MAX_FORM_CHARS:
        return False
    text = normalize_answer(answer)
    return bool(text) and (text == unanswerable or _REFUSAL.match(text) is not None)


def canonical_tokens(text: str) -> list[str]:
    """Normalised words with number words as digits and a date as day, month, year."""
    words = [_NUMBER_WORDS.get(w, w) for w in normalize_answer(text).split()]
    out: list[str] = []
    i = 0
    while i < len(words):
        starts_date = words[i] in _MONTHS or words[i][:1].isdigit()
        date = _date_at(words, i) if starts_date else None
        if date is not None:
            day, month, year, width = date
            out += [day, month, year]
            i += width
        else:
            out.append(words[i])
            i += 1
    return out


def _date_at(words: Sequence[str], i: int) -> tuple[str, str, str, int] | None:
    """(day, month, year, words used) for "3 march 1847", "3rd of march 1847" or
    "march 3 1847" starting at word i."""
    window = list(words[i : i + 4])
    for order in ((0, 1, 2), (0, 2, 3), (1, 0, 2)):  # d m y, d of m y, m d y
        if max(order) >= len(window):
            continue
        day, month, year = (window[k] for k in order)
        if order == (0, 2, 3) and window[1] != "of":
            continue
        day_match = _DAY.match(day)
        if day_match and month in _MONTHS and _YEAR.match(year):
            return day_match.group(1), month, year, max(order) + 1
    return None


class AnswerContext:
    """What tells a form of the gold from another candidate: the row's other hop answers
    (the candidates an agent holds on the way) and its documents (as canonical text, built on
    first use: most answers never need them)."""

    def __init__(self, info: Mapping[str, Any]) -> None:
        hops = info.get("hops") or []
        self.other_phrases = tuple(
            words for hop in hops[:-1] if (words := canonical_tokens(str(hop.get("answer") or "")))
        )
        self.other_answers = frozenset(w for words in self.other_phrases for w in words)
        self._paragraphs = list(info.get("paragraphs") or [])

    @cached_property
    def documents(self) -> tuple[str, ...]:
        """Each kept paragraph (title and text) as canonical words between spaces."""
        texts = (f"{p.get('title', '')} {p.get('text', '')}" for p in self._paragraphs)
        return tuple(f" {' '.join(canonical_tokens(text))} " for text in texts)

    def names_other(self, words: Sequence[str], gold: Sequence[str]) -> bool:
        """The words name another hop's answer in full (one the gold does not hold)."""
        text, inside = f" {' '.join(words)} ", f" {' '.join(gold)} "
        return any(
            f" {' '.join(other)} " in text and f" {' '.join(other)} " not in inside
            for other in self.other_phrases
        )

    def in_documents(self, words: Sequence[str]) -> bool:
        """The words appear together, in this order, in one document."""
        phrase = f" {' '.join(words)} "
        return any(phrase in doc for doc in self.documents)

    def beside(self, words: Sequence[str], gold: Sequence[str]) -> bool:
        """Every word appears in a document that also holds the gold phrase."""
        phrase = f" {' '.join(gold)} "
        docs = [doc for doc in self.documents if phrase in doc]
        return any(all(f" {w} " in doc for w in words) for doc in docs)


@cache
def _regions() -> frozenset[tuple[str, ...]]:
    """Countries, and the states and provinces places are commonly qualified by, as canonical
    words."""
    names = [*_SHORT_PLACE_NAMES]
    for country in pycountry.countries:
        names += [country.name, getattr(country, "common_name", ""), country.alpha_3]
    for region in pycountry.subdivisions:
        if region.type in _QUALIFYING_SUBDIVISIONS.get(region.country_code, ()):
            names.append(region.name.split("[")[0])
            if region.country_code == "US":  # postal abbreviations: "Pittsburgh, PA"
                names.append(region.code.split("-")[1])
    return frozenset(tuple(canonical_tokens(name)) for name in names if name)


_SCALES = frozenset(
    "hundred hundreds thousand thousands million millions billion billions trillion trillions "
    "dozen dozens lakh crore k m bn percent".split()
)
"""Words after a number that change its value ("1400 million" is not 1400): never a unit."""


def _is_number(words: Sequence[str]) -> bool:
    """A gold that is one number ("1,400" and "$72,641" normalise to digits)."""
    return len(words) == 1 and words[0].isdigit()


def _plain_extra(extra: Sequence[str], gold: Sequence[str], ctx: AnswerContext) -> bool:
    """No word that adds a candidate: no hedge or connective, no other hop's answer."""
    new = set(extra) - set(gold)
    return not (new & _HEDGES) and not (new & (ctx.other_answers - _FRAMING_KINDS - _PREPOSITIONS))


def _framing(prefix: Sequence[str], suffix: Sequence[str], gold: Sequence[str]) -> bool:
    """Words that frame the gold without naming anything: a preposition, a title or a kind
    before it; a kind, an era or a suffix after it; for a number, "about" and a unit."""
    before = _PREPOSITIONS | _TITLES | _FRAMING_KINDS
    if _is_number(gold):
        before |= _APPROXIMATE
        unit = len(suffix) <= 3 and all(w.isalpha() and w not in _SCALES for w in suffix)
        return all(w in before for w in prefix) and unit
    after = _FRAMING_KINDS | _ERAS_AND_SUFFIXES
    return all(w in before for w in prefix) and all(w in after for w in suffix)


def _holds_gold(words: Sequence[str], gold: Sequence[str], ctx: AnswerContext) -> bool:
    """The words are the gold, framed (`_framing`) or in a longer name the documents use."""
    if words == gold:
        return True
    n = len(gold)
    for i in range(len(words) - n + 1):
        if list(words[i : i + n]) != list(gold):
            continue
        prefix, suffix = words[:i], words[i + n :]
        extra = [*prefix, *suffix]
        if len(extra) > MAX_EXTRA_WORDS or not _plain_extra(extra, gold, ctx):
            continue
        if ctx.names_other(words, gold):
            continue
        if _framing(prefix, suffix, gold) or ctx.in_documents(words):
            return True
    return False


def _separators(text: str) -> int:
    """List separators in raw text: ; / | & + and commas that are not inside a number or date."""
    return sum(text.count(sep) for sep in _LIST_SEPARATORS) + len(_COMMA.findall(text))


def _qualified(answer: str, gold: str, ctx: AnswerContext) -> bool:
    """ "Gold, Qualifier" or "Gold (Qualifier)": the head holds the gold; the qualifier is a
    few words the documents write beside the gold, or a country, state or province; a second
    one after another comma must be a country, state or province ("Austin, Texas, USA"). No
    qualifier adds a candidate."""
    found = _QUALIFIER.match(answer.strip())
    if found is None or _separators(found["head"]) > _separators(gold):
        return False
    gold_words = canonical_tokens(gold)
    parts = [found["paren"]] if found["paren"] else _COMMA.split(found["comma"])
    if len(parts) > MAX_QUALIFIERS:
        return False
    for i, part in enumerate(parts):
        words = canonical_tokens(part)
        if not 0 < len(words) <= MAX_QUALIFIER_WORDS or any(w.isdigit() for w in words):
            return False
        known = tuple(words) in _regions() or (i == 0 and ctx.beside(words, gold_words))
        if not known or not _plain_extra(words, gold_words, ctx):
            return False
    return _holds_gold(canonical_tokens(found["head"]), gold_words, ctx)


def matching_gold(answer: str | None, golds: Iterable[str], ctx: AnswerContext) -> str | None:
    """The gold (or alias) that `answer` is a form of, or None (module docstring)."""
    if answer is None or len(answer) > MAX_FORM_CHARS or not normalize_answer(answer):
        return None
    words = canonical_tokens(answer)
    for gold in golds:
        gold_words = canonical_tokens(gold)
        if not gold_words:
            continue
        plain = _separators(answer) <= _separators(gold)
        if (plain and _holds_gold(words, gold_words, ctx)) or _qualified(answer, gold, ctx):
            return gold
    return None
