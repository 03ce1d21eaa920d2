"""The row an answer is judged on: its other hops' answers, its documents, its question.

`AnswerContext` tells a form of the gold from another candidate (`answers`): the candidates
an agent holds on the way (earlier hops' answers), the phrases its documents write, and what
kind of thing the question asks for.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from functools import cached_property, lru_cache
from typing import Any

from .notation import canonical_tokens
from .scoring import normalize_answer

__all__ = ["PLACE_KINDS", "AnswerContext"]

# Kinds of place: a gold that ends in one is a place, which a region may qualify.
PLACE_KINDS = frozenset(
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


@lru_cache(maxsize=256)
def _canonical_documents(texts: tuple[str, ...]) -> tuple[str, ...]:
    """The documents as canonical words between spaces, kept for the next rollouts of the same
    question (a group of rollouts shares one row)."""
    return tuple(f" {' '.join(canonical_tokens(text))} " for text in texts)


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
        texts = tuple(f"{p.get('title', '')} {p.get('text', '')}" for p in self._paragraphs)
        return _canonical_documents(texts)

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
        if gold and gold[-1] in PLACE_KINDS:
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
