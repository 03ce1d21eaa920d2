"""The shared rubric idiom (environments/shared/outcome_rubric.py): a rollout is read once into
its outcome, the reward and every metric are scored from it under their table names and in the
table's order, through verifiers' own scoring (`score_rollout`, `score_group`)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest
import verifiers as vf
from vf_planner.outcome_rubric import OutcomeRubric


@dataclass(frozen=True)
class Length:
    chars: int


class LengthRubric(OutcomeRubric[Length]):
    """Reward = 0.5 * long + 2 * short; `chars` is a metric; counts the reads per rollout."""

    def __init__(self, fail: bool = False) -> None:
        scores = {
            "long": lambda o: float(o.chars > 3),
            "chars": lambda o: o.chars,
            "short": lambda o: float(o.chars <= 3),
        }
        super().__init__(scores, {"long": 0.5, "short": 2.0})
        self.reads = 0
        self.fail = fail

    async def read_outcome(self, state: vf.State) -> Length:
        self.reads += 1
        if self.fail:
            raise RuntimeError("unreadable rollout")
        return Length(len(state["completion"][-1]["content"]))


def rollout(text: str) -> dict:
    return {
        "prompt": [{"role": "user", "content": "q"}],
        "completion": [{"role": "assistant", "content": text}],
        "answer": "",
        "trajectory": [],
    }


def test_outcome_is_read_once_and_scores_keep_names_order_and_weights():
    rubric = LengthRubric()
    state = rollout("hello")
    asyncio.run(rubric.score_rollout(state))
    assert rubric.reads == 1
    assert list(state["metrics"].items()) == [("long", 1.0), ("chars", 5.0), ("short", 0.0)]
    assert state["reward"] == 0.5


def test_score_group_reads_each_rollout_once():
    rubric = LengthRubric()
    states = [rollout("hi"), rollout("a longer reply")]
    asyncio.run(rubric.score_group(states))
    assert rubric.reads == 2
    assert [s["reward"] for s in states] == [2.0, 0.5]
    assert [s["metrics"]["chars"] for s in states] == [2.0, 14.0]


def test_an_outcome_kept_by_another_rubric_is_read_again():
    first, second = LengthRubric(), LengthRubric()
    state = rollout("hello")
    asyncio.run(first.score_rollout(state))
    asyncio.run(second.score_rollout(state))
    assert (first.reads, second.reads) == (1, 1)


def test_an_unreadable_rollout_scores_zero_and_is_not_kept():
    rubric = LengthRubric(fail=True)
    state = rollout("hello")
    asyncio.run(rubric.score_rollout(state))
    assert state["reward"] == 0.0
    assert state["metrics"] == {"long": 0.0, "chars": 0.0, "short": 0.0}
    assert rubric.reads == 3  # each score tried its own read, as separate functions would


def test_a_weight_for_no_score_is_refused():
    class Typo(LengthRubric):
        def __init__(self) -> None:
            OutcomeRubric.__init__(self, {"long": lambda o: 1.0}, {"lnog": 1.0})

    with pytest.raises(ValueError, match=r"weights name no score: \['lnog'\]"):
        Typo()
