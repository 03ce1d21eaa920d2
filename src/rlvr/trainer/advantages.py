"""Group-relative advantages: each rollout's reward against the other rollouts of its prompt."""

from __future__ import annotations

import math
from collections.abc import Sequence

from rlvr.batch import RolloutResult, rewards_equal
from rlvr.config import LossConfig


def overlong_penalty(rollout: RolloutResult, reply_cap: int | None, loss: LossConfig) -> float:
    """DAPO's soft overlong punishment of a rollout (Yu et al., 2025, eq. 13): 0 while its
    longest turn stays `loss.overlong_buffer` tokens short of the reply cap, rising linearly to
    `loss.overlong_penalty` at the cap. A reply cut at the cap is mostly unfinished work; the
    graded penalty teaches the model to finish sooner without the cliff between a reply one
    token short of the cap and one that hits it (DAPO measured the cliff as noise)."""
    if not loss.overlong_buffer or not reply_cap:
        return 0.0
    buffer = min(loss.overlong_buffer, reply_cap)
    over = rollout.longest_turn - (reply_cap - buffer)
    return loss.overlong_penalty * min(1.0, max(0, over) / buffer)


def group_advantages(
    groups: Sequence[Sequence[float]], scale_rewards: bool, eps: float = 1e-6
) -> tuple[list[list[float]], list[bool]]:
    """Reward minus the group's mean (optionally divided by the group's std).

    Returns the advantages, shaped like `groups`, and one flag per group that is True when
    all its rewards are equal: such a group has zero advantage everywhere and teaches nothing.
    The std is the population std of the group; `eps` only guards the division. A reward that
    is not finite raises: one NaN would make its whole group's advantages NaN, and the weights
    after one step (`rlvr.rollouts.groups` counts such rollouts as errored before they get here).
    """
    advantages: list[list[float]] = []
    zero_variance: list[bool] = []
    for index, rewards in enumerate(groups):
        if not all(math.isfinite(r) for r in rewards):
            raise ValueError(f"group {index} has a reward that is not finite: {list(rewards)}")
        n = len(rewards)
        mean = sum(rewards) / n if n else 0.0
        std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / n) if n else 0.0
        flat = rewards_equal(list(rewards))
        zero_variance.append(flat)
        if flat:
            advantages.append([0.0] * n)
            continue
        denom = std + eps if scale_rewards else 1.0
        advantages.append([(r - mean) / denom for r in rewards])
    return advantages, zero_variance
