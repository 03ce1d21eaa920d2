"""Reading the model's move: one `<move>...</move>` outside any `<think>` block, matched exactly.

The rules that keep the legality reward honest:
- reasoning is never searched: closed `<think>...</think>` blocks are dropped and an unclosed
  `<think>` hides the rest of the reply;
- the reply must hold exactly one `<move>` tag (listing several moves is not a move);
- the tag's content, stripped of surrounding whitespace, must equal a legal move's text or id
  (so `a1` never matches `a10`, and `a1 a2 a3` matches nothing).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import verifiers as vf

MOVE_TAG = re.compile(r"<move>(.*?)</move>", re.DOTALL | re.IGNORECASE)
THINK_BLOCK = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)
OPEN_THINK = re.compile(r"<think>.*", re.DOTALL | re.IGNORECASE)


def extract_move(text: str | None) -> str | None:
    """The move text of a reply, or None when the reply does not state exactly one move."""
    if not text:
        return None
    visible = OPEN_THINK.sub("", THINK_BLOCK.sub("", text))
    moves = MOVE_TAG.findall(visible)
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

    def message_text(self, message: object) -> str:
        """Text content of a pydantic or dict message (saved results hold dicts)."""
        return self._content_to_text(self._message_field(message, "content", "") or "")

    def parse_answer(self, completion: vf.Messages | str) -> str | None:
        if isinstance(completion, str):
            return extract_move(completion)
        replies = self.get_assistant_messages(completion)
        return extract_move(self.message_text(replies[-1])) if replies else None
