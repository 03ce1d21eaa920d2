"""How much memory a training step needs, checked before the first step, and each step's peak.

`fit_policy` estimates the peak of a step for the loaded policy and the largest micro-batch the
settings allow, switches gradient checkpointing on when the step only fits with it (unless the
user chose), and refuses settings that fit neither way with a ConfigError naming the knobs to
turn. The estimate stays above the peaks `bench/train_memory.py` measures.
Design and measurements: docs/training.md#what-the-memory-estimate-counts.
"""

from __future__ import annotations

import contextlib
import os
import resource
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rlvr.config import ConfigError, LoraConfig, ModelConfig
from rlvr.layout.prefix_tree import SplitCost
from rlvr.model.policy import Policy, describe_policy, enable_gradient_checkpointing
from rlvr.model.quantization import largest_dequantized_bytes, parameter_bytes
from rlvr.trainer.logprobs import MAX_CHUNK_ELEMENTS, MAX_SAVED_ELEMENTS

GIB = 2**30

ACTIVATION_MARGIN = 1.1
"""Measured peak activations over the formula's (see `bench/train_memory.py`)."""

HEAP_RETENTION = {False: 0.8, True: 0.5}
"""On the CPU, resident memory glibc's heap keeps after autograd frees it, as a share of every
layer's activations, without and with checkpointing (fitted with `bench/train_memory.py`)."""

CPU_RUNTIME_BYTES = int(0.75 * GIB)
"""Resident memory of a trainer process before it loads a model (python, torch,
transformers, accelerate, peft), measured on the CPU."""

CHECKPOINT_OFF_FRACTION = 0.8
"""Gradient checkpointing stays off only when the step fits in this share of free memory."""

SPLIT_COPIES = 1.5
"""The node split's copies of a layer's queries, keys and values, in units of their widths."""

SPLIT_MARGIN = 1.2
"""`split_cost` over what its terms count (what they leave out, and the fit's spread)."""

OPTIMIZER_BYTES = 16
"""Per trainable parameter: a float32 gradient, AdamW's two float32 moments and its
multi-tensor step's scratch."""


@dataclass(frozen=True)
class ModelShape:
    """What the estimate needs to know about a loaded model."""

    layers: int
    hidden: int
    attention_width: int
    """Query heads x head dimension."""
    kv_width: int
    """Key/value heads x head dimension."""
    intermediate: int
    vocab: int
    params: int
    trainable: int
    dtype_bytes: int
    """Bytes per element of the weights and activations (float32 4, bfloat16 2)."""
    weight_bytes: int | None = None
    """What the weights hold when not `params` x `dtype_bytes` (a quantized base: its stored
    bytes and its largest layer's dequantized copies); None: `params` x `dtype_bytes`."""

    @classmethod
    def of(cls, model: torch.nn.Module) -> ModelShape | None:
        """The shape of a Hugging Face causal LM (wrapped by PEFT or not), or None when its
        config lacks the usual decoder fields (then nothing can be estimated)."""
        config = model.config
        config = getattr(config, "text_config", None) or config
        names = ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads")
        if any(not isinstance(getattr(config, n, None), int) for n in names):
            return None
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        params = list(model.parameters())
        dtype_bytes = next(p for p in params if p.is_floating_point()).element_size()
        quantized = largest_dequantized_bytes(model, dtype_bytes)
        return cls(
            layers=config.num_hidden_layers,
            hidden=config.hidden_size,
            attention_width=heads * head_dim,
            kv_width=kv_heads * head_dim,
            intermediate=config.intermediate_size,
            vocab=config.vocab_size,
            params=sum(getattr(p, "ds_numel", p.numel()) for p in params),
            trainable=sum(getattr(p, "ds_numel", p.numel()) for p in params if p.requires_grad),
            dtype_bytes=dtype_bytes,
            weight_bytes=sum(map(parameter_bytes, params)) + 2 * quantized if quantized else None,
        )

    def layer_activation_bytes(self) -> int:
        """What one decoder layer saves for backward per token: two RMSNorms, q, k, v and
        attention's output, the MLP's gate, up, activation and product."""
        b = self.dtype_bytes
        trained_norms = self.trainable == self.params
        norms = 2 * self.hidden * (4 + b + (b if trained_norms else 0))
        attention = (2 * self.attention_width + 2 * self.kv_width) * b
        return norms + attention + 4 * self.intermediate * b


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes a training step needs on one rank, by what holds them."""

    tokens: int
    """Token slots of the largest micro-batch."""
    checkpointing: bool
    runtime: int
    weights: int
    optimizer: int
    """Gradients, AdamW moments and master copies of the trainable parameters."""
    activations: int
    """What autograd keeps for backward (the output head's share included) at the step's
    peak, and backward's transient gradients."""
    allocator: int
    """On the CPU, freed activation memory glibc's heap keeps (see `HEAP_RETENTION`)."""
    resident: int
    """What the process already holds of the above when the check runs."""

    @property
    def total(self) -> int:
        return self.runtime + self.weights + self.optimizer + self.activations + self.allocator

    @property
    def step_needs(self) -> int:
        """What the step still has to allocate: the total less what is resident already."""
        return self.total - self.resident

    def describe(self) -> str:
        parts = ("runtime", "weights", "optimizer", "activations", "allocator")
        terms = ", ".join(f"{p} {getattr(self, p) / GIB:.2f}" for p in parts if getattr(self, p))
        mode = "with" if self.checkpointing else "without"
        return (
            f"{self.total / GIB:.2f} GiB for {self.tokens} tokens per micro-batch {mode} "
            f"gradient checkpointing ({terms})"
        )


def estimate(
    shape: ModelShape,
    tokens: int,
    checkpointing: bool,
    *,
    on_cpu: bool = True,
    shards: int = 1,
    reference_copy: bool = False,
) -> MemoryEstimate:
    """The peak of one training step for a micro-batch of `tokens` slots; `shards`: ranks
    ZeRO-3 divides parameters and optimizer states over; `reference_copy`: a frozen copy of
    the weights for a full fine-tune's KL penalty."""
    b = shape.dtype_bytes
    weights = (shape.weight_bytes or shape.params * b) // shards
    master = 4 if b < 4 else 0
    optimizer = shape.trainable * (OPTIMIZER_BYTES + master) // shards
    layer = shape.layer_activation_bytes()
    live = slot_bytes(shape, checkpointing) * tokens + _head_bytes(tokens, shape.vocab)
    heap = shape.layers * layer * tokens if on_cpu else 0
    return MemoryEstimate(
        tokens=tokens,
        checkpointing=checkpointing,
        runtime=CPU_RUNTIME_BYTES if on_cpu else 0,
        weights=weights * (2 if reference_copy else 1),
        optimizer=optimizer,
        activations=int(ACTIVATION_MARGIN * live),
        allocator=int(HEAP_RETENTION[checkpointing] * heap),
        resident=(CPU_RUNTIME_BYTES + weights) if on_cpu else 0,
    )


def slot_bytes(shape: ModelShape, checkpointing: bool) -> int:
    """What a slot of a micro-batch keeps for backward: every layer's activations, or with
    checkpointing each layer's input and one layer recomputed with its gradients; plus the final
    norm and the head's selected hidden states."""
    layer = shape.layer_activation_bytes()
    if checkpointing:
        per_token = shape.layers * shape.hidden * shape.dtype_bytes + 2 * layer
    else:
        per_token = shape.layers * layer
    return per_token + 3 * shape.hidden * 4


def split_cost(model: torch.nn.Module) -> SplitCost:
    """What the sdpa node split keeps for backward beyond the unshared layout, in its slots
    (zero when the model's shape is unknown); the prefix-tree planner charges it.
    How it was fitted: docs/training.md#what-the-memory-estimate-counts."""
    shape = ModelShape.of(model)
    if shape is None:
        return SplitCost()
    checkpointing = bool(getattr(model, "is_gradient_checkpointing", False))
    b, slot = shape.dtype_bytes, slot_bytes(shape, checkpointing)
    layers = SPLIT_MARGIN * (2 if checkpointing else shape.layers)
    return SplitCost(
        per_slot=layers * SPLIT_COPIES * (shape.attention_width + 2 * shape.kv_width) * b / slot,
        # the keys and values, and the sample's predictions of the head (`slot_bytes`' last term)
        per_gathered=(layers * 2 * shape.kv_width * b + 3 * shape.hidden * 4) / slot,
        per_pair=layers * 4 / slot,
    )


def _head_bytes(tokens: int, vocab: int) -> int:
    """rlvr.trainer.logprobs' output head at its peak, every slot a loss token: the float32
    softmax of earlier chunks kept for backward, and the chunk in hand's three [n, V] buffers."""
    elements = tokens * vocab
    chunk = min(elements, MAX_CHUNK_ELEMENTS)
    if elements > MAX_SAVED_ELEMENTS:
        return 4 * 3 * chunk
    return 4 * (elements + 2 * chunk)


@dataclass(frozen=True)
class Budget:
    """The largest micro-batch a run can form, and the setting that bounds it."""

    tokens: int
    knob: str
    """The config field that bounds it (named in the error when it does not fit)."""
    floor: int
    """Slots a micro-batch holds at least: one sample of the longest length allowed."""
    floor_knob: str
    """The config field that sets `floor`."""


@dataclass(frozen=True)
class MemoryPlan:
    checkpointing: bool
    estimate: MemoryEstimate | None
    """None when the model's shape is unknown (nothing was checked)."""
    available: int
    device: str

    def describe(self) -> str:
        if self.estimate is None:
            return "no memory estimate (unknown model shape)"
        return (
            f"estimated peak memory {self.estimate.describe()}; the step needs "
            f"{self.estimate.step_needs / GIB:.2f} of {self.available / GIB:.2f} GiB free "
            f"on {self.device}"
        )


def fit_policy(
    policy: Policy,
    model_cfg: ModelConfig,
    lora_cfg: LoraConfig,
    budget: Budget,
    accelerator: Any,
    *,
    keep_reference: bool = False,
) -> MemoryPlan:
    """Refuse a step of `budget` that cannot fit, switch gradient checkpointing on where the
    plan needs it, and log the policy and the plan (`keep_reference`: see `load_policy`)."""
    plan = plan_memory(
        policy.model,
        model_cfg.gradient_checkpointing,
        budget,
        accelerator,
        reference_copy=keep_reference and not lora_cfg.enabled,
    )
    if plan.checkpointing:
        enable_gradient_checkpointing(policy.model)
    if accelerator.is_main_process:
        print(describe_policy(policy, model_cfg, lora_cfg, plan.checkpointing))
        print(plan.describe())
    return plan


def plan_memory(
    model: torch.nn.Module,
    checkpointing: bool | None,
    budget: Budget,
    accelerator: Any,
    *,
    reference_copy: bool = False,
) -> MemoryPlan:
    """Gradient checkpointing for `model` (the user's `checkpointing` when set, else off only
    when the step fits comfortably without it), after checking that the step fits at all;
    raises ConfigError naming what to change when it does not."""
    device = accelerator.device
    available = available_bytes(device)
    shape = ModelShape.of(model)
    if shape is None:
        return MemoryPlan(checkpointing is not False, None, available, str(device))
    options = [checkpointing] if checkpointing is not None else [False, True]
    shards = accelerator.num_processes if _zero3(accelerator) else 1
    kwargs = {
        "on_cpu": device.type == "cpu",
        "shards": shards,
        "reference_copy": reference_copy,
    }
    for option in options:
        est = estimate(shape, budget.tokens, option, **kwargs)
        room = available * (CHECKPOINT_OFF_FRACTION if len(options) > 1 and not option else 1)
        if est.step_needs <= room:
            return MemoryPlan(option, est, available, str(device))
    raise ConfigError(_unfit_message(shape, budget, checkpointing, available, str(device), kwargs))


def _unfit_message(
    shape: ModelShape,
    budget: Budget,
    checkpointing: bool | None,
    available: int,
    device: str,
    kwargs: dict[str, Any],
) -> str:
    """Why the step does not fit and which settings would make it fit."""
    best = checkpointing is not False
    est = estimate(shape, budget.tokens, best, **kwargs)
    fits = largest_fitting_tokens(shape, best, available, budget.tokens, kwargs)
    knobs = budget.knob if fits >= budget.floor else f"{budget.floor_knob} and {budget.knob}"
    fixes = [
        f"lower {knobs} to at most {fits} tokens" if fits else "free memory (not one token fits)"
    ]
    if not best:
        fixes.append("set model.gradient_checkpointing=true (or null: the trainer then chooses)")
    if shape.trainable == shape.params:
        fixes.append("train a LoRA adapter (lora.enabled=true) instead of every parameter")
    return (
        f"a training step will not fit in memory: estimated {est.describe()}; it needs "
        f"{est.step_needs / GIB:.2f} GiB more but {device} has {available / GIB:.2f} GiB free. "
        f"To fit: {'; or '.join(fixes)}. (see rlvr.trainer.memory for what the estimate counts)"
    )


def largest_fitting_tokens(
    shape: ModelShape, checkpointing: bool, available: int, upper: int, kwargs: dict[str, Any]
) -> int:
    """The most token slots per micro-batch whose step fits in `available` (0: none)."""
    low, high = 0, upper
    while low < high:
        mid = (low + high + 1) // 2
        if estimate(shape, mid, checkpointing, **kwargs).step_needs <= available:
            low = mid
        else:
            high = mid - 1
    return low


def _zero3(accelerator: Any) -> bool:
    plugin = getattr(accelerator.state, "deepspeed_plugin", None)
    return plugin is not None and getattr(plugin, "zero_stage", 0) == 3


# ---- what the machine has -------------------------------------------------------------


def available_bytes(device: torch.device) -> int:
    """Memory this rank can still allocate: on a GPU its free memory plus what torch's
    allocator holds unused; on the CPU what the kernel calls available (MemAvailable, capped
    by the cgroup's limit in a container), shared by the ranks on this machine."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    free = _meminfo_bytes("MemAvailable")
    limit = _cgroup_room()
    if limit is not None:
        free = min(free, limit)
    return free // max(int(os.environ.get("LOCAL_WORLD_SIZE", "1")), 1)


def _meminfo_bytes(field: str) -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/meminfo")


def _cgroup_room() -> int | None:
    """The cgroup v2 limit less what the cgroup uses, when a limit is set."""
    root = Path("/sys/fs/cgroup")
    try:
        limit = (root / "memory.max").read_text().strip()
        used = int((root / "memory.current").read_text())
    except (OSError, ValueError):
        return None
    return None if limit == "max" else int(limit) - used


# ---- the peak of each step ------------------------------------------------------------


def reset_peak(device: torch.device) -> None:
    """Start a new peak: the CUDA allocator's, or the kernel's high-water mark of this
    process's resident memory (writing 5 to /proc/self/clear_refs sets VmHWM to the current
    resident size; without it the CPU peak is the lifetime peak)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


def peak_bytes(device: torch.device) -> int:
    """The peak since `reset_peak`: tensors allocated on the GPU, or resident memory."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
