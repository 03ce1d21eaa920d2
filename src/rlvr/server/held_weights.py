"""What a vf-vllm worker's layers compute with, as fingerprints (rlvr.weight_sync.fingerprint),
and the one repair a reload needs: layers that share a tied parameter are processed again.

On the CPU vLLM packs each linear layer's weight into a kernel (oneDNN or sgl) and empties the
parameter, so the parameter alone says nothing; `record_kernel_inputs` fingerprints a layer's
parameters at the moment its kernel is built from them (`patch_cpu_gemm_dispatch`), and a layer
whose kernel was not rebuilt by a push keeps the fingerprint of what it still computes with.
Design: docs/weight-transfer.md#the-exact-check.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch

from rlvr.weight_sync.fingerprint import Fingerprint, fingerprint, to_wire

KERNEL_PRINTS = "_rlvr_kernel_prints"
"""A layer's attribute: its parameters' (dtype, fingerprint) when its kernel was last built."""


def record_kernel_inputs(layer: torch.nn.Module) -> None:
    """Fingerprint `layer`'s own parameters as its kernel is about to be built from them."""
    setattr(
        layer,
        KERNEL_PRINTS,
        {
            name: (str(p.dtype).removeprefix("torch."), fingerprint(p))
            for name, p in layer._parameters.items()
            if p is not None and not p.is_meta
        },
    )


def patch_cpu_gemm_dispatch() -> None:
    """Make vLLM's CPU linear-kernel dispatch record its inputs first (idempotent)."""
    from vllm.model_executor.layers import utils

    original = getattr(utils.dispatch_cpu_unquantized_gemm, "rlvr_original", None)
    original = original or utils.dispatch_cpu_unquantized_gemm

    def dispatch(layer: torch.nn.Module, remove_weight: bool) -> None:
        record_kernel_inputs(layer)
        original(layer, remove_weight)

    dispatch.rlvr_original = original
    utils.dispatch_cpu_unquantized_gemm = dispatch


def kernel_records(model: torch.nn.Module) -> dict[int, Any]:
    """The kernel record each layer holds now (kept alive, compared by identity), to tell after
    a reload which layers it rebuilt."""
    return {id(m): getattr(m, KERNEL_PRINTS, None) for m in model.modules()}


def reprocess_shared(model: torch.nn.Module, before: dict[int, Any]) -> int:
    """Process again every layer that shares a parameter with another (a tied output layer and
    the embedding) and that the reload did not rebuild (its kernel record is the one it held
    `before`): vLLM's layerwise reload processes only layers that received weights, so the
    other keeps a kernel built from the old values. Returns how many were processed."""
    owners: dict[int, list[torch.nn.Module]] = defaultdict(list)
    for module in model.modules():
        for param in module._parameters.values():
            if param is not None:
                owners[id(param)].append(module)
    stale = {
        id(module): module
        for modules in owners.values()
        if len(modules) > 1
        for module in modules
        if getattr(module, KERNEL_PRINTS, None) is before.get(id(module))
        and getattr(module, "quant_method", None) is not None
    }
    for module in stale.values():
        module.quant_method.process_weights_after_loading(module)
    return len(stale)


def is_shard(module: torch.nn.Module, name: str) -> bool:
    """Whether the parameter `name` of `module` holds one tensor-parallel rank's part: the
    weights (and column-parallel biases) of vLLM's parallel linear layers, the vocabulary's
    rows; a row-parallel layer's bias, a replicated layer's weights and norms are whole. Decided
    by layer type, not by the parameter: on a CPU a packed layer's parameter is emptied."""
    from vllm.model_executor.layers.linear import (
        LinearBase,
        ReplicatedLinear,
        RowParallelLinear,
    )
    from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

    if isinstance(module, VocabParallelEmbedding):
        return True
    if not isinstance(module, LinearBase) or isinstance(module, ReplicatedLinear):
        return False
    return name == "weight" or not isinstance(module, RowParallelLinear)


def held_fingerprints(model: torch.nn.Module, tp_size: int, replica: int) -> dict[str, Any]:
    """This worker's report: every parameter's dtype and fingerprint under vLLM's names (a
    tied parameter under each of its names; LoRA wrappers' `base_layer` left out of the name),
    which of them are tensor-parallel shards, which cannot be added up (key-value heads vLLM
    copies across ranks), the model's fused-module map and its replica."""
    prints: dict[str, tuple[str, Fingerprint]] = {}
    sharded: list[str] = []
    unchecked: list[str] = []
    for module_name, module in model.named_modules(remove_duplicate=False):
        recorded = getattr(module, KERNEL_PRINTS, {})
        prefix = module_name.replace(".base_layer", "")
        for name, param in module._parameters.items():
            if param is None:
                continue
            full = f"{prefix}.{name}" if prefix else name
            dtype = str(param.dtype).removeprefix("torch.")
            prints[full] = recorded.get(name) or (dtype, fingerprint(param))
            if tp_size > 1 and is_shard(module, name):
                sharded.append(full)
            if getattr(module, "num_kv_head_replicas", 1) > 1:  # heads copied across ranks
                unchecked.append(full)
    return {
        "params": to_wire(prints),
        "sharded": sharded,
        "unchecked": unchecked,
        "packed": fused_modules(model),
        "replica": replica,
    }


def fused_modules(model: torch.nn.Module) -> dict[str, list[str]]:
    """vLLM's fused module -> the Hugging Face modules it holds (`packed_modules_mapping`)."""
    packed = getattr(model, "packed_modules_mapping", None) or {}
    return {k: list(v) for k, v in packed.items()}


def held_adapter_fingerprints(model_runner: Any, replica: int) -> dict[str, Any]:
    """This worker's report on the newest LoRA adapter it holds (the highest id: the API server
    numbers adapters as they are loaded): `{module}.lora_a` and `.lora_b` under vLLM's module
    names (a fused module sums its parts), as vLLM stores them (lora_b with its scaling folded
    in), the model's fused-module map and the adapter's id; `adapter` None where none is held."""
    manager = getattr(model_runner, "lora_manager", None)
    adapters = manager._adapter_manager.list_adapters() if manager is not None else {}
    report: dict[str, Any] = {
        "params": {},
        "packed": fused_modules(model_runner.get_model()),
        "replica": replica,
        "adapter": max(adapters, default=None),
    }
    if not adapters:
        return report
    prints: dict[str, tuple[str, Fingerprint]] = {}
    for module, weights in adapters[report["adapter"]].loras.items():
        for part in ("lora_a", "lora_b"):
            held = getattr(weights, part)
            tensors = [t for t in (held if isinstance(held, list) else [held]) if t is not None]
            if tensors:
                dtype = str(tensors[0].dtype).removeprefix("torch.")
                prints[f"{module}.{part}"] = (
                    dtype,
                    sum(map(fingerprint, tensors[1:]), fingerprint(tensors[0])),
                )
    report["params"] = to_wire(prints)
    return report
