"""The answer a reply written as a sentence commits to.

Models answer in sentences: "The answer is Stanley.", "Final answer: Stanley", "Stanley (per the
documents)", "Stanley, the seat of Mountrail County.", "The seat of the county is Stanley."
`committed_spans` reads the span such a reply commits to, by rules that never look at the gold:

- an announcement before it: "the (final) answer is", "final answer:", "answer:", "based on
  the documents,", "it is", or the question restated up to a copula ("The seat of the county
  where Van Hook Township is located is ...": every content word before "is" is the question's
  or a hop's);
- a source after it: "(per the documents)", ", according to the documents", "[3]",
  "(Document 12)";
- an explanation after it, a clause that says why: after a full stop, a dash, a final bracket,
  or a comma followed by a word that starts an explanation ("because", "which", "the", "its",
  ...). An explanation holds no hedge ("or", "maybe", "possibly", ...) and reads as a clause:
  it starts with such a word or holds a verb ("is", "was", "born", any "-ed" word). "Stanley -
  Bismarck" and "Stanley. Bismarck." hold a bare second name, not an explanation, and are no
  sentence.

The rubric scores the span alone, right or wrong: a second name in the explanation or the
announcement is never read, so a reply that names two candidates in a sentence is paid exactly
as committing to the one it puts first (never more), and a wrong span earns the token F1 of
that span, not of the whole sentence. Where the gold is itself a clause ("French residents who
chose to remain in the colony would be given freedom"), the longer readings of the same reply
are tried too (`committed_spans`); each starts where the committed span starts.
"""

from __future__ import annotations

import re
from collections.abc import Collection

from .scoring import normalize_answer

_DOCUMENTS = (
    r"(?:documents?|docs?|sources?|texts?|context|passages?|paragraphs?|search\s+results?"
    r"|results|evidence|records?|articles?)"
)
_DOC_ADJECTIVES = (
    r"(?:(?:the|these|those|my|provided|retrieved|available|above|search|cited|given)\s+)*"
)
_ANNOUNCEMENT = re.compile(
    r"^\s*(?:(?:so|thus|therefore|hence|overall|in\s+conclusion|in\s+summary|in\s+short)\s*[,:]?\s+)?"
    rf"(?:(?:based\s+on|according\s+to|from|per|using|given|after\s+searching)\s+{_DOC_ADJECTIVES}"
    rf"{_DOCUMENTS}\s*[,:]?\s+)?"
    r"(?:(?:i\s+think|i\s+believe|i\s+found\s+that|i\s+conclude\s+that|i\s+am\s+confident\s+that"
    r"|i'm\s+confident\s+that)\s+)?"
    r"(?:(?:the\s+|my\s+)?(?:final\s+|correct\s+|short\s+|best\s+)?answer"
    r"(?:\s+to\s+(?:the|this|your)\s+question)?\s*(?:is|would\s+be|:|-|=|\u2013|\u2014)\s*"
    r"|(?:final|result)\s*[:=\-\u2013\u2014]\s*"
    r"|(?:it|that|this)(?:'s|\s+is|\s+was|\s+would\s+be)\s+)",
    re.IGNORECASE,
)
_SELF_ANNOUNCED = re.compile(
    r"\s+(?:is|was|would\s+be)\s+(?:the\s+)?(?:final\s+|correct\s+)?answer\s*[.!]?\s*$",
    re.IGNORECASE,
)
_SOURCE = re.compile(
    r"(?:\s*[,;:\-\u2013\u2014]\s*|\s+|\s*[(\[]\s*)"
    r"(?:(?:per|according\s+to|based\s+on|from|see|cf\.?|sources?:?|cited\s+in|supported\s+by"
    r"|as\s+(?:stated|given|shown|reported|mentioned|found|written|said)\s+in|as\s+per)\s+"
    rf"{_DOC_ADJECTIVES}{_DOCUMENTS}"
    r"(?:\s*(?:#|no\.?|id:?)?\s*\d+(?:\s*(?:,|and|&)\s*#?\d+)*)?"
    r"|(?:documents?|docs?|doc\s+id|sources?|passages?|paragraphs?)\s*(?:#|no\.?|id:?)?\s*\d+"
    r"(?:\s*(?:,|and|&)\s*#?\d+)*)"
    r"\s*[)\]]?\s*[.!]?\s*$",
    re.IGNORECASE,
)
_BRACKETED_IDS = re.compile(r"\s*\[\s*\d+(?:\s*,\s*\d+)*\s*\]\s*[.!]?\s*$")
# Where an explanation may start after the span.
_SENTENCE_END = re.compile(r"[.!]\s+(?=\S)")
_DASH = re.compile(r"\s+(?:-{1,2}|\u2013|\u2014)\s+|\s*\u2014\s*")
_COMMA_CLAUSE = re.compile(r",\s+(?=\w)")
_CLAUSE_WORD = re.compile(r"\s+(?=(?:because|since|via|which|who|whose)\b)", re.IGNORECASE)
_FINAL_BRACKET = re.compile(r"\s*\((?P<inside>[^()]+)\)\s*[.!]?\s*$")

# Words that start an explanation (after a comma they must: "Stanley, the seat of ...").
_EXPLAINING = frozenset(
    "because since as which who whose whom where when while that the a an this these those it "
    "i we its he she his her they their them him there per according based via through from found "
    "located being having after before following so thus hence born died one".split()
)
# Words that make an explanation a clause ("Bismarck is the state capital").
_LINKS = frozenset(
    "is was are were be been being has had have became becomes become lies lay sits stands "
    "found born died won wrote married founded located named called known served plays played sang "
    "sings leads led holds held owns owned runs ran built made makes gave gives took takes "
    "belongs belonged flows flowed borders contains includes include replaced succeeded "
    "followed preceded married".split()
)
# Words with which an "explanation" names another candidate instead of explaining one.
_HEDGES = frozenset(
    "or nor either maybe perhaps possibly possible probably likely unlikely alternatively "
    "alternative otherwise might could guess unsure uncertain versus vs instead unless if "
    "candidate candidates option options".split()
)
# Abbreviations a full stop ends without ending the sentence ("Mr. Lawrence", "St. Louis").
_ABBREVIATIONS = frozenset(
    "mr mrs ms dr st mt ft jr sr lt col gen capt sgt rev prof gov sen rep pres no co inc ltd "
    "bros corp jan feb mar apr jun jul aug sep sept oct nov dec vs etc approx ca c".split()
)


def ends_abbreviation(span: str) -> bool:
    """The span ends with an initial or an abbreviation, so a full stop after it is not the
    end of a sentence ("A.P.J. Abdul Kalam", "Mr. Lawrence", "Glenn L. Martin", "Michael S.
    Rogers"); a unit after a number ("1,400 m.") ends one."""
    words = span.split()
    last = re.sub(r"^\W+", "", words[-1]) if words else ""
    after_word = len(words) >= 2 and words[-2][-1:].isalpha()
    return (
        (len(last) == 1 and last.isalpha() and (last.isupper() or after_word))
        or re.fullmatch(r"(?:[A-Za-z]{1,3}\.)+[A-Za-z]{0,3}", last) is not None
        or last.lower() in _ABBREVIATIONS
    )


def is_explanation(text: str) -> bool:
    """A clause that says why (module docstring): two or more words, no hedge, starting with
    an explaining word or holding a verb."""
    words = re.findall(r"[\w']+", text)
    lower = [w.lower() for w in words]
    if len(words) < 2 or set(lower) & _HEDGES:
        return False
    return (
        lower[0] in _EXPLAINING
        or any(w in _LINKS for w in words)  # as written: "LED" is no verb
        or any(w.islower() and len(w) >= 4 and w.endswith("ed") for w in words)
    )


def _strip_source(text: str) -> str:
    for pattern in (_SOURCE, _BRACKETED_IDS):
        found = pattern.search(text)
        if found and found.start() > 0:
            text = text[: found.start()]
    return text


def _restated(text: str, question_words: Collection[str]) -> str | None:
    """The span after the question restated up to a copula, or None: the last copula before
    which every content word is the question's ("... where Van Hook Township is located is
    Stanley", not "located is Stanley")."""
    for found in reversed(list(re.finditer(r"\s(?:is|was|are|were)\s", text))):
        before = normalize_answer(text[: found.start()]).split()
        content = [w for w in before if w not in _RESTATEMENT_FILLER]
        if content and all(w in question_words or w.rstrip("s") in question_words for w in content):
            return text[found.end() :]
    return None


_RESTATEMENT_FILLER = frozenset(
    "of in on at by for to from with who whom whose which that what where when answer final "
    "correct name one person".split()
)


def _readings(span: str) -> list[str]:
    """The span cut before each explanation that may follow it, in order, then the span
    whole: "16th - century. I found it through Venice." reads "16th" (the dash starts "century.
    I found ...", a clause), then "16th - century", then the whole. A full stop after an
    abbreviation is read last ("Mr. Lawrence. He voices him." commits to "Mr. Lawrence", and
    "Kenny G. The documents also name him." to "Kenny G")."""
    starts = [
        *((m.start(), m.end()) for m in _SENTENCE_END.finditer(span)),
        *((m.start(), m.end()) for m in _DASH.finditer(span)),
        *((m.start(), m.end()) for m in _CLAUSE_WORD.finditer(span)),
    ]
    starts += [
        (m.start(), m.end())
        for m in _COMMA_CLAUSE.finditer(span)
        if span[m.end() :].split()[0].lower().strip(".,;:") in _EXPLAINING
    ]
    bracket = _FINAL_BRACKET.search(span)
    if bracket and bracket.start() > 0:
        starts.append((bracket.start(), -1))
    readings, after_abbreviations = [], []
    for start, end in sorted(starts):
        head = span[:start]
        rest = bracket["inside"] if end == -1 else span[end:]
        if not head.strip() or not is_explanation(rest):
            continue
        if span[start] == "." and ends_abbreviation(head):
            after_abbreviations.append(head)  # "Kenny G. The documents ..." when nothing else
        else:
            readings.append(head)
    return [*readings, *after_abbreviations, span]


def _clean(span: str) -> str:
    return _strip_source(span).strip().strip("*_`\"'").rstrip(".!,;: ")


def committed_spans(answer: str, question_words: Collection[str] = ()) -> list[str]:
    """The spans a sentence-shaped reply may commit to (module docstring), the committed one
    first: the text after its announcement (or restated question) with its explanation cut,
    then the readings that keep more (the explanation, where the gold is itself a clause:
    "French residents who chose to remain ..."; the reply without the restatement: "palace
    was seldom used"). Every reading is a prefix of what follows the announcement, so none
    reaches a name the committed span does not start with. Empty when the reply is no such
    sentence (it is its own answer). `question_words` are the normalised words of the
    question and its hops, which a restated question may use."""
    text = " ".join(answer.split()).strip().strip("*_`\"'")
    stripped = _strip_source(text)
    bodies = []
    announced = _ANNOUNCEMENT.match(stripped)
    self_announced = _SELF_ANNOUNCED.search(stripped)
    if announced and announced.end() < len(stripped):
        bodies.append(stripped[announced.end() :])
    elif self_announced and self_announced.start() > 0:
        bodies.append(stripped[: self_announced.start()])
    else:
        if question_words and (restated := _restated(stripped, question_words)) is not None:
            bodies.append(restated)
        bodies.append(stripped)
    spans = [_clean(reading) for body in bodies for reading in _readings(body)]
    whole = normalize_answer(answer)
    found: list[str] = []
    for span in spans:
        words = normalize_answer(span)
        if words and words != whole and span not in found:
            found.append(span)
    return found


def committed_answer(answer: str, question_words: Collection[str] = ()) -> str | None:
    """The span a sentence-shaped reply commits to, or None when it is its own answer."""
    spans = committed_spans(answer, question_words)
    return spans[0] if spans else None
