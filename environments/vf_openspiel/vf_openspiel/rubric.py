"""Scoring from the rollout's JSON record (state["openspiel"]); every component is also a metric.

- outcome in [0, 1]: the model seat's return mapped with the game's own min/max utility. A loss by
  illegal moves ("forfeit") or a rollout stopped by verifiers ("aborted") scores 0, the minimum.
  A game cut by the turn limit scores `truncation_reward` (default 0, the minimum): the returns of
  an unfinished position are 0 in most games (0.5 once mapped), which would pay a losing model
  for surviving until the limit.
- legal_rate in [0, 1]: legal replies / replies the environment answered; 0 for an aborted
  rollout, as in outcome mode: one legal move and then a reply bloated past the context (or a
  timeout) would otherwise keep the perfect rate of a whole legal game.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import verifiers as vf

from .env import RECORD_KEY
from .outcome_rubric import OutcomeRubric
from .session import normalized, verdict

LOSSES = ("forfeit", "aborted")


@dataclass(frozen=True)
class GameOutcome:
    """One rollout's game from the model seat's view; all zero when no game was recorded as
    ended."""

    ended_by: str | None = None
    result: str = "loss"
    returned: float = 0.0
    """The seat's return mapped into [0, 1] by the game's utility range (a finished game only)."""
    replies: int = 0
    legal_replies: int = 0
    illegal_attempts: int = 0
    model_moves: int = 0
    game_length: int = 0
    """Player (non-chance) moves in the whole game, random opening included."""


def _record(state: vf.State) -> dict[str, Any] | None:
    record = state.get(RECORD_KEY)
    return record if record and record.get("ended_by") else None


def result(record: dict[str, Any] | None) -> str:
    """win / draw / loss / unfinished, from the model seat's view."""
    if record is None or record["ended_by"] in LOSSES:
        return "loss"
    if record["ended_by"] != "game_over":
        return "unfinished"
    return verdict(record["returns"], record["seat"], record["min_utility"], record["max_utility"])


def game_outcome(record: dict[str, Any] | None) -> GameOutcome:
    """The outcome of an ended game's record (None: no game ended)."""
    if record is None:
        return GameOutcome()
    finished = record["ended_by"] not in (*LOSSES, "turn_limit")
    returned = (
        normalized(record["returns"][record["seat"]], record["min_utility"], record["max_utility"])
        if finished
        else 0.0
    )
    return GameOutcome(
        ended_by=record["ended_by"],
        result=result(record),
        returned=returned,
        replies=record["replies"],
        legal_replies=record["legal_replies"],
        illegal_attempts=record["illegal_attempts"],
        model_moves=record["model_moves"],
        game_length=record["game_length"],
    )


def legal_rate(game: GameOutcome) -> float:
    """Legal replies / replies the environment answered; 0 without replies or when aborted."""
    if game.replies == 0 or game.ended_by == "aborted":
        return 0.0
    return game.legal_replies / game.replies


METRICS: dict[str, Callable[[GameOutcome], float]] = {
    "legal_rate": legal_rate,
    "win": lambda g: float(g.result == "win"),
    "draw": lambda g: float(g.result == "draw"),
    "loss": lambda g: float(g.result == "loss"),
    "unfinished": lambda g: float(g.result == "unfinished"),
    "forfeit": lambda g: float(g.ended_by == "forfeit"),
    "illegal_attempts": lambda g: float(g.illegal_attempts),
    "model_moves": lambda g: float(g.model_moves),
    "game_length": lambda g: float(g.game_length),
}
"""Every logged value but `outcome` (which depends on the rubric's truncation reward)."""


class OpenSpielRubric(OutcomeRubric[GameOutcome]):
    """Reward = outcome or legal_rate (per `reward_mode`); the rest are weight-0 metrics."""

    def __init__(self, reward_mode: str, parser: vf.Parser, truncation_reward: float = 0.0):
        reward = "outcome" if reward_mode == "outcome" else "legal_rate"
        super().__init__({"outcome": self.outcome_score, **METRICS}, {reward: 1.0}, parser)
        self.truncation_reward = truncation_reward

    async def read_outcome(self, state: vf.State) -> GameOutcome:
        return game_outcome(_record(state))

    def outcome_score(self, game: GameOutcome) -> float:
        """The seat's mapped return; 0 for a loss by forfeit or abort (and no game), the
        truncation reward for a game cut by the turn limit."""
        if game.ended_by == "turn_limit":
            return self.truncation_reward
        return game.returned
