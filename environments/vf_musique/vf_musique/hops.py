"""Whether a search looked for the hop whose evidence MuSiQue-Full removed.

An "unanswerable" verdict pays only if the agent searched for the first missing hop, and a
search counts only when it is *focused* on that hop: the work of decomposing the question. The
question itself (reworded, repeated, with words added) holds every hop at once, so it never
counts; a query built from the hop's own sub-question does. Terms are counted with repeats
(`Counter`), so "the father of X's father" is not the same search as "X's father".
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .retrieval import tokenize

_REFERENCE = re.compile(r"#(\d+)")
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


def _bridge_terms(hops: Sequence[Mapping[str, Any]], h: int) -> Counter[str]:
    """Terms of the earlier answers hop h builds on ("#1 >> founded by" -> hop 1's answer)."""
    built_on = {int(k) for k in _REFERENCE.findall(hops[h]["question"])}
    return sum((content_terms(hops[k - 1]["answer"]) for k in built_on), Counter())


def _covers(query: Counter[str], own: Counter[str], bridge: Counter[str]) -> bool:
    """The query asks for the hop. A hop built on earlier answers: it names all of them (the
    agent found the bridge entity); otherwise it holds at least half of the hop's terms. A hop
    with neither terms nor named bridges cannot be searched for, so nothing covers it."""
    if bridge:
        return set(bridge) <= set(query)
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
    bridge = _bridge_terms(hops, h)
    others = {t for i, hop in enumerate(hops) if i != h for t in content_terms(hop["question"])}
    focused = _focused(query, own + bridge, others, content_terms(question))
    return focused and _covers(query, own, bridge)


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
