"""Reading model replies: message fields, their text, and the answer part after the reasoning.

Messages come as verifiers 0.1.14 pydantic objects during a rollout and as dicts in saved results,
with a string or a list of text parts as content; these readers take every form. Each environment
package holds a symlink to this file (a wheel or sdist ships its content), so every environment
installs on its own, without rlvr; rlvr's own reader (`rlvr.messages`) renders messages for people,
tool calls included, while `message_text` here is only the text a rubric scores.
"""

from __future__ import annotations

import re
from typing import Any

# Think tags match in any letter case, everywhere they are read (one rule for stripping the
# reasoning and for checking the think format).
THINK_OPEN = re.compile(re.escape("<think>"), re.IGNORECASE)
THINK_CLOSE = re.compile(re.escape("</think>"), re.IGNORECASE)


def get_field(obj: Any, name: str, default: Any = None) -> Any:
    """Attribute or key access, so pydantic messages and dicts read the same way."""
    if isinstance(obj, dict):
        return obj.get(name, default)
    return getattr(obj, name, default)


def message_text(message: Any) -> str:
    """The text a rubric scores: string content, or the text parts of a content list joined
    (tool calls are not text)."""
    content = get_field(message, "content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = (get_field(part, "text") for part in content)
        return "".join(text for text in texts if isinstance(text, str))
    return ""


def last_reply_text(completion: Any) -> str:
    """Text of the last assistant message of a completion (a chat list or a plain string)."""
    if isinstance(completion, str):
        return completion
    for message in reversed(completion or []):
        if get_field(message, "role") == "assistant":
            return message_text(message)
    return ""


def strip_reasoning(text: str) -> str:
    """The part of a reply that may hold the answer: the reasoning is never searched.

    Text after the last `</think>` when there is one (this covers replies whose `<think>` was
    put in the generation prompt by the chat template, so that only `</think>` appears); "" from
    a `<think>` that never closes to the end (the model had not finished thinking); the whole
    text when there is no think tag. Tags match in any letter case.
    """
    closes = list(THINK_CLOSE.finditer(text))
    if closes:
        text = text[closes[-1].end() :]
    still_open = THINK_OPEN.search(text)
    return text[: still_open.start()] if still_open else text
