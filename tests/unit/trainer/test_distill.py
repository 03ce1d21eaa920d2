"""On-policy distillation in the trainer: the per-token advantage is the teacher's
log-probability minus the sampler's, it reaches every loss token through every layout, and a
teacher keeps groups whose rewards say nothing."""

from __future__ import annotations

import pytest
import torch

from rlvr.batch import GroupResult, RolloutResult, Sample, StepBatch
from rlvr.config import ConfigError, load_config
from rlvr.layout.micro_batches import collate, split_micro_batches
from rlvr.reasoning_vocab.mapping import load_tokenizer
from rlvr.trainer.advantages import distill_advantages
from rlvr.trainer.train_batch import build_train_batch

from ..layout.test_micro_batches import step as layout_step
from ..layout.test_prefix_tree import assert_same_training, policy, step_samples, train_step
from .test_loss import make_samples, step_gradient, tiny_policy

TEACHER = "distill.base_url=http://127.0.0.1:9/v1"
"""A teacher URL for configs that never call it (build_train_batch reads the scores given)."""


def graded(sample: Sample, seed: int) -> Sample:
    """`sample` with made-up teacher log-probabilities on its loss tokens (0.0 elsewhere)."""
    g = torch.Generator().manual_seed(seed)
    teacher = [-float(torch.rand(1, generator=g)) * 4 * m for m in sample.loss_mask]
    return Sample(
        sample.input_ids,
        sample.loss_mask,
        sample.sampler_logprobs,
        sample.advantage,
        sample.rollout,
        sample.rollout_tokens,
        teacher_logprobs=teacher,
    )


def rollout(reward: float, sampler: list[float], teacher: list[float]) -> RolloutResult:
    sample = Sample([1, 2, 3, 4], [0, 1, 0, 1], sampler, teacher_logprobs=teacher)
    return RolloutResult(0, reward, {}, [sample], False, 1, 2, "p", "c", "", 2, False)


def step(*groups: GroupResult) -> StepBatch:
    return StepBatch(
        0, list(groups), data_position=0, skipped_prompts=0, generate_s=1.0, min_policy_version=0
    )


def test_distill_advantage_is_teacher_minus_sampler_logprob():
    """Each sampled token gains coef x (teacher - sampler log-probability), every other token
    nothing; in the batch it adds to the group advantage token by token (pure distillation:
    it alone), and the step logs the reverse KL it estimates."""
    sample = Sample(
        [7, 8, 9, 10, 11],
        [0, 1, 1, 0, 1],
        [0.0, -1.0, -2.5, 0.0, -0.5],
        teacher_logprobs=[0.0, -0.25, -3.0, 0.0, -0.5],
    )
    assert distill_advantages(sample, 2.0) == [0.0, 1.5, -1.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="without teacher log-probabilities"):
        distill_advantages(Sample([1, 2], [0, 1], [0.0, -1.0]), 1.0)

    sampler, teacher = [0.0, -1.0, 0.0, -2.0], [0.0, -0.5, 0.0, -3.0]
    group = GroupResult([rollout(1.0, sampler, teacher), rollout(0.0, sampler, teacher)])
    for rewards, a in (("true", 1.0), ("false", 0.0)):
        cfg = load_config(overrides=[TEACHER, "distill.coef=0.5", f"distill.rewards={rewards}"])
        train = build_train_batch(step(group), cfg)
        mb = collate([[s] for s in train.samples], 0)
        # the predictions of tokens 1..3: sampled, the environment's, sampled
        expected = [[a + 0.25, 0.0, a - 0.5], [-a + 0.25, 0.0, -a - 0.5]]
        masked = (mb.advantages * mb.loss_mask).tolist()
        assert masked == [pytest.approx(row, rel=1e-5) for row in expected], rewards
        assert train.metrics["distill/reverse_kl"] == pytest.approx(0.25)  # (-0.5 + 1) / 2
        assert train.metrics["distill/advantage_abs"] == pytest.approx(0.375)


def test_a_teacher_keeps_groups_whose_rewards_are_equal():
    """Equal rewards teach GRPO nothing, but the teacher's term does: such groups (and groups
    of one rollout) train under distillation even with loss.drop_zero_variance, and are still
    counted; the teacher agreeing exactly leaves nothing to train."""
    sampler = [0.0, -1.0, 0.0, -2.0]
    flat = GroupResult([rollout(1.0, sampler, [0.0, -0.5, 0.0, -2.0])] * 2)
    single = GroupResult([rollout(0.0, sampler, [0.0, -1.5, 0.0, -2.0])])
    drop = "loss.drop_zero_variance=true"
    grpo = build_train_batch(step(flat, single), load_config(overrides=[drop]))
    assert grpo.samples == [] and grpo.metrics["rollouts/dropped_groups"] == 2
    kept = build_train_batch(step(flat, single), load_config())
    assert len(kept.samples) == 3 and not kept.has_signal  # no teacher: zero advantages
    distilled = build_train_batch(step(flat, single), load_config(overrides=[drop, TEACHER]))
    assert len(distilled.samples) == 3 and distilled.has_signal
    assert distilled.metrics["rollouts/zero_variance_groups"] == 2
    assert distilled.metrics["rollouts/dropped_groups"] == 0
    agreeing = GroupResult([rollout(1.0, sampler, sampler)] * 2)
    assert not build_train_batch(step(agreeing), load_config(overrides=[TEACHER])).has_signal


def test_distill_config_is_checked():
    with pytest.raises(ConfigError, match="distill.coef=0.0"):
        load_config(overrides=[TEACHER, "distill.coef=0"]).validate()
    with pytest.raises(ConfigError, match="distill.rewards=False: false means pure"):
        load_config(overrides=["distill.rewards=false"]).validate()
    with pytest.raises(ConfigError, match="distill.base_url='localhost:8000'"):
        load_config(overrides=["distill.base_url=localhost:8000"]).validate()
    with pytest.raises(ConfigError, match="set one"):
        two = "distill.base_urls=[http://a:1/v1,http://b:1/v1]"
        load_config(overrides=[TEACHER, two]).validate()
    load_config(overrides=[TEACHER]).validate()


def distilled(samples: list[Sample], coef: float = 1.5) -> list[Sample]:
    """`samples` graded by a made-up teacher and scored as build_train_batch scores them."""
    out = []
    for i, s in enumerate(samples):
        g = graded(s, i)
        out.append(g.scored(g.advantage, g.rollout, g.rollout_tokens, distill_advantages(g, coef)))
    return out


def test_distillation_trains_every_layout(tiny_model_dir):
    """The teacher's term flows like the environment's advantage: the step's gradient is the
    same whole, in micro-batches of any size, over ranks, packed into rows, and folded into
    prefix trees (per-sequence losses too), and it is not the gradient without the term."""
    model = tiny_policy()
    samples = distilled(make_samples())
    without = step_gradient(model, make_samples(), len(samples))
    for aggregation in ("token_mean", "seq_mean_token_mean"):
        overrides = (f"loss.aggregation={aggregation}",)
        whole = step_gradient(model, samples, len(samples), overrides=overrides)
        assert not torch.allclose(whole, without, atol=1e-4)
        for mbs, world in [(1, 1), (3, 1), (1, 2), (2, 3)]:
            split = step_gradient(model, samples, mbs, world, overrides=overrides)
            assert torch.allclose(split, whole, rtol=1e-4, atol=1e-7), (aggregation, mbs, world)
    padded = split_micro_batches(samples, 4)
    packed = split_micro_batches(samples, 2, 24)
    assert any(len(row) > 1 for rows in packed for row in rows)
    padded_loss, padded_grad = layout_step(model, padded)
    packed_loss, packed_grad = layout_step(model, packed)
    assert packed_loss == pytest.approx(padded_loss, abs=1e-5)
    assert torch.allclose(packed_grad, padded_grad, atol=1e-5)

    tokenizer = load_tokenizer(tiny_model_dir)
    trees = distilled(step_samples(lambda t: tokenizer.encode(t, add_special_tokens=False)))
    for loss in ((), ("loss.ratio_level=sequence", "loss.aggregation=seq_mean_token_mean")):
        setup = policy(tiny_model_dir, True, False, loss=loss)
        folded = train_step(*setup, trees, "sdpa")
        assert_same_training(folded, train_step(*setup, trees, None), trees)
