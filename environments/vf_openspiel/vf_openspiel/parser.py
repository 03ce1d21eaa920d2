"""Reading the model's move: the last `<move>...</move>` after the reasoning, as one legal move.

The rules that keep the legality reward honest:
- reasoning is never searched: only what `strip_reasoning` leaves is read (the text after the last
  `</think>`, so a reply whose `<think>` came from the chat template has its reasoning dropped too;
  an unclosed `<think>` hides the rest of the reply);
- the move is the last non-empty `<move>` tag (the final answer); an earlier tag that names a
  *different* legal move makes the reply a hedge, which is illegal (listing moves is not a move),
  while empty tags (`<move></move>` when the format is mentioned) and repeats of the same move
  are not;
- the tag's content must name one legal move as a whole, never by substring: its id, its exact
  text, or the listed line `id: text` (both parts naming the same move); failing those, the text
  with letter case and spaces ignored and surrounding quotes, backticks or `**` removed, when that
  names exactly one legal move (so `A1` is `a1` in hex, while `a1` never matches `a10` and
  `a1 a2 a3` matches nothing).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import verifiers as vf

from .replies import last_reply_text, strip_reasoning

MOVE_TAG = re.compile(r"<move>(.*?)</move>", re.DOTALL | re.IGNORECASE)
_WRAPPING = re.compile(r"^(?:\*\*|[`\"'])+|(?:\*\*|[`\"'])+$")
_LISTED_LINE = re.compile(r"^(\d+)\s*:\s*(.+)$", re.DOTALL)

NO_ANSWER = "no <move>...</move> tag outside your reasoning"
HEDGE = "several <move> tags name different moves"


def extract_moves(text: str | None) -> list[str]:
    """The non-empty `<move>` tag contents of a reply's answer part, in order, stripped."""
    if not text:
        return []
    moves = (move.strip() for move in MOVE_TAG.findall(strip_reasoning(text)))
    return [move for move in moves if move]


def extract_move(text: str | None) -> str | None:
    """The final move text of a reply (its last non-empty `<move>` tag), or None."""
    moves = extract_moves(text)
    return moves[-1] if moves else None


def _loose(text: str) -> str:
    """A move text with surrounding quotes, backticks and `**`, letter case and spaces ignored."""
    return re.sub(r"\s+", "", _WRAPPING.sub("", text.strip())).casefold()


def _loose_table(lookup: Mapping[str, int]) -> dict[str, set[int]]:
    """Loose form of every legal id and text -> the actions it names."""
    table: dict[str, set[int]] = {}
    for key, action in lookup.items():
        table.setdefault(_loose(key), set()).add(action)
    return table


def _match(move: str, lookup: Mapping[str, int], loose: Mapping[str, set[int]]) -> int | None:
    if move in lookup:
        return lookup[move]
    if listed := _LISTED_LINE.match(move):
        by_id, by_text = lookup.get(listed[1]), _match(listed[2].strip(), lookup, loose)
        return by_id if by_id is not None and by_id == by_text else None
    named = loose.get(_loose(move), set())
    return next(iter(named)) if len(named) == 1 else None


def match_move(move: str | None, lookup: Mapping[str, int]) -> int | None:
    """The legal action a move text names (module docstring), or None if it names none."""
    return None if move is None else _match(move, lookup, _loose_table(lookup))


def read_move(moves: Sequence[str], lookup: Mapping[str, int]) -> tuple[int | None, str]:
    """(the action of the final move, "") or (None, why the reply is not a legal move)."""
    if not moves:
        return None, NO_ANSWER
    loose = _loose_table(lookup)
    action = _match(moves[-1], lookup, loose)
    if action is None:
        return None, f"{moves[-1][:80]!r} is not one of your legal moves"
    named = {_match(move, lookup, loose) for move in set(moves[:-1])} - {None, action}
    return (None, HEDGE) if named else (action, "")


class MoveParser(vf.Parser):
    """verifiers parser for `<move>` answers (used by the environment and its rubric)."""

    def parse(self, text: str) -> str | None:
        return extract_move(text)

    def parse_answer(self, completion: vf.Messages | str) -> str | None:
        return extract_move(last_reply_text(completion))

    def parse_moves(self, completion: vf.Messages | str) -> list[str]:
        """Every non-empty `<move>` tag of the last reply's answer part (see `read_move`)."""
        return extract_moves(last_reply_text(completion))
