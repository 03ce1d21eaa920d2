"""Read tool calls in every form they reach us: verifiers 0.1.14 pydantic objects during a
rollout, plain dicts and JSON strings in saved results (message text: see replies.py).

verifiers 0.1.14 tool calls are flat: ``vf.ToolCall(id, name, arguments: str)``; saved results
store each one as a JSON string of that flat dict. There is no nested ``function`` field, and code
that indexes one raises inside a rubric, which verifiers turns into a silent zero.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .replies import get_field


@dataclass(frozen=True)
class ParsedToolCall:
    """One tool call, whatever form it arrived in; `arguments` is the raw JSON text."""

    id: str
    name: str
    arguments: str


def _arguments_text(arguments: Any) -> str:
    """Arguments as JSON text; some dict forms hold them already decoded."""
    if isinstance(arguments, str):
        return arguments
    return json.dumps(arguments if arguments is not None else {})


def parse_tool_call(raw: Any) -> ParsedToolCall | None:
    """A flat tool call from a vf.ToolCall, a flat dict, or its JSON string; None if unreadable."""
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except (ValueError, RecursionError):  # malformed, 5,000-digit numbers, deep nesting
            return None
    name = get_field(raw, "name")
    if not isinstance(name, str):
        return None
    call_id = get_field(raw, "id")
    return ParsedToolCall(
        id=call_id if isinstance(call_id, str) else "",
        name=name,
        arguments=_arguments_text(get_field(raw, "arguments")),
    )


def tool_calls(message: Any) -> list[ParsedToolCall]:
    """The readable tool calls of an assistant message (none for other roles)."""
    if get_field(message, "role") != "assistant":
        return []
    raw_calls = get_field(message, "tool_calls") or []
    parsed = (parse_tool_call(raw) for raw in raw_calls)
    return [call for call in parsed if call is not None]
