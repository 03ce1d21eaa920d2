"""Scripted players for no-server rollouts: `random_mover` and `quiet_mover` play a uniformly random
legal move read from the prompt, the way a model would see it, in any game. Tests and benchmarks
drive real rollouts with them as the policy of a scripted client (`rlvr.scripted.ScriptedClient` in
this repository), and `rlvr-demos --policy vf_openspiel.scripted:quiet_mover` plays demonstrations
with them. Each is a policy factory: `factory(seed)` returns a function of the prompt messages
to the reply text.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable

import verifiers as vf

from .replies import message_text

LEGAL_LINE = re.compile(r"^(\d+): (.+)$", re.M)
LEGAL_HEADER = "legal moves (id: move):"
Policy = Callable[[list[vf.Message]], str]


def legal_from_prompt(prompt: list[vf.Message]) -> list[tuple[str, str]]:
    """(id, text) pairs listed in the last user message."""
    return LEGAL_LINE.findall(message_text(prompt[-1]).rsplit(LEGAL_HEADER, 1)[-1])


def random_mover(seed: int) -> Policy:
    """Answers a random listed move, by id or by text, after some filler reasoning."""
    rng = random.Random(seed)

    def policy(prompt: list[vf.Message]) -> str:
        move_id, text = rng.choice(legal_from_prompt(prompt))
        return f"Let me think about {text} and others. <move>{rng.choice([move_id, text])}</move>"

    return policy


def quiet_mover(seed: int) -> Policy:
    """Answers a random listed move's id and nothing else (`<move>4</move>`): the shortest legal
    reply, so a model fine-tuned on these games keeps its replies (and its generation) short."""
    rng = random.Random(seed)

    def policy(prompt: list[vf.Message]) -> str:
        move_id, _ = rng.choice(legal_from_prompt(prompt))
        return f"<move>{move_id}</move>"

    return policy
