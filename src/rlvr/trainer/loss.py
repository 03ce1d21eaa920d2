"""The GRPO policy-gradient loss, as pure tensor functions.

Nothing here knows about models, servers or processes, so every formula is unit-tested on
hand-made tensors.

Loss (per sampled token t of a rollout with advantage A):

    r_t  = exp(logp_trainer(t) - logp_sampler(t))        importance ratio vs the sampler
    pg_t = -r_t * A                                       (or PPO-clipped: -min(r A, clip(r) A))
    kl_t = exp(ref - logp) - (ref - logp) - 1             (only when beta > 0)
    loss = sum_t m_t (pg_t + beta kl_t) / N

The ratio corrects for the off-policy lag (rollouts generated `async_level` steps earlier, or
with weights that changed mid-rollout) and for numeric differences between vLLM and the
trainer. Tokens whose ratio leaves [ratio_mask_low, ratio_mask_high] get m_t = 0: their
samples are too far off-policy to trust. N is the number of loss tokens in the whole step,
across every micro-batch on every rank, so each token weighs the same however the batch is cut
(a per-micro-batch mean would weigh tokens of short micro-batches more).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from rlvr.config import LossConfig


@dataclass
class LossTerms:
    """`loss_sum` carries the gradient; `stats` are detached sums/extremes for logging."""

    loss_sum: torch.Tensor
    stats: dict[str, torch.Tensor]


def policy_loss(
    logprobs: torch.Tensor,
    sampler_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    cfg: LossConfig,
    ref_logprobs: torch.Tensor | None = None,
) -> LossTerms:
    """Token-level importance-weighted policy-gradient loss, summed (not averaged) over tokens.

    All inputs are [B, T-1], aligned as `token_logprobs`. The caller divides `loss_sum` by the
    step's global loss-token count (see `normalised_loss`).
    """
    mask = loss_mask.float()
    log_ratio = logprobs - sampler_logprobs
    ratio = torch.exp(log_ratio)
    with torch.no_grad():
        in_bounds = (ratio >= cfg.ratio_mask_low) & (ratio <= cfg.ratio_mask_high)
    keep = mask * in_bounds.float()
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
        stats["kl_ref_sum"] = (kl_ref * keep).sum().detach()
    loss_sum = (per_token * keep).sum()
    with torch.no_grad():
        ratio_on_mask = ratio[mask.bool()]
        if ratio_on_mask.numel():
            stats.update(ratio_min=ratio_on_mask.min(), ratio_max=ratio_on_mask.max())
        stats.update(
            tokens=mask.sum(),
            ratio_sum=(ratio * mask).sum(),
            ratio_masked_sum=(mask * (1 - in_bounds.float())).sum(),
            clipped_sum=(mask * clipped.float()).sum(),
            # k3 estimator of KL(sampler || trainer) on the sampler's own tokens: >= 0, and 0
            # only when the two agree on every sampled token. In float64 with expm1: near
            # agreement it is ~log_ratio^2 / 2, which float32's `r - 1 - log r` rounds to 0.
            mismatch_kl_sum=((torch.expm1(log_ratio.double()) - log_ratio.double()) * mask).sum(),
            pg_loss_sum=(-surrogate * keep).sum(),
        )
    return LossTerms(loss_sum=loss_sum, stats=stats)


def normalised_loss(loss_sum: torch.Tensor, global_tokens: float, world_size: int):
    """Scale a micro-batch's summed loss so that the gradients of all micro-batches on all
    ranks add up to the gradient of (total summed loss / global token count).

    Gradients accumulate (sum) over micro-batches and are averaged over ranks by DDP and
    DeepSpeed, hence the factor `world_size`.
    """
    return loss_sum * (world_size / max(global_tokens, 1.0))


class StatsAccumulator:
    """Combines `LossTerms.stats` over micro-batches (and ranks): keys ending in `_min`/`_max`
    keep the extreme, the rest add up."""

    def __init__(self) -> None:
        self.values: dict[str, float] = {}

    def add(self, stats: dict[str, torch.Tensor | float]) -> None:
        for key, value in stats.items():
            v = float(value)
            if key not in self.values:
                self.values[key] = v
            elif key.endswith("_min"):
                self.values[key] = min(self.values[key], v)
            elif key.endswith("_max"):
                self.values[key] = max(self.values[key], v)
            else:
                self.values[key] += v

    def keys(self) -> list[str]:
        return sorted(self.values)

    def summary(self) -> dict[str, float]:
        """Per-token means of the sums (`x_sum` -> `x`), extremes as they are."""
        tokens = max(self.values.get("tokens", 0.0), 1.0)
        out: dict[str, float] = {}
        for key, value in self.values.items():
            if key.endswith("_sum"):
                out[key.removesuffix("_sum")] = value / tokens
            else:
                out[key] = value
        return out
