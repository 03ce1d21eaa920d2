"""Chat messages as the trainer side reads them: pydantic objects during a rollout, dicts in saved
results. `message_field` is the one reader of both; `render_messages` is the readable text the
sample table shows. The environments read replies by their own rules (environments/shared/
replies.py: each installs without rlvr, and a rubric scores only a message's text).
"""

from __future__ import annotations

from typing import Any


def message_field(obj: Any, key: str, default: Any = None) -> Any:
    """A message's (or content part's, tool call's) field, whether it is a dict or an object."""
    if isinstance(obj, dict):
        return obj.get(key, default)
    return getattr(obj, key, default)


def display_text(message: Any) -> str:
    """A message as a person reads it: its content (text parts joined by spaces), then each
    tool call as `[tool_call name(arguments)]` on a line of its own."""
    content = message_field(message, "content")
    if isinstance(content, list):
        content = " ".join(str(message_field(part, "text", "")) for part in content)
    text = content or ""
    for call in message_field(message, "tool_calls") or []:
        text += f"\n[tool_call {message_field(call, 'name')}({message_field(call, 'arguments')})]"
    return text


def render_messages(messages: Any, limit: int = 2000) -> str:
    """Readable text for the sample table: `role: text` per message, cut to `limit` chars."""
    if isinstance(messages, str):
        return messages[:limit]
    lines = [f"{message_field(m, 'role')}: {display_text(m)}" for m in messages or []]
    return "\n".join(lines)[:limit]
