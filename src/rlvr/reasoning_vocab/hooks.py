"""What a policy extension adds to a training step, behind hooks that do nothing by default.

The trainers call every hook on every step and never ask whether the policy has an extension:
`PolicyHooks` (the default) adds nothing; `ReasoningVocabHooks` gates the logits of a model with
a reasoning vocabulary and logs its use (`rlvr.reasoning_vocab`). `policy_hooks` picks one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

from rlvr.batch import MicroBatch, Sample
from rlvr.reasoning_vocab.gate import ThinkGate
from rlvr.reasoning_vocab.mapping import ReasoningVocab, row_cosines

MaskLogits = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class PolicyHooks:
    """The hooks of a plain policy: no logit mask, no extra metrics."""

    def logit_mask(self, mb: MicroBatch, fold: bool = False) -> MaskLogits | None:
        """The `mask_logits` of `rlvr.trainer.logprobs` for this micro-batch (None: none)."""
        return None

    def rollout_metrics(self, samples: Iterable[Sample]) -> dict[str, float]:
        """Metrics of the step's sampled tokens."""
        return {}

    def weight_metrics(self, model: torch.nn.Module) -> dict[str, float]:
        """Metrics of the trained weights (every rank calls it: ZeRO-3 may gather)."""
        return {}


class ReasoningVocabHooks(PolicyHooks):
    """The hooks of a model with a reasoning vocabulary: its think gate on the logits, the
    share of reasoning ids sampled, and how far the reasoning rows moved from their originals."""

    def __init__(self, vocab: ReasoningVocab, tokenizer: Any):
        self.vocab = vocab
        self.gate = ThinkGate.from_tokenizer(vocab, tokenizer)

    def logit_mask(self, mb: MicroBatch, fold: bool = False) -> MaskLogits | None:
        return self.gate.logit_mask(mb, fold=fold)

    def rollout_metrics(self, samples: Iterable[Sample]) -> dict[str, float]:
        return self.gate.rollout_metrics(samples)

    def weight_metrics(self, model: torch.nn.Module) -> dict[str, float]:
        return row_cosines(model, self.vocab)


def policy_hooks(vocab: ReasoningVocab | None, tokenizer: Any) -> PolicyHooks:
    """The hooks for a policy with reasoning vocabulary `vocab` (None: a plain policy)."""
    return PolicyHooks() if vocab is None else ReasoningVocabHooks(vocab, tokenizer)
