"""The trainers' typed configurations: a YAML file plus dotted command-line overrides.

One dataclass tree describes a run: `Config` for GRPO, `SFTConfig` for supervised fine-tuning
(which shares the model, LoRA, optimizer, checkpoint and W&B sections, and their checks).
`load_config(path, overrides)` reads the file, applies
overrides such as `optim.lr=1e-5` or `lora.enabled=false` (values are parsed as YAML, so
`[q_proj, v_proj]` and `null` work), checks every value against the declared type and rejects
unknown keys with the full dotted name, so a typo fails before any model is loaded instead of
being silently ignored.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml

from rlvr.atomic import atomic_write_text


class ConfigError(ValueError):
    """A config value or key is wrong; the message names the dotted field and the value."""


@dataclass
class EnvConfig:
    id: str = "vf-deepscaler"
    """Environment id, as for `verifiers.load_environment` (module `vf_x` for `vf-x`)."""
    args: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments for the environment's `load_environment`."""


@dataclass
class ModelConfig:
    name: str = "smollm2-135m"
    """`smollm2-135m` (embedded default), a local directory, or a Hugging Face id."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """auto: bfloat16 on CUDA, float32 on CPU (CPU bf16 matmuls are slow and imprecise)."""
    gradient_checkpointing: bool | None = None
    """None: the trainer chooses from its start-up memory estimate (rlvr.trainer.memory): off only when
    the largest micro-batch fits comfortably without it. true/false: as set."""
    attn_implementation: str | None = None
    """Passed to transformers (e.g. `sdpa`, `flash_attention_2`); None lets it choose."""
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
        _require(self.reasoning_vocab_size >= -1, "model.reasoning_vocab_size",
                 self.reasoning_vocab_size, "must be -1 (all), 0 (off) or a count")  # fmt: skip
        start, end = self.reasoning_start, self.reasoning_end
        _require(delimiters_ok(start, end), "model.reasoning_start/end", (start, end),
                 "must be non-empty and neither may contain the other")  # fmt: skip


def delimiters_ok(start: str, end: str) -> bool:
    """Think delimiters are told apart only when neither contains the other."""
    return bool(start and end) and start not in end and end not in start


@dataclass
class LoraConfig:
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
        _require(self.rank >= 1, "lora.rank", self.rank)


@dataclass
class OptimConfig:
    lr: float = 1e-5
    scheduler: Literal["constant", "linear", "cosine"] = "constant"
    warmup_steps: int = 0
    weight_decay: float = 0.0
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1e-8
    max_grad_norm: float = 1.0
    """Gradient clipping by global norm; 0 disables it."""

    def validate(self) -> None:
        _require(self.lr > 0, "optim.lr", self.lr)
        _require(len(self.betas) == 2, "optim.betas", self.betas, "needs 2 values")
        _require(self.warmup_steps >= 0, "optim.warmup_steps", self.warmup_steps, "must be >= 0")


@dataclass
class BatchConfig:
    rollouts_per_example: int = 8
    """Group size: rollouts of the same prompt whose rewards are compared."""
    batch_size: int = 64
    """Rollouts per optimizer step (a multiple of rollouts_per_example)."""
    micro_batch_size: int | None = None
    """Most rows per forward/backward on each rank (a row holds one sample, or several
    packed); None: as many as micro_batch_tokens allows."""
    micro_batch_tokens: int | None = 4096
    """Most token slots per forward/backward on each rank: rows x the widest row (padding
    costs the memory a token does). Bounds activation memory whatever the samples' lengths;
    a sample longer than this gets a micro-batch of its own. Checked against free memory
    before the first step (rlvr.trainer.memory). None: only micro_batch_size bounds micro-batches."""
    packing: bool = False
    """Pack short samples together into rows as wide as the step's longest sample (attention
    stays within each sample), instead of padding every sample to that width. Same loss,
    less padding; pays with attn_implementation=flash_attention_2, slower with sdpa on a CPU
    (see `rlvr.trainer.micro_batches`)."""
    prefix_sharing: bool = True
    """Forward each token prefix that several samples share (a group's prompt, a rollout's
    earlier turns) once, in a prefix tree whose attention keeps samples apart: the same
    log-probabilities and gradients for fewer tokens. Applies with attn_implementation sdpa
    (the default; a dense mask) or flex_attention (GPUs, no dense mask), on steps where it
    saves enough tokens to pay (see `rlvr.trainer.prefix_tree`); false: every sample on its own."""
    max_seq_len: int = 2048
    """Longest training sequence (prompt + completion tokens); longer turns are truncated."""
    max_prompt_len: int = 1024
    """Dataset rows whose rendered prompt is longer are skipped (and counted) before training."""
    async_level: int = 1
    """How many steps rollouts may run ahead of training (0 = fully synchronous)."""
    trainer_cores: list[int] | None = None
    """CPU cores for the trainer process, e.g. [1] beside a vf-vllm on core 0 of the same CPU
    (vLLM's CPU worker binds every core but the last by default); None: all cores. Keeps
    generation that runs ahead from stalling the trainer's threads (see `rlvr.trainer.cores`)."""
    max_concurrent: int = -1
    """Most groups generating at once (-1: all groups of a step)."""
    max_errored_frac: float = 0.25
    """Groups where more than this share of rollouts errored (server or tool failures) get no
    loss: errors are rarely random (long generations, bad tool calls), so a baseline taken
    over the survivors is biased. Counted as rollouts/dropped_errored_groups."""
    mask_truncated: bool = False
    """True: rollouts cut by max_tokens/max_seq_len get no loss (their reward still counts in
    the group's baseline); False: train on them like any other rollout."""


@dataclass
class SamplingConfig:
    temperature: float = 1.0
    """Sampling temperature; the trainer divides its logits by the same value."""
    top_p: float = 1.0
    """Must stay 1.0: the trainer's log-probabilities cover the whole distribution, so a
    nucleus-filtered sampler would bias the importance ratio (see rlvr.rollouts.request_args)."""
    max_tokens: int | None = None
    """Most tokens per model turn. None: the environment's own default (its
    `sampling_args["max_tokens"]`, which each environment's README states), else 512. A value
    set here (file or `sampling.max_tokens=N`) wins over the environment's."""
    seed_requests: bool = True
    """Give each request a seed derived from (seed, step, rollout), so runs (and resumed runs)
    sample the same tokens. vLLM 0.32's CPU backend crashes when a seeded request's prefill is
    split into chunks (its CPU generators cannot rewind), so CPU servers with long prompts or
    many concurrent requests need `false` (see configs/examples/deepscaler_smollm2_cpu.yaml)."""
    extra_body: dict[str, Any] = field(default_factory=dict)
    """Extra vLLM request fields (e.g. `stop`, `skip_special_tokens`). Fields that reshape the
    distribution (top_k, min_p, penalties, logit_bias, min_tokens, ...) are refused at start:
    the trainer could not reproduce them in its log-probabilities."""


@dataclass
class LossConfig:
    scale_rewards: bool = True
    """Divide group-relative advantages by the group's reward std (GRPO); False = Dr. GRPO."""
    drop_zero_variance: bool = False
    """Drop groups whose rewards are all equal (they carry no signal); always counted."""
    ratio_mask_low: float = 0.125
    """Tokens whose trainer/sampler probability ratio is below this get no loss."""
    ratio_mask_high: float = 8.0
    """Tokens whose trainer/sampler probability ratio is above this get no loss."""
    clip_low: float | None = None
    """PPO-style clipping of the ratio to [1-clip_low, 1+clip_high]; None disables it."""
    clip_high: float | None = None
    beta: float = 0.0
    """Weight of the KL penalty to the reference (initial) model; 0 skips the reference pass."""


@dataclass
class EvalConfig:
    every: int = 0
    """Evaluate on the environment's eval set every N steps (0: never); also at the end."""
    num_examples: int = 32
    rollouts_per_example: int = 1
    at_start: bool = False


@dataclass
class CheckpointConfig:
    every: int = 50
    """Save every N steps (0: only at the end)."""
    keep_last: int = 2
    resume: str | None = None
    """`auto` (latest checkpoint in output_dir, if any), a checkpoint directory, or None."""

    def validate(self) -> None:
        _require(self.every >= 0, "checkpoint.every", self.every, "must be >= 0")
        _require(self.keep_last >= 1, "checkpoint.keep_last", self.keep_last)


@dataclass
class WandbConfig:
    mode: Literal["auto", "online", "offline", "disabled"] = "auto"
    """auto: online when WANDB_API_KEY is set, offline otherwise."""
    project: str = "rlvr"
    entity: str | None = None
    name: str | None = None
    tags: list[str] = field(default_factory=list)


@dataclass
class LoggingConfig:
    samples_per_step: int = 4
    """Rows of the sample-rollout table logged per step (0: none)."""
    table_every: int = 10
    """Log the sample table every N steps."""
    mismatch_kl_warn: float = 1e-2
    """Warn when the sampler/trainer KL on sampled tokens exceeds this."""
    progress_bar: bool = True


@dataclass
class ServerConfig:
    base_url: str = "http://127.0.0.1:8000/v1"
    api_key: str | None = None
    served_model: str | None = None
    """The name vf-vllm serves the model under (default: model.name, as vf-vllm does)."""
    backend: Literal["auto", "shm", "gloo", "nccl", "ipc"] = "auto"
    """Weight transfer: nccl (server on other GPUs), ipc (server on the trainer's GPU), shm
    (CPU server on this host), gloo (CPU server elsewhere). auto: nccl when the trainer has
    CUDA, else shm for a local server, else gloo."""
    timeout_s: float = 600.0
    """Per-request timeout for generation and control calls."""
    transfer_host: str | None = None
    """Address of the trainer's first node that vf-vllm's workers connect to for the gloo or
    nccl weight transfer. None: this machine's address on its route to the server (loopback
    for a local server). Set it where that guess is wrong (NAT, several interfaces)."""
    transfer_port: int = 0
    """Port of that rendezvous (0: any free port; fix one for firewalls)."""
    transfer_timeout_s: float = 300.0
    """Deadline for the transfer rendezvous and each transfer's collectives: a wrong or
    unreachable address fails after this long, naming both addresses and the port."""
    lora_sync: Literal["auto", "adapter", "merged"] = "auto"
    """How a LoRA policy reaches the server. adapter: push only the adapter (megabytes); vLLM
    serves it on its frozen base under `adapter_name` (needs vf-vllm --enable-lora). merged:
    stream base + adapter merged, as for full fine-tuning. auto: adapter whenever the server
    can serve it, else merged (the log says why)."""
    adapter_name: str = "policy"
    """Adapter sync serves weight version v as `{adapter_name}-v{v}`; each rollout requests
    the version its batch is tagged with. One trainer per name on a server: a trainer unloads
    the versions under its name that it finds at start (a dead trainer's)."""
    push_weights: bool = True
    """Push weights after every optimizer step (the initial weights are pushed regardless).
    Off only for debugging: rollouts then come from the initial weights."""
    push_probe: bool = True
    """After every push, score a fixed token sequence on the server (prompt log-probabilities
    of the name rollouts will request) and with the trainer's just-pushed weights, logged as
    `push/probe_kl`: it sees a server that does not serve what was pushed (stale or partly
    updated weights), which mismatch-KL cannot tell from policy lag at async_level >= 1."""
    probe_kl_max: float | None = None
    """A push whose `push/probe_kl` exceeds this raises an error. None: calibrated by the
    initial push, where both sides hold the same weights: 10x its probe_kl (the rounding
    between server and trainer: ~1e-13 with float32 on both, ~1e-3 for a bf16 server against
    a float32 trainer on SmolLM2), within [1e-6, 1e-2]. Set it for servers in lower precision
    (fp8)."""


@dataclass
class DistributedConfig:
    timeout_s: float = 7200.0
    """Timeout of the trainer ranks' process group. Ranks other than 0 wait in a collective
    while rank 0 generates a step's rollouts or evaluates, so this bounds one generation or
    evaluation; rank 0 gives up on rollouts a little earlier, with a clear error."""

    def validate(self) -> None:
        _require(self.timeout_s > 0, "distributed.timeout_s", self.timeout_s)


@dataclass
class Config:
    env: EnvConfig = field(default_factory=EnvConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    batch: BatchConfig = field(default_factory=BatchConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    wandb: WandbConfig = field(default_factory=WandbConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    server: ServerConfig = field(default_factory=ServerConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    max_steps: int = 100
    seed: int = 0
    output_dir: str = "outputs/run"

    def validate(self) -> None:
        """Cross-field checks that types alone cannot express."""
        b = self.batch
        _require(b.rollouts_per_example >= 1, "batch.rollouts_per_example", b.rollouts_per_example)
        _require(
            b.batch_size >= 1 and b.batch_size % b.rollouts_per_example == 0,
            "batch.batch_size",
            b.batch_size,
            f"must be a positive multiple of batch.rollouts_per_example ({b.rollouts_per_example})",
        )
        for name in ("micro_batch_size", "micro_batch_tokens"):
            value = getattr(b, name)
            _require(value is None or value >= 1, f"batch.{name}", value, "must be >= 1 or null")
        _require(bool(b.micro_batch_size or b.micro_batch_tokens), "batch.micro_batch_tokens", None,
                 "set it or batch.micro_batch_size: nothing would bound a micro-batch")  # fmt: skip
        _require(b.async_level >= 0, "batch.async_level", b.async_level, "must be >= 0")
        _require(0 <= b.max_errored_frac <= 1, "batch.max_errored_frac", b.max_errored_frac,
                 "must be between 0 and 1")  # fmt: skip
        _require(b.max_prompt_len < b.max_seq_len, "batch.max_prompt_len", b.max_prompt_len,
                 f"must be below batch.max_seq_len ({b.max_seq_len})")  # fmt: skip
        _require(self.max_steps >= 1, "max_steps", self.max_steps)
        self.optim.validate()
        _require(self.sampling.temperature > 0, "sampling.temperature", self.sampling.temperature)
        _require(self.sampling.max_tokens is None or self.sampling.max_tokens >= 1,
                 "sampling.max_tokens", self.sampling.max_tokens)  # fmt: skip
        self._check_sampling_filters()
        _require(self.server.transfer_timeout_s > 0, "server.transfer_timeout_s",
                 self.server.transfer_timeout_s)  # fmt: skip
        probe_max = self.server.probe_kl_max
        _require(probe_max is None or probe_max > 0, "server.probe_kl_max", probe_max)
        _require(0 <= self.server.transfer_port < 65536, "server.transfer_port",
                 self.server.transfer_port, "must be a port number (0: any free port)")  # fmt: skip
        self.distributed.validate()
        low, high = self.loss.ratio_mask_low, self.loss.ratio_mask_high
        _require(0 <= low < 1 < high, "loss.ratio_mask_low/high", (low, high),
                 "need 0 <= low < 1 < high")  # fmt: skip
        _require(self.loss.beta >= 0, "loss.beta", self.loss.beta)
        self.model.validate()
        self.lora.validate()
        self.checkpoint.validate()

    def _check_sampling_filters(self) -> None:
        from rlvr.rollouts.request_args import SamplingFilterError, check_reproducible

        s = self.sampling
        try:
            check_reproducible({"top_p": s.top_p, "extra_body": s.extra_body}, "sampling")
        except SamplingFilterError as e:
            raise ConfigError(str(e)) from None

    @property
    def examples_per_step(self) -> int:
        return self.batch.batch_size // self.batch.rollouts_per_example

    @property
    def served_model(self) -> str:
        return self.server.served_model or self.model.name


@dataclass
class SFTDataConfig:
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


@dataclass
class SFTTrainConfig:
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
    `rlvr.trainer.micro_batches`."""
    eval_every: int = 0
    """val/loss every N steps (0: only before the first and after the last step)."""


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
        d, t = self.data, self.train
        _require(bool(d.train_files), "data.train_files", d.train_files, "name at least one file")
        _require(d.max_seq_len >= 2, "data.max_seq_len", d.max_seq_len, "must be at least 2")
        _require(d.validation_holdout >= 0, "data.validation_holdout", d.validation_holdout,
                 "must be >= 0")  # fmt: skip
        _require(not (d.validation_file and d.validation_holdout), "data.validation_holdout",
                 d.validation_holdout, "cannot be combined with data.validation_file")  # fmt: skip
        if d.max_examples is not None:
            _require(d.max_examples >= 1, "data.max_examples", d.max_examples)
        _require(t.epochs >= 1, "train.epochs", t.epochs)
        if t.max_steps is not None:
            _require(t.max_steps >= 1, "train.max_steps", t.max_steps)
        _require(t.batch_size >= 1, "train.batch_size", t.batch_size)
        _require(t.micro_batch_size >= 1, "train.micro_batch_size", t.micro_batch_size)
        _require(t.eval_every >= 0, "train.eval_every", t.eval_every, "must be >= 0")
        self.optim.validate()
        self.model.validate()
        self.lora.validate()
        self.checkpoint.validate()
        self.distributed.validate()


AnyConfig = TypeVar("AnyConfig", Config, SFTConfig)


def _require(ok: bool, name: str, value: Any, why: str = "must be positive") -> None:
    if not ok:
        raise ConfigError(f"{name}={value!r}: {why}")


def _type_name(hint: Any) -> str:
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")


def _coerce(value: Any, hint: Any, name: str) -> Any:
    """Check `value` against the type hint `hint`, converting only where it is lossless
    (int -> float). Returns the checked value or raises ConfigError naming `name`."""
    origin = typing.get_origin(hint)
    if hint is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        if value is None and type(None) in options:
            return None
        for option in options:
            if option is type(None):
                continue
            try:
                return _coerce(value, option, name)
            except ConfigError:
                continue
        raise ConfigError(f"{name}={value!r}: expected {_type_name(hint)}")
    if origin is Literal:
        if value not in typing.get_args(hint):
            raise ConfigError(f"{name}={value!r}: choose one of {list(typing.get_args(hint))}")
        return value
    if origin is list:
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{name}={value!r}: expected a list")
        (item,) = typing.get_args(hint)
        return [_coerce(v, item, f"{name}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{name}={value!r}: expected a mapping")
        return dict(value)
    if dataclasses.is_dataclass(hint):
        return from_dict(hint, value, name)
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint is bool and not isinstance(value, bool):
        raise ConfigError(f"{name}={value!r}: expected true or false")
    if hint is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise ConfigError(f"{name}={value!r}: expected an integer")
    if not isinstance(value, hint):
        raise ConfigError(f"{name}={value!r}: expected {_type_name(hint)}")
    return value


def from_dict(cls: type, data: Any, prefix: str = "") -> Any:
    """Build dataclass `cls` from a mapping, rejecting unknown keys by their dotted name.

    A section given only in part keeps its other fields at the defaults of the config that
    holds it (SFTConfig's `optim` defaults differ from OptimConfig's own)."""
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix or 'config'}: expected a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        where = f"{prefix}." if prefix else ""
        raise ConfigError(
            f"unknown config key {where}{unknown[0]}; known keys here: {', '.join(sorted(fields))}"
        )
    kwargs = {}
    for key, value in data.items():
        default = fields[key].default_factory
        section = dataclasses.is_dataclass(hints[key]) and default is not dataclasses.MISSING
        if section and isinstance(value, dict):
            value = {**dataclasses.asdict(default()), **value}
        kwargs[key] = _coerce(value, hints[key], f"{prefix}.{key}" if prefix else key)
    return cls(**kwargs)


def parse_override(item: str) -> tuple[list[str], Any]:
    """`a.b=value` -> (["a", "b"], parsed value). Values are YAML: `1e-5`, `true`, `[a, b]`."""
    if "=" not in item:
        raise ConfigError(f"override {item!r} is not of the form dotted.key=value")
    key, raw = item.split("=", 1)
    key = key.strip().removeprefix("--").replace("-", "_")
    if not key:
        raise ConfigError(f"override {item!r} has an empty key")
    value = yaml.safe_load(raw) if raw.strip() else ""
    # YAML reads 1e-5 as a string (it wants 1.0e-5); numbers are what people mean.
    if isinstance(value, str):
        try:
            value = float(value) if any(c in value.lower() for c in ".e") else value
        except ValueError:
            pass
    return key.split("."), value


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """Set each dotted override in a nested dict (a copy); `env.args.x=1` creates mappings."""
    out = _deepcopy(data)
    for item in overrides:
        path, value = parse_override(item)
        node = out
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override {item!r}: {part} is not a section")
            node = child
        node[path[-1]] = value
    return out


def _deepcopy(data: Any) -> Any:
    if isinstance(data, dict):
        return {k: _deepcopy(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_deepcopy(v) for v in data]
    return data


def load_config(
    path: str | Path | None = None,
    overrides: list[str] | None = None,
    cls: type[AnyConfig] = Config,
) -> AnyConfig:
    """Read an optional YAML file, apply dotted overrides, type-check and validate a `cls`."""
    data: dict = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file {path} does not exist")
        data = yaml.safe_load(path.read_text()) or {}
        if not isinstance(data, dict):
            raise ConfigError(f"config file {path} must hold a mapping at the top level")
    data = apply_overrides(data, overrides or [])
    config = from_dict(cls, data)
    config.validate()
    return config


def to_dict(config: Config | SFTConfig) -> dict:
    return dataclasses.asdict(config)


def to_yaml(config: Config | SFTConfig) -> str:
    return yaml.safe_dump(to_dict(config), sort_keys=False, default_flow_style=False)


def save_config(config: Config | SFTConfig, path: str | Path) -> None:
    """Write the full resolved config beside the run's outputs (atomically)."""
    atomic_write_text(Path(path), to_yaml(config))
