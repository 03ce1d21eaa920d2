"""Per-token log-probabilities and entropy of the trainer's policy, computed only where the loss
reads them, with bounded memory.

A causal LM's output head turns every position's hidden state into a row of vocabulary logits.
The loss only reads the positions that predict a sampled (loss-mask) token, so the head runs on
those alone: prompts, tool outputs and padding never reach it (on SmolLM2-135M the head is
about a fifth of the forward pass). The selected hidden states go through the head in chunks of
at most `MAX_CHUNK_ELEMENTS` logits, each widened to float32 only for its own log-softmax, so
no full-vocabulary float32 copy of a micro-batch ever exists (4 x 8k tokens x 152k vocabulary
would be tens of GB). Backward needs each chunk's softmax; while all of a micro-batch's fit in
`MAX_SAVED_ELEMENTS` they are kept, and beyond that each chunk is checkpointed: backward
recomputes its logits, at the price of one more head pass over the loss tokens.

Per chunk, one fused autograd function (`_TokenLogprobs`) takes the logits to the sampled
tokens' log-probabilities, the entropy and, in backward, the logits' gradient
`g * (onehot - softmax) / T`, written into the saved softmax itself. Autograd's own chain
(divide, log-softmax, gather, entropy) passes over the [n, V] logits about twice as often and
allocates the gradient afresh. On a CPU, where these passes are memory-bound, they and the
recomputation that `MAX_SAVED_ELEMENTS` now spares typical micro-batches took about a fifth of
a SmolLM2 micro-batch's forward/backward (4 rows of up to 729 tokens, profiled).

The model still runs through its own top-level forward (the DDP or DeepSpeed wrapper when
there is one), which keeps DDP's gradient hooks and ZeRO-3's parameter gathering in place: a
forward pre-hook on the output embeddings takes the final hidden states and hands the head an
empty slice, and the head module is then called on the selected chunks (PEFT's LoRA on
`lm_head`, tied embeddings and ZeRO-3's per-module gathering all follow the module call).
Models that transform the head's logits inside their forward (Gemma-2's soft-capping, Cohere's
and Granite's logit scales) are refused, since the chunks would miss the transform.

Masking logits per position (`mask_logits`): some policies forbid tokens at some positions
(for example a reasoning vocabulary that may only be used inside a think span). Pass
`mask_logits(logits, positions) -> logits`, called on every chunk before the log-softmax with
`logits` [n, V] in float32, already divided by the temperature, and `positions` [n], the flat
index `row * (T - 1) + column` of each logits row in the micro-batch's [B, T - 1] grid of
next-token predictions (the layout of `MicroBatch.loss_mask`; column c predicts token c + 1 of
the row). Set forbidden entries to -inf (e.g. `logits.masked_fill(forbid[positions][:, None] &
in_range, -inf)`); both the log-probabilities and the entropy then follow the masked
distribution, as the sampler's processed logprobs do. In packed micro-batches (see
`rlvr.trainer.micro_batches`) a row holds several samples; `MicroBatch.position_ids` restart at 0
where each sample starts. A folded micro-batch (`rlvr.trainer.prefix_tree`) forwards a prefix tree
but keeps this grid, one sample per row: its hidden states are gathered back to it
(`prediction_states`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch.utils.checkpoint import checkpoint

from rlvr.batch import MicroBatch

MAX_CHUNK_ELEMENTS = 2**26
"""Most logits (tokens x vocabulary) in one chunk: 256 MiB in float32, 1365 tokens of a 49k
vocabulary; bounds the memory a chunk's forward works in."""

MAX_SAVED_ELEMENTS = 2**28
"""Most softmax entries (loss tokens x vocabulary) a micro-batch keeps for backward: 1 GiB in
float32, 5461 loss tokens of a 49k vocabulary or 1765 of a 152k one. Micro-batches with more
loss tokens recompute each chunk in backward instead (one more head pass)."""

MaskLogits = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

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
