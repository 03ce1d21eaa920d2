"""One prompt's group of rollouts generated and scored together (`run_group`, `GroupResult`), and
a training step's groups (`StepBatch`)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from rlvr.rollouts.request_args import SamplingFilterError
from rlvr.rollouts.to_samples import (
    MissingTokensError,
    RolloutResult,
    rollout_result,
)


@dataclass
class GroupResult:
    """The rollouts of one prompt that finished without error, and how many errored."""

    rollouts: list[RolloutResult]
    errored: int = 0
    errors: list[str] = field(default_factory=list)


async def run_group(
    env: Any,
    client: Any,
    model: str,
    row: dict,
    sampling_args: list[dict[str, Any]],
    max_seq_len: int,
    mask_truncated: bool,
) -> GroupResult:
    """Generate and score one group (len(sampling_args) rollouts of `row`).

    Mirrors verifiers' own group runner (rollouts, then `rubric.score_group`, then cleanup)
    through public methods, because its public `run_group` returns serialised outputs without
    the token trajectory. A rollout that raises or ends with `state["error"]` is dropped and
    counted; the others are scored together.
    """
    results = await asyncio.gather(
        *(env.rollout(dict(row), client, model, args) for args in sampling_args),
        return_exceptions=True,
    )
    states = []
    errors = []
    for result in results:
        if isinstance(result, MissingTokensError | SamplingFilterError):
            raise result  # no rollout of this run could train: stop it, naming the cause
        if isinstance(result, BaseException):
            errors.append(f"{type(result).__name__}: {result}")
        elif result.get("error") is not None:
            errors.append(repr(result["error"]))
        else:
            states.append(result)
    if states:
        if env.score_rollouts:
            await env.rubric.score_group(states)
        else:
            await env.rubric.dummy_score_group(states)
    for state in states:
        await env.rubric.cleanup(state)
    rollouts = [rollout_result(s, max_seq_len, mask_truncated) for s in states]
    return GroupResult(rollouts, errored=len(errors), errors=errors)


@dataclass
class StepBatch:
    """All groups for one training step, with the bookkeeping the logs need."""

    step: int
    groups: list[GroupResult]
    data_position: int
    """Position in the prompt order after this batch (where the next batch starts)."""
    skipped_prompts: int
    """Rows passed over because their prompt is longer than batch.max_prompt_len."""
    generate_s: float
    """Wall time from starting the step's rollouts to the last group finishing."""
    min_policy_version: int
    """The weight version the server held when these rollouts started: under adapter sync the
    version that generated all of them; merged pushes may change the weights mid-batch."""
    errors: list[str] = field(default_factory=list)

    @property
    def rollouts(self) -> list[RolloutResult]:
        return [r for g in self.groups for r in g.rollouts]

    @property
    def errored(self) -> int:
        return sum(g.errored for g in self.groups)

    @property
    def completion_tokens(self) -> int:
        return sum(r.completion_tokens for r in self.rollouts)
