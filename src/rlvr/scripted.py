"""A scripted model client: `ScriptedClient` is a verifiers `Client` whose replies come from a
Python function of the prompt messages (a `Policy`) instead of a server, so the environment's own
loop (turns, tools, stop conditions, the rubric) runs as it does against vf-vllm. Tests and
benchmarks drive environments with it, and `rlvr-demos` plays demonstrations with it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import verifiers as vf
from verifiers.clients import Client

from rlvr.messages import message_field

# What the scripted model says: plain assistant text, or the tool calls of its turn.
Reply = str | list[vf.ToolCall]
Policy = Callable[[list[vf.Message]], Reply]


def render(message: Any) -> str:
    """A chat-template stand-in: each message rendered on its own, so a conversation renders as
    the concatenation of its messages (as with ChatML) and turns extend each other."""
    content = message_field(message, "content")
    if isinstance(content, list):
        content = "".join(str(message_field(part, "text") or "") for part in content)
    calls = "".join(
        f"<call>{message_field(c, 'name')}{message_field(c, 'arguments')}"
        for c in message_field(message, "tool_calls") or []
    )
    return f"<|{message_field(message, 'role')}|>{content or ''}{calls}<|end|>"


def _char_ids(text: str) -> list[int]:
    """A character-level tokenizer: ids are code points, so tests can decode what got loss."""
    return [ord(ch) for ch in text]


def _tokens(prompt: list[vf.Message], message: vf.ResponseMessage) -> vf.ResponseTokens:
    """Token ids as vf-vllm reports them: the rendered prompt (no loss) and the reply."""
    prompt_ids = _char_ids("".join(render(m) for m in prompt))
    completion_ids = _char_ids(render(message))
    return vf.ResponseTokens(
        prompt_ids=prompt_ids,
        prompt_mask=[0] * len(prompt_ids),
        completion_ids=completion_ids,
        completion_mask=[1] * len(completion_ids),
        completion_logprobs=[-0.5] * len(completion_ids),
    )


class ScriptedClient(Client):
    """A verifiers Client that answers `policy(prompt_messages)` instead of calling a server.

    A string reply is plain assistant text (finish reason "stop"); a list of `vf.ToolCall` is a
    tool-calling turn. With `tokens`, each response also carries token ids as vf-vllm returns
    them (code points of `render`ed messages), for tests of what a trainer builds from them.
    """

    def __init__(self, policy: Policy, tokens: bool = False) -> None:
        super().__init__(object())
        self.policy = policy
        self.tokens = tokens

    def setup_client(self, config: object) -> None:
        return None

    def with_attempt(self, attempt: object) -> ScriptedClient:
        """Itself: a scripted reply never fails as a server does (`rlvr.rollouts.router`)."""
        return self

    async def to_native_tool(self, tool: vf.Tool) -> vf.Tool:
        return tool

    async def to_native_prompt(self, messages: vf.Messages) -> tuple[vf.Messages, dict]:
        return messages, {}

    async def get_native_response(
        self, prompt, model, sampling_args, tools=None, **kwargs
    ) -> vf.Response:
        reply = self.policy(prompt)
        text = isinstance(reply, str)
        message = vf.ResponseMessage(
            content=reply if text else None,
            tool_calls=None if text else reply,
            finish_reason="stop" if text else "tool_calls",
            is_truncated=False,
        )
        if self.tokens:
            message.tokens = _tokens(prompt, message)
        return vf.Response(id="scripted", created=0, model=model, message=message)

    async def raise_from_native_response(self, response: vf.Response) -> None:
        return None

    async def from_native_response(self, response: vf.Response) -> vf.Response:
        return response

    async def close(self) -> None:
        return None
