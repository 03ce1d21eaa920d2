"""Reading the model's move: the last `<move>...</move>` after the reasoning, as one legal move.

The rules that keep the legality reward honest:
- reasoning is never searched: only what `strip_reasoning` leaves is read (the text after the last
  `</think>`, so a reply whose `<think>` came from the chat template has its reasoning dropped too;
  an unclosed `<think>` hides the rest of the reply);
- the move is the last non-empty `<move>` tag (the final answer); an earlier tag that names a
  *different* legal move makes the reply a hedge, which is illegal (listing moves is not a move),
  while empty tags (`<move></move>` when the format is mentioned) and repeats of the same move
  are not;
- the tag's content must name one legal move as a whole, never by substring: its id or its exact
  text; failing those, the text with letter case and spaces ignored and surrounding quotes,
  backticks or `**` removed, when that names exactly one legal move; letter case is ignored only
  between texts written in one case, since in a mixed-case notation case is meaning (so `A1` is
  `a1` in hex, while `a1` never matches `a10`, `a1 a2 a3` matches nothing, and chess's `bxc4`, a
  pawn capture, never becomes the legal bishop move `Bxc4`, nor `Bxc4` the legal pawn capture
  `bxc4`);
- failing that, the one move is read from the package around it: markdown (`**`, backticks),
  quotes, a leading label (`Move:`, `Action:`, `Final answer:`, `I play`, `id 12`) and trailing
  punctuation (`12.`) are dropped; the id and the text together (`12 (e4)`, `e4 (id 12)`,
  `12: e4`, `12 - e4`, `1=Call`) and a JSON object's `id`/`move`/`action` values
  (`{"id": 12, "move": "e4"}`) must each name the same legal move: two different moves
  (`12 (e5)` where 12 is e4, `e4 or d4`, `{"id": 12, "move": "d4"}`) name none, and a part is
  never split again (`0: 0: b2` names none);
- a tag's content over `MAX_MOVE_CHARS` names no move (no move text is that long, and reading
  stays linear in the reply).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import verifiers as vf

from .replies import last_reply_text, strip_reasoning

MOVE_TAG = re.compile(r"<move>(.*?)</move>", re.DOTALL | re.IGNORECASE)
_WRAPPING = re.compile(r"^(?:\*\*|[`\"'])+|(?:\*\*|[`\"'])+$")
_MARKDOWN = re.compile(r"\*\*|`")  # a single `*` is kept: breakthrough marks captures `a1b2*`
_QUOTES = re.compile(r"^[\"'“”‘’]+|[\"'“”‘’]+$")
_LABEL = re.compile(
    r"^(?:(?:my|final|the)\s+)?(?:move|action|answer|choice|play)\s*[:=]\s*"
    r"|^i(?:\s+will|['’]ll)?\s+(?:play|choose|pick)\b\s*:?\s*"
    r"|^id\s*[:=#]?\s*(?=\d)",
    re.IGNORECASE,
)
_TRAILING = re.compile(r"[.,;!?]+$")
_SEPARATED = re.compile(r"^(.+?)\s*(?::|=|\s[-–—]\s)\s*(.+)$", re.DOTALL)
_FENCE = re.compile(r"^\s*`+\s*(?:json\b)?|`+\s*$", re.IGNORECASE)
_JSON_KEYS = ("id", "move", "action")

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


def _unwrapped(text: str) -> str:
    """`text` without markdown (`**`, backticks), quotes, a leading label and end punctuation."""
    text = _QUOTES.sub("", _MARKDOWN.sub("", text).strip()).strip()
    text = _TRAILING.sub("", _LABEL.sub("", text, count=1)).strip()
    return _QUOTES.sub("", text).strip()


def _named(text: str, lookup: Mapping[str, int], loose: _Loose) -> int | None:
    """The legal action `text` names as it is or unwrapped (`_unwrapped`), exactly or loosely."""
    for form in (text.strip(), _unwrapped(text)):
        action = lookup[form] if form in lookup else loose.named(form)
        if action is not None:
            return action
    return None


def _opening(text: str) -> int:
    """Index of the `(` that closes with the final character of `text`, or -1 if none does."""
    depth = 0
    for index in range(len(text) - 1, -1, -1):
        depth += {")": 1, "(": -1}.get(text[index], 0)
        if depth == 0:
            return index
    return -1


def _pair(text: str) -> list[str]:
    """`A (B)` or `A: B` / `A = B` / `A - B` as [A, B] (the id and the text, in either order),
    else [text]; the `(` of an aside follows a space (`x(1,1)` is one text, not `x` and `1,1`)."""
    start = _opening(text) if text.endswith(")") else -1
    if start > 0 and text[start - 1].isspace():
        return [text[:start], text[start + 1 : -1]]
    line = _SEPARATED.match(text)
    return [line[1], line[2]] if line else [text]


def _json_values(text: str) -> list[str] | None:
    """The `id`/`move`/`action` values of a JSON object (a code fence allowed), as strings
    ("" for a value that is neither a string nor an integer); None if `text` is no JSON object."""
    try:
        data = json.loads(_FENCE.sub("", text))
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    values = [value for key, value in data.items() if key.casefold() in _JSON_KEYS]
    return [
        str(value) if isinstance(value, str | int) and not isinstance(value, bool) else ""
        for value in values
    ]


def _match(move: str, lookup: Mapping[str, int], loose: _Loose) -> int | None:
    """The legal action `move` names as a whole, else the one action that every part of its
    package names (module docstring); None if it names none or different ones."""
    if len(move) > MAX_MOVE_CHARS:
        return None
    action = _named(move, lookup, loose)
    if action is not None:
        return action
    parts = _json_values(move)
    if parts is None:
        parts = _pair(_unwrapped(move))
    named = {_named(part, lookup, loose) for part in parts}
    return next(iter(named)) if len(named) == 1 else None  # a lone None is None too


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
