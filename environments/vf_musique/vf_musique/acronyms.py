"""Acronyms: whether a short name spells the initial letters of a long one ("NIDA", "KaDeWe").

`answers` pays a gold beside its acronym or expansion ("KaDeWe (Kaufhaus des Westens)").
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from .notation import canonical_tokens

__all__ = ["abbreviates"]

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


def abbreviates(short: str, long: str, in_documents: Callable[[Sequence[str]], bool]) -> bool:
    """`short` is the acronym of `long`: written in capitals (two or more), it spells the
    initial letters of `long`'s words ("NIDA", "KaDeWe"), or the documents write `long`
    followed by it (a foreign acronym: "People's Party for Freedom and Democracy (VVD)"):
    `in_documents(words)` says whether a document of the row writes the words together."""
    letters = re.sub(r"[\s.'&\-]", "", short)
    if not 2 <= len(letters) <= 10 or not letters.isalpha():
        return False
    capitals = sum(ch.isupper() for ch in letters)
    words = [w.lower() for w in re.findall(r"[^\W\d_]+|&", long)]
    if capitals < 2 or len(words) < 2:
        return False
    if _spells(letters.lower(), words):
        return True
    return capitals >= 0.75 * len(letters) and in_documents(canonical_tokens(f"{long} {short}"))
