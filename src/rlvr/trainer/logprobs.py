"""Per-token log-probabilities and entropy of the policy, only where the loss reads them.

`sequence_scores` runs the model through its own (possibly wrapped) forward, captures the final
hidden states and runs the output head on the loss positions alone, in chunks of at most
`MAX_CHUNK_ELEMENTS` logits with a fused log-softmax/entropy (`_TokenLogprobs`), so no
full-vocabulary float32 copy of a micro-batch exists. `mask_logits` (`MaskLogits`) forbids tokens
per position. Design and profile: docs/training.md#memory-and-speed-of-the-log-probabilities.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch.utils.checkpoint import checkpoint

from rlvr.batch import MicroBatch
from rlvr.reasoning_vocab.hooks import MaskLogits

MAX_CHUNK_ELEMENTS = 2**26
"""Most logits (tokens x vocabulary) in one chunk: 256 MiB in float32, 1365 tokens of a 49k
vocabulary; bounds the memory a chunk's forward works in."""

MAX_SAVED_ELEMENTS = 2**28
"""Most softmax entries (loss tokens x vocabulary) a micro-batch keeps for backward: 1 GiB in
float32, 5461 loss tokens of a 49k vocabulary or 1765 of a 152k one. Micro-batches with more
loss tokens recompute each chunk in backward instead (one more head pass)."""

_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling")


@dataclass
class TokenScores:
    logprobs: torch.Tensor
    """[B, T-1] float32, aligned with `MicroBatch.loss_mask`: the log-probability (after the
    temperature) of each loss token; 0.0 where the loss mask is 0."""
    entropy_sum: torch.Tensor | None
    """Sum of the policy's entropy over the loss tokens (no gradient), when asked for."""


def output_head(model: torch.nn.Module) -> torch.nn.Module:
    """The module that maps final hidden states to logits (a LoRA wrapper when PEFT targets
    it), found through any DDP/DeepSpeed/PEFT wrapping."""
    from accelerate.utils import extract_model_from_parallel

    inner = extract_model_from_parallel(model)
    config = getattr(inner, "config", None)
    for name in _LOGIT_TRANSFORMS:
        value = getattr(config, name, None)
        if value not in (None, 1, 1.0):
            raise NotImplementedError(
                f"the model's config sets {name}={value}: its forward transforms the head's "
                "logits, which the chunked log-probabilities do not reproduce"
            )
    head = inner.get_output_embeddings()
    if head is None:
        raise ValueError(f"{type(inner).__name__} has no output embeddings (not a causal LM?)")
    return head


@contextlib.contextmanager
def _final_hidden_states(head: torch.nn.Module) -> Iterator[list[torch.Tensor]]:
    """While active, calls of `head` record their input (the final hidden states) and compute
    nothing: the head gets an empty slice of the sequence."""
    captured: list[torch.Tensor] = []

    def take(_module: torch.nn.Module, args: tuple) -> tuple:
        hidden = args[0]
        captured.append(hidden)
        return (hidden[..., :0, :], *args[1:])

    handle = head.register_forward_pre_hook(take)
    try:
        yield captured
    finally:
        handle.remove()


class _TokenLogprobs(torch.autograd.Function):
    """Log-probabilities of `targets` [n] under `logits` [n, V] / `temperature`, and their
    summed entropy (no gradient) when asked for; `masked`: some logits may be -inf. See the
    module docstring for why this is one function rather than autograd's chain."""

    @staticmethod
    def forward(ctx, logits, targets, temperature, masked, with_entropy):
        scaled = logits.float()
        if temperature != 1.0:
            scaled = scaled / temperature
        logp = torch.log_softmax(scaled, dim=-1)
        del scaled
        picked = logp.gather(-1, targets[:, None])[:, 0]
        entropy = None
        if not (with_entropy or ctx.needs_input_grad[0]):  # e.g. the reference model's pass
            return picked, entropy
        if masked and with_entropy:  # forbidden entries: 0 * -inf would make the entropy nan
            logp.clamp_(min=torch.finfo(logp.dtype).min)
        probs = logp.exp()
        if with_entropy:  # -sum p log p, one row-wise dot product per token
            entropy = -torch.bmm(probs[:, None, :], logp[:, :, None]).sum()
            ctx.mark_non_differentiable(entropy)
        del logp
        ctx.save_for_backward(probs, targets)
        ctx.temperature, ctx.dtype = temperature, logits.dtype
        return picked, entropy

    @staticmethod
    def backward(ctx, grad_picked, _grad_entropy):
        probs, targets = ctx.saved_tensors
        # d picked_i / d logit_ij = (1[j == target_i] - p_ij) / T, written over the softmax
        grad = probs.mul_(-grad_picked[:, None])
        grad.scatter_add_(-1, targets[:, None], grad_picked[:, None])
        if ctx.temperature != 1.0:
            grad.div_(ctx.temperature)
        return grad.to(ctx.dtype), None, None, None, None


def _chunk_logprobs(
    head: torch.nn.Module,
    hidden: torch.Tensor,
    targets: torch.Tensor,
    positions: torch.Tensor,
    temperature: float,
    mask_logits: MaskLogits | None,
    with_entropy: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probabilities of `targets` under the head's logits for `hidden` [n, H], and the
    chunk's summed entropy (no gradient) when asked for."""
    logits = head(hidden)
    if mask_logits is not None:  # any reshaping of the logits: autograd carries its gradient
        logits = mask_logits(logits.float() / temperature, positions)
        temperature = 1.0
    masked = mask_logits is not None
    return _TokenLogprobs.apply(logits, targets, temperature, masked, with_entropy)


def _vocab_size(head: torch.nn.Module) -> int:
    """The head's output width (also when ZeRO-3 has partitioned its weight to nothing)."""
    if hasattr(head, "out_features"):
        return int(head.out_features)
    weight = head.weight
    return int(getattr(weight, "ds_shape", weight.shape)[0])


def head_logprobs(
    head: torch.nn.Module,
    hidden: torch.Tensor,
    targets: torch.Tensor,
    positions: torch.Tensor,
    temperature: float = 1.0,
    *,
    with_entropy: bool = False,
    mask_logits: MaskLogits | None = None,
    chunk_tokens: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probabilities [n] of `targets` [n] given final hidden states `hidden` [n, H], in
    chunks of `chunk_tokens` rows (default: as many as fit `MAX_CHUNK_ELEMENTS`), and the
    summed entropy when `with_entropy`. `positions` [n] are passed to `mask_logits`."""
    vocab = _vocab_size(head)
    if chunk_tokens is None:
        chunk_tokens = max(1, MAX_CHUNK_ELEMENTS // vocab)
    n = hidden.shape[0]
    recompute = torch.is_grad_enabled() and n * vocab > MAX_SAVED_ELEMENTS
    pieces, entropies = [], []
    # At least one (possibly empty) chunk: the result stays connected to the head and the
    # hidden states, so a micro-batch without loss tokens still runs a backward that reaches
    # every parameter (DDP and ZeRO-3 need each rank to take part in every backward).
    for start in range(0, max(n, 1), chunk_tokens):
        part = slice(start, start + chunk_tokens)
        args = (head, hidden[part], targets[part], positions[part], temperature, mask_logits)
        if recompute:
            picked, entropy = checkpoint(_chunk_logprobs, *args, with_entropy, use_reentrant=False)
        else:
            picked, entropy = _chunk_logprobs(*args, with_entropy)
        pieces.append(picked)
        entropies.append(entropy)
    return torch.cat(pieces), torch.stack(entropies).sum() if with_entropy else None


def sequence_scores(
    model: torch.nn.Module,
    mb: MicroBatch,
    temperature: float = 1.0,
    *,
    with_entropy: bool = False,
    mask_logits: MaskLogits | None = None,
) -> TokenScores:
    """Run `model` on the micro-batch and score its loss tokens: log-probabilities (with the
    gradient, when enabled) and optionally the entropy. See the module docstring."""
    head = output_head(model)
    with _final_hidden_states(head) as captured:
        model(**mb.model_inputs(), use_cache=False)
    if len(captured) != 1:
        raise RuntimeError(f"the output head ran {len(captured)} times in one forward, not once")
    select = mb.loss_mask > 0
    positions = select.flatten().nonzero()[:, 0]
    picked, entropy_sum = head_logprobs(
        head,
        mb.prediction_states(captured[0], select),
        mb.input_ids[:, 1:][select],
        positions,
        temperature,
        with_entropy=with_entropy,
        mask_logits=mask_logits,
    )
    logprobs = torch.zeros(select.shape, dtype=torch.float32, device=picked.device)
    return TokenScores(logprobs.masked_scatter(select, picked), entropy_sum)


def token_logprobs(model: torch.nn.Module, mb: MicroBatch) -> torch.Tensor:
    """`sequence_scores`' log-probabilities at temperature 1 (the layout self-check's scorer)."""
    return sequence_scores(model, mb).logprobs
