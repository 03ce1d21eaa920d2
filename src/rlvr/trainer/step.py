"""One micro-batch's loss and what a step's forward/backward measured.

`micro_batch_loss` forwards a micro-batch and returns its normalised loss with the terms of
`rlvr.trainer.loss.STATS`; `has_gradient` says whether a step can move the weights at all;
`Trained` carries the step's statistics and throughput.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from rlvr.batch import MicroBatch, TrainBatch
from rlvr.config import Config
from rlvr.reasoning_vocab.hooks import MaskLogits
from rlvr.trainer.logprobs import sequence_scores
from rlvr.trainer.loss import LossTerms, normalised_loss, policy_loss


def micro_batch_loss(
    model: torch.nn.Module,
    mb: MicroBatch,
    cfg: Config,
    normaliser: float,
    world_size: int,
    reference: Any = None,
    mask_logits: MaskLogits | None = None,
) -> tuple[torch.Tensor, LossTerms]:
    """Forward one micro-batch; return its normalised loss (ready for backward) and its terms,
    with every statistic of `rlvr.trainer.loss.STATS`.

    `normaliser` is the step's `rlvr.trainer.loss.step_normaliser`; `reference(mb)` returns the
    reference model's token log-probabilities (needed when loss.beta > 0); `mask_logits`
    forbids tokens per position (see `rlvr.trainer.logprobs`)."""
    scores = sequence_scores(
        model, mb, cfg.sampling.temperature, with_entropy=True, mask_logits=mask_logits
    )
    ref = reference(mb) if cfg.loss.beta > 0 else None
    terms = policy_loss(
        scores.logprobs,
        mb.sampler_logprobs,
        mb.advantages,
        mb.loss_mask,
        cfg.loss,
        ref,
        mb.sequence_ids,
        mb.rollout_tokens,
    )
    terms.stats["entropy"] = scores.entropy_sum
    return normalised_loss(terms.loss_sum, normaliser, world_size), terms


def has_gradient(batch: TrainBatch, beta: float) -> bool:
    """Whether a step's loss can move the weights: some loss token with a non-zero advantage,
    or the KL penalty (`beta` > 0), which pulls toward the reference whatever the advantages.

    A step without either (every group dropped, or every group's rewards equal) skips forward,
    backward and the optimizer: AdamW would otherwise move the weights on its momentum alone,
    repeating the last step that had signal at two thirds or more of its size."""
    return batch.loss_tokens > 0 and (batch.has_signal or beta > 0)


@dataclass
class Trained:
    """What one step's forward/backward measured, over all ranks."""

    stats: dict[str, float]
    """The statistics of `rlvr.trainer.loss.STATS` the step measured, by their logged names
    (see `rlvr.trainer.loss.summarise`)."""
    forwarded: float
    """Token positions the forward passes computed (a shared prefix counts once)."""
    slots: float
    """Token positions the micro-batches' tensors held, padding included."""

    def throughput(self, batch: TrainBatch, forward_backward_s: float) -> dict[str, float]:
        """Training speed, and the shares of the work padding cost and prefix sharing saved."""
        return {
            "throughput/train_tokens_per_s": batch.tokens / max(forward_backward_s, 1e-9),
            "throughput/padded_frac": 1 - self.forwarded / max(self.slots, 1),
            "throughput/prefix_saved_frac": 1 - self.forwarded / max(batch.tokens, 1),
        }
