"""The reward: is the last boxed answer equal to the gold answer, plus an optional format bonus.

``reward = correct`` without ``use_think``; with it ``reward = correct * (1 - w + w * format)``
where ``w = think_format_weight``. Both lie in [0, 1], and format can only scale a correct
answer: a well-formatted wrong answer earns 0, so the reward cannot be raised without solving.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import verifiers as vf

from vf_deepscaler.forms import asks_percent
from vf_deepscaler.outcome_rubric import OutcomeRubric
from vf_deepscaler.parser import BoxedAnswerParser, follows_think_format
from vf_deepscaler.pool import VerifierPool
from vf_deepscaler.replies import get_field, last_reply_text, message_text
from vf_deepscaler.verifier import MAX_ANSWER_CHARS


def _problem_text(prompt: Any) -> str:
    """The problem: the last user message of the prompt (a chat list or a plain string)."""
    if isinstance(prompt, str):
        return prompt
    users = [message for message in prompt or [] if get_field(message, "role") == "user"]
    return message_text(users[-1]) if users else ""


@dataclass(frozen=True)
class MathOutcome:
    """One reply, verified once."""

    correct: bool
    """The last boxed answer is equivalent to the gold within the time limit."""
    has_boxed: bool
    """The answer part of the reply has a non-empty box."""
    format: bool
    """One non-empty ``<think>`` block followed by a non-empty answer."""
    completion_chars: int
    """Length of the reply in characters (tokens depend on the model's tokenizer)."""


class DeepScaleRRubric(OutcomeRubric[MathOutcome]):
    """Reward ``math_reward``; metrics ``correct``, ``has_boxed``, ``format`` (with
    ``use_think``) and ``completion_chars``."""

    def __init__(
        self,
        parser: BoxedAnswerParser,
        verify_timeout_s: float,
        verify_workers: int,
        use_think: bool,
        think_format_weight: float,
    ):
        if not 0.0 <= think_format_weight <= 1.0:
            raise ValueError(f"think_format_weight must be in [0, 1], got {think_format_weight}")
        scores = {
            "math_reward": self.math_reward,
            "correct": lambda o: float(o.correct),
            "has_boxed": lambda o: float(o.has_boxed),
            "format": lambda o: float(o.format),
            "completion_chars": lambda o: float(o.completion_chars),
        }
        if not use_think:
            del scores["format"]
        super().__init__(scores, {"math_reward": 1.0}, parser)
        self.parser: BoxedAnswerParser = parser
        self.pool = VerifierPool(verify_workers, verify_timeout_s)
        self.use_think = use_think
        self.think_format_weight = think_format_weight

    async def read_outcome(self, state: vf.State) -> MathOutcome:
        """Verifies the last boxed answer against the row's ``answer``; the problem in the
        prompt says whether a bare number may be a percent (forms.py)."""
        completion = state["completion"]
        prediction = self.parser.parse_answer(completion)
        gold = str(state.get("answer", "") or "").strip()
        correct = False
        if prediction and gold and len(prediction) <= MAX_ANSWER_CHARS:
            percent = asks_percent(_problem_text(state.get("prompt")))
            correct = (await self.pool.check(gold, prediction, percent)).correct
        reply = last_reply_text(completion)
        return MathOutcome(bool(correct), bool(prediction), follows_think_format(reply), len(reply))

    def math_reward(self, outcome: MathOutcome) -> float:
        """``correct``, scaled by the think format with ``use_think`` (module docstring)."""
        correct = float(outcome.correct)
        if not self.use_think:
            return correct
        w = self.think_format_weight
        return correct * (1.0 - w + w * float(outcome.format))

    async def score_reply(self, completion: Any, answer: Any, prompt: Any = None) -> float:
        """``math_reward`` of one reply outside a rollout (corpus, tests, benchmarks); the
        problem in ``prompt`` decides percent readings, as in a rollout."""
        state = {"prompt": prompt, "completion": completion, "answer": answer}
        return self.math_reward(await self.outcome(state))

    @vf.teardown
    async def close_pool(self) -> None:
        self.pool.close()
