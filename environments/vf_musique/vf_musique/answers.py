"""Which submitted answers are the gold: the forms a correct answer takes, in any wrapper.

People and models write a correct answer in more forms than the gold string: "in 2003",
"Pittsburgh, Pennsylvania", "Charles Carroll of Carrollton" (for "Charles Carroll"),
"1,400 meters" (for "1400"), "3 March 1847" or "1847-03-03" (for "March 3, 1847"),
"Kaufhaus des Westens (KaDeWe)" (for "KaDeWe"), "Bjork" (for "Björk"), "6.8 in" (for "6.8
inches"), and wrap it: "The answer is Stanley.", "Probably Stanley [3][7]", '{"answer":
"Stanley"}', "Mountrail County → Stanley". `judge_answer` reads the answer the reply commits
to and treats it as the gold when it holds the gold (or an alias) and nothing else:

- the wrappers are peeled by structure (`wrappers`): container, markup, label, citations,
  confidence words, hedge, announcement (anywhere: the text after the last one), step chain;
  a sentence is read for the span it commits to (`spans`: X and an explanation);
- compared as canonical words (`notation`): one notation for dates, numbers and units, no
  diacritics;
- the words around the gold may be a preposition, a title, a kind ("the city of"), an era or a
  unit, or a longer name the documents use;
- a qualifier after a comma or in brackets must say *which* gold, never offer another: a region
  containing a place (a country, a state or province; "Moscow, Russia", "Austin, Texas, USA";
  never a region beside a region, "Maine, Vermont", and no region at all for an answer that is
  no place), the acronym of the gold or its expansion ("KaDeWe (Kaufhaus des Westens)", and the
  gold in brackets beside its full name), another name of the gold among the golds, or a kind
  ("(city)").

Words that add a candidate never pass: a connective or hedge inside the answer ("or", "and",
"maybe"), another hop's answer, a second separator, a phrase the documents do not hold, a
second name after a comma or in brackets ("Stanley, Bismarck", "Stanley (Bismarck)"). So a list
of guesses or a long answer holding the gold among other candidates stays a wrong answer
(scored by token F1 alone), a sentence naming two candidates is paid as committing to the one
it commits to (never more), and a refusal beside a guess ("Unanswerable, but probably X") is
read as no answer (`refusals.holds_refusal`). Refusals are `refusals.is_refusal`.

Both work on MuSiQue's official normalisation (SQuAD's: lower case, no punctuation, no
articles, single spaces).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from .acronyms import abbreviates
from .context import AnswerContext
from .notation import UNIT_WORDS, canonical_tokens, resolve_units
from .refusals import holds_refusal, is_refusal
from .regions import countries_named, other_subdivisions, regions
from .scoring import exact_match, normalize_answer
from .spans import committed_spans, ends_abbreviation
from .wrappers import peeled_stages

__all__ = [
    "KIND_WORDS",
    "MAX_FORM_CHARS",
    "AnswerContext",
    "canonical_tokens",
    "is_refusal",
    "judge_answer",
    "matching_gold",
]

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
_OTHER_ERAS = frozenset("bc bce".split())  # after a number, another year: never a unit
# Words that add or weigh a candidate.
_HEDGES = frozenset(
    "and or nor either neither but maybe perhaps possibly probably likely unlikely not no vs "
    "versus also plus instead except unless if guess unsure uncertain alternatively otherwise "
    "might could".split()
)
# Marks that set two things side by side: list separators ("/" but not in "3/14/1895"), an
# opening bracket, a spaced dash, the end of a sentence ("Stanley. Bismarck").
_LIST_SEPARATORS = re.compile(r"[;|&+(]|(?<!\d)/|/(?!\d)|\s[-\u2013\u2014]{1,2}\s|\u2014")
_SENTENCE_END = re.compile(r"(?<=\w)[.!]\s+(?=\w)")
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


def _contains(words: Sequence[str], gold: Sequence[str], ctx: AnswerContext) -> bool:
    """The qualifier is a region that may contain the gold: a country or a common subdivision
    (or any other subdivision the documents write right after the gold), qualifying a place;
    a region qualifies a region only as its country ("Maine, USA", never "Maine, Vermont"), and
    a country nothing, a gold that names a country ("SR Serbia") by that country alone; an
    earlier hop's answer only where the last hop looks inside it or the documents write it
    after the gold (`AnswerContext.qualifies_by_hop`)."""
    codes = regions().get(tuple(words))
    if codes is None and ctx.in_documents([*gold, *words]):
        codes = other_subdivisions().get(tuple(words))
    if not codes or not ctx.asks_for_place(gold) or not ctx.qualifies_by_hop(words, gold):
        return False
    named = countries_named(tuple(gold))
    if named:  # a country-level gold ("SR Serbia"): its own country at most
        return tuple(words) in named
    gold_codes = regions().get(tuple(gold))
    if gold_codes is None:
        return True
    return any(kind == "country" and ("subdivision", code) in gold_codes for kind, code in codes)


# --- forms of the gold ------------------------------------------------------------------------


def _is_measure(words: Sequence[str]) -> bool:
    """A gold that is a number, with or without a unit ("1,400", "$72,641", "1,400 metres")."""
    return (
        bool(words)
        and words[0].isdigit()
        and len(words) <= 3
        and all(w.isalpha() for w in words[1:])
    )


def _plain_extra(extra: Sequence[str], gold: Sequence[str], ctx: AnswerContext) -> bool:
    """No word that adds a candidate: no hedge or connective, no other hop's answer."""
    new = set(extra) - set(gold)
    return not (new & _HEDGES) and not (new & (ctx.other_answers - _FRAMING_KINDS - _PREPOSITIONS))


def _framing(
    prefix: Sequence[str], suffix: Sequence[str], gold: Sequence[str], ctx: AnswerContext
) -> bool:
    """Words that frame the gold without naming anything: a preposition, a title or a kind
    before it; a kind, an era or a suffix after it; for a number, "about", "AD" and a unit (a
    unit of measure or money, a thing counted, or a word of the question: "12 campuses" for
    "how many campuses"), never a name ("1216 King Harold")."""
    before = _PREPOSITIONS | _TITLES | _FRAMING_KINDS
    if _is_measure(gold):
        before |= _APPROXIMATE | {"ad"}
        units = _UNIT_WORDS | ctx.question_words
        unit = len(suffix) <= 3 and all(
            w in units and w not in _SCALES and w not in _OTHER_ERAS for w in suffix
        )
        return all(w in before for w in prefix) and unit
    after = _FRAMING_KINDS | _ERAS_AND_SUFFIXES
    return all(w in before for w in prefix) and all(w in after for w in suffix)


_UNIT_WORDS = UNIT_WORDS | frozenset(
    "dollars dollar usd us euros euro eur pounds gbp yen rupees francs marks cents ad ce old "
    "people persons inhabitants residents citizens employees workers staff students pupils "
    "members times years year months weeks days hours minutes seconds games matches goals "
    "points runs wins seats votes copies units episodes seasons books albums songs films "
    "novels children sons daughters campuses branches stores locations countries states cities "
    "floors storeys stories rooms beds passengers troops soldiers casualties deaths species "
    "languages words pages tons tonnes high tall long wide deep".split()
)
"""Words after a number that say what it counts or measures ("22 times", "7,531 people")."""

_SCALES = frozenset(
    "hundred hundreds thousand thousands million millions billion billions trillion trillions "
    "dozen dozens lakh crore k m bn percent".split()
)
"""Words after a number that change its value ("1400 million" is not 1400): never a unit."""


def _holds_gold(words: Sequence[str], gold: Sequence[str], ctx: AnswerContext) -> bool:
    """The words are the gold, framed (`_framing`) or in a longer name the documents use."""
    if list(words) == list(gold):
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
        if _framing(prefix, suffix, gold, ctx) or ctx.in_documents(words):
            return True
    return False


def _separators(text: str) -> int:
    """Separators in raw text: ; / | & + ( , a spaced dash, a sentence end, and commas that
    are not inside a number or date. An answer with more of them than the gold sets another
    thing beside it, which only a qualifier (`_qualified`) or a sentence's explanation
    (`spans`) may be."""
    ends = [m for m in _SENTENCE_END.finditer(text) if not ends_abbreviation(text[: m.start()])]
    return len(_LIST_SEPARATORS.findall(text)) + len(_COMMA.findall(text)) + len(ends)


def _qualifies(
    part: str, first: bool, head: str, gold: Sequence[str], golds: Sequence[str], ctx: AnswerContext
) -> bool:
    """One qualifier of a head that holds the gold (module docstring): a region containing
    it; or, right after the head, the head's acronym or expansion, another of the golds, or a
    kind ("(city)")."""
    if first and (
        abbreviates(part, head, ctx.in_documents) or abbreviates(head, part, ctx.in_documents)
    ):
        return True  # "DRDO (Defence Research and Development Organisation)"
    words = canonical_tokens(part)
    if not 0 < len(words) <= MAX_QUALIFIER_WORDS or any(w.isdigit() for w in words):
        return False
    if set(words) & _HEDGES:
        return False
    if first and (
        any(words == canonical_tokens(other) for other in golds)
        or all(w in _FRAMING_KINDS for w in words)
    ):
        return True
    return _contains(words, gold, ctx)


def _qualified(answer: str, gold: str, golds: Sequence[str], ctx: AnswerContext) -> bool:
    """ "Gold, Qualifier" or "Gold (Qualifier)" where each qualifier says which gold
    (`_qualifies`; a second one, after another comma, only a region: "Austin, Texas, USA"); or
    the gold in brackets beside its full name ("Kaufhaus des Westens (KaDeWe)")."""
    found = _QUALIFIER.match(answer.strip())
    if found is None or _separators(found["head"]) > _separators(gold):
        return False
    gold_words = canonical_tokens(gold)
    head = found["head"]
    parts = [found["paren"]] if found["paren"] else _COMMA.split(found["comma"])
    if len(parts) > MAX_QUALIFIERS:
        return False
    if len(parts) == 1 and canonical_tokens(parts[0]) == gold_words:
        return abbreviates(head, parts[0], ctx.in_documents) or abbreviates(
            parts[0], head, ctx.in_documents
        )
    head_words = resolve_units(canonical_tokens(head), gold_words)
    return _holds_gold(head_words, gold_words, ctx) and all(
        _qualifies(part, i == 0, head, gold_words, golds, ctx) for i, part in enumerate(parts)
    )


def matching_gold(answer: str | None, golds: Iterable[str], ctx: AnswerContext) -> str | None:
    """The gold (or alias) that the whole `answer` is a form of, or None (module docstring)."""
    if answer is None or len(answer) > MAX_FORM_CHARS or not normalize_answer(answer):
        return None
    golds = [str(gold) for gold in golds]
    words = canonical_tokens(answer)
    for gold in golds:
        gold_words = canonical_tokens(gold)
        if not gold_words:
            continue
        plain = _separators(answer) <= _separators(gold)
        if plain and _holds_gold(resolve_units(words, gold_words), gold_words, ctx):
            return gold
        if _qualified(answer, gold, golds, ctx):
            return gold
    return None


def _readings(stage: str, ctx: AnswerContext) -> list[str]:
    """The stage itself, then the spans it may commit to as a sentence (`spans`)."""
    return list(dict.fromkeys([stage, *committed_spans(stage, ctx.question_words)]))


def judge_answer(
    answer: str | None, golds: Iterable[str], ctx: AnswerContext
) -> tuple[str | None, str | None]:
    """(the gold the answer is a form of, or None; the text to score against the golds).

    The answer as written first; then, unless a part of it refuses (`refusals.holds_refusal`:
    a refusal beside a guess commits to neither), each stage of it as its wrappers peel
    (`wrappers.peeled_stages`) and the spans each commits to as a sentence
    (`spans.committed_spans`): the gold where one of these readings is a form of it. Right or
    wrong, the text to score is the committed reading: the first span of the most peeled
    stage, or that stage."""
    golds = [str(gold) for gold in golds]
    if (gold := matching_gold(answer, golds, ctx)) is not None or answer is None:
        return gold, answer
    if len(answer) > MAX_FORM_CHARS or holds_refusal(answer):
        return None, answer
    stages = peeled_stages(answer)
    readings = dict.fromkeys(reading for stage in stages for reading in _readings(stage, ctx))
    for reading in readings:
        exact = next((gold for gold in golds if exact_match(reading, gold)), None)
        if (gold := exact or matching_gold(reading, golds, ctx)) is not None:
            return gold, reading
    committed = _readings(stages[-1], ctx)
    return None, committed[1] if len(committed) > 1 else committed[0]
