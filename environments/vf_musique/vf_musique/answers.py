"""Which submitted answers are the gold: the forms a correct answer takes, and refusals.

People and models write a correct answer in more forms than the gold string: "in 2003",
"Pittsburgh, Pennsylvania", "Charles Carroll of Carrollton" (for "Charles Carroll"),
"1,400 meters" (for "1400"), "3 March 1847" or "1847-03-03" (for "March 3, 1847"),
"Kaufhaus des Westens (KaDeWe)" (for "KaDeWe"), "The answer is Stanley." `judge_answer` treats
such an answer as the gold when it holds the gold (or an alias) and nothing else:

- compared as canonical words (`notation`): one notation for dates, numbers and units;
- the words around the gold may be a preposition, a title, a kind ("the city of"), an era or a
  unit, or a longer name the documents use;
- a qualifier after a comma or in brackets must say *which* gold, never offer another: a region
  containing a place (a country, a state or province; "Moscow, Russia", "Austin, Texas, USA";
  never a region beside a region, "Maine, Vermont", and no region at all for an answer that is
  no place), the acronym of the gold or its expansion ("KaDeWe (Kaufhaus des Westens)", and the
  gold in brackets beside its full name), another name of the gold among the golds, or a kind
  ("(city)");
- a reply written as a sentence is read for the span it commits to (`spans.committed_answer`:
  "The answer is X.", "Final answer: X", "X (per the documents)", X and an explanation), and the
  span is judged alone.

Words that add a candidate never pass: a connective or hedge ("or", "and", "maybe"), another
hop's answer, a second separator, a phrase the documents do not hold, a second name after a
comma or in brackets ("Stanley, Bismarck", "Stanley (Bismarck)"). So a list of guesses or a
long answer holding the gold among other candidates stays a wrong answer (scored by token F1
alone), and a sentence naming two candidates is paid as committing to the first.

`is_refusal` recognises "unanswerable" in its common phrasings ("not answerable", "cannot be
determined", "the documents do not say", "insufficient information", ...), with the reason in
any order ("Not enough information in the documents to answer.", "I could not find this
information in the documents.") and sentences of refusal joined ("Unanswerable: the documents
do not say who founded it."): every part of the answer must refuse, so an answer that hedges
with a refusal is not one.

Both work on MuSiQue's official normalisation (SQuAD's: lower case, no punctuation, no
articles, single spaces).
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from functools import cache, cached_property
from typing import Any

import pycountry

from .notation import UNIT_WORDS, canonical_tokens, resolve_units
from .scoring import exact_match, normalize_answer
from .spans import committed_spans, ends_abbreviation

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
# Kinds of place: a gold that ends in one is a place, which a region may qualify.
_PLACE_KINDS = frozenset(
    "city town village county state province country island islands river lake mountain "
    "mountains mount district region municipality parish borough township harbour harbor bay "
    "sea ocean peninsula valley prefecture gmina".split()
)
_PLACE_QUESTION = re.compile(
    r"\b(?:where|city|cities|town|village|county|country|state|province|region|district"
    r"|municipality|place|seat|capital|located|location|island|headquarters|birthplace"
    r"|hometown)\b",
    re.IGNORECASE,
)
_NOT_PLACE_QUESTION = re.compile(r"^\s*(?:when|what year|how many|how much)\b", re.IGNORECASE)
# A last hop that looks inside the answer it builds on ("#1 >> capital", "what is the largest
# city in #1"): that answer holds the gold, so it may qualify it ("Moscow, Russia").
_INSIDE_QUESTION = (
    r">>\s*(?:capital|seat|largest city|county seat)\s*$"
    r"|\b(?:capital|seat|largest|biggest|city|cities|town|towns|village|county|counties|state"
    r"|province|region|district|place|mountains?|river|lake|island)\b[^#]*\b(?:in|of) #{k}\b"
)
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

# Countries by the short names people write, where pycountry has only an official or a
# current name ("Russian Federation", "Türkiye"), or none (the Soviet Union).
_SHORT_COUNTRY_NAMES = {
    "Russia": "RU",
    "Syria": "SY",
    "Vietnam": "VN",
    "South Korea": "KR",
    "North Korea": "KP",
    "Laos": "LA",
    "Czech Republic": "CZ",
    "Macedonia": "MK",
    "Brunei": "BN",
    "Turkey": "TR",
    "Swaziland": "SZ",
    "Burma": "MM",
    "Cape Verde": "CV",
    "East Timor": "TL",
    "Palestine": "PS",
    "Ivory Coast": "CI",
    "Vatican": "VA",
    "Vatican City": "VA",
    "Holland": "NL",
    "USA": "US",
    "US": "US",
    "United States of America": "US",
    "America": "US",
    "UK": "GB",
    "Britain": "GB",
    "Great Britain": "GB",
    "Soviet Union": "SU",
    "USSR": "SU",
    "Yugoslavia": "YU",
    "Czechoslovakia": "CS",
    "East Germany": "DD",
    "West Germany": "DE",
}
# The subdivisions a place is commonly qualified by from general knowledge ("Pittsburgh,
# Pennsylvania"); any other subdivision qualifies a place where the documents write it so.
_QUALIFYING_SUBDIVISIONS = {
    "US": {"State", "District"},
    "CA": {"Province", "Territory"},
    "AU": {"State", "Territory"},
    "GB": {"Country", "Province"},
    "IN": {"State", "Union territory"},
}

# --- refusals ---------------------------------------------------------------------------------

_DOCS = (
    r"(?:documents?|docs|sources?|texts?|context|passages?|paragraphs?|search results?|results"
    r"|articles?|excerpts?|records?|materials?|evidence|data|information)"
)
# Where a refusal says it looked: removed wherever it stands ("not enough information in the
# documents to answer" and "not enough information to answer from the documents" alike).
_WHERE_LOOKED = re.compile(
    r"(?:^| )(?:from|in|based on|given|according to|with|using|within|among|across|per|on"
    r"|after searching|after reviewing)(?: any of| all of| any| all)?"
    r"(?: provided| available| retrieved| given| these| those| this| my| search| above"
    r"| supplied| cited| relevant)* " + _DOCS + r"(?: provided| given| available| retrieved"
    r"| supplied| at hand| here| above)?(?= |$)"
)
_TOPIC = (
    r"(?:(?:about|on|regarding|concerning|for|of|who|whom|whose|what|when|where|which|whether"
    r"|how|why) \w+(?: \w+){0,11})"
)
# What a refusal could not find: a fixed object ("the answer", "enough information to answer
# the question", "about it"), or, after "I could not find", "the documents do not say", any
# few words ("the founder of Routledge", "who wrote it"), which a song called "Don't Know
# Why" never has before it.
_OBJECT = (
    r"(?:(?:(?:enough|sufficient|any|relevant|such|this|that) )*(?:information|info|evidence"
    r"|data|details|answer|mention)(?: " + _TOPIC + r")?"
    r"(?: to (?:answer|determine|tell|say|know)(?: (?:it|this|that|question|this question"
    r"|that question))?)?(?: to (?:this |that )?question)?"
    r"|it|this|that|question|this question|that question|" + _TOPIC + r")"
)
_FREE_OBJECT = r"(?:\w+(?: \w+){0,15})"
_SUBJECT = (
    r"(?:(?:question|answer|it|this|that|this question|information"
    r"|answer to (?:this |that )?question)(?: is| was)? )?"
)
_NEGATIONS = (
    r"(?:cannot|can not|cant|could not|couldnt|am unable to|was unable to|were unable to"
    r"|unable to|do not|dont|did not|didnt|failed to|was not able to|am not able to)"
)
_REFUSAL = re.compile(
    "^(?:"
    + "|".join(
        [
            _SUBJECT + r"(?:un ?answerable|unknown|not known|unknowable|undeterminable"
            r"|indeterminable|indeterminate|undetermined|unclear|not (?:answerable|determinable"
            r"|stated|given|specified|mentioned|provided|available|found|clear|known|possible"
            r"(?: to (?:determine|answer|tell|know|say))?))(?: " + _TOPIC + ")?",
            _SUBJECT + r"(?:cannot|can not|cant|could not|couldnt) be (?:determined|answered"
            r"|found|known|established|identified|inferred|verified|said|told|confirmed)",
            r"(?:i |we )" + _NEGATIONS + r" (?:determine|answer|tell|find|know|say|identify"
            r"|verify|locate|confirm|see|work out|figure out)(?: " + _FREE_OBJECT + r")?",
            _NEGATIONS + r" (?:determine|answer|tell|find|know|say|identify|verify|locate"
            r"|confirm|see)(?: " + _OBJECT + r")?",
            r"(?:none of )?(?:documents?|docs|sources?|texts?|context|passages?|paragraphs?"
            r"|search results?|results|retrieved documents?|provided documents?|evidence"
            r"|information|searches|my searches|search)"
            r" (?:do not|dont|does not|doesnt|did not|didnt|fail to|failed to) (?:say|mention"
            r"|contain|specify|state|provide|include|answer|give|tell|show|support|indicate"
            r"|reveal|cover|discuss|name|identify|find|turn up|return)(?: " + _FREE_OBJECT + r")?",
            r"(?:none of )?(?:documents?|docs|sources?|texts?|passages?|paragraphs?|search results?"
            r"|results) (?:says?|mentions?|answers?|contains?|names?)(?: " + _FREE_OBJECT + r")?",
            r"(?:there is |there was |there isnt |there wasnt |there are |i have |i found |i see )?"
            r"(?:not enough|insufficient|no|not sufficient|inadequate|lack of|missing|not any"
            r"|too little)(?: relevant)? (?:information|info|evidence|data|context|details"
            r"|answer|mention)(?: (?:is |was )?(?:available|provided|given|found))?"
            r"(?: " + _TOPIC + r")?"
            r"(?: to (?:answer|determine|tell|say|know|identify)(?: " + _OBJECT + r")?)?",
            r"(?:no answer|none found|no answer found|answer not found|not found"
            r"|(?:answer|information)(?: is| was)? not(?: in| available in| found in| available"
            r"| found| provided| given| there| included| here| known)?(?: " + _DOCS + r")?)",
        ]
    )
    + ")$"
)
# Words that hedge a refusal with an answer ("unknown, probably Stanley").
_REFUSAL_HEDGES = frozenset(
    "or but maybe perhaps possibly probably likely guess might though although however except "
    "unless if either alternatively otherwise instead think believe seems".split()
)
# Where a refusal's parts meet: sentence ends (which no part joins across, unless after an
# abbreviation: "Eugene V. Debs"), colons, commas, dashes, brackets.
_REFUSAL_BREAKS = re.compile(r"([.!;]\s+|[.!;]$|:\s*|,\s*|\s+[-\u2013\u2014]+\s+|\s*[()\[\]]\s*)")
_ANNOUNCED_REFUSAL = re.compile(
    r"^(?:(?:so|therefore|thus|overall|sorry|im sorry|i am sorry|unfortunately|but"
    r"|(?:after|having) (?:searching|searched|reviewing|reviewed|checking|checked|looking"
    r"|looked)(?: through| at| in)?) )*"
    r"(?:(?:my |final |correct |short )*answer(?: is)? |final |because |since |as )?"
)
_SAYS_NOTHING = frozenset(("", "final answer", "answer", "final"))
MAX_REFUSAL_PARTS = 12


def _refusal_part(part: str, unanswerable: str) -> bool | None:
    """True for a refusal, False for anything else, None for a part that says nothing (where
    the refusal looked, "Final answer")."""
    looked = " ".join(_WHERE_LOOKED.sub(" ", normalize_answer(part)).split())
    announced = _ANNOUNCED_REFUSAL.sub("", looked + " ").strip()
    if looked in _SAYS_NOTHING or announced in _SAYS_NOTHING:
        return None
    if set(looked.replace("could not", "").replace("couldnt", "").split()) & _REFUSAL_HEDGES:
        hedged = set(announced.replace("could not", "").replace("couldnt", "").split())
        if hedged & _REFUSAL_HEDGES:
            return False
    return any(
        text == unanswerable or _REFUSAL.match(text) is not None for text in (announced, looked)
    )


def is_refusal(answer: str | None, unanswerable: str = "unanswerable") -> bool:
    """Whether the whole answer says the question cannot be answered, in any common phrasing
    (`unanswerable` itself, "not answerable", "the documents do not say", ...): it splits
    into parts (at sentence ends, colons, commas, dashes, brackets; a part may span the marks
    inside a name, "Country Girl (Shake It for Me)", but no sentence end) each of which
    refuses or says nothing more (where it looked, "Final answer"), one at least refusing."""
    if answer is None or len(answer) > MAX_FORM_CHARS or not normalize_answer(answer):
        return False
    pieces = _REFUSAL_BREAKS.split(answer)
    texts, marks = pieces[0::2], pieces[1::2]
    if len(texts) > MAX_REFUSAL_PARTS:  # no refusal has so many; keeps the search small
        return False
    hard = [
        mark.strip()[:1] in (".", "!", ";") and not ends_abbreviation(texts[i])
        for i, mark in enumerate(marks)
    ]
    reach: list[set[bool]] = [set() for _ in range(len(texts) + 1)]
    reach[0].add(False)  # at each boundary: whether a refusing part came before
    for i in range(len(texts)):
        if not reach[i]:
            continue
        for j in range(i + 1, min(len(texts), i + MAX_REFUSAL_PARTS) + 1):
            if j - 1 > i and hard[j - 2]:
                break
            joined = "".join(
                t + (marks[k] if k < j - 1 else "") for k, t in enumerate(texts[i:j], i)
            )
            verdict = _refusal_part(joined, unanswerable)
            if verdict is not False:
                reach[j].update(before or bool(verdict) for before in reach[i])
    return True in reach[-1]


# --- the row: candidates, documents, the question ---------------------------------------------


class AnswerContext:
    """What tells a form of the gold from another candidate: the row's other hop answers
    (the candidates an agent holds on the way), its documents (as canonical text, built on
    first use: most answers never need them), and its question (what kind of thing it asks
    for; the words a reply may restate)."""

    def __init__(self, info: Mapping[str, Any]) -> None:
        hops = info.get("hops") or []
        self.other_phrases = tuple(
            words for hop in hops[:-1] if (words := canonical_tokens(str(hop.get("answer") or "")))
        )
        self.other_answers = frozenset(w for words in self.other_phrases for w in words)
        self._paragraphs = list(info.get("paragraphs") or [])
        asked = str(hops[-1].get("question") or "") if hops else ""
        self._asked = asked or str(info.get("question") or "")
        inside = [
            k
            for k in {int(k) for k in re.findall(r"#(\d+)", asked)}
            if 0 < k < len(hops) and re.search(_INSIDE_QUESTION.format(k=k), asked, re.IGNORECASE)
        ]
        self._holding = frozenset(
            tuple(canonical_tokens(str(hops[k - 1].get("answer") or ""))) for k in inside
        )
        self._question_texts = [
            str(info.get("question") or ""),
            *(str(hop.get("question") or "") for hop in hops),
            *(str(hop.get("answer") or "") for hop in hops[:-1]),
        ]

    @cached_property
    def documents(self) -> tuple[str, ...]:
        """Each kept paragraph (title and text) as canonical words between spaces."""
        texts = (f"{p.get('title', '')} {p.get('text', '')}" for p in self._paragraphs)
        return tuple(f" {' '.join(canonical_tokens(text))} " for text in texts)

    @cached_property
    def question_words(self) -> frozenset[str]:
        """Normalised words of the question, its hops and the earlier hops' answers."""
        return frozenset(w for text in self._question_texts for w in normalize_answer(text).split())

    def asks_for_place(self, gold: Sequence[str]) -> bool:
        """The answer is a place (a region may qualify it): the last hop asks for one (where,
        city, located in, capital, ...), or the gold names a kind of place ("Presque Isle
        County"). A context without a question allows it."""
        if not self._asked:
            return True
        if gold and gold[-1] in _PLACE_KINDS:
            return True
        return not _NOT_PLACE_QUESTION.match(self._asked) and bool(
            _PLACE_QUESTION.search(self._asked)
        )

    def qualifies_by_hop(self, words: Sequence[str], gold: Sequence[str]) -> bool:
        """Whether `words`, if they are an earlier hop's answer (a candidate the agent holds),
        may say where the gold lies: where the last hop looks inside that answer ("#1 >>
        capital": "Moscow, Russia"), or where the documents write them after the gold; never
        otherwise (the country the last hop's subject lies in, another country the chain
        went through). Words that are no hop's answer may."""
        if tuple(words) not in {tuple(p) for p in self.other_phrases}:
            return True
        return tuple(words) in self._holding or self.in_documents([*gold, *words])

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


# --- regions ----------------------------------------------------------------------------------

Regions = Mapping[tuple[str, ...], frozenset[tuple[str, str]]]


def _country_names(country: Any) -> list[str]:
    """A country's names as pycountry gives them, and the short forms of the official ones
    ("Bolivia" for "Bolivia, Plurinational State of", "Falkland Islands" for "Falkland Islands
    (Malvinas)")."""
    names = [
        getattr(country, field, "") or "" for field in ("name", "common_name", "official_name")
    ]
    short = [re.split(r",|\(", name)[0].strip() for name in names if name]
    return [name for name in {*names, *short} if name]


@cache
def _regions() -> Regions:
    """Countries (every one pycountry knows, current and historic, by any of its names and
    its three-letter code) and the subdivisions places are commonly qualified by, as
    canonical words -> {("country" | "subdivision", country code)}."""
    found: defaultdict[tuple[str, ...], set[tuple[str, str]]] = defaultdict(set)

    def add(name: str, kind: str, code: str) -> None:
        if words := tuple(canonical_tokens(name)):
            found[words].add((kind, code))

    for country in pycountry.countries:
        for name in [*_country_names(country), country.alpha_3]:
            add(name, "country", country.alpha_2)
    for country in pycountry.historic_countries:
        for name in _country_names(country):
            add(name, "country", getattr(country, "alpha_2", "") or country.alpha_4)
    for name, code in _SHORT_COUNTRY_NAMES.items():
        add(name, "country", code)
    for region in pycountry.subdivisions:
        if region.type in _QUALIFYING_SUBDIVISIONS.get(region.country_code, ()):
            add(region.name.split("[")[0], "subdivision", region.country_code)
            if region.country_code == "US":  # postal abbreviations: "Pittsburgh, PA"
                add(region.code.split("-")[1], "subdivision", "US")
    return dict(found)


@cache
def _other_subdivisions() -> Regions:
    """Every other subdivision pycountry knows (a Philippine province, an Italian region)."""
    found: defaultdict[tuple[str, ...], set[tuple[str, str]]] = defaultdict(set)
    for region in pycountry.subdivisions:
        if words := tuple(canonical_tokens(region.name.split("[")[0])):
            found[words].add(("subdivision", region.country_code))
    return dict(found)


def _countries_named(gold: tuple[str, ...]) -> frozenset[tuple[str, ...]]:
    """The country names among the gold's words ("Alfredo Stroessner's Paraguay" names
    Paraguay): such a gold answers at the level of countries."""
    regions = _regions()
    return frozenset(
        gold[i:j]
        for i in range(len(gold))
        for j in range(i + 1, len(gold) + 1)
        if any(kind == "country" for kind, _ in regions.get(gold[i:j], ()))
    )


def _contains(words: Sequence[str], gold: Sequence[str], ctx: AnswerContext) -> bool:
    """The qualifier is a region that may contain the gold: a country or a common subdivision
    (or any other subdivision the documents write right after the gold), qualifying a place;
    a region qualifies a region only as its country ("Maine, USA", never "Maine, Vermont"), and
    a country nothing, a gold that names a country ("SR Serbia") by that country alone; an
    earlier hop's answer only where the last hop looks inside it or the documents write it
    after the gold (`AnswerContext.qualifies_by_hop`)."""
    codes = _regions().get(tuple(words))
    if codes is None and ctx.in_documents([*gold, *words]):
        codes = _other_subdivisions().get(tuple(words))
    if not codes or not ctx.asks_for_place(gold) or not ctx.qualifies_by_hop(words, gold):
        return False
    named = _countries_named(tuple(gold))
    if named:  # a country-level gold ("SR Serbia"): its own country at most
        return tuple(words) in named
    gold_codes = _regions().get(tuple(gold))
    if gold_codes is None:
        return True
    return any(kind == "country" and ("subdivision", code) in gold_codes for kind, code in codes)


# --- acronyms ---------------------------------------------------------------------------------

_FUNCTION_WORDS = frozenset(
    "of the and for de des du la le les der die das von van y e di del da do dos in on at to "
    "&".split()
)


def _spells(letters: str, words: Sequence[str], used: int = 0) -> bool:
    """`letters` is a run of prefixes of `words`, in order, one per word, where only function
    words may be left out: "nida" of "national institute of dramatic art", "kadewe" of
    "kaufhaus des westens"."""
    if not letters:
        return used >= 2 and all(w in _FUNCTION_WORDS for w in words)
    if not words:
        return False
    word, rest = words[0], words[1:]
    if word in _FUNCTION_WORDS and _spells(letters, rest, used):
        return True
    return any(
        letters[:k] == word[:k] and _spells(letters[k:], rest, used + 1)
        for k in range(1, min(len(word), len(letters)) + 1)
    )


def _abbreviates(short: str, long: str, ctx: AnswerContext) -> bool:
    """`short` is the acronym of `long`: written in capitals (two or more), it spells the
    initial letters of `long`'s words ("NIDA", "KaDeWe"), or the documents write `long`
    followed by it (a foreign acronym: "People's Party for Freedom and Democracy (VVD)")."""
    letters = re.sub(r"[\s.'&\-]", "", short)
    if not 2 <= len(letters) <= 10 or not letters.isalpha():
        return False
    capitals = sum(ch.isupper() for ch in letters)
    words = [w.lower() for w in re.findall(r"[^\W\d_]+|&", long)]
    if capitals < 2 or len(words) < 2:
        return False
    if _spells(letters.lower(), words):
        return True
    return capitals >= 0.75 * len(letters) and ctx.in_documents(canonical_tokens(f"{long} {short}"))


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
    if first and (_abbreviates(part, head, ctx) or _abbreviates(head, part, ctx)):
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
        return _abbreviates(head, parts[0], ctx) or _abbreviates(parts[0], head, ctx)
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


def judge_answer(
    answer: str | None, golds: Iterable[str], ctx: AnswerContext
) -> tuple[str | None, str | None]:
    """(the gold the answer is a form of, or None; the text to score against the golds).
    A reply written as a sentence is judged by the span it commits to
    (`spans.committed_spans`: the gold where one of its readings is a form of it), right or
    wrong: the text to score is that span."""
    golds = [str(gold) for gold in golds]
    if (gold := matching_gold(answer, golds, ctx)) is not None or answer is None:
        return gold, answer
    if len(answer) > MAX_FORM_CHARS:
        return None, answer
    spans = committed_spans(answer, ctx.question_words)
    if not spans:
        return None, answer
    for span in spans:
        exact = next((gold for gold in golds if exact_match(span, gold)), None)
        if (gold := exact or matching_gold(span, golds, ctx)) is not None:
            return gold, span
    return None, spans[0]
