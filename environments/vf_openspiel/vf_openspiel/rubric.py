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

from typing import Any

import verifiers as vf

from .env import RECORD_KEY
from .session import normalized, verdict

LOSSES = ("forfeit", "aborted")


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


class OpenSpielRubric(vf.Rubric):
    """Reward = outcome or legal_rate (per `reward_mode`); the rest are weight-0 metrics."""

    def __init__(self, reward_mode: str, parser: vf.Parser, truncation_reward: float = 0.0):
        super().__init__(parser=parser)
        self.truncation_reward = truncation_reward
        metrics = [
            self.outcome,
            self.legal_rate,
            self.win,
            self.draw,
            self.loss,
            self.unfinished,
            self.forfeit,
            self.illegal_attempts,
            self.model_moves,
            self.game_length,
        ]
        reward = self.outcome if reward_mode == "outcome" else self.legal_rate
        for func in metrics:
            if func == reward:
                self.add_reward_func(func, 1.0)
            else:
                self.add_metric(func)

    def outcome(self, state: vf.State) -> float:
        record = _record(state)
        if record is None or record["ended_by"] in LOSSES:
            return 0.0
        if record["ended_by"] == "turn_limit":
            return self.truncation_reward
        return normalized(
            record["returns"][record["seat"]], record["min_utility"], record["max_utility"]
        )

    def legal_rate(self, state: vf.State) -> float:
        record = _record(state)
        if record is None or record["replies"] == 0 or record["ended_by"] == "aborted":
            return 0.0
        return record["legal_replies"] / record["replies"]

    def win(self, state: vf.State) -> float:
        return float(result(_record(state)) == "win")

    def draw(self, state: vf.State) -> float:
        return float(result(_record(state)) == "draw")

    def loss(self, state: vf.State) -> float:
        return float(result(_record(state)) == "loss")

    def unfinished(self, state: vf.State) -> float:
        return float(result(_record(state)) == "unfinished")

    def forfeit(self, state: vf.State) -> float:
        record = _record(state)
        return float(record is not None and record["ended_by"] == "forfeit")

    def illegal_attempts(self, state: vf.State) -> float:
        record = _record(state)
        return float(record["illegal_attempts"]) if record else 0.0

    def model_moves(self, state: vf.State) -> float:
        record = _record(state)
        return float(record["model_moves"]) if record else 0.0

    def game_length(self, state: vf.State) -> float:
        """Player (non-chance) moves in the whole game, random opening included."""
        record = _record(state)
        return float(record["game_length"]) if record else 0.0
