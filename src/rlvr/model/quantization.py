"""Quantized bases (QLoRA): the frozen base stored in 4 or 8 bits (`nf4`, `int8`), LoRA on top.

Promise: the trainer's effective base is a plain weight matrix the server can hold. Each
quantized layer computes `x @ dequantized_weight(layer).T + b` exactly (no activation
quantization; `prepare_quantized` switches off the bitsandbytes behaviours that would not), and
quantizing is deterministic, so a checkpoint stores only the adapter.
Design and measurements: docs/training.md#quantized-bases-qlora.
"""

from __future__ import annotations

import contextlib
import types
from typing import Any

import torch

from rlvr.config import ConfigError

QUANTIZATIONS = ("none", "nf4", "int8")
UNQUANTIZED_MODULES = ["lm_head"]
"""Linear layers left in the model's dtype: the output head (the log-probabilities every ratio
is built from; tied to the embedding in many models)."""


def bnb_config(quantization: str, dtype: torch.dtype) -> Any:
    """transformers' `BitsAndBytesConfig` for `quantization` (computing in `dtype`), or None for
    `none`."""
    if quantization == "none":
        return None
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"unknown quantization {quantization!r}; choose one of {QUANTIZATIONS}")
    from transformers import BitsAndBytesConfig

    if quantization == "nf4":
        return BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_compute_dtype=dtype,
            bnb_4bit_use_double_quant=False,
            llm_int8_skip_modules=UNQUANTIZED_MODULES,
        )
    return BitsAndBytesConfig(
        load_in_8bit=True, llm_int8_threshold=0.0, llm_int8_skip_modules=UNQUANTIZED_MODULES
    )


def is_4bit(module: torch.nn.Module) -> bool:
    """A bitsandbytes 4-bit layer (told by class name, so that models without quantization
    never import bitsandbytes)."""
    return type(module).__name__ == "Linear4bit" and hasattr(module.weight, "quant_state")


def is_8bit(module: torch.nn.Module) -> bool:
    """A bitsandbytes int8 layer (told by class name, as `is_4bit`)."""
    return type(module).__name__ == "Linear8bitLt" and hasattr(module, "state")


def is_quantized_layer(module: torch.nn.Module) -> bool:
    """A bitsandbytes linear layer holding a quantized weight."""
    return is_4bit(module) or is_8bit(module)


def quantization_of(model: torch.nn.Module) -> str:
    """`nf4`, `int8` or `none`: how `model`'s (PEFT-wrapped or not) linear layers are stored."""
    for module in model.modules():
        if is_4bit(module):
            return "nf4"
        if is_8bit(module):
            return "int8"
    return "none"


def quantized_from(model: torch.nn.Module) -> torch.dtype:
    """The dtype `model`'s quantized layers were quantized from: the dtype its weights loaded
    in, which decides the codes (a bfloat16 load rounds the weights before quantizing)."""
    for module in model.modules():
        if is_4bit(module):
            return module.weight.quant_state.dtype
        if is_8bit(module):
            return module.compute_dtype
    raise TypeError(f"{type(model).__name__} has no quantized layer")


def prepare_quantized(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """Make every quantized layer of `model` compute `x @ dequantized_weight(layer).T + b` in
    every mode and on every device, in `dtype` (the model's); run it right after loading.
    Otherwise bitsandbytes' int8 matmul quantizes the activations too (LLM.int8: on CUDA, and
    on the CPU outside train mode), and a 4-bit layer run in eval mode without gradients on an
    AVX512-BF16 CPU repacks its weights for a bfloat16 kernel for good."""
    for module in model.modules():
        if is_4bit(module):
            module.support_avx512bf16_for_cpu = False
        elif is_8bit(module):
            module.compute_dtype = dtype
            module.forward = types.MethodType(_weight_only_int8_forward, module)


def dequantized_weight(module: torch.nn.Module, dtype: torch.dtype | None = None) -> torch.Tensor:
    """The weight a quantized layer multiplies by, as a new plain tensor in `dtype` (default:
    what the layer computes in): bitsandbytes' own dequantization for nf4, the int8 rows
    times their absmax / 127, in the order `WeightOnlyInt8` computes it, for int8."""
    if is_4bit(module):
        from bitsandbytes.functional import dequantize_4bit

        weight = module.weight
        out = dtype or module.compute_dtype or weight.quant_state.dtype
        return dequantize_4bit(weight.data, weight.quant_state).to(out)
    if is_8bit(module):
        return _int8_weight(module, dtype or module.compute_dtype)
    raise TypeError(f"{type(module).__name__} is not a quantized layer")


def _int8_rows(module: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """The int8 weight and its per-row absmax (bitsandbytes moves them from the parameter to
    the layer's state on its first own forward)."""
    state, weight = module.state, module.weight
    codes = state.CB if state.CB is not None else weight.data
    scales = state.SCB if state.SCB is not None else weight.SCB
    if scales is None:
        raise RuntimeError("int8 layer without its row scales (SCB): was it quantized?")
    return codes, scales


def _int8_weight(module: torch.nn.Module, dtype: torch.dtype) -> torch.Tensor:
    codes, scales = _int8_rows(module)
    return codes.to(dtype).mul_(scales.to(codes.device).unsqueeze(1).mul(1.0 / 127.0))


class WeightOnlyInt8(torch.autograd.Function):
    """y = x @ W.T + b with W the int8 layer's dequantized weight, built in the input's dtype in
    forward and again in backward: autograd keeps no float copy of W (that would hold the
    whole base in float across a step, undoing the quantization)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, module: torch.nn.Module, bias: Any) -> torch.Tensor:
        ctx.module, ctx.x_dtype = module, x.dtype
        ctx.bias_grad = bias is not None and bias.requires_grad
        weight = _int8_weight(module, module.compute_dtype)
        x = x.to(weight.dtype)
        out = torch.nn.functional.linear(x, weight, None if bias is None else bias.to(x.dtype))
        return out.to(ctx.x_dtype)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, None, Any]:
        weight = _int8_weight(ctx.module, ctx.module.compute_dtype)
        grad = grad.to(weight.dtype)
        grad_bias = grad.reshape(-1, grad.shape[-1]).sum(0) if ctx.bias_grad else None
        return (grad @ weight).to(ctx.x_dtype), None, grad_bias


def _weight_only_int8_forward(self: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    return WeightOnlyInt8.apply(x, self, self.bias)


def parameter_bytes(param: torch.Tensor) -> int:
    """Bytes a parameter holds, with a quantized weight's block scales (nf4) or row scales
    (int8); ZeRO-3 partitioned parameters count their full size."""
    total = getattr(param, "ds_numel", param.numel()) * param.element_size()
    state = getattr(param, "quant_state", None)
    if state is not None:
        total += state.absmax.numel() * state.absmax.element_size()
    scales = getattr(param, "SCB", None)
    if isinstance(scales, torch.Tensor):
        total += scales.numel() * scales.element_size()
    return total


def largest_dequantized_bytes(model: torch.nn.Module, dtype_bytes: int) -> int:
    """Bytes of the largest quantized layer's weight once dequantized (0: none quantized): the
    transient copy a quantized layer's forward and backward build, one layer at a time."""
    sizes = [m.in_features * m.out_features for m in model.modules() if is_quantized_layer(m)]
    return max(sizes, default=0) * dtype_bytes


def check_device(quantization: str, device: torch.device) -> None:
    """bitsandbytes quantizes on the CPU and on CUDA: refuse other devices by name, before any
    weight loads."""
    if quantization != "none" and device.type not in ("cpu", "cuda"):
        raise ConfigError(
            f"model.quantization={quantization!r} runs on the CPU or CUDA (bitsandbytes), "
            f"not on {device.type}"
        )


def dequantize_model(model: torch.nn.Module) -> torch.nn.Module:
    """Replace every quantized layer of `model` (not PEFT-wrapped) by a plain `nn.Linear` holding
    its `dequantized_weight` and bias, in place: the base a QLoRA run trained on, as an ordinary
    model (to merge an adapter into, or to serve)."""
    for name, module in list(model.named_modules()):
        if not is_quantized_layer(module):
            continue
        weight = dequantized_weight(module)
        plain = torch.nn.Linear(
            module.in_features,
            module.out_features,
            bias=module.bias is not None,
            dtype=weight.dtype,
            device=weight.device,
        )
        with torch.no_grad():
            plain.weight.copy_(weight)
            if module.bias is not None:
                plain.bias.copy_(module.bias)
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, child, plain)
    for attribute in ("quantization_config", "_pre_quantization_dtype"):
        if hasattr(model.config, attribute):
            delattr(model.config, attribute)
    for attribute in (
        "hf_quantizer",
        "is_loaded_in_4bit",
        "is_loaded_in_8bit",
        "quantization_method",
    ):
        if hasattr(model, attribute):
            with contextlib.suppress(AttributeError):
                delattr(model, attribute)
    return model
