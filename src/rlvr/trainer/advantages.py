"""Group-relative advantages: each rollout's reward against the other rollouts of its prompt."""

from __future__ import annotations

import math
from collections.abc import Sequence

from rlvr.batch import RolloutResult, Sample, rewards_equal
from rlvr.config import LossConfig


def overlong_penalty(rollout: RolloutResult, reply_cap: int | None, loss: LossConfig) -> float:
    """DAPO's soft overlong punishment of a rollout (Yu et al., 2025, eq. 13): 0 while its
    longest reply stays `loss.overlong_buffer` tokens short of the reply cap, rising linearly to
    `loss.overlong_penalty` at the cap. A reply that stopped at its token limit
    (`RolloutResult.capped_reply`) counts as reaching the cap; any other is measured as
    generated, so a short reply whose turn was cut to `max_seq_len` after a long prompt pays
    nothing. A reply cut at the cap is mostly unfinished work; the graded penalty teaches the
    model to finish sooner without the cliff between a reply one token short of the cap and
    one that hits it (DAPO measured the cliff as noise)."""
    if not loss.overlong_buffer or not reply_cap:
        return 0.0
    buffer = min(loss.overlong_buffer, reply_cap)
    length = reply_cap if rollout.capped_reply else rollout.longest_reply
    over = length - (reply_cap - buffer)
    return loss.overlong_penalty * min(1.0, max(0, over) / buffer)


def group_advantages(
    groups: Sequence[Sequence[float]],
    scale_rewards: bool,
    penalties: Sequence[Sequence[float]] | None = None,
    eps: float = 1e-6,
) -> tuple[list[list[float]], list[bool]]:
    """Reward minus the group's mean (optionally divided by the group's std), minus the
    rollout's penalty against the group's mean penalty.

    Returns the advantages, shaped like `groups`, and one flag per group that is True when
    all its rewards are equal: such a group's rewards teach nothing, and only its penalties
    (`penalties`, shaped like `groups`: the overlong penalty) move its advantages. The std is
    the population std of the rewards alone and does not scale the penalty: a penalty divided
    by a std it is part of would amplify itself (in a group of equal rewards, one token into
    the overlong buffer would weigh as much as a reply cut at the cap). `eps` only guards the
    division. A reward that is not finite raises: one NaN would make its whole group's
    advantages NaN, and the weights after one step (`rlvr.rollouts.groups` counts such
    rollouts as errored before they get here).
    """
    advantages: list[list[float]] = []
    zero_variance: list[bool] = []
    for index, rewards in enumerate(groups):
        if not all(math.isfinite(r) for r in rewards):
            raise ValueError(f"group {index} has a reward that is not finite: {list(rewards)}")
        flat = rewards_equal(list(rewards))
        zero_variance.append(flat)
        shaped = [0.0] * len(rewards) if flat else centred(rewards, scale_rewards, eps)
        if penalties is not None:
            shaped = [a - p for a, p in zip(shaped, centred(penalties[index]), strict=True)]
        advantages.append(shaped)
    return advantages, zero_variance


def centred(values: Sequence[float], scale: bool = False, eps: float = 1e-6) -> list[float]:
    """`values` minus their mean, divided by their population std (+ `eps`) when `scale`."""
    n = len(values)
    mean = sum(values) / n if n else 0.0
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / n) if n else 0.0
    denom = std + eps if scale else 1.0
    return [(v - mean) / denom for v in values]


def distill_advantages(sample: Sample, coef: float) -> list[float]:
    """On-policy distillation's per-token advantage of `sample`: coef x (teacher log-probability
    - sampler log-probability) of each sampled token, 0 on every other token.

    The difference is the negative of the per-token reverse KL, log pi_sampler - log pi_teacher,
    at the token the student sampled: a token the teacher finds likelier than the student is
    pushed up, one it finds unlikely down, and the expectation over the student's own samples is
    the reverse KL's gradient (on-policy distillation as Agarwal et al., 2024, and the field's
    recipes since). It needs no reward, so it teaches in groups whose rewards are all equal."""
    if sample.teacher_logprobs is None:
        raise ValueError("a sample without teacher log-probabilities cannot be distilled")
    return [
        coef * (teacher - sampler) if mask else 0.0
        for teacher, sampler, mask in zip(
            sample.teacher_logprobs, sample.sampler_logprobs, sample.loss_mask, strict=True
        )
    ]
