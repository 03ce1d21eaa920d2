"""Reading the model's move: one `<move>...</move>` after the reasoning, matched exactly.

The rules that keep the legality reward honest:
- reasoning is never searched: only what `strip_reasoning` leaves is read (the text after the last
  `</think>`, so a reply whose `<think>` came from the chat template has its reasoning dropped too;
  an unclosed `<think>` hides the rest of the reply);
- the reply must hold exactly one `<move>` tag (listing several moves is not a move);
- the tag's content, stripped of surrounding whitespace, must equal a legal move's text or id
  (so `a1` never matches `a10`, and `a1 a2 a3` matches nothing).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import verifiers as vf

from .replies import last_reply_text, strip_reasoning

MOVE_TAG = re.compile(r"<move>(.*?)</move>", re.DOTALL | re.IGNORECASE)


def extract_move(text: str | None) -> str | None:
    """The move text of a reply, or None when the reply does not state exactly one move."""
    if not text:
        return None
    moves = MOVE_TAG.findall(strip_reasoning(text))
    if len(moves) != 1:
        return None
    move = moves[0].strip()
    return move or None


def match_move(move: str | None, lookup: Mapping[str, int]) -> int | None:
    """Exact lookup of a move text or decimal id among the legal moves; None if illegal."""
    if move is None:
        return None
    return lookup.get(move)


class MoveParser(vf.Parser):
    """verifiers parser for `<move>` answers (used by the environment and its rubric)."""

    def parse(self, text: str) -> str | None:
        return extract_move(text)

    def parse_answer(self, completion: vf.Messages | str) -> str | None:
        return extract_move(last_reply_text(completion))
