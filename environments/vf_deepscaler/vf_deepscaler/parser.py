"""Reading the final answer out of a completion: the last box, after the reasoning.

Only the last ``\\boxed``/``\\fbox`` counts, so a completion that boxes every candidate is graded
on its last one alone. Reasoning in ``<think>...</think>`` never supplies the answer: text before
the last ``</think>`` is ignored, and an unclosed ``<think>`` means the model never answered.
"""

from __future__ import annotations

import re
from typing import Any

import verifiers as vf

from vf_deepscaler.replies import THINK_CLOSE, THINK_OPEN, last_reply_text, strip_reasoning

_BOX_COMMAND = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")
_BARE_ARGUMENT = re.compile(r"[^\s$]+")


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{..}``, ``\\boxed x`` or ``\\fbox{..}``, or None.

    Braces nest and escaped braces (``\\{``) do not count. An unclosed last box gives "" rather
    than falling back to an earlier box, because the last box is the answer the model gave.
    """
    commands = list(_BOX_COMMAND.finditer(text))
    if not commands:
        return None
    start = commands[-1].end()
    while start < len(text) and text[start].isspace():
        start += 1
    if start < len(text) and text[start] == "{":
        return _braced(text, start)
    bare = _BARE_ARGUMENT.match(text, start)
    return bare.group(0) if bare else ""


def _braced(text: str, open_at: int) -> str:
    """The text inside the brace group opening at ``open_at`` ("" when it never closes)."""
    depth, i = 0, open_at
    while i < len(text):
        char = text[i]
        if char == "\\":
            i += 2
            continue
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return text[open_at + 1 : i].strip()
        i += 1
    return ""


def answer_region(text: str, use_think: bool) -> str:
    """The part of a reply that may hold the answer: what `strip_reasoning` leaves (after the
    last `</think>`; nothing from an unclosed `<think>` on), and nothing at all when `use_think`
    demands a think block whose `</think>` is missing."""
    if use_think and not THINK_CLOSE.search(text):
        return ""
    return strip_reasoning(text)


def follows_think_format(text: str) -> bool:
    """One non-empty think block, then a non-empty answer.

    The opening tag may be missing (chat templates that put ``<think>`` in the generation
    prompt leave only the closing tag in the completion), but if present it must come first.
    Tags match in any letter case, by the rule that strips the reasoning (replies.py).
    """
    parts = THINK_CLOSE.split(text.strip())
    opens = list(THINK_OPEN.finditer(parts[0]))
    if len(parts) != 2 or len(opens) > 1 or THINK_OPEN.search(parts[1]):
        return False
    if opens and opens[0].start() != 0:
        return False
    thought, answer = parts
    return bool(THINK_OPEN.sub("", thought, count=1).strip()) and bool(answer.strip())


class BoxedAnswerParser(vf.Parser):
    """``parse_answer(completion)`` is the last boxed answer of the last assistant reply, or ""."""

    def __init__(self, use_think: bool = False):
        super().__init__()
        self.use_think = use_think

    def parse(self, text: str) -> str:
        return last_boxed(answer_region(text, self.use_think)) or ""

    def parse_answer(self, completion: Any) -> str:
        return self.parse(last_reply_text(completion))
