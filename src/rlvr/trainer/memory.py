"""How much memory a training step needs, checked against the machine before the first step,
and the peak each step actually reached.

A run whose micro-batch does not fit would die in the kernel's OOM killer with nothing but
`Killed`. `plan_memory` estimates the peak of a step for the loaded
model, the largest micro-batch the batch settings allow (in token slots, see
`rlvr.trainer.micro_batches`) and the dtype, compares it with what the device has free, switches
gradient checkpointing on when the step only fits with it (unless the user chose), and refuses
settings that fit neither way with a ConfigError that names the knobs to turn.

What the estimate counts, per rank (`MemoryEstimate`):

- weights: every parameter in its dtype (divided over the ranks under ZeRO-3), plus a frozen
  reference copy for full fine-tuning with a KL penalty; a quantized base (QLoRA) counts its
  stored bytes (packed codes and their scales, `rlvr.model.quantization.parameter_bytes`) and
  the one layer's weight it dequantizes at a time, twice (forward and backward's copies);
- optimizer: gradients and AdamW states of the trainable parameters only (LoRA: the adapter),
  in float32 (and a float32 master copy when the parameters are in a lower precision, as bf16
  full fine-tuning needs to keep small updates), divided under ZeRO-3;
- activations: what autograd saves for backward, per token and per decoder layer of a
  Llama-style block: the two RMSNorms' float32 inputs and outputs, attention's q, k, v and
  output, and the MLP's gate, up, activation and product (SmolLM2 + LoRA: 10.1k float32 values,
  40 KB, per token per layer, as saved-tensor hooks count them; tests/unit/trainer/test_memory.py
  checks the formula against them). With gradient checkpointing each layer keeps only its input, and
  backward recomputes one layer at a time beside its gradients. A padding slot costs what a
  token costs, so the count is in slots (rows x widest row, see `rlvr.trainer.micro_batches`). Plus
  the output head's share in `rlvr.trainer.logprobs`, every slot taken as a loss token (the worst
  case): the float32 softmax kept for backward (up to `MAX_SAVED_ELEMENTS`) and one chunk's logits,
  log-softmax and softmax while it is computed;
- allocator (CPU only): freed activation memory glibc's heap keeps (`HEAP_RETENTION`);
- runtime (CPU only): the interpreter and libraries (`CPU_RUNTIME_BYTES`).

A folded prefix-tree micro-batch (`rlvr.trainer.prefix_tree`) is planned to keep no more than
the budget's slots would unshared, its node split's extra copies charged (`split_cost`), so
the one estimate covers both layouts.

Activations are scaled by `ACTIVATION_MARGIN` (backward's transient gradients and the small
tensors the formula leaves out). The constants are fitted to `bench/train_memory.py` so that the
estimate stays above the measured peak (docs/training.md#memory has the numbers). The check
compares what the step adds to what the process already holds with what is free now: on the CPU
the loaded weights are resident already, on a GPU they are not there yet. Ranks sharing a CPU
share its free memory.
"""

from __future__ import annotations

import contextlib
import os
import resource
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rlvr.config import ConfigError
from rlvr.layout.prefix_tree import SplitCost
from rlvr.model.quantization import largest_dequantized_bytes, parameter_bytes
from rlvr.trainer.logprobs import MAX_CHUNK_ELEMENTS, MAX_SAVED_ELEMENTS

GIB = 2**30

ACTIVATION_MARGIN = 1.1
"""Measured peak activations over the formula's (see `bench/train_memory.py`)."""

HEAP_RETENTION = {False: 0.8, True: 0.5}
"""On the CPU, resident memory that glibc's allocator keeps after autograd frees it, as a share
of the activations of every layer (whether checkpointing recomputes them or not), without and
with checkpointing. glibc serves tensors below its mmap threshold from its heap and raises that
threshold (up to 32 MiB) each time it frees a larger mapped block, so after the first step a
micro-batch's per-layer tensors come from a heap that fragments and seldom shrinks. Fixing the
threshold (MALLOC_MMAP_THRESHOLD_) would return the memory but slows every step, so the
estimate counts it instead (fitted with `bench/train_memory.py`)."""

CPU_RUNTIME_BYTES = int(0.75 * GIB)
"""Resident memory of a trainer process before it loads a model (python, torch,
transformers, accelerate, peft), measured on the CPU."""

CHECKPOINT_OFF_FRACTION = 0.8
"""Gradient checkpointing stays off only when the step fits in this share of free memory:
recomputation costs about a third more compute, running out of memory costs the run."""

SPLIT_COPIES = 1.5
"""The node split's copies of a layer's queries, keys and values, in units of their widths:
the pieces it cuts and the padded stacks of shared calls (fitted: 1.1x on a tiny Llama, 1.35x
on SmolLM2's shape)."""

SPLIT_MARGIN = 1.2
"""`split_cost` over what its terms count: log-sum-exps, the padding of unequal nodes in one
call, and the fit's spread (0.93-1.06 of it)."""

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
        """What one decoder layer saves for backward per token: two RMSNorms (float32 input,
        the projections' input and, when the norm's weight trains, the normalised value it
        multiplies), q, k, v and attention's output, the MLP's gate, up, activation and
        product (see the module docstring)."""
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
    the weights for a full fine-tune's KL penalty. A folded prefix-tree micro-batch costs no
    more than `tokens` unshared slots (`rlvr.trainer.prefix_tree` plans it so, charging
    `split_cost`), so one estimate covers both layouts."""
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
    """What the sdpa node split keeps for backward beyond the unshared layout, in its slots.

    `rlvr.trainer.tree_sdpa` cuts every layer's queries, keys and values into the nodes'
    pieces (copies), attends each node's queries to its ancestors' keys and values concatenated
    with its own (per gathered token, key/value width x 2; the CPU kernel takes grouped heads
    without repeating them) under a mask SDPA may widen to float32, per query-key pair. Each is
    kept in every layer that keeps activations (all of them, or with checkpointing the
    recomputed one and its backward). The head reads one hidden state per sample token, not
    per folded token, so a gathered token also pays the head's share of a slot. Fitted with
    saved-tensor hooks on SmolLM2's shape and a tiny Llama (`SPLIT_COPIES`; the gathered tokens
    came to the key/value width x 2 exactly); `SPLIT_MARGIN` covers the rest
    (tests/unit/trainer/test_memory.py checks budgets). The planner charges this
    (`rlvr.trainer.prefix_tree`), so a folded micro-batch keeps no more than the budget's slots
    would unshared. Zero when the model's shape is unknown (nothing was sized)."""
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
    """rlvr.trainer.logprobs' output head at its peak, every slot taken as a loss token: the float32
    softmax of earlier chunks kept for backward, and the chunk in hand's logits, log-softmax
    and softmax (three [n, V] float32 buffers; recomputed chunks keep nothing)."""
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
