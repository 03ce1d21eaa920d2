"""One rubric idiom: read a rollout once into an outcome, then score the reward and every metric
from that outcome.

A subclass says how to read one rollout (`read_outcome`: parse the completion, run the worker,
look up the game record) and declares a table of scores, each a plain function of the outcome,
plus the weights of those that make up the reward. Every score is registered with verifiers as a
reward function of the rollout's state, under its table name (the trainer logs it as
`env/<name>`) and its weight (0 for a metric), so `state["reward"]` is verifiers' weighted sum
and `state["metrics"]` lists the scores in the table's order.

verifiers 0.1.14 calls each reward function on its own (`Rubric.score_rollout` one after the
other; `score_group` one function at a time across the group) and hands each the same state
object, the one thing the calls share; so the outcome is read on the first call and kept on the
state. An outcome that fails to read is not kept: each score then fails as its own function
would, and verifiers logs it and scores it 0.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import Generic, TypeVar

import verifiers as vf

Outcome = TypeVar("Outcome")

_KEPT = "_outcome_rubric"
"""State key of (rubric, outcome): the outcome read for this state by that rubric."""


class OutcomeRubric(vf.Rubric, ABC, Generic[Outcome]):
    """Scores a rollout from its outcome, read once per rollout by `read_outcome`."""

    def __init__(
        self,
        scores: Mapping[str, Callable[[Outcome], float]],
        weights: Mapping[str, float],
        parser: vf.Parser | None = None,
    ) -> None:
        """`scores`: every logged value, in the order `state["metrics"]` lists them; `weights`:
        the reward's terms among them (a score it leaves out is a weight-0 metric)."""
        unknown = sorted(set(weights) - set(scores))
        if unknown:
            raise ValueError(f"weights name no score: {unknown}; the scores are {list(scores)}")
        super().__init__(parser=parser)
        for name, score in scores.items():
            self.add_reward_func(self._state_reader(name, score), weights.get(name, 0.0))

    @abstractmethod
    async def read_outcome(self, state: vf.State) -> Outcome:
        """Everything the scores need from one rollout (called once per rollout)."""

    async def outcome(self, state: vf.State) -> Outcome:
        """The rollout's outcome: read on first use, then kept on the state for this rubric."""
        kept = state.get(_KEPT)
        if kept is not None and kept[0] is self:
            return kept[1]
        outcome = await self.read_outcome(state)
        state[_KEPT] = (self, outcome)
        return outcome

    def _state_reader(self, name: str, score: Callable[[Outcome], float]) -> Callable:
        """The reward function verifiers calls: it asks for the state (by parameter name) and
        scores the rollout's outcome."""

        async def read(state: vf.State) -> float:
            return float(score(await self.outcome(state)))

        read.__name__ = name
        return read
