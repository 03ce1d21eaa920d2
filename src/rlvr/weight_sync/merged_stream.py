"""The weight stream of merged pushes: each LoRA module goes out as W + scale * B @ A under
the base model's Hugging Face name, one module at a time (under ZeRO-3 gathered on all ranks
in lockstep, sent by rank 0, released before the next), so no rank holds more than one merged
module beyond the model. A quantized base goes out dequantized; `with_adapters=False` streams
that base alone. Design: docs/weight-transfer.md#merged-pushes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from rlvr.model.quantization import dequantized_weight, is_quantized_layer
from rlvr.model.zero3 import zero3_gather
from rlvr.reasoning_vocab.mapping import trained_rows_params, with_trained_rows
from rlvr.weight_sync.fingerprint import aliases


def base_model(model: torch.nn.Module) -> torch.nn.Module:
    """The Hugging Face model inside a PeftModel (LoRA layers injected), or `model` itself."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def full_shape(param: torch.Tensor) -> tuple[int, ...]:
    """A parameter's full shape, also when ZeRO-3 has partitioned it to an empty tensor."""
    return tuple(getattr(param, "ds_shape", param.shape))


def hf_name(peft_name: str) -> str | None:
    """The base model's parameter name for a parameter of a LoRA-injected model, or None for
    parameters that do not exist in the base checkpoint (adapter weights, saved originals,
    trainable token rows)."""
    if any(s in peft_name for s in (".lora_", ".original_module.", ".trainable_tokens_")):
        return None
    parts = peft_name.split(".")
    if "modules_to_save" in parts:
        i = parts.index("modules_to_save")
        parts = parts[:i] + parts[i + 2 :]
    return ".".join(p for p in parts if p not in ("base_layer", "token_adapter"))


@dataclass(frozen=True)
class TensorMeta:
    """Name, dtype and full (Hugging Face) shape of one streamed tensor: what vLLM's
    `ParamMeta` declares (rlvr.weight_sync.merged converts), without importing vLLM here."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]


def adapter_factors(layer: torch.nn.Module, adapter: str) -> list[torch.nn.Parameter]:
    """A LoRA layer's A and B for `adapter` (PEFT keeps an embedding's apart from a linear's),
    or [] where the layer does not carry it."""
    if adapter in layer.lora_A:
        return [layer.lora_A[adapter].weight, layer.lora_B[adapter].weight]
    if adapter in getattr(layer, "lora_embedding_A", {}):
        return [layer.lora_embedding_A[adapter], layer.lora_embedding_B[adapter]]
    return []


def merged_weight(
    weight: torch.Tensor, layer: torch.nn.Module, adapters: list[str]
) -> torch.Tensor:
    """A new tensor W + scale * B @ A over `adapters`. For plain linear LoRA one fused addmm
    (PEFT's get_delta_weight materialises the delta and a transposed copy: on a CPU that was
    most of a merged push's time); PEFT's own delta for everything else (embeddings,
    fan_in_fan_out, factors in another dtype than the weight)."""
    merged = weight.clone() if not adapters else None
    for a in adapters:
        base = weight if merged is None else merged
        A, B = adapter_factors(layer, a)
        fused = (
            a in layer.lora_A
            and isinstance(layer.lora_A[a], torch.nn.Linear)
            and not getattr(layer, "fan_in_fan_out", False)
            and A.dtype == B.dtype == weight.dtype
        )
        if fused:
            merged = torch.addmm(base, B, A, alpha=layer.scaling[a])
        else:
            merged = base + layer.get_delta_weight(a).to(weight.dtype)
    return merged


@dataclass
class _Entry:
    name: str
    param: torch.nn.Parameter
    lora_layer: torch.nn.Module | None
    """Set for a LoRA-wrapped module's base weight: its value is merged on the fly."""
    tokens_layer: torch.nn.Module | None = None
    """Set for the base weight of PEFT trainable token rows (a reasoning vocabulary's rows):
    the trained rows replace the base ones on the fly."""
    quantized: torch.nn.Module | None = None
    """Set for a quantized layer's weight (QLoRA): it goes out dequantized."""

    def meta(self, dtype: torch.dtype | None) -> TensorMeta:
        """What this entry streams, in `dtype` (None: its own)."""
        layer = self.quantized
        if layer is None:
            return TensorMeta(self.name, dtype or self.param.dtype, full_shape(self.param))
        shape = (layer.out_features, layer.in_features)
        return TensorMeta(self.name, dtype or layer.compute_dtype, shape)

    def base_value(self) -> torch.Tensor:
        """The entry's base weight as the trainer computes with it (call it gathered)."""
        if self.quantized is not None:
            return dequantized_weight(self.quantized)
        return self.param.detach()


class MergedWeightSource:
    """The model's weights as vLLM expects them: base names, LoRA deltas merged in (plain
    models too). `dtype`: what every tensor travels in (a mixed-precision policy's compute
    dtype; None keeps each parameter's own); `with_adapters=False`: the base alone."""

    def __init__(
        self,
        model: torch.nn.Module,
        gather: Callable[[list[torch.nn.Parameter]], contextlib.AbstractContextManager]
        | None = None,
        dtype: torch.dtype | None = None,
        with_adapters: bool = True,
    ):
        self.gather = gather or zero3_gather
        self.dtype = dtype
        self.with_adapters = with_adapters
        self.entries = self._plan(base_model(model))
        self.tied = {
            hf_name(alias): hf_name(name)
            for alias, name in aliases(base_model(model)).items()
            if hf_name(alias) and hf_name(name)
        }
        """A tied parameter's other names -> the name it streams under (the exact check)."""

    @staticmethod
    def _plan(model: torch.nn.Module) -> list[_Entry]:
        from peft.tuners.lora import LoraLayer
        from peft.tuners.trainable_tokens.layer import TrainableTokensLayer

        modules = dict(model.named_modules())
        entries = []
        for name, param in model.named_parameters():
            target = hf_name(name)
            if target is None:
                continue
            owner_name = name.rsplit(".", 1)[0]
            owner = modules.get(owner_name.removesuffix(".base_layer"))
            lora = owner if isinstance(owner, LoraLayer) and name.endswith("weight") else None
            if lora is not None and any(lora.use_dora.get(a) for a in lora.active_adapters):
                raise NotImplementedError("streaming merged weights does not support DoRA")
            tokens = owner if isinstance(owner, TrainableTokensLayer) else None
            layer = modules.get(owner_name)
            quantized = layer if is_quantized_layer(layer) and name.endswith("weight") else None
            entries.append(_Entry(target, param, lora, tokens, quantized))
        return entries

    def metadata(self) -> list[TensorMeta]:
        return [e.meta(self.dtype) for e in self.entries]

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in self._tensors():
            yield name, tensor if self.dtype is None else tensor.to(self.dtype)

    def _tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        for entry in self.entries:
            if entry.tokens_layer is not None and self.with_adapters:
                yield entry.name, self._with_trained_rows(entry)
                continue
            layer = entry.lora_layer if self.with_adapters else None
            if layer is None:
                with self.gather([entry.param]):
                    tensor = entry.base_value()
                    # A gathered ZeRO-3 tensor is freed when the context exits, possibly
                    # before the engine has consumed it: hand out a copy.
                    yield entry.name, tensor.clone() if hasattr(entry.param, "ds_id") else tensor
                continue
            adapters = [a for a in layer.active_adapters if adapter_factors(layer, a)]
            params = [entry.param]
            for a in adapters:
                params += adapter_factors(layer, a)
            with self.gather(params), torch.no_grad():
                yield entry.name, merged_weight(entry.base_value(), layer, adapters)

    def _with_trained_rows(self, entry: _Entry) -> torch.Tensor:
        layer = entry.tokens_layer
        with self.gather(trained_rows_params(layer)), torch.no_grad():
            return with_trained_rows(layer).detach().clone()
