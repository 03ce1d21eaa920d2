"""Which replies refuse: "unanswerable" in its common phrasings, with a reason and what was found.

`is_refusal` recognises "unanswerable" in its common phrasings ("not answerable", "N/A",
"cannot be determined", "it is not possible to answer this question", "the documents do not
say", "insufficient information", "no document says who founded Routledge", "there is nothing
about the founder of Routledge", ...), with the reason in any order ("Not enough information in
the documents to answer.", "I could not find this information in the documents.") and
sentences of refusal joined ("Unanswerable: the documents do not say who founded it."), beside
what the search found before the gap ("Unanswerable: I found Routledge, but nothing about who
founded it.", "I could identify Routledge but not its founder"), whatever package wraps it
(`wrappers.peel_package`: '{"answer": "N/A"}', "**Unanswerable**", "Final answer - N/A [6]").
Every part of the reply must refuse or say only where it looked or what it found, one part at
least refusing: so a reply that hedges with a candidate ("Unanswerable, but probably X", "N/A
(maybe X)", "I could not find it, so I guess X") is no refusal, and `holds_refusal` tells
`answers` not to read it as the candidate either.

Both work on MuSiQue's official normalisation (SQuAD's: lower case, no punctuation, no
articles, single spaces).
"""

from __future__ import annotations

import re

from .scoring import normalize_answer
from .spans import ends_abbreviation
from .wrappers import peel_package, peeled_stages

__all__ = ["MAX_REFUSAL_CHARS", "holds_refusal", "is_refusal"]

MAX_REFUSAL_CHARS = 300  # no refusal is longer; keeps the patterns linear on huge inputs

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
_DOC_NOUNS = (
    r"(?:documents?|docs?|sources?|texts?|passages?|paragraphs?|search results?|results?"
    r"|articles?|records?)"
)
_SAY = (
    r"(?:says?|mentions?|states?|names?|gives?|specif(?:y|ies)|identif(?:y|ies)|contains?"
    r"|answers?|tells?|shows?|indicates?|provides?|reveals?|lists?)"
)
_REFUSAL = re.compile(
    "^(?:"
    + "|".join(
        [
            _SUBJECT + r"(?:un ?answerable|unknown|not known|unknowable|undeterminable"
            r"|indeterminable|indeterminate|undetermined|unclear|na|n a|not applicable"
            r"|(?:not |im)possible(?: to (?:determine|answer|tell|know|say)"
            r"(?: (?:it|this|that|question|this question|that question))?)?"
            r"|not (?:answerable|determinable|stated|given|specified|mentioned|provided"
            r"|available|found|clear|known))(?: " + _TOPIC + ")?",
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
            r"none of " + _DOC_NOUNS + r" " + _SAY + r"(?: " + _FREE_OBJECT + r")?",
            r"no " + _DOC_NOUNS + r" " + _SAY + r"(?: " + _FREE_OBJECT + r")?",
            r"(?:there is |there was |i found |i see |i could find |we found )?nothing"
            r" (?:about|on|regarding|concerning|that (?:says|states|mentions|tells|names)"
            r"|saying|mentioning|which says|to say|to indicate|to show|to tell|to identify)"
            r"(?: " + _FREE_OBJECT + r")?",
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
# What the search found before the gap ("I found Routledge", "the documents identify
# Routledge", "Routledge is mentioned"): says nothing for or against a refusal.
_FOUND = (
    r"(?:(?:i |we )?(?:found|find|identified|could identify|can identify|was able to identify"
    r"|were able to identify|located|could locate|know|learned|established|confirmed"
    r"|could find|can find)(?: that)?"
    r"|(?:documents?|sources?|passages?|paragraphs?|search results?|results|evidence|searches)"
    r"(?: do| does)? (?:identify|identifies|name|names|mention|mentions|show|shows|give|gives"
    r"|point to|points to|lead to|leads to)"
    r"|(?:first|earlier|previous|second|third) (?:hop|step)s?(?: answer)? (?:is|was|gives"
    r"|gave|yields|leads to|points to)) \w+(?: \w+){0,15}"
)
_FOUND_PART = re.compile(
    "^(?:" + _FOUND + r"|\w+(?: \w+){0,8} (?:is|are|was|were) (?:mentioned|named|identified"
    r"|found|given|covered))$"
)
_FOUND_BUT_NOT = re.compile("^" + _FOUND + r" but (?:not|nothing|no) \w+(?: \w+){0,15}$")
# Words that hedge a refusal with an answer ("unknown, probably Stanley").
_REFUSAL_HEDGES = frozenset(
    "or but maybe perhaps possibly probably likely guess might though although however except "
    "unless if either alternatively otherwise instead think believe seems".split()
)
# A connective that joins a refusal to what came before ("I found X, but nothing about Y").
_CONNECTIVE = re.compile(r"^(?:but|however|though|although|yet|and|so|thus|therefore|hence) ")
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


_NOT_HEDGES = re.compile(r"\bcould(?=(?: not| nt|nt)\b)|\bbut (?=(?:not|nothing|no|none)\b)")
# A question the refusal names, in its own words: one that asks to choose between names it
# gives ("who has more titles, Clemson or South Carolina": its "or"), one that asks what
# someone thought ("where did Avicenna think Venus was": its "think").
_WH = r"\b(?:who|whom|whose|what|which|whether|when|where|how|why)\b"
_CHOICE = re.compile(
    _WH + r".*?\b(?:whether|which|more|most|less|fewer|first|earlier|later|older|younger"
    r"|bigger|larger|smaller|longer|shorter|higher|lower|between)\b"
)
_ASKED_BELIEF = re.compile(
    _WH + r" (?:did|does|do|would|will|can|could|is|was|were) .*?(?<!\bi )(?<!\bwe )"
    r"\b(?:think|believe|guess)\b"
)


def _hedged(text: str) -> bool:
    """Words that weigh a candidate beside the refusal; not "could not", "but not", nor the
    words of a question the refusal names (`_CHOICE`, `_ASKED_BELIEF`)."""
    text = _NOT_HEDGES.sub("", text)
    if choice := _CHOICE.search(text):
        text = text[: choice.end()] + re.sub(r"\bor\b", "", text[choice.end() :])
    if belief := _ASKED_BELIEF.search(text):
        text = text[: belief.start()] + text[belief.end() :]
    return bool(set(text.split()) & _REFUSAL_HEDGES)


def _refusal_part(part: str, unanswerable: str, weigh_hedges: bool = True) -> bool | None:
    """True for a refusal, False for anything else, None for a part that says nothing for or
    against one (where the refusal looked, "Final answer", what the search found). A part that
    hedges ("unknown, probably Stanley") is no refusal, unless `weigh_hedges` is False."""
    looked = " ".join(_WHERE_LOOKED.sub(" ", normalize_answer(part)).split())
    looked = _CONNECTIVE.sub("", looked)
    announced = _ANNOUNCED_REFUSAL.sub("", looked + " ").strip()
    if looked in _SAYS_NOTHING or announced in _SAYS_NOTHING:
        return None
    if weigh_hedges and _hedged(looked) and _hedged(announced):
        return False
    if any(_REFUSAL.match(t) or _FOUND_BUT_NOT.match(t) for t in (announced, looked)):
        return True
    if unanswerable in (announced, looked):
        return True
    if "answer" not in looked.split() and _FOUND_PART.match(looked):
        return None
    return False


def _parts(answer: str) -> tuple[list[str], list[str], list[bool]]:
    """The answer's parts, the marks between them, and which marks end a sentence."""
    pieces = _REFUSAL_BREAKS.split(answer)
    texts, marks = pieces[0::2], pieces[1::2]
    hard = [
        mark.strip()[:1] in (".", "!", ";") and not ends_abbreviation(texts[i])
        for i, mark in enumerate(marks)
    ]
    return texts, marks, hard


def _refuses(answer: str, unanswerable: str) -> bool:
    """Every part refuses or says nothing, one at least refusing; a part may span the marks
    inside a name ("Country Girl (Shake It for Me)"), never a sentence end."""
    texts, marks, hard = _parts(answer)
    if len(texts) > MAX_REFUSAL_PARTS:  # no refusal has so many; keeps the search small
        return False
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


def is_refusal(answer: str | None, unanswerable: str = "unanswerable") -> bool:
    """Whether the whole answer says the question cannot be answered, in any common phrasing
    and package (module docstring): as written, or without its package."""
    if answer is None or len(answer) > MAX_REFUSAL_CHARS or not normalize_answer(answer):
        return False
    return any(
        _refuses(text, unanswerable) for text in dict.fromkeys([answer, peel_package(answer)])
    )


# Where a clause that refuses may meet one that answers inside a part: a contrast ("N/A but
# the answer is X"), an announcement ("Unknown. The answer is probably X").
_CLAUSE_BREAKS = re.compile(
    r"\s+(?:but|however|though|although|yet|whereas|while)\s+"
    r"|\s+(?=(?:(?:the|my)\s+)?(?:final\s+)?answer\s+(?:is|would\s+be)\b)",
    re.IGNORECASE,
)


def holds_refusal(answer: str) -> bool:
    """Whether a part of the answer refuses, hedged or wrapped or not ("Unanswerable, but
    probably X", "Probably N/A. The answer is X": a refusal and a guess): such an answer commits
    to no candidate it names. Its parts are split as `is_refusal` splits them, and at a
    contrast or an announcement inside one; each is read as its wrappers peel."""
    if len(answer) > MAX_REFUSAL_CHARS:
        return False
    texts = _parts(peel_package(answer))[0]
    clauses = (clause for text in texts for clause in _CLAUSE_BREAKS.split(text) if clause)
    readings = (reading for clause in clauses for reading in peeled_stages(clause))
    return any(_refusal_part(reading, "unanswerable", weigh_hedges=False) for reading in readings)
