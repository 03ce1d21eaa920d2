"""The wrappers around the answer a reply commits to, peeled by structure.

Models package one answer in layers: a container ('{"answer": "X"}', "1. X", "- X", "> X"),
markup and quotes ("**X**", "`X`", '"X"'), a label ("Answer: X", "Final answer - X", YAML's
"answer: X"), citations in any bracket layout ("X [6][14][15]", "X [6, 14]", "X (Doc 6, 14)",
"X (see Documents 6 and 14)"), trailing punctuation, confidence words ("X (confidence: high)",
"X, though I am not completely certain", "X, I think"), a hedge ("Probably X", "It seems to be
X", "I believe the answer is X", "My best guess is X"), an announcement ("Based on the
documents, X", "Therefore, X", "The answer is X") and a step chain ("B → X"). Each layer is
recognised by its own closed grammar and peeled from the outside in, in any order and any
number, so a wrapper never changes what the reply commits to and no list of whole-sentence
forms is needed.

Two layers move the start of the reply past words that are not the answer: an announcement
anywhere in the sentence ("Since the earlier hop is B, the answer is X.", "<a sentence>.
Final answer: X": the text after the last "the answer is" / "final answer:") and a step chain
(the text after the last arrow). Both give one reading, never two: a reply that names a
second candidate before the last announcement or arrow commits to the one after it, exactly
as committing to that one pays.

Nothing here weighs candidates: a hedge peels only at the edge of the reply, so "X or Y",
"X (or possibly Y)", "X; alternatively Y" keep every candidate, and the rules of `answers`
and `spans` read them as no form of either. Nothing here looks at the gold.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable

__all__ = ["peel_package", "peeled_stages", "strip_hedge"]

_I = re.IGNORECASE

# --- containers, markup, labels ----------------------------------------------------------------

_ANSWER_KEY = re.compile(
    r"^(?:final[ _-]?|short[ _-]?)?(?:answer|result|response|output|prediction)s?$", _I
)
_LOOSE_OBJECT = re.compile(r"^\{\s*['\"]?(?P<key>[\w -]+)['\"]?\s*:\s*(?P<value>.*?)\s*,?\s*\}$")


def _json_value(text: str) -> str | None:
    """The answer a JSON object or one-element list holds ('{"answer": "X"}' -> "X"): the
    value of an answer key, or of the only key; None for anything else."""
    if (text[:1], text[-1:]) not in {("{", "}"), ("[", "]")}:
        return None
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        loose = _LOOSE_OBJECT.match(text)
        value = {loose["key"]: loose["value"].strip("'\"")} if loose else None
    if isinstance(value, dict):
        keys = [key for key in value if _ANSWER_KEY.match(str(key).strip())]
        if not keys and len(value) != 1:
            return None
        value = value[keys[0]] if keys else next(iter(value.values()))
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        return None
    return str(value)


def _container(text: str) -> str:
    """The value a JSON container holds, else the text."""
    value = _json_value(text)
    return value.strip() if value is not None else text


# A one-item list: "1." (never "12.": a number before a sentence may be an answer), a bullet,
# a quote mark.
_LIST_MARKER = re.compile(r"^(?:1[.)]|[-*+>\u2022\u25aa\u25cf\u2023]|\(\w\))\s+")
_EMPHASIS = re.compile(
    r"(?<![\w*])\*(?=\S)(?P<star>[^*]+?)(?<=\S)\*(?![\w*])"
    r"|(?<![\w_])_(?=\S)(?P<under>[^_]+?)(?<=\S)_(?![\w_])"
)
_MARKS = re.compile(r"\*\*|__|~~|`|[\"\u201c\u201d\u201e\u00ab\u00bb]")
_EDGE_QUOTES = re.compile(r"(?<!\w)['\u2018\u2019](?=\w)|(?<=\w)['\u2018\u2019](?!\w)")
_LABEL = re.compile(
    r"^(?:(?:my|the|our|your)\s+)?(?:(?:final|short|correct|best|direct|predicted|proposed)\s+)?"
    r"(?:answer|response|result|output|solution|prediction)\s*(?:\([^()]{0,20}\)\s*)?"
    r"(?::|=|\s[-\u2013\u2014]{1,2})\s*"
    r"|^a\s*:\s*",
    _I,
)


def _list_marker(text: str) -> str:
    """The text without the list marker or quote mark it opens with ("1. X", "- X", "> X")."""
    return _LIST_MARKER.sub("", text, count=1)


def _markup(text: str) -> str:
    """Markdown emphasis and code, and quotes, wherever they stand (a quote inside a word,
    "O'Brien", stays)."""
    text = _MARKS.sub("", text)
    text = _EMPHASIS.sub(lambda m: m["star"] or m["under"], text)
    return _EDGE_QUOTES.sub("", text)


def _label(text: str) -> str:
    """The text without the label it opens with ("Answer: X", "Final Answer - X", "A: X")."""
    return _LABEL.sub("", text, count=1)


# --- citations and punctuation -----------------------------------------------------------------

_DOC_WORD = r"(?:doc(?:ument)?s?|sources?|refs?|references?|passages?|paragraphs?|para|ids?)\.?"
_ONE_ID = rf"(?:{_DOC_WORD}\s*)?(?:#|no\.?\s*|id\s*:?\s*)?\d{{1,3}}"
_MORE_IDS = rf"(?:\s*(?:,|;|&|\band\b|-|\u2013)\s*{_ONE_ID})*"
_LEAD = r"(?:(?:see|cf\.?|source|sources|per|from|via|ref|refs|citing|cited\s+in|in)\s*:?\s*)?"
_CITATION = re.compile(
    rf"\s*\[\s*\^?{_LEAD}{_ONE_ID}{_MORE_IDS}\s*\]"  # [6] [6, 14] [Doc 6, Doc 14] [^6]
    rf"|\s*\(\s*{_LEAD}{_DOC_WORD}\s*(?:#|no\.?\s*)?\d{{1,3}}{_MORE_IDS}\s*\)"  # (Doc 6, 14)
    r"|\s*\u3010[^\u3011]{0,40}\u3011",  # 【6†source】
    _I,
)
_TRAILING = re.compile(r"[\s.!?\u2026;:,]+$")


def _citations(text: str) -> str:
    """Every bracket that holds only document references, wherever it stands; a bracket
    with anything else ("(Bismarck)", "(2016)") stays."""
    return _CITATION.sub("", text).strip()


def _trailing(text: str) -> str:
    """The text without trailing punctuation ("X.", "X!", "X ...")."""
    return _TRAILING.sub("", text)


# --- confidence and hedges ---------------------------------------------------------------------

_SURE = (
    r"(?:(?:fairly|pretty|quite|very|reasonably|almost|highly|completely|entirely|totally"
    r"|fully|absolutely|100\s*%|one\s+hundred\s+percent)\s+)?(?:confident|sure|certain)"
)
_LEVEL = r"(?:(?:very\s+)?(?:high|medium|moderate|low|strong)|\d{1,3}\s*%|0?\.\d+|\d+\s*/\s*\d+)"
_CONFIDENCE_SUFFIX = re.compile(
    r"\s*[(\[]\s*(?:(?:confidence|certainty)(?:\s+level)?\s*[:=\-]?\s*" + _LEVEL
    + r"|" + _LEVEL + r"\s+(?:confidence|certainty)"
    r"|i\s+think|i\s+believe|probably|likely|most\s+likely|(?:i(?:'m|\s+am)\s+)?" + _SURE
    + r"|not\s+" + _SURE + r")\s*[)\]]$"
    r"|\s*[,;\-\u2013\u2014]?\s*(?:(?:though|although|but)\s+)?i(?:'m|\s+am)\s+not\s+" + _SURE
    + r"(?:\s+(?:about|of)\s+(?:this|it|that))?$"
    r"|\s*[,;\-\u2013\u2014]\s*(?:i\s+think|i\s+believe|i\s+guess|i\s+suppose|i'd\s+say"
    r"|i\s+would\s+say|probably|most\s+likely|likely)$"
    r"|\s*[,;.\-\u2013\u2014]?\s*(?:confidence|certainty)\s*[:=]\s*" + _LEVEL + r"$",
    _I,
)  # fmt: skip
_LEADING_HEDGE = re.compile(
    r"^(?:(?:probably|most\s+(?:likely|probably)|very\s+likely|likely|possibly|perhaps|maybe"
    r"|presumably|apparently|almost\s+certainly|certainly|definitely|clearly)\b\s*,?\s*"
    r"|i\s+(?:think|believe|guess|suspect|reckon|would\s+say)(?:\s+that)?\s*,?\s+"
    r"|(?:i'd|i\s+would)\s+say\s+"
    r"|i(?:'m|\s+am)\s+" + _SURE + r"(?:\s+that)?\s*,?\s+"
    r"|it\s+(?:seems|appears|looks)(?:\s+(?:to\s+be|like|that))?\s+"
    r"|(?:it|this|that)(?:'s|\s+is|\s+was)\s+(?:probably|likely|most\s+likely|possibly)\s+"
    r"|my\s+(?:best\s+)?guess\s*(?:is|would\s+be|:|-)\s*"
    r"|(?:the\s+)?(?:most\s+likely|likeliest|best)\s+(?:answer|candidate)\s+(?:is|would\s+be|:)\s*)",
    _I,
)  # fmt: skip


def _confidence(text: str) -> str:
    """The text without the confidence words it ends with ("X (confidence: high)")."""
    return _CONFIDENCE_SUFFIX.sub("", text, count=1)


def strip_hedge(text: str) -> str:
    """The text without the hedge it opens with ("Probably X" -> "X")."""
    return _LEADING_HEDGE.sub("", text.strip(), count=1)


# --- announcements and chains ------------------------------------------------------------------

_DOCUMENTS = (
    r"(?:documents?|docs?|sources?|texts?|context|passages?|paragraphs?|search\s+results?"
    r"|results|evidence|records?|articles?|information|searches|hops)"
)
_LEAD_IN = re.compile(
    r"^(?:(?:so|thus|therefore|hence|overall|in\s+conclusion|in\s+summary|in\s+short|ultimately"
    r"|finally|to\s+conclude|to\s+summarize|all\s+in\s+all|putting\s+(?:it|this|these|everything"
    r"|the\s+hops|the\s+steps|the\s+pieces)\s+together|combining\s+(?:these|the\s+hops|the"
    r"\s+steps|both|them))\b\s*[,:\-\u2013\u2014]?\s*"
    r"|(?:based\s+on|according\s+to|from|per|using|given|after\s+(?:searching|reviewing|checking"
    r"|reading|looking\s+at)|having\s+(?:searched|reviewed|checked|read))"
    r"(?:\s+(?:the|these|those|my|provided|retrieved|available|above|search|cited|given"
    r"|relevant|all))*(?:\s+" + _DOCUMENTS + r"(?:\s*(?:#|no\.?)?\s*\d{1,3}"
    r"(?:\s*(?:,|and|&)\s*#?\d{1,3})*)?)?\s*[,:]\s*"
    r"|(?:i|we)\s+(?:found|find|can\s+confirm|conclude|determined|can\s+see|see)\s+that\s+"
    r"|(?:the\s+)?(?:documents?|sources?|evidence|passages?)\s+(?:show|say|state|indicate"
    r"|suggest|confirm)s?\s+that\s+)",
    _I,
)  # fmt: skip
_ANSWER_IS = re.compile(
    r"^(?:(?:the|my|our)\s+)?(?:(?:final|correct|short|best|direct)\s+)?answer"
    r"(?:\s+to\s+(?:the|this|your)\s+question)?\s*(?:is|would\s+be|will\s+be|should\s+be)\s*:?\s+"
    r"|^(?:it|that|this)(?:'s|\s+is|\s+was|\s+would\s+be|\s+must\s+be)\s+",
    _I,
)
# An announcement anywhere: the reply commits to what follows the last one.
_MARKER = re.compile(
    r"(?:(?<=[\s.,;:!?])|^)(?:(?:the|my|our)\s+)?(?:(?:final|correct|short|best)\s+)?answer"
    r"(?:\s+to\s+(?:the|this|your)\s+question)?\s*(?:is\b|would\s+be\b|:|=|\s[-\u2013\u2014])\s*",
    _I,
)
_ARROW = re.compile(r"\s*(?:\u2192|-{1,2}>|={1,2}>|\u21d2|\u27f6|\u2794|\u279c|\u27f9|\u2014>)\s*")


def _lead_in(text: str) -> str:
    """The text without the announcement it opens with ("Based on the documents, X", "The
    answer is X", "It is X")."""
    return _ANSWER_IS.sub("", _LEAD_IN.sub("", text, count=1), count=1)


def _last_announcement(text: str) -> str:
    """The text after the last announcement that has text after it, where one stands after
    other words ("Since the earlier hop is B, the answer is X" -> "X"), else the text."""
    ends = [m.end() for m in _MARKER.finditer(text) if m.start() > 0 and m.end() < len(text)]
    return text[ends[-1] :] if ends else text


def _last_step(text: str) -> str:
    """The last step of a chain ("B → X" -> "X")."""
    steps = [step for step in _ARROW.split(text) if step.strip()]
    return steps[-1].strip() if len(steps) > 1 else text


Layers = tuple[Callable[[str], str], ...]
# Package layers, then the layers that keep the start, then those that move it.
_PACKAGE: Layers = (
    _container,
    _list_marker,
    _markup,
    _citations,
    _label,
    _trailing,
)
_WORDING: Layers = (_confidence, _lead_in, strip_hedge)
_MOVES: Layers = (_last_announcement, _last_step)
MAX_PEELS = 24


def _peel(text: str, layers: Layers, moves: Layers = ()) -> list[str]:
    """Each state of `text` as the layers peel it, outermost first; a move that skips words
    ends the earlier states (they are no reading of what the reply commits to)."""
    stages = [" ".join(text.split())]
    for _ in range(MAX_PEELS):
        before = stages[-1]
        for layer in (*layers, *moves):
            peeled = " ".join(layer(stages[-1]).split())
            if peeled and peeled != stages[-1]:
                stages = [peeled] if layer in moves else [*stages, peeled]
        if stages[-1] == before:
            break
    return stages


def peel_package(text: str) -> str:
    """The reply without its container, markup, quotes, label, citations and trailing
    punctuation: what it says, in its own words (a refusal is read from this)."""
    return _peel(text, _PACKAGE)[-1]


def peeled_stages(text: str) -> list[str]:
    """The reply and each reading of it as its wrappers peel (module docstring), from the
    least peeled to the committed core; all start where the committed answer starts, except
    the first ones before a move past other words, which are dropped."""
    return _peel(text, (*_PACKAGE, *_WORDING), _MOVES)
