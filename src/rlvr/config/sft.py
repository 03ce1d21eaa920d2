"""The supervised fine-tuning run's configuration, `SFTConfig` (scripts/sft.py).

Its own sections are the data files and their format and the training loop, beside the shared
sections (rlvr.config.sections); each checks its own values in `validate()`. Design:
docs/training.md#sft.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from rlvr.config.checks import require
from rlvr.config.sections import (
    CheckpointConfig,
    DistributedConfig,
    LoraConfig,
    ModelConfig,
    OptimConfig,
    WandbConfig,
    check_quantized_base,
)


@dataclass
class SFTDataConfig:
    """`data.*`: the SFT rows, their validation split and length limit."""

    train_files: list[str] = field(default_factory=list)
    """Training data: .jsonl, .json or .parquet files, read with `datasets` (required)."""
    validation_file: str | None = None
    """Held-out rows in the same format, for val/loss."""
    validation_holdout: int = 0
    """Without validation_file: hold out the last N training rows for val/loss instead."""
    format: Literal["messages", "prompt_completion"] = "messages"
    """messages: one column holds the conversation, a list of {role, content} (loss on every
    assistant turn). prompt_completion: a prompt column (a string, which becomes a user message,
    or a message list) and a completion column (a string, which becomes the assistant's reply,
    or a message list, e.g. a saved multi-turn rollout)."""
    messages_column: str = "messages"
    prompt_column: str = "prompt"
    completion_column: str = "completion"
    system_prompt: str | None = None
    """Put first as a system message in conversations that have none."""
    tools_column: str = "tools"
    """Optional column of tool definitions per row (OpenAI function schemas, or verifiers'
    `{name, description, parameters}` as `eval_report.py --export-sft` writes them); the chat
    template renders them as at inference. Rows without it have no tools."""
    max_seq_len: int = 2048
    """Longest training sequence in tokens, chat template included."""
    truncation: Literal["truncate", "drop"] = "truncate"
    """Longer examples: `truncate` keeps their first max_seq_len tokens (an example with no
    assistant token left is dropped); `drop` skips them. Both are counted and logged."""
    max_examples: int | None = None
    """Train on the first N rows only (before shuffling; for quick runs)."""
    shuffle_seed: int = 0
    """Each epoch visits the rows in a fresh order drawn from (shuffle_seed, epoch)."""

    def validate(self) -> None:
        files = self.train_files
        require(bool(files), "data.train_files", files, "name at least one file")
        require(self.max_seq_len >= 2, "data.max_seq_len", self.max_seq_len, "must be at least 2")
        holdout = self.validation_holdout
        require(holdout >= 0, "data.validation_holdout", holdout, "must be >= 0")
        require(
            not (self.validation_file and holdout),
            "data.validation_holdout",
            holdout,
            "cannot be combined with data.validation_file",
        )
        if self.max_examples is not None:
            require(self.max_examples >= 1, "data.max_examples", self.max_examples)


@dataclass
class SFTTrainConfig:
    """`train.*`: epochs, steps and batch sizes of an SFT run."""

    epochs: int = 1
    """Passes over the training rows (unless max_steps is set)."""
    max_steps: int | None = None
    """Optimizer steps to run, taking as many passes as needed; None: `epochs` passes."""
    batch_size: int = 32
    """Sequences per optimizer step, over all ranks."""
    micro_batch_size: int = 4
    """Rows per forward/backward on each rank (memory; does not change the loss)."""
    packing: bool = False
    """Pack short sequences together into rows as wide as the step's longest (attention stays
    within each sequence) instead of padding each one; for flash_attention_2, see
    `rlvr.layout.micro_batches`."""
    eval_every: int = 0
    """val/loss every N steps (0: only before the first and after the last step)."""

    def validate(self) -> None:
        require(self.epochs >= 1, "train.epochs", self.epochs)
        if self.max_steps is not None:
            require(self.max_steps >= 1, "train.max_steps", self.max_steps)
        require(self.batch_size >= 1, "train.batch_size", self.batch_size)
        require(self.micro_batch_size >= 1, "train.micro_batch_size", self.micro_batch_size)
        require(self.eval_every >= 0, "train.eval_every", self.eval_every, "must be >= 0")


@dataclass
class SFTConfig:
    """Supervised fine-tuning (scripts/sft.py): loss on assistant tokens only."""

    data: SFTDataConfig = field(default_factory=SFTDataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    optim: OptimConfig = field(
        default_factory=lambda: OptimConfig(lr=1e-4, scheduler="cosine", warmup_steps=10)
    )
    train: SFTTrainConfig = field(default_factory=SFTTrainConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    wandb: WandbConfig = field(default_factory=lambda: WandbConfig(project="rlvr-sft"))
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    seed: int = 0
    output_dir: str = "outputs/sft"

    def validate(self) -> None:
        """Each section's own checks, and those that span sections."""
        self.data.validate()
        self.train.validate()
        self.optim.validate()
        self.model.validate()
        self.lora.validate()
        check_quantized_base(self.model, self.lora)
        self.checkpoint.validate()
        self.distributed.validate()
