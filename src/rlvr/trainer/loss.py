"""The GRPO policy-gradient loss, as pure tensor functions.

Nothing here knows about models, servers or processes, so every formula is unit-tested on
hand-made tensors.

Loss (per sampled token t of sequence i, a rollout's sample with advantage A), the defaults:

    r_t  = exp(logp_trainer(t) - logp_sampler(t))        importance ratio vs the sampler
    pg_t = -r_t * A                                       (or PPO-clipped: -min(r A, clip(r) A))
    kl_t = exp(ref - logp) - (ref - logp) - 1             (only when beta > 0)
    loss = sum_t m_t (pg_t + beta kl_t) / N

A is per token: the rollout's group advantage, plus, under on-policy distillation, the
teacher's term coef * (logp_teacher(t) - logp_sampler(t)) (`rlvr.trainer.advantages`).

The ratio corrects for the off-policy lag (rollouts generated `async_level` steps earlier, or
with weights that changed mid-rollout) and for numeric differences between vLLM and the
trainer. Tokens whose ratio leaves [ratio_mask_low, ratio_mask_high] get m_t = 0: their
samples are too far off-policy to trust. N is the number of loss tokens in the whole step,
across every micro-batch on every rank, so each token weighs the same however the batch is cut
(a per-micro-batch mean would weigh tokens of short micro-batches more).

The choices (`rlvr.config.LossConfig`; docs/training.md#loss-choices has the papers):

    aggregation=seq_mean_token_mean   loss = sum_i (1/|i|) sum_{t in i} m_t l_t / G   (GRPO)
    aggregation=constant              loss = sum_t m_t l_t / (G * L)          (Dr. GRPO)
        i: a rollout, over all its samples (a multi-turn rollout whose turns were re-rendered
        is several samples, and weighs as one rollout); G: rollouts with a loss token in the
        step; |i|: loss tokens of rollout i (`Sample.rollout_tokens`, so a rollout's samples
        may sit in any micro-batch on any rank); L: loss.constant_tokens (default
        batch.max_seq_len)
    ratio_level=sequence   r_t = s_i = exp(mean_{t in i} log r_t), the value of the rollout's
                           geometric-mean ratio with the gradient of log p_t (GSPO)
    correction=sequence_mask   m_t = 0 for every token of a rollout whose s_i leaves the
                               bounds (sequence-level masked importance sampling, MIS)
    correction=tis   pg_t = -min(r_t, tis_cap) A with the gradient of log p_t only (the weight
                     is a constant), no token masked; tis_cap=inf is plain importance sampling

s_i is a mean over the rollout's tokens in the micro-batch at hand: a rollout whose samples
the layout put in different micro-batches (never on different ranks) gets, in each, the ratio of
the part there (`ratio/split_rollout_frac` logs the share of loss tokens this concerns; the
gradient then differs from the single-batch one). A ratio that overflows `exp` on a token the
correction masks stays out of the loss and its gradient (no inf * 0).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

import torch

from rlvr.batch import TrainBatch
from rlvr.config import LossConfig


class Reduce(enum.Enum):
    """How a statistic combines over a step's micro-batches and ranks."""

    TOKEN_MEAN = "token_mean"
    """Summed, then divided by the step's loss tokens (a per-token mean of the whole step)."""
    MIN = "min"
    MAX = "max"
    SUM = "sum"


@dataclass(frozen=True)
class Stat:
    """A logged statistic's reduction, and what a step logs when no token had loss: `empty`,
    or nothing when None (a step that trains nothing measured no entropy or mismatch-KL; a 0
    there would plot as a real point)."""

    reduce: Reduce
    empty: float | None = None


STATS: dict[str, Stat] = {
    "loss/total": Stat(Reduce.TOKEN_MEAN, empty=0.0),
    "loss/pg": Stat(Reduce.TOKEN_MEAN, empty=0.0),
    "loss/kl_ref": Stat(Reduce.TOKEN_MEAN, empty=0.0),
    "entropy": Stat(Reduce.TOKEN_MEAN),
    "ratio/mean": Stat(Reduce.TOKEN_MEAN),
    "ratio/min": Stat(Reduce.MIN),
    "ratio/max": Stat(Reduce.MAX),
    "ratio/masked_frac": Stat(Reduce.TOKEN_MEAN),
    "ratio/clipped_frac": Stat(Reduce.TOKEN_MEAN),
    "mismatch_kl": Stat(Reduce.TOKEN_MEAN),
    "ratio/split_rollout_frac": Stat(Reduce.TOKEN_MEAN),
}
"""Every statistic a GRPO step logs from its loss, by its logged name. A micro-batch reports
token-mean statistics as sums over its loss tokens (`StepStats` divides once per step) and
extremes as +-inf when it has no loss token. Only the losses are logged (as 0) by a step
without loss tokens: it adds no loss."""


@dataclass
class LossTerms:
    """`loss_sum` carries the gradient; `stats` are detached statistics named as `STATS`
    logs them; `tokens` counts the loss-mask tokens they are sums over."""

    loss_sum: torch.Tensor
    tokens: torch.Tensor
    stats: dict[str, torch.Tensor]


def policy_loss(
    logprobs: torch.Tensor,
    sampler_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    cfg: LossConfig,
    ref_logprobs: torch.Tensor | None = None,
    sequence_ids: torch.Tensor | None = None,
    rollout_tokens: torch.Tensor | None = None,
) -> LossTerms:
    """Importance-weighted policy-gradient loss, summed (not averaged) over tokens.

    All inputs are [B, T-1], aligned as `token_logprobs`; `sequence_ids` says which rollout
    each position belongs to (needed by `ratio_level=sequence` and `correction=sequence_mask`)
    and `rollout_tokens` how many loss tokens its whole rollout has (needed by
    `aggregation=seq_mean_token_mean`). The caller divides `loss_sum` by the step's
    `step_normaliser` (see `normalised_loss`). The formulas are in the module docstring.
    """
    mask = loss_mask.float()
    token_log_ratio = logprobs - sampler_logprobs
    log_ratio = token_log_ratio
    rollout_log_ratio = None  # log s_i: GSPO's ratio, MIS's bound
    if cfg.ratio_level == "sequence" or cfg.correction == "sequence_mask":
        rollout_log_ratio = sequence_means(token_log_ratio.detach(), mask, sequence_ids)
    if cfg.ratio_level == "sequence":  # GSPO: the value of s_i, the gradient of log p_t
        log_ratio = rollout_log_ratio + logprobs - logprobs.detach()
    with torch.no_grad():
        bounded = rollout_log_ratio if cfg.correction == "sequence_mask" else log_ratio
        in_bounds = correction_mask(bounded, mask, cfg)
        raw_ratio = torch.exp(log_ratio.detach())
    keep = mask * in_bounds.float()
    # a masked token's ratio may overflow exp: it is left out of the value and the gradient
    ratio = torch.exp(torch.where(in_bounds, log_ratio, 0.0))
    if cfg.correction == "tis":  # value min(r, cap) A, gradient min(r, cap) A grad log p
        weight = ratio.detach().clamp(max=cfg.tis_cap)
        surrogate = weight * torch.exp(logprobs - logprobs.detach()) * advantages
    else:
        surrogate = ratio * advantages
    clipped = torch.zeros_like(mask, dtype=torch.bool)
    if cfg.clip_low is not None or cfg.clip_high is not None:
        low = 1.0 - (cfg.clip_low if cfg.clip_low is not None else math.inf)
        high = 1.0 + (cfg.clip_high if cfg.clip_high is not None else math.inf)
        clipped_surrogate = torch.clamp(ratio, low, high) * advantages
        clipped = (clipped_surrogate < surrogate).detach()
        surrogate = torch.minimum(surrogate, clipped_surrogate)
    per_token = -surrogate
    stats: dict[str, torch.Tensor] = {}
    if cfg.beta > 0:
        if ref_logprobs is None:
            raise ValueError("loss.beta > 0 needs reference log-probabilities")
        ref_diff = ref_logprobs - logprobs
        kl_ref = torch.exp(ref_diff) - ref_diff - 1
        per_token = per_token + cfg.beta * kl_ref
        # the loss's own mask (ratio-masked tokens left out), as for pg_loss: the two
        # statistics add up to the loss that trains
        stats["loss/kl_ref"] = (kl_ref * keep).sum().detach()
    token_loss = (per_token * keep).sum()
    loss_sum = token_loss
    if cfg.aggregation == "seq_mean_token_mean":  # each rollout's tokens weigh 1/|rollout|
        if rollout_tokens is None:
            raise ValueError("seq_mean_token_mean needs the micro-batch's rollout_tokens")
        loss_sum = (per_token * keep / rollout_tokens.clamp(min=1)).sum()
    with torch.no_grad():
        on_mask = mask.bool()
        stats["loss/total"] = token_loss.detach()
        stats["ratio/min"] = torch.where(on_mask, raw_ratio, math.inf).min()
        stats["ratio/max"] = torch.where(on_mask, raw_ratio, -math.inf).max()
        stats["ratio/mean"] = (raw_ratio * mask).sum()
        stats["ratio/masked_frac"] = (mask * (1 - in_bounds.float())).sum()
        stats["ratio/clipped_frac"] = (mask * clipped.float()).sum()
        # k3 estimator of KL(sampler || trainer) on the sampler's own tokens: >= 0, and 0 only
        # when the two agree on every sampled token. In float64 with expm1: near agreement it
        # is ~log_ratio^2 / 2, which float32's `r - 1 - log r` rounds to 0.
        log_ratio64 = token_log_ratio.double()
        stats["mismatch_kl"] = ((torch.expm1(log_ratio64) - log_ratio64) * mask).sum()
        stats["loss/pg"] = (-surrogate * keep).sum()
        if rollout_log_ratio is not None and rollout_tokens is not None:
            partial = per_sequence(mask, sequence_ids) < rollout_tokens
            stats["ratio/split_rollout_frac"] = (mask * partial.float()).sum()
    return LossTerms(loss_sum=loss_sum, tokens=mask.sum(), stats=stats)


def correction_mask(log_ratio: torch.Tensor, mask: torch.Tensor, cfg: LossConfig) -> torch.Tensor:
    """Where the off-policy correction lets a token train: everywhere under `tis` (it weighs
    instead); elsewhere where `exp(log_ratio)` (the token's ratio under `token_mask`, its
    rollout's geometric-mean ratio under `sequence_mask`) lies in [ratio_mask_low,
    ratio_mask_high]."""
    if cfg.correction == "tis":
        return torch.ones_like(mask, dtype=torch.bool)
    ratio = torch.exp(log_ratio)
    return (ratio >= cfg.ratio_mask_low) & (ratio <= cfg.ratio_mask_high)


def per_sequence(values: torch.Tensor, sequence_ids: torch.Tensor | None) -> torch.Tensor:
    """At each position, the sum of `values` over the positions of its sequence (its
    rollout's positions in the micro-batch)."""
    if sequence_ids is None:
        raise ValueError("this loss reduces per sequence: it needs the micro-batch's sequence_ids")
    rows, columns = sequence_ids.shape
    # sized by the tokens (a sample has at least one, the padding id is one more), so no id
    # is read back to the host
    size = rows * (columns + 1) + 1
    sums = values.new_zeros(size).index_add(0, sequence_ids.flatten(), values.flatten())
    return sums[sequence_ids]


def sequence_means(
    values: torch.Tensor, mask: torch.Tensor, sequence_ids: torch.Tensor | None
) -> torch.Tensor:
    """At each position, the mean of `values` over its sequence's loss positions (`mask`)."""
    return per_sequence(values * mask, sequence_ids) / per_sequence(mask, sequence_ids).clamp(min=1)


def loss_normaliser(cfg: LossConfig, tokens: int, sequences: int, max_seq_len: int) -> float:
    """What the step's summed loss is divided by: its loss `tokens` (`token_mean`), its
    `sequences` (rollouts) with a loss token (`seq_mean_token_mean`: each already a mean over
    its tokens), or sequences x a constant length (`constant`, Dr. GRPO)."""
    if cfg.aggregation == "token_mean":
        return tokens
    if cfg.aggregation == "seq_mean_token_mean":
        return sequences
    return sequences * (cfg.constant_tokens or max_seq_len)


def step_normaliser(cfg: LossConfig, batch: TrainBatch, max_seq_len: int) -> float:
    """`loss_normaliser` of a step's `batch`: its loss tokens, and its rollouts with a loss
    token as the sequences."""
    return loss_normaliser(cfg, batch.loss_tokens, batch.loss_sequences, max_seq_len)


def normalised_loss(loss_sum: torch.Tensor, global_tokens: float, world_size: int):
    """Scale a micro-batch's summed loss so that the gradients of all micro-batches on all
    ranks add up to the gradient of (total summed loss / `global_tokens`, the step's
    `loss_normaliser`).

    Gradients accumulate (sum) over micro-batches and are averaged over ranks by DDP and
    DeepSpeed, hence the factor `world_size`.
    """
    return loss_sum * (world_size / max(global_tokens, 1.0))


class StepStats:
    """A step's loss statistics, accumulated on the device over its micro-batches and read to
    the host once (`read`); layout counts (`count`) stay on the host."""

    def __init__(self) -> None:
        self._sums: dict[str, torch.Tensor] = {}
        self._counts: dict[str, float] = {}

    def add(self, terms: LossTerms) -> None:
        """One micro-batch's statistics (sums in float64, so no precision is lost)."""
        for name, value in {**terms.stats, "tokens": terms.tokens}.items():
            value = value.detach().double()
            held = self._sums.get(name)
            self._sums[name] = value if held is None else _combine(name, held, value)

    def count(self, name: str, value: float) -> None:
        self._counts[name] = self._counts.get(name, 0.0) + value

    def read(self) -> dict[str, float]:
        """This rank's raw sums, extremes and counts, in one device-to-host copy."""
        names = list(self._sums)
        values = torch.stack([self._sums[n] for n in names]).tolist() if names else []
        return {**dict(zip(names, values, strict=True)), **self._counts}


def _combine(name: str, a, b):
    """`a` and `b` (tensors or floats) combined as statistic `name` reduces."""
    reduce = STATS[name].reduce if name in STATS else Reduce.SUM
    if reduce is Reduce.MIN:
        return torch.minimum(a, b) if torch.is_tensor(a) else min(a, b)
    if reduce is Reduce.MAX:
        return torch.maximum(a, b) if torch.is_tensor(a) else max(a, b)
    return a + b


def merge_ranks(per_rank: list[dict[str, float]]) -> dict[str, float]:
    """Every rank's `StepStats.read()`, combined in rank order."""
    merged: dict[str, float] = {}
    for values in per_rank:
        for name, value in values.items():
            merged[name] = value if name not in merged else _combine(name, merged[name], value)
    return merged


def summarise(raw: dict[str, float]) -> dict[str, float]:
    """The statistics of `STATS` as logged: token means divided by the step's loss tokens,
    extremes as they are; where no token had loss, `Stat.empty`, or nothing."""
    tokens = raw.get("tokens", 0.0)
    out: dict[str, float] = {}
    for name, stat in STATS.items():
        value = raw.get(name)
        measured = value is not None and not math.isinf(value)
        if stat.reduce is Reduce.TOKEN_MEAN and measured:
            measured = tokens > 0
        if not measured:
            if stat.empty is not None:
                out[name] = stat.empty
        elif stat.reduce is Reduce.TOKEN_MEAN:
            out[name] = value / tokens
        else:
            out[name] = value
    return out
