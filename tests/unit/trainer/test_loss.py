"""GRPO's math on hand-made inputs: advantages, the loss and its masks, and the invariance of
the gradient to how a step's samples are cut into micro-batches and spread over ranks."""

from __future__ import annotations

import math

import pytest
import torch

from rlvr.batch import Sample
from rlvr.config import ConfigError, LossConfig, load_config
from rlvr.trainer.advantages import group_advantages
from rlvr.trainer.grpo import micro_batch_loss
from rlvr.trainer.loss import (
    LossTerms,
    StepStats,
    loss_normaliser,
    merge_ranks,
    normalised_loss,
    policy_loss,
    summarise,
)
from rlvr.trainer.micro_batches import collate, padding_micro_batch, shard, split_micro_batches

from .tiny_models import tiny_qwen2

# ---- advantages ------------------------------------------------------------------------


def test_group_advantages_scaled_and_unscaled():
    groups = [[1.0, 0.0, 0.0, 1.0], [0.5, 0.5, 0.5], [2.0], [0.0, 3.0]]
    scaled, flat = group_advantages(groups, scale_rewards=True)
    assert scaled[0] == pytest.approx([1.0, -1.0, -1.0, 1.0], abs=1e-5)  # mean .5, std .5
    assert scaled[1] == [0.0, 0.0, 0.0] and scaled[2] == [0.0]
    assert scaled[3] == pytest.approx([-1.0, 1.0], abs=1e-5)
    assert flat == [False, True, True, False]
    unscaled, _ = group_advantages(groups, scale_rewards=False)
    assert unscaled[0] == pytest.approx([0.5, -0.5, -0.5, 0.5])
    assert unscaled[3] == pytest.approx([-1.5, 1.5])
    assert sum(unscaled[0]) == pytest.approx(0.0)


def test_group_advantages_ragged_groups_after_errors():
    advantages, flat = group_advantages([[1.0, 0.0, 0.0], []], scale_rewards=False)
    assert advantages[0] == pytest.approx([2 / 3, -1 / 3, -1 / 3])
    assert advantages[1] == [] and flat == [False, True]


def test_group_advantages_refuse_a_non_finite_reward():
    """One NaN would make the whole group's advantages NaN (and every weight, one step later)."""
    with pytest.raises(ValueError, match="group 1 has a reward that is not finite"):
        group_advantages([[1.0, 0.0], [1.0, math.nan]], scale_rewards=True)


# ---- the loss --------------------------------------------------------------------------


def loss_cfg(**kw) -> LossConfig:
    return LossConfig(**kw)


def test_on_policy_loss_is_minus_advantage_weighted_logprob_gradient():
    logprobs = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    sampler = logprobs.detach().clone()
    adv = torch.tensor([[2.0, 2.0, -1.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    terms = policy_loss(logprobs, sampler, adv, mask, loss_cfg())
    assert terms.loss_sum.item() == pytest.approx(-4.0)  # -(1*2 + 1*2), third token masked
    terms.loss_sum.backward()
    assert logprobs.grad.tolist() == [[-2.0, -2.0, 0.0]]
    assert terms.tokens.item() == 2
    assert terms.stats["mismatch_kl"].item() == pytest.approx(0.0, abs=1e-12)


def test_ratio_masking_drops_off_policy_tokens():
    logprobs = torch.log(torch.tensor([[0.5, 0.5, 0.5]]))
    sampler = torch.log(torch.tensor([[0.5, 0.01, 0.99]]))  # ratios 1, 50, ~0.505
    terms = policy_loss(logprobs, sampler, torch.ones(1, 3), torch.ones(1, 3), loss_cfg())
    assert terms.stats["ratio/masked_frac"].item() == 1
    assert terms.loss_sum.item() == pytest.approx(-(1.0 + 0.5 / 0.99), rel=1e-5)
    assert terms.stats["ratio/max"].item() == pytest.approx(50.0, rel=1e-4)
    assert terms.stats["mismatch_kl"].item() > 0


def test_ppo_clipping_stops_the_gradient_beyond_the_bound():
    logprobs = torch.log(torch.tensor([[0.6, 0.6]])).requires_grad_()
    sampler = torch.log(torch.tensor([[0.5, 0.5]]))  # ratio 1.2 on both tokens
    adv = torch.tensor([[1.0, -1.0]])
    cfg = loss_cfg(clip_low=0.1, clip_high=0.1)
    terms = policy_loss(logprobs, sampler, adv, torch.ones(1, 2), cfg)
    terms.loss_sum.backward()
    # A > 0 and r > 1 + eps: clipped, no gradient; A < 0: the unclipped term is the minimum
    assert logprobs.grad[0, 0].item() == 0.0
    assert logprobs.grad[0, 1].item() == pytest.approx(1.2, rel=1e-5)
    assert terms.stats["ratio/clipped_frac"].item() == 1


def test_kl_to_reference_adds_beta_weighted_penalty():
    logprobs = torch.tensor([[-1.0, -1.0]])
    ref = torch.tensor([[-1.0, -2.0]])
    cfg = loss_cfg(beta=0.5)
    terms = policy_loss(logprobs, logprobs, torch.zeros(1, 2), torch.ones(1, 2), cfg, ref)
    kl = math.exp(-1.0) + 1.0 - 1.0  # exp(d) - d - 1 with d = -1
    assert terms.loss_sum.item() == pytest.approx(0.5 * kl)
    with pytest.raises(ValueError, match="reference"):
        policy_loss(logprobs, logprobs, torch.zeros(1, 2), torch.ones(1, 2), cfg)


def test_kl_ref_statistic_uses_the_loss_mask():
    """A token the ratio bounds mask out has no loss, so it has no part in `loss/kl_ref`
    either: pg_loss + beta * kl_ref is the loss that trains."""
    logprobs = torch.tensor([[-1.0, -1.0, -1.0]])
    sampler = torch.tensor([[-1.0, -1.0, -9.0]])  # ratio e^8: outside ratio_mask_high
    ref = torch.tensor([[-2.0, -1.5, -3.0]])
    adv = torch.tensor([[1.0, -1.0, 1.0]])
    cfg = loss_cfg(beta=0.5)
    terms = policy_loss(logprobs, sampler, adv, torch.ones(1, 3), cfg, ref)
    assert terms.stats["ratio/masked_frac"].item() == 1
    d = ref[0, :2] - logprobs[0, :2]
    kept_kl = (torch.exp(d) - d - 1).sum().item()
    assert terms.stats["loss/kl_ref"].item() == pytest.approx(kept_kl)
    total = terms.stats["loss/pg"] + cfg.beta * terms.stats["loss/kl_ref"]
    assert terms.loss_sum.item() == pytest.approx(total.item())


# ---- loss and correction choices ---------------------------------------------------------

RATIOS = {0: [1.5, 0.5], 1: [4.0, 1.0], 2: [3.0, 3.0, 3.0]}
"""Trainer/sampler ratio of each sample's loss tokens."""
ADVANTAGES = {0: 1.0, 1: -0.5, 2: 2.0}
COLUMNS = {0: [(0, 0), (0, 1)], 1: [(0, 3), (0, 4)], 2: [(1, 0), (1, 1), (1, 2)]}
"""Where each sample's loss tokens sit in the collated [2, 5] grid: samples 0 and 1 packed in
row 0 (sample 1's first token is not predicted from sample 0), sample 2 in row 1, padded."""


def variant_inputs() -> tuple:
    """A packed micro-batch of three samples through `collate`, and trainer log-probabilities
    (-1 everywhere, with a gradient) that give each loss token its `RATIOS` entry."""
    samples = []
    for ratios in RATIOS.values():
        sampler = [0.0] + [-1.0 - math.log(r) for r in ratios]
        samples.append(Sample(list(range(len(sampler))), [0] + [1] * len(ratios), sampler))
    samples = [s.with_advantage(ADVANTAGES[i]) for i, s in enumerate(samples)]
    mb = collate([[samples[0], samples[1]], [samples[2]]], pad_id=0)
    logprobs = torch.full(mb.loss_mask.shape, -1.0, requires_grad=True)
    return mb, logprobs


def run_variant(cfg: LossConfig) -> tuple[float, torch.Tensor]:
    mb, logprobs = variant_inputs()
    terms = policy_loss(
        logprobs, mb.sampler_logprobs, mb.advantages, mb.loss_mask, cfg, None, mb.sequence_ids
    )
    terms.loss_sum.backward()
    return terms.loss_sum.item(), logprobs.grad


def reference(per_sample) -> tuple[float, torch.Tensor]:
    """The loss `per_sample(i, log_ratios, advantage)` adds up over the samples, written one
    sample at a time (no layout), with its gradient by autograd."""
    mb, logprobs = variant_inputs()
    total = torch.zeros(())
    for i, columns in COLUMNS.items():
        log_ratios = torch.stack([logprobs[c] - mb.sampler_logprobs[c] for c in columns])
        total = total + per_sample(i, log_ratios, ADVANTAGES[i])
    total.backward()
    return total.item(), logprobs.grad


def assert_matches(cfg: LossConfig, expected: tuple[float, torch.Tensor]) -> None:
    value, grad = run_variant(cfg)
    assert value == pytest.approx(expected[0], rel=1e-5)
    assert torch.allclose(grad, expected[1], atol=1e-6), (grad, expected[1])


def test_loss_variants_match_reference_formulas():
    """Each aggregation, GSPO and each correction against its paper's formula written per
    sample; and the identities: a one-token sequence makes GSPO the token ratio, an infinite
    TIS cap is plain importance sampling."""
    mb, _ = variant_inputs()
    assert mb.sequence_ids.tolist() == [[0, 0, 1, 1, 1], [2, 2, 2, 3, 3]]
    bounds = dict(ratio_mask_low=0.125, ratio_mask_high=3.5)  # masks sample 1's ratio of 4

    def kept(log_ratios):
        return ((log_ratios.exp() >= 0.125) & (log_ratios.exp() <= 3.5)).float()

    def token_terms(i, log_ratios, adv):
        return -(log_ratios.exp() * adv * kept(log_ratios)).sum()

    # token_mean (today's loss): the summed token terms
    assert_matches(loss_cfg(**bounds), reference(token_terms))
    # seq_mean_token_mean (GRPO): each sample's terms over its loss tokens, masked ones included
    assert_matches(
        loss_cfg(aggregation="seq_mean_token_mean", **bounds),
        reference(lambda i, lr, adv: token_terms(i, lr, adv) / len(lr)),
    )
    # constant (Dr. GRPO) sums like token_mean; the normalisers tell the three apart
    assert_matches(loss_cfg(aggregation="constant", **bounds), reference(token_terms))
    for aggregation, normaliser in [
        ("token_mean", 7),
        ("seq_mean_token_mean", 3),
        ("constant", 3 * 16),
    ]:
        cfg = loss_cfg(aggregation=aggregation, constant_tokens=16)
        assert loss_normaliser(cfg, tokens=7, sequences=3, max_seq_len=64) == normaliser
    assert loss_normaliser(loss_cfg(aggregation="constant"), 7, 3, max_seq_len=64) == 3 * 64

    # GSPO: one clipped ratio per sequence, s = exp(mean log r), loss -min(s A, clip(s) A)
    def gspo(i, log_ratios, adv):
        s = log_ratios.mean().exp()
        return -torch.minimum(s * adv, s.clamp(0.8, 1.2) * adv)

    gspo_cfg = loss_cfg(
        ratio_level="sequence",
        aggregation="seq_mean_token_mean",
        clip_low=0.2,
        clip_high=0.2,
        ratio_mask_high=100.0,
    )
    assert_matches(gspo_cfg, reference(gspo))

    # sequence_mask (MIS): a sample whose geometric-mean ratio leaves the bounds drops whole;
    # sample 1 (ratios 4 and 1, mean 2) stays whole where the token mask drops its 4
    def sequence_masked(i, log_ratios, adv):
        inside = 0.125 <= log_ratios.mean().exp().item() <= 2.5
        return -(log_ratios.exp() * adv).sum() * inside

    seq_mask = loss_cfg(correction="sequence_mask", ratio_mask_high=2.5)
    assert_matches(seq_mask, reference(sequence_masked))

    # TIS: value -min(r, cap) A, gradient -min(r, cap) A d log p; nothing masked
    cfg = loss_cfg(correction="tis", tis_cap=2.0)
    value, grad = run_variant(cfg)
    expected = torch.zeros_like(grad)
    total = 0.0
    for i, columns in COLUMNS.items():
        for c, r in zip(columns, RATIOS[i], strict=True):
            expected[c] = -min(r, 2.0) * ADVANTAGES[i]
            total += expected[c].item()
    assert value == pytest.approx(total, rel=1e-5)
    assert torch.allclose(grad, expected, atol=1e-6)

    # identities
    plain = loss_cfg(ratio_mask_high=100.0)
    assert_matches(loss_cfg(correction="tis", tis_cap=math.inf), run_variant(plain))
    one_token = torch.tensor([[-0.7, -1.2]], requires_grad=True)
    sampler, adv, ids = (
        torch.tensor([[-1.0, -1.0]]),
        torch.tensor([[1.0, -2.0]]),
        torch.tensor([[0, 1]]),
    )
    results = []
    for level in ("token", "sequence"):
        lp = one_token.detach().clone().requires_grad_()
        terms = policy_loss(
            lp, sampler, adv, torch.ones(1, 2), loss_cfg(ratio_level=level), None, ids
        )
        terms.loss_sum.backward()
        results.append((terms.loss_sum.item(), lp.grad))
    assert results[0][0] == pytest.approx(results[1][0])
    assert torch.allclose(results[0][1], results[1][1])


def test_loss_choices_are_checked_at_start():
    """A correction that leaves a setting nothing to do, or an impossible value, fails naming
    the field."""
    with pytest.raises(ConfigError, match="loss.correction='tis'.*clip"):
        load_config(overrides=["loss.correction=tis", "loss.clip_high=0.2"])
    with pytest.raises(ConfigError, match="loss.aggregation"):
        load_config(overrides=["loss.aggregation=sum"])
    with pytest.raises(ConfigError, match="loss.constant_tokens"):
        load_config(overrides=["loss.constant_tokens=0"])


def _terms(tokens: float, pg: float, ratio_min: float, ratio_max: float) -> LossTerms:
    stats = {"loss/pg": pg, "ratio/min": ratio_min, "ratio/max": ratio_max}
    as_tensors = {name: torch.tensor(value, dtype=torch.float64) for name, value in stats.items()}
    return LossTerms(torch.tensor(0.0), torch.tensor(tokens), as_tensors)


def test_step_stats_sum_token_means_and_keep_extremes():
    """Token-mean statistics add up over micro-batches and ranks and are divided by the step's
    loss tokens once; extremes keep the extreme; a micro-batch without loss tokens (+-inf
    extremes) changes nothing, and a statistic nothing reported logs its empty value: 0 for
    the losses, nothing for the rest (a step that trains nothing measured no entropy, ratio or
    mismatch-KL)."""
    ranks = []
    for micro_batches in (
        [(2.0, 4.0, 0.9, 1.1), (0.0, 0.0, math.inf, -math.inf)],
        [(2.0, 2.0, 0.8, 1.05)],
    ):
        stats = StepStats()
        for values in micro_batches:
            stats.add(_terms(*values))
        stats.count("slots", 8)
        ranks.append(stats.read())
    summary = summarise(merge_ranks(ranks))
    assert summary["loss/pg"] == 1.5
    assert (summary["ratio/min"], summary["ratio/max"]) == (0.8, 1.1)
    assert "ratio/mean" not in summary and summary["loss/total"] == 0.0  # not reported
    assert merge_ranks(ranks)["slots"] == 16
    losses = {"loss/total": 0.0, "loss/pg": 0.0, "loss/kl_ref": 0.0}
    assert set(summary) == {"ratio/min", "ratio/max", *losses}
    assert summarise({}) == losses
    assert summarise({"tokens": 0.0, "entropy": 0.0, "ratio/max": -math.inf}) == losses


# ---- micro-batch / rank invariance -------------------------------------------------------


def tiny_policy() -> torch.nn.Module:
    return tiny_qwen2(layers=1, tied=False)


def make_samples(n: int = 7) -> list[Sample]:
    g = torch.Generator().manual_seed(1)
    samples = []
    for i in range(n):
        prompt, completion = 3 + i % 3, 2 + (3 * i) % 7  # lengths vary: padding matters
        ids = torch.randint(1, 64, (prompt + completion,), generator=g).tolist()
        mask = [0] * prompt + [1] * completion
        logprobs = [0.0] * prompt + (-torch.rand(completion, generator=g) * 3).tolist()
        samples.append(Sample(ids, mask, logprobs, advantage=float(i % 3) - 1.0))
    return samples


def step_gradient(model, samples, micro_batch_size: int, world_size: int = 1) -> torch.Tensor:
    """Gradient of one step as the trainer computes it: each simulated rank accumulates over
    its micro-batches (padded to the same count), then ranks are averaged like DDP/DeepSpeed."""
    cfg = load_config()
    global_tokens = sum(s.num_loss_tokens for s in samples)
    shards = [
        split_micro_batches(shard(samples, r, world_size), micro_batch_size)
        for r in range(world_size)
    ]
    count = max(len(s) for s in shards)
    per_rank = []
    for mbs in shards:
        model.zero_grad()
        for chunk in mbs + [padding_micro_batch(0)] * (count - len(mbs)):
            loss, _ = micro_batch_loss(model, collate(chunk, 0), cfg, global_tokens, world_size)
            loss.backward()
        per_rank.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    return torch.stack(per_rank).mean(0)


def test_loss_normalisation_is_invariant_to_micro_batch_split_and_ranks():
    model = tiny_policy()
    samples = make_samples()
    whole = step_gradient(model, samples, micro_batch_size=len(samples))
    assert whole.abs().sum() > 0
    for mbs, world in [(1, 1), (2, 1), (3, 1), (1, 2), (2, 2), (2, 3)]:
        split = step_gradient(model, samples, micro_batch_size=mbs, world_size=world)
        assert torch.allclose(split, whole, rtol=1e-4, atol=1e-7), (mbs, world)


def test_a_per_micro_batch_mean_would_not_be_invariant():
    """The property above is not automatic: averaging per micro-batch weighs tokens of
    short micro-batches more, and the gradient changes with the split."""
    model = tiny_policy()
    samples = make_samples()

    def per_mb_mean_gradient(micro_batch_size):
        model.zero_grad()
        mbs = split_micro_batches(samples, micro_batch_size)
        for chunk in mbs:
            mb = collate(chunk, 0)
            loss, _ = micro_batch_loss(model, mb, load_config(), mb.num_loss_tokens * len(mbs), 1)
            loss.backward()
        return torch.cat([p.grad.flatten() for p in model.parameters()])

    assert not torch.allclose(per_mb_mean_gradient(2), per_mb_mean_gradient(7), rtol=1e-3)


def test_normalised_loss_scales_by_world_size_over_tokens():
    assert normalised_loss(torch.tensor(6.0), 3.0, 2).item() == pytest.approx(4.0)
    assert normalised_loss(torch.tensor(1.0), 0.0, 1).item() == 1.0  # no division by zero


def test_collate_aligns_masks_with_next_token_predictions():
    mb = collate(
        [
            [Sample([5, 6, 7], [0, 1, 1], [0.0, -0.1, -0.2], 1.5)],
            [Sample([8, 9], [0, 1], [0, -0.3])],
        ],
        0,
    )
    assert mb.input_ids.tolist() == [[5, 6, 7], [8, 9, 0]]
    assert mb.attention_mask.tolist() == [[1, 1, 1], [1, 1, 0]]
    assert mb.model_inputs().keys() == {"input_ids"}  # causal attention hides right padding
    assert mb.loss_mask.tolist() == [[1, 1], [1, 0]]
    assert mb.sampler_logprobs.flatten().tolist() == pytest.approx([-0.1, -0.2, -0.3, 0.0])
    assert mb.advantages[0].tolist() == [1.5, 1.5]
    with pytest.raises(ValueError, match="differ in length"):
        Sample([1, 2], [0], [0.0, 0.0])
