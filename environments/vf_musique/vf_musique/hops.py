"""Whether a search looked for the hop whose evidence MuSiQue-Full removed.

An "unanswerable" verdict pays only if the agent searched for the first missing hop, and a
search counts only when it is *focused* on that hop: the work of decomposing the question. The
question itself (reworded, repeated, with words added) holds every hop at once, so it never
counts; a query built from the hop's own sub-question does. Terms are counted with repeats
(`Counter`), so "the father of X's father" is not the same search as "X's father". A bridge
entity counts as named by any term of it the question does not hold (a surname will do), and a
first hop by half of its subject's terms (the relation may be left out). Where the first hop is
missing its honest query is a slice of the question, so words alone cannot tell it from a
shotgun of slices: `few_searches` bounds how many distinct searches a backed claim may take.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .answers import KIND_WORDS
from .retrieval import tokenize

_REFERENCE = re.compile(r"#(\d+)")
# Distinct searches per hop within which a claim can be backed: an honest searcher asks for a
# hop once or rewords it once or twice; a shotgun of question fragments asks dozens of times.
SEARCHES_PER_HOP = 3
# Words that say a sentence is a question, not what it asks about: no hop owns them.
_QUESTION_WORDS = frozenset(
    "what which who whom whose where when why how whether do does did has have had were been "
    "being am can could would should may might shall must".split()
)


def content_terms(text: str) -> Counter[str]:
    """Terms with their counts, without stopwords, question words and `#k` references (a
    reference is a bridge answer, counted separately)."""
    words = tokenize(_REFERENCE.sub(" ", text))
    return Counter(word for word in words if word not in _QUESTION_WORDS)


def _bridges(hops: Sequence[Mapping[str, Any]], h: int) -> list[Counter[str]]:
    """Terms of each earlier answer hop h builds on ("#1 >> founded by" -> hop 1's answer)."""
    built_on = sorted({int(k) for k in _REFERENCE.findall(hops[h]["question"])})
    return [content_terms(hops[k - 1]["answer"]) for k in built_on if 0 < k <= len(hops)]


def _subject_terms(hop_question: str) -> Counter[str]:
    """What a first hop asks about: the subject of "X >> relation" (a searcher may leave the
    relation out), else every term of the natural-language sub-question."""
    subject = hop_question.split(">>", 1)[0] if ">>" in hop_question else hop_question
    return content_terms(subject) or content_terms(hop_question)


def _names_bridge(query: Counter[str], bridge: Counter[str], question: Counter[str]) -> bool:
    """The query names a bridge entity in the searcher's own words: one of its terms that the
    question does not hold (a surname, "Routledge"), which only finding the bridge reveals; or
    any of its terms ("Sitwell" for "Sacheverell Sitwell" in a question about Osbert Sitwell)
    in a query with words of its own, not a slice of the question."""
    distinctive = set(bridge) - set(question)
    own_words = bool(set(query) - set(question))
    return bool(set(query) & (set(bridge) if own_words or not distinctive else distinctive))


def _covers(
    query: Counter[str], hop_question: str, bridges: list[Counter[str]], question: Counter[str]
) -> bool:
    """The query asks for the hop. A hop built on earlier answers: it names each of them
    (`_names_bridge`), with or without the relation; a first hop: it holds at least half of
    the subject's terms. A hop with neither terms nor named bridges cannot be searched for, so
    nothing covers it."""
    if any(bridges):
        return all(_names_bridge(query, bridge, question) for bridge in bridges if bridge)
    own = _subject_terms(hop_question)
    return bool(own) and 2 * sum((own & query).values()) >= sum(own.values())


def _focused(
    query: Counter[str], allowed: Counter[str], others: set[str], whole: Counter[str]
) -> bool:
    """The query asks for this hop alone: beyond what the hop (and its bridges) allow it holds
    no term of another hop's sub-question, and it does not hold the whole question (which
    catches the later hops' words when the question paraphrases the decomposition)."""
    if set(query - allowed) & others:
        return False
    return not (whole and whole <= query)


def searches_hop(
    query: Counter[str], hops: Sequence[Mapping[str, Any]], h: int, question: str
) -> bool:
    """Whether one query (its content terms) is a focused search for hop h of the question."""
    own = content_terms(hops[h]["question"])
    bridges = _bridges(hops, h)
    others = {
        t for i, hop in enumerate(hops) if i != h for t in content_terms(hop["question"])
    } - KIND_WORDS
    whole = content_terms(question)
    focused = _focused(query, own + sum(bridges, Counter()), others, whole)
    return focused and _covers(query, hops[h]["question"], bridges, whole)


def searched_missing_hop(queries: Iterable[Counter[str]], info: Mapping[str, Any]) -> bool:
    """Whether a focused search looked for the first hop whose evidence the row removed. True
    when the row marks no hop missing (nothing to look for). Rows built before `info` carried
    the question skip the whole-question test and keep the others."""
    hops = info.get("hops") or []
    missing = next((h for h, hop in enumerate(hops) if hop.get("support") is None), None)
    if missing is None:
        return True
    question = str(info.get("question", ""))
    return any(searches_hop(query, hops, missing, question) for query in queries)


def distinct_searches(queries: Iterable[Counter[str]]) -> int:
    """Searches with different content terms (a repeated or reordered query counts once)."""
    return len({frozenset(query) for query in queries})


def few_searches(queries: Sequence[Counter[str]], n_hops: int) -> bool:
    """Whether the searches stayed within `SEARCHES_PER_HOP` distinct queries per hop, so a
    focused one among them was aimed rather than hit by a shotgun of fragments."""
    return distinct_searches(queries) <= SEARCHES_PER_HOP * max(1, n_hops)
