"""A scripted stand-in for a model: a verifiers `Client` whose replies come from a Python function
of the prompt. With `random_mover` it plays a uniformly random legal move read from the prompt,
the way a model would see it; tests and the benchmark drive real rollouts with it.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable

import verifiers as vf
from verifiers.clients import Client

LEGAL_LINE = re.compile(r"^(\d+): (.+)$", re.M)
LEGAL_HEADER = "legal moves (id: move):"
Policy = Callable[[list[vf.Message]], str]


def legal_from_prompt(prompt: list[vf.Message]) -> list[tuple[str, str]]:
    """(id, text) pairs listed in the last user message."""
    content = prompt[-1].content if not isinstance(prompt[-1], dict) else prompt[-1]["content"]
    return LEGAL_LINE.findall(str(content).rsplit(LEGAL_HEADER, 1)[-1])


def random_mover(seed: int) -> Policy:
    """Answers a random listed move, by id or by text, after some filler reasoning."""
    rng = random.Random(seed)

    def policy(prompt: list[vf.Message]) -> str:
        move_id, text = rng.choice(legal_from_prompt(prompt))
        return f"Let me think about {text} and others. <move>{rng.choice([move_id, text])}</move>"

    return policy


class ScriptedClient(Client):
    """verifiers Client that calls `policy(prompt_messages)` instead of a server."""

    def __init__(self, policy: Policy):
        super().__init__(object())
        self.policy = policy
        self.calls = 0

    def setup_client(self, config: object) -> None:
        return None

    async def to_native_tool(self, tool: vf.Tool) -> vf.Tool:
        return tool

    async def to_native_prompt(self, messages: vf.Messages) -> tuple[vf.Messages, dict]:
        return messages, {}

    async def get_native_response(self, prompt, model, sampling_args, tools=None, **kwargs) -> str:
        self.calls += 1
        return self.policy(prompt)

    async def raise_from_native_response(self, response: str) -> None:
        return None

    async def from_native_response(self, response: str) -> vf.Response:
        message = vf.ResponseMessage(content=response, finish_reason="stop", is_truncated=False)
        return vf.Response(id=f"r{self.calls}", created=0, model="scripted", message=message)

    async def close(self) -> None:
        return None
