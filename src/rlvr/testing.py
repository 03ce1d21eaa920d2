"""A scripted stand-in for a model server, for unit tests of environment logic (and
`masked_runs`, what a loss mask covers).

An environment's behaviour lives in its real loop (`env.rollout` / `env.generate`: turns, tools,
stop conditions, the rubric), so tests and benchmarks should drive that loop rather than call its
pieces by hand. A model server is slow to start and says random things; `ScriptedClient` is a
verifiers `Client` whose replies come from a Python function of the prompt messages instead, so a
test decides exactly what "the model" says and everything else runs as it does against vf-vllm.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import verifiers as vf
from verifiers.clients import Client

# What the scripted model says: plain assistant text, or the tool calls of its turn.
Reply = str | list[vf.ToolCall]
Policy = Callable[[list[vf.Message]], Reply]


def _get(obj: Any, name: str) -> Any:
    """Messages are pydantic objects at run time and dicts in saved results: read both."""
    return obj.get(name) if isinstance(obj, dict) else getattr(obj, name, None)


def render(message: Any) -> str:
    """A chat-template stand-in: each message rendered on its own, so a conversation renders as
    the concatenation of its messages (as with ChatML) and turns extend each other."""
    content = _get(message, "content")
    if isinstance(content, list):
        content = "".join(str(_get(part, "text") or "") for part in content)
    calls = "".join(
        f"<call>{_get(c, 'name')}{_get(c, 'arguments')}" for c in _get(message, "tool_calls") or []
    )
    return f"<|{_get(message, 'role')}|>{content or ''}{calls}<|end|>"


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


def masked_runs(ids: list[int], mask: list[int]) -> list[list[int]]:
    """The maximal stretches of consecutive loss tokens (mask 1) of a training sample, e.g. to
    decode and check what SFT or GRPO trains on."""
    runs: list[list[int]] = []
    for i, (token, m) in enumerate(zip(ids, mask, strict=True)):
        if m and i and mask[i - 1]:
            runs[-1].append(token)
        elif m:
            runs.append([token])
    return runs
