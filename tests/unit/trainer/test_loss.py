"""GRPO's math on hand-made inputs: advantages, the loss and its masks, and the invariance of
the gradient to how a step's samples are cut into micro-batches and spread over ranks."""

from __future__ import annotations

import math

import pytest
import torch

from rlvr.batch import GroupResult, RolloutResult, Sample, StepBatch, TrainBatch
from rlvr.config import ConfigError, LossConfig, load_config
from rlvr.layout.micro_batches import collate, padding_micro_batch, shard, split_micro_batches
from rlvr.trainer.advantages import group_advantages
from rlvr.trainer.loss import (
    LossTerms,
    StepStats,
    loss_normaliser,
    merge_ranks,
    normalised_loss,
    policy_loss,
    step_normaliser,
    summarise,
)
from rlvr.trainer.step import micro_batch_loss
from rlvr.trainer.train_batch import build_train_batch

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


def test_asymmetric_clipping_bounds_each_side_by_its_own_setting():
    """clip_low bounds ratios below 1 (where A < 0 gains from lowering them), clip_high those
    above 1 (A > 0): with 0.1 and 0.3, a ratio of 1.2 under A > 0 still trains, a ratio of
    0.85 under A < 0 is clipped; swapped settings would do the opposite."""
    logprobs = torch.log(torch.tensor([[0.6, 0.85]])).requires_grad_()
    sampler = torch.log(torch.tensor([[0.5, 1.0]]))  # ratios 1.2 and 0.85
    adv = torch.tensor([[1.0, -1.0]])
    terms = policy_loss(
        logprobs, sampler, adv, torch.ones(1, 2), loss_cfg(clip_low=0.1, clip_high=0.3)
    )
    terms.loss_sum.backward()
    assert logprobs.grad[0, 0].item() == pytest.approx(-1.2, rel=1e-5)  # inside 1 + 0.3
    assert logprobs.grad[0, 1].item() == 0.0  # below 1 - 0.1: clipped
    assert terms.stats["ratio/clipped_frac"].item() == 1


def test_a_masked_ratio_that_overflows_exp_stays_out_of_the_loss():
    """A token whose log-ratio overflows float32's exp (e^100) is masked by the ratio bounds:
    it adds nothing to the loss or its gradient, rather than inf * 0 = NaN; its ratio is still
    logged as what it was. Under sequence_mask its whole sequence drops alike."""
    for cfg in (loss_cfg(), loss_cfg(correction="sequence_mask")):
        logprobs = torch.tensor([[-1.0, -1.0, -1.0]], requires_grad=True)
        sampler = torch.tensor([[-1.0, -101.0, -1.0]])
        ids = torch.tensor([[0, 0, 1]])
        adv = torch.tensor([[1.0, 1.0, -1.0]])
        terms = policy_loss(
            logprobs, sampler, adv, torch.ones(1, 3), cfg, None, ids, torch.tensor([[2, 2, 1.0]])
        )
        terms.loss_sum.backward()
        kept = [1.0, 0.0, -1.0] if cfg.correction == "token_mask" else [0.0, 0.0, -1.0]
        assert terms.loss_sum.item() == pytest.approx(-sum(kept))
        assert logprobs.grad.tolist() == [[-k for k in kept]]
        assert terms.stats["ratio/max"].item() == math.inf
        assert all(math.isfinite(terms.stats[n].item()) for n in ("loss/pg", "loss/total"))


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
        logprobs,
        mb.sampler_logprobs,
        mb.advantages,
        mb.loss_mask,
        cfg,
        None,
        mb.sequence_ids,
        mb.rollout_tokens,
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
    # sample 1 (ratios 4 and 1: geometric mean 2, arithmetic 2.5) stays whole where the token
    # mask drops its 4, and where a bound on the arithmetic mean would drop it
    def sequence_masked(i, log_ratios, adv):
        inside = 0.125 <= log_ratios.mean().exp().item() <= 2.2
        return -(log_ratios.exp() * adv).sum() * inside

    seq_mask = loss_cfg(correction="sequence_mask", ratio_mask_high=2.2)
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


def piece(ratios: list[float], prompt: int = 2) -> Sample:
    """A sample of `prompt` tokens without loss, then one loss token per ratio: the sampler's
    log-probability is set so that trainer log-probabilities of -1 give that ratio."""
    sampler = [0.0] * prompt + [-1.0 - math.log(r) for r in ratios]
    return Sample(list(range(len(sampler))), [0] * prompt + [1] * len(ratios), sampler)


def joined(*pieces: list[float]) -> Sample:
    """One sample holding every piece's loss tokens, an environment token between turns."""
    sampler, mask = [0.0, 0.0], [0, 0]
    for ratios in pieces:
        sampler += [-1.0 - math.log(r) for r in ratios] + [0.0]
        mask += [1] * len(ratios) + [0]
    return Sample(list(range(len(sampler))), mask, sampler)


TURNS = [[1.5, 1.4], [1.0], [0.7, 0.9]]
"""Rollout A's turns (the trainer/sampler ratios of their loss tokens)."""


def split_rollout_step(split: bool) -> TrainBatch:
    """Rollout A (reward 1) as 3 samples or 1, rollout B (reward 0) as 1: advantages +-1;
    and a group whose only rollouts have no loss token (an environment's mask)."""
    a = [piece(t) for t in TURNS] if split else [joined(*TURNS)]
    rollouts = [
        RolloutResult(0, 1.0, {}, a, False, 3, 5, "p", "c"),
        RolloutResult(0, 0.0, {}, [piece([1.1, 1.0, 1.2])], False, 1, 3, "p", "c"),
    ]
    masked = Sample([1, 2, 3], [0, 0, 0], [0.0] * 3)
    silent = [RolloutResult(1, r, {}, [masked], False, 1, 1, "p", "c") for r in (1.0, 0.0)]
    groups = [GroupResult(rollouts), GroupResult(silent)]
    batch = StepBatch(0, groups, 0, 0, 1.0, 0)
    return build_train_batch(batch, load_config())


def token_gradients(cfg: LossConfig, batch: TrainBatch, layout: list[list[list[int]]]):
    """The step's loss and its gradient on each loss token (in sample order), with the
    batch's samples (by index) laid out in `layout`'s micro-batches of rows."""
    normaliser = step_normaliser(cfg, batch, max_seq_len=64)
    total, grads, split = 0.0, {}, 0.0
    for rows in layout:
        mb = collate([[batch.samples[i] for i in row] for row in rows], pad_id=0)
        logprobs = torch.full(mb.loss_mask.shape, -1.0, requires_grad=True)
        terms = policy_loss(
            logprobs,
            mb.sampler_logprobs,
            mb.advantages,
            mb.loss_mask,
            cfg,
            None,
            mb.sequence_ids,
            mb.rollout_tokens,
        )
        loss = normalised_loss(terms.loss_sum, normaliser, world_size=1)
        loss.backward()
        total += loss.item()
        split += terms.stats.get("ratio/split_rollout_frac", torch.tensor(0.0)).item()
        for r, row in enumerate(rows):
            start = 0
            for i in row:
                n = len(batch.samples[i])
                columns = slice(max(start - 1, 0), start + n - 1)
                on = mb.loss_mask[r, columns].bool()
                grads[i] = logprobs.grad[r, columns][on].tolist()
                start += n
    return total, [g for i in sorted(grads) for g in grads[i]], split


GSPO = dict(ratio_level="sequence", aggregation="seq_mean_token_mean", clip_low=0.2, clip_high=0.2)


@pytest.mark.parametrize(
    "choice",
    [
        dict(aggregation="seq_mean_token_mean"),
        dict(aggregation="constant", constant_tokens=10),
        GSPO,
        dict(correction="sequence_mask", ratio_mask_high=1.1),
    ],
)
def test_sequence_losses_weigh_rollouts_not_pieces(choice):
    """A rollout split into 3 samples (turns re-rendered) trains exactly as the same rollout
    unsplit: it counts once in G, its tokens weigh 1/|rollout|, and GSPO's and MIS's ratio is
    the rollout's geometric mean (1.06: inside GSPO's clip and MIS's bound of 1.1, where its
    first piece's own, 1.45, is outside both). With advantages +-1 each rollout weighs 1/2
    (the group whose rollouts have no loss token counts nowhere). seq_mean_token_mean and
    constant are exact whatever the layout; GSPO and MIS where the rollout's samples share a
    micro-batch, and log the share of tokens they cannot see whole."""
    cfg = loss_cfg(**choice)
    whole = split_rollout_step(split=False)
    pieces = split_rollout_step(split=True)
    assert (whole.loss_sequences, pieces.loss_sequences) == (2, 2)
    assert [s.advantage for s in pieces.samples[:4]] == pytest.approx([1, 1, 1, -1], abs=1e-5)
    expected = token_gradients(cfg, whole, [[[0], [1]]])
    layouts = [[[[0], [1], [2], [3]]], [[[0, 1], [2, 3]]], [[[3, 2, 1, 0]]]]
    per_rollout = cfg.ratio_level == "sequence" or cfg.correction == "sequence_mask"
    if not per_rollout:
        layouts.append([[[0]], [[1]], [[2, 3]]])
    for layout in layouts:
        value, grads, split = token_gradients(cfg, pieces, layout)
        assert value == pytest.approx(expected[0], rel=1e-5, abs=1e-7), layout
        assert grads == pytest.approx(expected[1], rel=1e-5, abs=1e-7), layout
        assert split == 0.0
    if not per_rollout:  # token t of rollout i: -r_t A_i / (|i| G), or / (G L) (constant)
        a, b = sum(TURNS, []), [1.1, 1.0, 1.2]
        lengths = (10, 10) if cfg.aggregation == "constant" else (len(a), len(b))
        weights = [-r / (lengths[0] * 2) for r in a] + [r / (lengths[1] * 2) for r in b]
        assert expected[1] == pytest.approx(weights, rel=1e-5)
    if per_rollout:  # split over micro-batches: each part's own ratio, and the log says so
        _, grads, split = token_gradients(cfg, pieces, [[[0]], [[1]], [[2, 3]]])
        assert split == 5
        assert grads != pytest.approx(expected[1], rel=1e-5, abs=1e-7)


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
    """`n` samples of varied lengths, advantages -1, 0, 1; samples 2i and 2i + 1 are the
    pieces of rollout i (a multi-turn rollout split in two)."""
    g = torch.Generator().manual_seed(1)
    samples = []
    for i in range(n):
        prompt, completion = 3 + i % 3, 2 + (3 * i) % 7  # lengths vary: padding matters
        ids = torch.randint(1, 64, (prompt + completion,), generator=g).tolist()
        mask = [0] * prompt + [1] * completion
        logprobs = [0.0] * prompt + (-torch.rand(completion, generator=g) * 3).tolist()
        samples.append(Sample(ids, mask, logprobs, advantage=float(i // 2 % 3) - 1.0))
    tokens = [sum(s.num_loss_tokens for s in samples[i - i % 2 : i - i % 2 + 2]) for i in range(n)]
    return [s.scored(s.advantage, i // 2, tokens[i]) for i, s in enumerate(samples)]


def step_gradient(
    model, samples, micro_batch_size: int, world_size: int = 1, overrides: tuple = ()
) -> torch.Tensor:
    """Gradient of one step as the trainer computes it: each simulated rank accumulates over
    its micro-batches (padded to the same count), then ranks are averaged like DDP/DeepSpeed."""
    cfg = load_config(overrides=list(overrides))
    normaliser = step_normaliser(cfg.loss, TrainBatch(samples, {}, [], 0), cfg.batch.max_seq_len)
    shards = [
        split_micro_batches(shard(samples, r, world_size), micro_batch_size)
        for r in range(world_size)
    ]
    count = max(len(s) for s in shards)
    per_rank = []
    for mbs in shards:
        model.zero_grad()
        for chunk in mbs + [padding_micro_batch(0)] * (count - len(mbs)):
            loss, _ = micro_batch_loss(model, collate(chunk, 0), cfg, normaliser, world_size)
            loss.backward()
        per_rank.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    return torch.stack(per_rank).mean(0)


@pytest.mark.parametrize(
    "aggregation",
    [
        "loss.aggregation=token_mean",
        "loss.aggregation=seq_mean_token_mean",
        "loss.aggregation=constant",
    ],
)
@pytest.mark.slow
def test_loss_normalisation_is_invariant_to_micro_batch_split_and_ranks(aggregation):
    """Every aggregation gives the single-batch gradient however the step's samples are cut
    into micro-batches and spread over ranks, rollouts split over micro-batches included."""
    model = tiny_policy()
    samples = make_samples()
    whole = step_gradient(model, samples, len(samples), overrides=(aggregation,))
    assert whole.abs().sum() > 0
    for mbs, world in [(1, 1), (2, 1), (3, 1), (1, 2), (2, 2), (2, 3)]:
        split = step_gradient(model, samples, mbs, world, overrides=(aggregation,))
        assert torch.allclose(split, whole, rtol=1e-4, atol=1e-7), (mbs, world)


WIDE = ("loss.ratio_mask_low=1e-30", "loss.ratio_mask_high=1e30")
"""Ratio bounds no token of `make_samples` leaves (its sampler log-probabilities are random)."""


@pytest.mark.parametrize("correction", ["token_mask", "sequence_mask"])
def test_a_rollouts_samples_stay_on_one_rank(correction):
    """GSPO (alone, and with MIS) takes one ratio per rollout, so a rollout's samples (a
    multi-turn rollout cut in two) stay on one rank at any world size: with micro-batches
    that hold a rank's share, two and three ranks train exactly the single-rank step (dealt
    round-robin by length, the pieces of most rollouts landed on different ranks, each with
    its own ratio)."""
    samples = make_samples()
    for world in (2, 3):
        shares = [shard(samples, r, world) for r in range(world)]
        owners = {s.rollout: r for r, share in enumerate(shares) for s in share}
        assert all(owners[s.rollout] == r for r, share in enumerate(shares) for s in share)
        assert sorted(map(id, sum(shares, []))) == sorted(map(id, samples))
    model = tiny_policy()
    gspo = ("loss.ratio_level=sequence", f"loss.correction={correction}", *WIDE)
    whole = step_gradient(model, samples, len(samples), overrides=gspo)
    assert whole.abs().sum() > 0
    for world in (2, 3):
        ranks = step_gradient(model, samples, len(samples), world, overrides=gspo)
        assert torch.allclose(ranks, whole, rtol=1e-4, atol=1e-7), world


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
