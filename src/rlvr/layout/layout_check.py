"""The start-up self-check of the shared layouts (prefix trees and packed rows).

`check_shared_layouts` runs a tiny batch of four samples through each shared layout the run
asks for and through the unshared one, without gradients, and switches off (with a warning
naming the model class) any layout whose log-probabilities differ by more than `TOLERANCE`: a
model that drops or rebuilds the mask would otherwise train on wrong log-probabilities silently.
Every rank runs it together and all decide alike. Design: docs/training.md#the-start-up-self-check.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from rlvr.batch import MicroBatch, Sample
from rlvr.config import BatchConfig
from rlvr.layout.attention import tree_attention
from rlvr.layout.folded import collate_folded
from rlvr.layout.micro_batches import collate
from rlvr.layout.prefix_tree import fold_rows

log = logging.getLogger(__name__)

TOLERANCE = {torch.float32: 1e-4, torch.float64: 1e-6}
"""Largest mean |difference| of a token's log-probability between a shared layout and the
unshared one that still counts as the same, by compute dtype (half dtypes: `HALF_TOLERANCE`).
Different layouts change the matrix shapes and so the rounding, never which tokens are
attended to; a model that ignores the mask differs by far more (see docs/troubleshooting.md)."""

HALF_TOLERANCE = 5e-3

CONTROL_RATIO = 10.0
"""A layout whose error on samples placed after another stays within this many times its error
on samples placed first (the rounding alone, see `LayoutError`) is honoured whatever the floor."""

PROBE_SEED = 0

Scorer = Callable[[torch.nn.Module, MicroBatch], torch.Tensor]
"""The trainer's token log-probabilities of a micro-batch on its [rows, width - 1] grid
(`rlvr.trainer.logprobs.token_logprobs`), passed in: this floor does not import the trainer."""


def probe_samples(vocab_size: int) -> list[Sample]:
    """Four samples in the shape of a GRPO step: three replies to one prompt (two of them
    sharing their first tokens: a tree two levels deep) and one other prompt's reply, every
    token after the first compared. Token ids are drawn with a fixed seed from the vocabulary,
    so every rank builds the same batch."""
    g = torch.Generator().manual_seed(PROBE_SEED)

    def tokens(n: int) -> list[int]:
        return torch.randint(0, vocab_size, (n,), generator=g).tolist()

    prompt, reply = tokens(12), tokens(3)
    sequences = [
        prompt + reply + tokens(6),
        prompt + reply + tokens(4),
        prompt + tokens(7),
        tokens(9) + tokens(5),
    ]
    return [Sample(ids, [0] + [1] * (len(ids) - 1), [0.0] * len(ids)) for ids in sequences]


def _logprobs(
    score: Scorer, model: torch.nn.Module, mb: MicroBatch, device: torch.device
) -> torch.Tensor:
    """The micro-batch's log-probabilities of its compared tokens, in sample order."""
    mb = mb.to(device)
    return score(model, mb)[mb.loss_mask > 0]


@dataclass(frozen=True)
class LayoutError:
    """Mean |difference| of per-token log-probabilities between a shared layout and the
    unshared one: on the tokens of samples placed after another one (`shared`: a wrong mask
    lets them read their neighbours) and on the first sample of each row (`control`: it reads
    the same tokens in either layout, so it measures the rounding of the layout's other
    shapes and kernels alone). NaN where a log-probability is not finite."""

    shared: float
    control: float

    def honoured(self, floor: float) -> bool:
        """Whether the layout's mask is honoured: `shared` within `floor`, or within
        `CONTROL_RATIO` times the rounding the control measures."""
        return self.shared <= floor or self.shared <= CONTROL_RATIO * self.control


@torch.no_grad()
def layout_errors(
    score: Scorer,
    model: torch.nn.Module,
    pad_id: int,
    device: torch.device,
    attention: str | None,
    packing: bool,
) -> dict[str, LayoutError]:
    """The probe batch's `LayoutError` of each shared layout asked for: "prefix_sharing"
    (folded under `attention`'s mask, when not None) and "packing" (one packed row, when
    `packing`)."""
    from accelerate.utils import extract_model_from_parallel

    vocab = extract_model_from_parallel(model).config.vocab_size
    rows = fold_rows(probe_samples(vocab), max_cost=10**9)
    ordered = [s for row in rows for s in row]
    unshared = _logprobs(score, model, collate([[s] for s in ordered], pad_id), device)
    firsts = {id(row[0]) for row in rows}
    layouts: dict[str, tuple[MicroBatch, set[int]]] = {}  # with the ids of its control samples
    if attention is not None:
        layouts["prefix_sharing"] = collate_folded(rows, pad_id, attention), firsts
    if packing:
        layouts["packing"] = collate([ordered], pad_id), {id(ordered[0])}
    errors = {}
    for name, (mb, controls) in layouts.items():
        flags = [id(s) in controls for s in ordered for _ in range(s.num_loss_tokens)]
        is_control = torch.tensor(flags, device=device)
        diff = (_logprobs(score, model, mb, device) - unshared).abs()
        errors[name] = LayoutError(_mean(diff[~is_control]), _mean(diff[is_control]))
    return errors


def _mean(values: torch.Tensor) -> float:
    mean = values.mean()
    return float(mean) if bool(torch.isfinite(mean)) else math.nan


def tolerance(dtype: torch.dtype) -> float:
    """`TOLERANCE` of a compute dtype."""
    return TOLERANCE.get(dtype, HALF_TOLERANCE)


def check_shared_layouts(
    score: Scorer,
    model: torch.nn.Module,
    batch: BatchConfig,
    pad_id: int,
    device: torch.device,
    compute_dtype: torch.dtype,
) -> BatchConfig:
    """`batch` with `prefix_sharing` and `packing` switched off where the model fails the
    self-check (see the module docstring), each with a warning naming the model class. Every
    rank must call this together."""
    from accelerate.utils import extract_model_from_parallel, gather_object

    attention = tree_attention(model, batch.max_seq_len) if batch.prefix_sharing else None
    if attention is None and not batch.packing:
        return batch
    errors = layout_errors(score, model, pad_id, device, attention, batch.packing)
    floor = tolerance(compute_dtype)
    mine = [name for name, error in errors.items() if not error.honoured(floor)]
    failed = sorted(set().union(*gather_object([mine])))  # any rank's failure: all decide alike
    inner = extract_model_from_parallel(model)
    model_class = type(inner.get_base_model() if hasattr(inner, "get_base_model") else inner)
    for name in failed:
        error = errors[name]
        log.warning(
            "batch.%s is switched off for this run: %s gives a tiny %s batch log-probabilities "
            "that differ from the unshared layout's by %.3g nats per token on average where a "
            "sample follows another (%.3g on the first sample of a row; allowed: %g for %s, or "
            "%g times that), so it does not honour the layout's attention mask. Every sample is "
            "forwarded on its own (see docs/troubleshooting.md).",
            name,
            model_class.__name__,
            "folded" if name == "prefix_sharing" else "packed",
            error.shared,
            error.control,
            floor,
            compute_dtype,
            CONTROL_RATIO,
        )
    return dataclasses.replace(batch, **{name: False for name in failed})
