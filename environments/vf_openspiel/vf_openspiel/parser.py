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
  names exactly one legal move; letter case is ignored only between texts written in one case,
  since in a mixed-case notation case is meaning (so `A1` is `a1` in hex, while `a1` never
  matches `a10`, `a1 a2 a3` matches nothing, and chess's `bxc4`, a pawn capture, never becomes
  the legal bishop move `Bxc4`, nor `Bxc4` the legal pawn capture `bxc4`);
- a tag's content over `MAX_MOVE_CHARS` names no move (no move text is that long, and reading
  stays linear in the reply).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import verifiers as vf

from .replies import last_reply_text, strip_reasoning

MOVE_TAG = re.compile(r"<move>(.*?)</move>", re.DOTALL | re.IGNORECASE)
_WRAPPING = re.compile(r"^(?:\*\*|[`\"'])+|(?:\*\*|[`\"'])+$")
_LISTED_LINE = re.compile(r"^(\d+)\s*:\s*(.+)$", re.DOTALL)

MAX_MOVE_CHARS = 200
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


def _bare(text: str) -> str:
    """A move text without surrounding quotes, backticks and `**`, and without spaces."""
    return re.sub(r"\s+", "", _WRAPPING.sub("", text.strip()))


def one_case(text: str) -> bool:
    """No letter of `text` is upper-case while another is lower-case (`Bxc4` is mixed)."""
    return text == text.lower() or text == text.upper()


@dataclass(frozen=True)
class _Loose:
    """The legal moves' bare forms, and their case-folded forms, each -> the actions it names
    (None standing for a mixed-case text, which a folded form never names)."""

    bare: dict[str, set[int]]
    folded: dict[str, set[int | None]]

    @classmethod
    def of(cls, lookup: Mapping[str, int]) -> _Loose:
        bare: dict[str, set[int]] = {}
        folded: dict[str, set[int | None]] = {}
        for key, action in lookup.items():
            bare.setdefault(_bare(key), set()).add(action)
            folded.setdefault(_bare(key).casefold(), set()).add(action if one_case(key) else None)
        return cls(bare, folded)

    def named(self, move: str) -> int | None:
        """The one legal action `move` names with wrapping and spaces ignored, else with letter
        case ignored too where `move` is written in one case; None if not exactly one."""
        text = _bare(move)
        actions = self.bare.get(text, set())
        if not actions and one_case(text):
            actions = self.folded.get(text.casefold(), set())
        return next(iter(actions)) if len(actions) == 1 else None  # a lone None is None too


def _match(
    move: str,
    lookup: Mapping[str, int],
    loose: _Loose,
    listed: bool = True,
) -> int | None:
    """The legal action `move` names, or None; `listed`: the `id: text` form is allowed (once:
    its text part is matched without it)."""
    if len(move) > MAX_MOVE_CHARS:
        return None
    if move in lookup:
        return lookup[move]
    if listed and (line := _LISTED_LINE.match(move)):
        by_id = lookup.get(line[1])
        by_text = _match(line[2].strip(), lookup, loose, listed=False)
        return by_id if by_id is not None and by_id == by_text else None
    return loose.named(move)


def match_move(move: str | None, lookup: Mapping[str, int]) -> int | None:
    """The legal action a move text names (module docstring), or None if it names none."""
    return None if move is None else _match(move, lookup, _Loose.of(lookup))


def read_move(moves: Sequence[str], lookup: Mapping[str, int]) -> tuple[int | None, str]:
    """(the action of the final move, "") or (None, why the reply is not a legal move)."""
    if not moves:
        return None, NO_ANSWER
    loose = _Loose.of(lookup)
    action = _match(moves[-1], lookup, loose)
    if action is None:
        return None, f"{moves[-1][:80]!r} is not one of your legal moves"
    named = {_match(move, lookup, loose) for move in set(moves[:-1])}
    return (None, HEDGE) if named - {None, action} else (action, "")


class MoveParser(vf.Parser):
    """verifiers parser for `<move>` answers (used by the environment and its rubric)."""

    def parse(self, text: str) -> str | None:
        return extract_move(text)

    def parse_answer(self, completion: vf.Messages | str) -> str | None:
        return extract_move(last_reply_text(completion))

    def parse_moves(self, completion: vf.Messages | str) -> list[str]:
        """Every non-empty `<move>` tag of the last reply's answer part (see `read_move`)."""
        return extract_moves(last_reply_text(completion))
