"""Prompt log-probabilities on a CPU server with LoRA on: vLLM 0.32 computes them from a
request's prompt rows, while its CPU LoRA logits path indexes one row per request in the batch
(`sampler_indices`), so scoring a prompt beside running generations killed the engine
(`einsum(): subscript b has size 20 ... 36`). Design: docs/weight-transfer.md#lora-adapter-sync.

The adapters vf-vllm serves never change the output layer (an adapter that trains `lm_head` is
merged and served as a model instead), so their logits delta is zero: rows that do not match the
batch's requests get none, and anything else is refused with a clear error."""

from __future__ import annotations

from typing import Any

import torch


def patch_cpu_lora_logits() -> None:
    """Let vLLM's CPU LoRA logits path take prompt rows (idempotent)."""
    from vllm.lora.punica_wrapper.punica_cpu import PunicaWrapperCPU

    original = PunicaWrapperCPU.add_lora_logits
    original = getattr(original, "rlvr_original", original)

    def add_lora_logits(
        self,
        y: torch.Tensor,
        x: torch.Tensor,
        lora_a_stacked: torch.Tensor,
        lora_b_stacked: torch.Tensor,
        scale: float,
        **kwargs: Any,
    ) -> Any:
        rows = x.numel() // x.shape[-1]
        if rows == self.sampler_indices.numel():
            return original(self, y, x, lora_a_stacked, lora_b_stacked, scale, **kwargs)
        if not lora_b_stacked.any():  # no loaded adapter changes the output layer
            return y
        raise NotImplementedError(
            f"{rows} prompt rows against {self.sampler_indices.numel()} requests with an "
            "adapter that changes the output layer: vf-vllm serves such adapters merged"
        )

    add_lora_logits.rlvr_original = original
    PunicaWrapperCPU.add_lora_logits = add_lora_logits
