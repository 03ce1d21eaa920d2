"""The reward: is the last boxed answer equal to the gold answer, plus an optional format bonus.

``reward = correct`` without ``use_think``; with it ``reward = correct * (1 - w + w * format)``
where ``w = think_format_weight``. Both lie in [0, 1], and format can only scale a correct
answer: a well-formatted wrong answer earns 0, so the reward cannot be raised without solving.
"""

from __future__ import annotations

from typing import Any

import verifiers as vf

from vf_deepscaler.forms import asks_percent
from vf_deepscaler.parser import BoxedAnswerParser, follows_think_format
from vf_deepscaler.pool import VerifierPool
from vf_deepscaler.replies import get_field, last_reply_text, message_text
from vf_deepscaler.verifier import MAX_ANSWER_CHARS

_CORRECT_KEY = "vf_deepscaler_correct"
"""State key caching the verdict, so that the reward and the ``correct`` metric verify once."""


def _problem_text(prompt: Any) -> str:
    """The problem: the last user message of the prompt (a chat list or a plain string)."""
    if isinstance(prompt, str):
        return prompt
    users = [message for message in prompt or [] if get_field(message, "role") == "user"]
    return message_text(users[-1]) if users else ""


class DeepScaleRRubric(vf.Rubric):
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
        super().__init__(parser=parser)
        self.parser: BoxedAnswerParser = parser
        self.pool = VerifierPool(verify_workers, verify_timeout_s)
        self.use_think = use_think
        self.think_format_weight = think_format_weight
        self.add_reward_func(self.math_reward, weight=1.0)
        self.add_metric(self.correct)
        self.add_metric(self.has_boxed)
        if use_think:
            self.add_metric(self.format)
        self.add_metric(self.completion_chars)

    async def math_reward(
        self,
        completion: Any,
        answer: Any,
        state: dict | None = None,
        prompt: Any = None,
        **kwargs: Any,
    ) -> float:
        correct = await self.correct(completion, answer, state, prompt)
        if not self.use_think:
            return correct
        w = self.think_format_weight
        return correct * (1.0 - w + w * await self.format(completion))

    async def correct(
        self,
        completion: Any,
        answer: Any,
        state: dict | None = None,
        prompt: Any = None,
        **kwargs: Any,
    ) -> float:
        """1.0 when the last boxed answer is equivalent to ``answer`` within the time limit;
        the problem in ``prompt`` says whether a bare number may be a percent (forms.py)."""
        if state is not None and state.get(_CORRECT_KEY) is not None:
            return state[_CORRECT_KEY]
        prediction = self.parser.parse_answer(completion)
        gold = str(answer or "").strip()
        score = 0.0
        if prediction and gold and len(prediction) <= MAX_ANSWER_CHARS:
            percent = asks_percent(_problem_text(prompt))
            score = float((await self.pool.check(gold, prediction, percent)).correct)
        if state is not None:
            state[_CORRECT_KEY] = score
        return score

    async def has_boxed(self, completion: Any, **kwargs: Any) -> float:
        """1.0 when the answer part of the reply has a non-empty box."""
        return float(bool(self.parser.parse_answer(completion)))

    async def format(self, completion: Any, **kwargs: Any) -> float:
        """1.0 for one non-empty ``<think>`` block followed by a non-empty answer."""
        return float(follows_think_format(last_reply_text(completion)))

    async def completion_chars(self, completion: Any, **kwargs: Any) -> float:
        """Length of the reply in characters (tokens depend on the model's tokenizer)."""
        return float(len(last_reply_text(completion)))

    @vf.teardown
    async def close_pool(self) -> None:
        self.pool.close()
