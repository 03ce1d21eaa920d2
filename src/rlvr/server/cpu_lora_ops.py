"""vLLM's CPU LoRA matmuls, one per adapter slot instead of one copy of the adapter per token.

vLLM 0.32's CPU punica ops (`vllm.lora.ops.torch_ops`) gather the whole A or B matrix of each
token's adapter (`weights[indices]`) and contract per token: a prefill of 5,280 tokens copies a
1536 x 64 float32 matrix 5,280 times per projection per layer (2 GB), so a batch of 64 GSM8K
prompts held one engine step past vLLM's 300 s execute timeout and the engine died. Tokens of
one adapter share its matrix: `per_slot` multiplies each slot's rows by it once. Same indexing
(a negative slot counts from the end, as the gather did), same outputs up to float summation
order. Measured in bench/cpu_lora.py; docs/weight-transfer.md#which-to-use-on-a-cpu.
"""

from __future__ import annotations

import torch


def per_slot(
    inputs: torch.Tensor, weights: torch.Tensor, slots: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """out[t] = weights[slots[t]] @ inputs[t] for every token t, one matmul per slot used
    (`weights`: [slots, out, in] or [slots, 1, out, in])."""
    if weights.dim() == 4:
        weights = weights.squeeze(1)
    inputs = inputs.to(dtype)
    out = inputs.new_zeros(inputs.shape[0], weights.shape[1])
    for slot in slots.unique().tolist():
        rows = (slots == slot).nonzero(as_tuple=True)[0]
        out[rows] = inputs[rows] @ weights[slot].to(dtype).T
    return out


def bgmv_shrink(
    inputs: torch.Tensor,
    lora_a_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    scaling: float = 1.0,
) -> None:
    """x @ A^T per token, scaled, written into the front columns of `output_tensor`."""
    out = per_slot(inputs, lora_a_weights, lora_indices_tensor, output_tensor.dtype)
    output_tensor[:, : out.shape[1]] = scaling * out


def bgmv_expand(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    add_inputs: bool = True,
) -> None:
    """h @ B^T per token into `output_tensor` (added or written); a single row broadcasts,
    and the adapter's and the model's padding may differ (the shorter width counts)."""
    out = per_slot(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    width = min(out.shape[1], output_tensor.shape[1])
    out = out[: output_tensor.shape[0], :width]
    if add_inputs:
        output_tensor[:, :width] += out
    else:
        output_tensor[:, :width] = out


def bgmv_expand_slice(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    slice_offset: int,
    slice_size: int,
    add_inputs: bool = True,
) -> None:
    """h @ B^T per token into columns [slice_offset, slice_offset + slice_size) (one part of a
    fused q/k/v or gate/up output)."""
    out = per_slot(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    columns = slice(slice_offset, slice_offset + slice_size)
    if add_inputs:
        output_tensor[:, columns] += out
    else:
        output_tensor[:, columns] = out


OPS = {
    "bgmv_shrink": bgmv_shrink,
    "bgmv_expand": bgmv_expand,
    "bgmv_expand_slice": bgmv_expand_slice,
}


def patch_cpu_lora_ops() -> None:
    """Use these ops wherever vLLM's CPU LoRA path calls its own: the punica wrapper's direct
    calls and the sgmv ops' (idempotent)."""
    from vllm.lora.ops.torch_ops import lora_ops
    from vllm.lora.punica_wrapper import punica_cpu

    for module in (lora_ops, punica_cpu):
        for name, op in OPS.items():
            setattr(module, name, op)
