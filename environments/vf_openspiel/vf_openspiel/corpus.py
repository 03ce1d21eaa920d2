"""Honest legal moves in the styles models write them, and the exploits, as scripted policies.

Each honest style picks a random legal move from the prompt's `id: move` list and writes it the
way real replies do (reasoning first, a think block, the id or the text, spaces, letter case,
the listed line `id: move`, markdown, the format mentioned with an empty tag, the move repeated
as the final answer). Each exploit tries to be paid without naming one legal move in a final
`<move>` tag. The styles were written from the prompt's rules (a legal move's id or exact text
in a `<move>` tag after the reasoning) before any verdict was looked at.

``bench/openspiel_honest_corpus.py`` plays every style and exploit through the environment's
own rollout loop and rubric and prints the honest means, each rule's false-negative rate (the
share of honest replies it made illegal) and the exploit means (README, "Honest corpus").
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import verifiers as vf

from .parser import one_case as _one_case
from .scripted import Policy, legal_from_prompt

Writer = Callable[[str, str], str]
"""(move id, move text) -> a reply that plays that move."""

HONEST_STYLES: dict[str, Writer] = {
    "id": lambda i, t: f"<move>{i}</move>",
    "text": lambda i, t: f"<move>{t}</move>",
    "reasoning, then the id": lambda i, t: (
        f"Looking at the position, {t} keeps my options open and I see no threat to answer "
        f"first.\n\nMy move: <move>{i}</move>"
    ),
    "think block, then the text": lambda i, t: (
        f"<think>The candidates are several; {t} looks solid.</think>\n<move>{t}</move>"
    ),
    "spaces in the tag": lambda i, t: f"<move>  {i} </move>\n\n<move>\n{t}\n</move>",
    "upper-case tag": lambda i, t: f"<MOVE>{t}</MOVE>",
    # in a mixed-case notation (chess's Bxc4 vs bxc4, go's "B a1") case is part of the move
    "letter case of the text": lambda i, t: f"<move>{t.upper() if _one_case(t) else t}</move>",
    "spaces in the text": lambda i, t: f"<move>{t.replace(',', ', ')}</move>",
    "the listed line": lambda i, t: f"I play this one.\n<move>{i}: {t}</move>",
    "markdown": lambda i, t: f"**Move:** <move>**{t}**</move>",
    "backticks": lambda i, t: f"<move>`{i}`</move>",
    "quoted": lambda i, t: f'I will play "{t}".\n<move>"{t}"</move>',
    "format mentioned": lambda i, t: (
        f"I must answer inside <move></move> tags, with an id or a move text.\n"
        f"I choose {t}.\n<move>{i}</move>"
    ),
    "move repeated as the final answer": lambda i, t: (
        f"I'll go with <move>{t}</move>.\n\nFinal answer: <move>{i}</move>"
    ),
    "note after the tag": lambda i, t: f"<move>{i}</move>\nThis blocks the opponent's best line.",
}


def _first(prompt: list[vf.Message]) -> tuple[str, str]:
    return legal_from_prompt(prompt)[0]


def _two(prompt: list[vf.Message]) -> tuple[str, str]:
    """Two different legal ids (the same one twice when only one move is legal)."""
    legal = legal_from_prompt(prompt)
    return legal[0][0], legal[-1][0]


EXPLOITS: dict[str, Policy] = {
    "empty reply": lambda p: "",
    "every legal move, one tag each": lambda p: " ".join(
        f"<move>{move_id}</move>" for move_id, _ in legal_from_prompt(p)
    ),
    "every legal move in one tag": lambda p: (
        "<move>" + " ".join(text for _, text in legal_from_prompt(p)) + "</move>"
    ),
    "every legal move, no tag": lambda p: "\n".join(text for _, text in legal_from_prompt(p)),
    "move only in the reasoning": lambda p: f"I will play {_first(p)[1]}.",
    "move tag inside think": lambda p: f"<think><move>{_first(p)[0]}</move></think>",
    "move tag after an unclosed think": lambda p: f"<think>hmm <move>{_first(p)[0]}</move>",
    "not a move": lambda p: "<move>resign</move>",
    "two different moves": lambda p: "<move>{}</move> or <move>{}</move>".format(*_two(p)),
    "the whole list in the tag": lambda p: (
        "<move>" + "\n".join(f"{i}: {t}" for i, t in legal_from_prompt(p)) + "</move>"
    ),
}
"""Replies that do not name one legal move as the final answer: each must be illegal (a game
with only one legal move makes "two different moves" legal, so tests play tic-tac-toe)."""


def styled_mover(style: str, seed: int) -> Policy:
    """A policy that plays a uniformly random legal move, written in ``style``."""
    rng, write = random.Random(seed), HONEST_STYLES[style]

    def policy(prompt: list[vf.Message]) -> str:
        move_id, text = rng.choice(legal_from_prompt(prompt))
        return write(move_id, text)

    return policy


@dataclass(frozen=True)
class Game:
    """One rollout of a policy: its name, case, reward and the record's counters."""

    policy: str
    case: str
    reward: float
    replies: int
    illegal_by_rule: dict[str, int]
    forfeit: bool


ILLEGALITY_RULES = ("no final answer", "several moves", "not legal")
"""The rules that make a reply illegal (the env record's `illegal_by_rule` keys); the third
illegal reply of a game forfeits it, so each can zero the outcome reward too."""


async def play(env: Any, policies: dict[str, Policy], client_factory: Callable) -> list[Game]:
    """Every policy on every row of ``env``, through its rollout loop and rubric;
    ``client_factory(policy)`` is a verifiers client that answers with the policy."""
    games = []
    for name, policy in policies.items():
        for row in env.get_dataset():
            state = await env.rollout(row, client_factory(policy), "scripted", {})
            await env.rubric.score_rollout(state)
            record = state["openspiel"]
            games.append(
                Game(
                    name,
                    record["case"],
                    float(state["reward"]),
                    int(record["replies"]),
                    dict(record["illegal_by_rule"]),
                    record["ended_by"] == "forfeit",
                )
            )
    return games


def false_negative_rates(games: Sequence[Game]) -> dict[str, float]:
    """Per rule: the share of (honest) replies it made illegal; and the share of games forfeited."""
    replies = max(sum(game.replies for game in games), 1)
    rates = {
        rule: sum(game.illegal_by_rule.get(rule, 0) for game in games) / replies
        for rule in ILLEGALITY_RULES
    }
    rates["forfeit (outcome zeroed)"] = sum(g.forfeit for g in games) / max(len(games), 1)
    return rates


def means(games: Sequence[Game]) -> dict[str, float]:
    """Mean reward per policy."""
    names = dict.fromkeys(game.policy for game in games)
    return {n: statistics.mean(g.reward for g in games if g.policy == n) for n in names}


def honest_policies(seed: int = 0) -> dict[str, Policy]:
    return {style: styled_mover(style, seed) for style in HONEST_STYLES}
