"""The typed sections both trainers share: model, LoRA, optimizer, checkpoints, W&B, the
process group.

The rule of every config module: a section checks its own values in `validate()` (with
`rlvr.config.checks.require`); the config holding it calls that, and holds only the checks that
span sections (such as `check_quantized_base`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from rlvr.config.checks import require


@dataclass
class ModelConfig:
    """`model.*`: which model to load, its dtype, and its optional reasoning vocabulary."""

    name: str = "smollm2-135m"
    """`smollm2-135m` (embedded default), a local directory, or a Hugging Face id."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """auto: bfloat16 on CUDA, float32 on CPU (CPU bf16 matmuls are slow and imprecise)."""
    gradient_checkpointing: bool | None = None
    """None: the trainer chooses from its start-up memory estimate (rlvr.trainer.memory): off only
    when the largest micro-batch fits comfortably without it. true/false: as set."""
    attn_implementation: str | None = None
    """Passed to transformers (e.g. `sdpa`, `flash_attention_2`); None lets it choose."""
    quantization: Literal["none", "nf4", "int8"] = "none"
    """The frozen base's storage under LoRA (QLoRA, rlvr.model.quantization): `nf4` (4-bit
    NormalFloat) or `int8` (per-row absmax) with bitsandbytes, every linear layer but the output
    head; the embeddings and norms stay in `dtype`. Needs lora.enabled=true. The trainer
    computes with the dequantized weights, and vf-vllm is given exactly those."""
    reasoning_vocab_size: int = 0
    """A reasoning vocabulary (rlvr.reasoning_vocab.mapping): N extra ids, V + j a copy of the j-th
    non-special token of the tokenizer (-1: a copy of every one), usable only inside think
    spans. 0: none, unless the model directory already carries one (reasoning_vocab.json),
    which is always restored."""
    reasoning_start: str = "<think>"
    """Opens a think span (matched in the decoded text, see rlvr.reasoning_vocab.gate)."""
    reasoning_end: str = "</think>"
    """Closes a think span."""

    def validate(self) -> None:
        require(
            self.reasoning_vocab_size >= -1,
            "model.reasoning_vocab_size",
            self.reasoning_vocab_size,
            "must be -1 (all), 0 (off) or a count",
        )
        start, end = self.reasoning_start, self.reasoning_end
        require(
            delimiters_ok(start, end),
            "model.reasoning_start/end",
            (start, end),
            "must be non-empty and neither may contain the other",
        )


def check_quantized_base(model: ModelConfig, lora: LoraConfig) -> None:
    """A quantized base trains only under LoRA: its weights are frozen integers (no gradient,
    no optimizer step can move them), so a full fine-tune would train nothing but the norms
    and embeddings while claiming to train the model."""
    require(
        model.quantization == "none" or lora.enabled,
        "model.quantization",
        model.quantization,
        "a quantized base cannot be fine-tuned in full (its weights are frozen integers): "
        "set lora.enabled=true (QLoRA) or model.quantization=none",
    )


def delimiters_ok(start: str, end: str) -> bool:
    """Think delimiters are told apart only when neither contains the other."""
    return bool(start and end) and start not in end and end not in start


@dataclass
class LoraConfig:
    """`lora.*`: whether the policy trains a LoRA adapter, and its shape."""

    enabled: bool = True
    rank: int = 16
    alpha: float = 32.0
    dropout: float = 0.0
    target_modules: list[str] = field(
        default_factory=lambda: [
            "q_proj",
            "k_proj",
            "v_proj",
            "o_proj",
            "gate_proj",
            "up_proj",
            "down_proj",
        ]
    )
    resume_from: str | None = None
    """An adapter directory (PEFT format) to continue training from."""

    def validate(self) -> None:
        require(self.rank >= 1, "lora.rank", self.rank)


@dataclass
class OptimConfig:
    """`optim.*`: the optimizer and its learning-rate schedule."""

    lr: float = 1e-5
    scheduler: Literal["constant", "linear", "cosine"] = "constant"
    warmup_steps: int = 0
    weight_decay: float = 0.0
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1e-8
    max_grad_norm: float = 1.0
    """Gradient clipping by global norm; 0 disables it."""

    def validate(self) -> None:
        require(self.lr > 0, "optim.lr", self.lr)
        require(len(self.betas) == 2, "optim.betas", self.betas, "needs 2 values")
        require(self.warmup_steps >= 0, "optim.warmup_steps", self.warmup_steps, "must be >= 0")


@dataclass
class CheckpointConfig:
    """`checkpoint.*`: how often checkpoints are saved and how many are kept."""

    every: int = 50
    """Save every N steps (0: only at the end)."""
    keep_last: int = 2
    resume: str | None = None
    """`auto` (latest checkpoint in output_dir, if any), a checkpoint directory, or None."""

    def validate(self) -> None:
        require(self.every >= 0, "checkpoint.every", self.every, "must be >= 0")
        require(self.keep_last >= 1, "checkpoint.keep_last", self.keep_last)


@dataclass
class WandbConfig:
    """`wandb.*`: where metrics are logged (offline unless a key is set)."""

    mode: Literal["auto", "online", "offline", "disabled"] = "auto"
    """auto: online when WANDB_API_KEY is set, offline otherwise."""
    project: str = "rlvr"
    entity: str | None = None
    name: str | None = None
    tags: list[str] = field(default_factory=list)


@dataclass
class DistributedConfig:
    """`distributed.*`: the trainer ranks' process group."""

    timeout_s: float = 7200.0
    """Timeout of the trainer ranks' process group. Ranks other than 0 wait in a collective
    while rank 0 generates a step's rollouts or evaluates, so this bounds one generation or
    evaluation; rank 0 gives up on rollouts a little earlier, with a clear error."""

    def validate(self) -> None:
        require(self.timeout_s > 0, "distributed.timeout_s", self.timeout_s)
