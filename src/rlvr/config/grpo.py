"""The GRPO run's configuration, `Config`, and the sections only GRPO has.

Each section checks its own values in `validate()`; `Config.validate` calls them and holds only
the checks that span sections. Field reference: docs/training.md#configuration.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from rlvr.config.checks import require
from rlvr.config.distill import DistillConfig
from rlvr.config.env_server import EnvServerConfig
from rlvr.config.sampling import SamplingConfig
from rlvr.config.sections import (
    CheckpointConfig,
    DistributedConfig,
    LoraConfig,
    ModelConfig,
    OptimConfig,
    WandbConfig,
    check_quantized_base,
)
from rlvr.config.server import ServerConfig


@dataclass
class EnvConfig:
    """`env.*`: which verifiers environment to train on, and its arguments."""

    id: str = "vf-deepscaler"
    """Environment id, as for `verifiers.load_environment` (module `vf_x` for `vf-x`)."""
    args: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments for the environment's `load_environment`."""


@dataclass
class MixtureEnvConfig:
    """One item of `envs:`, a mixture's environment: `env.*` plus its share of the groups and
    its own reply length and eval size."""

    id: str
    """Environment id, as for `env.id`."""
    args: dict[str, Any] = field(default_factory=dict)
    weight: float = 1.0
    """Its share of each step's groups: weight / the sum of the weights."""
    name: str | None = None
    """Its name in metrics (`env/<name>/reward`, `eval/<name>/...`) and sample tables
    (default: the id)."""
    max_tokens: int | None = None
    """Most tokens per model turn for this environment (None: `sampling.max_tokens`, else the
    environment's own default)."""
    eval_examples: int | None = None
    """Eval examples of this environment (None: `eval.num_examples`)."""
    env_server: EnvServerConfig = field(default_factory=EnvServerConfig)
    """A verifiers 0.4 taskset through its EnvServer (`id` is then only its name)."""

    @property
    def label(self) -> str:
        return self.name or self.id

    def validate(self, where: str) -> None:
        """A positive weight, a name without '/' and, if set, a positive reply length and eval
        size; `where` is the entry's dotted name (`envs[i]`)."""
        require(self.weight > 0, f"{where}.weight", self.weight)
        for key in ("max_tokens", "eval_examples"):
            value = getattr(self, key)
            require(value is None or value >= 1, f"{where}.{key}", value, "must be >= 1 or null")
        require("/" not in self.label, f"{where}.name", self.label, "may not contain '/'")
        self.env_server.validate(f"{where}.env_server")


@dataclass
class BatchConfig:
    """`batch.*`: the size of a step, its micro-batches and the off-policy lag."""

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
    before the first step (rlvr.trainer.memory). None: only micro_batch_size bounds
    micro-batches."""
    packing: bool = False
    """Pack short samples together into rows as wide as the step's longest sample (attention
    stays within each sample), instead of padding every sample to that width. Same loss,
    less padding; pays with attn_implementation=flash_attention_2, slower with sdpa on a CPU
    (see `rlvr.layout.micro_batches`)."""
    prefix_sharing: bool = True
    """Forward each token prefix that several samples share (a group's prompt, a rollout's
    earlier turns) once, in a prefix tree whose attention keeps samples apart: the same
    log-probabilities and gradients for fewer tokens. Applies with attn_implementation sdpa
    (the default; a dense mask) or flex_attention (GPUs, no dense mask), on steps where it
    saves enough tokens to pay (see `rlvr.layout.plan`); false: every sample on its own."""
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
    dynamic_sampling: bool = False
    """Replace groups without signal (all rewards equal, or too many errored) with groups of
    fresh prompts, generated by the same policy, until every group of the step has signal or
    `max_refill_rounds` rounds are spent (DAPO's dynamic sampling)."""
    max_refill_rounds: int = 3
    """Most refill rounds per step under `dynamic_sampling`; groups still without signal then
    stay in the batch (they get zero advantage)."""

    def validate(self) -> None:
        require(
            self.rollouts_per_example >= 1, "batch.rollouts_per_example", self.rollouts_per_example
        )
        per_example = self.rollouts_per_example
        require(
            self.batch_size >= 1 and self.batch_size % per_example == 0,
            "batch.batch_size",
            self.batch_size,
            f"must be a positive multiple of batch.rollouts_per_example ({per_example})",
        )
        for name in ("micro_batch_size", "micro_batch_tokens"):
            value = getattr(self, name)
            require(value is None or value >= 1, f"batch.{name}", value, "must be >= 1 or null")
        require(
            bool(self.micro_batch_size or self.micro_batch_tokens),
            "batch.micro_batch_tokens",
            None,
            "set it or batch.micro_batch_size: nothing would bound a micro-batch",
        )
        require(self.async_level >= 0, "batch.async_level", self.async_level, "must be >= 0")
        rounds = self.max_refill_rounds
        require(rounds >= 0, "batch.max_refill_rounds", rounds, "must be >= 0")
        require(
            0 <= self.max_errored_frac <= 1,
            "batch.max_errored_frac",
            self.max_errored_frac,
            "must be between 0 and 1",
        )
        require(
            self.max_prompt_len < self.max_seq_len,
            "batch.max_prompt_len",
            self.max_prompt_len,
            f"must be below batch.max_seq_len ({self.max_seq_len})",
        )


@dataclass
class LossConfig:
    """`loss.*`: advantages and the policy-gradient loss."""

    scale_rewards: bool = True
    """Divide group-relative advantages by the group's reward std (GRPO); False = Dr. GRPO."""
    drop_zero_variance: bool = False
    """Drop groups whose rewards are all equal (they carry no signal); always counted."""
    ratio_mask_low: float = 0.125
    """Tokens whose trainer/sampler probability ratio is below this get no loss."""
    ratio_mask_high: float = 8.0
    """Tokens whose trainer/sampler probability ratio is above this get no loss."""
    clip_low: float | None = None
    """PPO-style clipping of the ratio to [1-clip_low, 1+clip_high]; None disables it. A wider
    upper bound (clip_high > clip_low, e.g. 0.2 and 0.28) is DAPO's clip-higher."""
    clip_high: float | None = None
    beta: float = 0.0
    """Weight of the KL penalty to the reference (initial) model; 0 skips the reference pass."""
    aggregation: Literal["token_mean", "seq_mean_token_mean", "constant"] = "token_mean"
    """How token losses add up (docs/training.md#loss-choices): `token_mean` divides their sum
    by the step's loss tokens (DAPO), `seq_mean_token_mean` averages each rollout's tokens and
    then the rollouts (GRPO), `constant` divides by rollouts x `constant_tokens` (Dr. GRPO); a
    rollout of several samples counts once."""
    constant_tokens: int | None = None
    """`aggregation=constant`'s tokens per sequence (None: batch.max_seq_len)."""
    ratio_level: Literal["token", "sequence"] = "token"
    """`sequence`: every token of a rollout takes the geometric mean of its rollout's
    trainer/sampler ratios, clipped and masked per rollout (GSPO)."""
    correction: Literal["token_mask", "sequence_mask", "tis"] = "token_mask"
    """The off-policy correction: `token_mask` drops tokens whose ratio leaves
    [ratio_mask_low, ratio_mask_high] (as IcePop does); `sequence_mask` drops whole rollouts
    whose geometric-mean ratio does (sequence-level masked importance sampling, MIS); `tis`
    weighs each token by its ratio truncated at
    `tis_cap` and drops nothing (truncated importance sampling)."""
    tis_cap: float = 2.0
    """`correction=tis`'s truncation of the importance weight (inf: plain importance sampling)."""
    overlong_buffer: int = 0
    """DAPO's soft overlong punishment: a rollout whose longest model reply reaches into the
    last `overlong_buffer` tokens of its reply cap (max_tokens; a reply stopped at max_tokens
    reaches it, one cut to batch.max_seq_len is measured as generated) loses reward linearly,
    up to `overlong_penalty` at the cap, for its advantage only, centred in its group and not
    scaled by the rewards' std (logged rewards stay the environment's). 0: off."""
    overlong_penalty: float = 1.0
    """The reward a turn that hits its cap loses under `overlong_buffer`."""

    def validate(self) -> None:
        """The ratio mask, the KL weight, the aggregation's and the correction's own settings,
        and their combinations."""
        low, high = self.ratio_mask_low, self.ratio_mask_high
        require(
            0 <= low < 1 < high, "loss.ratio_mask_low/high", (low, high), "need 0 <= low < 1 < high"
        )
        require(self.beta >= 0, "loss.beta", self.beta)
        tokens = self.constant_tokens
        require(
            tokens is None or tokens >= 1, "loss.constant_tokens", tokens, "must be >= 1 or null"
        )
        require(self.tis_cap > 0, "loss.tis_cap", self.tis_cap)
        require(
            self.overlong_buffer >= 0, "loss.overlong_buffer", self.overlong_buffer, "must be >= 0"
        )
        require(
            self.overlong_penalty >= 0,
            "loss.overlong_penalty",
            self.overlong_penalty,
            "must be >= 0",
        )
        clipped = self.clip_low is not None or self.clip_high is not None
        require(
            not (self.correction == "tis" and clipped),
            "loss.correction",
            self.correction,
            "tis weighs each token by its ratio to the sampler, truncated and never dropped; "
            "clipping bounds the same ratio (with one update per batch there is no other) and "
            "would zero the gradient of the tokens beyond its bounds that tis means to weigh, "
            "common under async_level >= 1: unset loss.clip_low/clip_high",
        )


@dataclass
class RolloutsConfig:
    """`rollouts.*`: how the prompt of a rollout's later turns reaches the server."""

    token_in: bool = False
    """Send each later turn as token ids: the previous turn's prompt ids, its completion ids
    verbatim, then the new environment messages (tool results, user messages) rendered as the
    chat template renders them; the server generates from exactly those ids. A multi-turn
    rollout then trains as one sample even where the template rewrites earlier turns (Qwen3
    strips past `<think>` blocks) or re-tokenising a turn boundary differs. false: every turn's
    prompt is rendered from the messages by the server (such rollouts split into one sample
    per turn). See docs/training.md#token-in-multi-turn."""
    keep_thinking: Literal["all", "tool_calls"] = "all"
    """With token_in, what later turns keep of earlier turns' thinking. `all`: everything, as
    sampled (every turn extends the previous one). `tool_calls`: kept verbatim across tool
    results only; a turn after a new user message is rendered from the messages by the chat
    template, which may drop earlier thinking as the model was trained to see it (that turn
    starts a new sample)."""


@dataclass
class CurriculumConfig:
    """`curriculum.*`: fewer prompts the policy always solves or always fails."""

    enabled: bool = False
    """Track each example's pass rate (its last group's share of rollouts reaching
    `pass_threshold`) and use an example whose last group all passed or all failed only with
    chance `keep_prob` (prime-rl's difficulty pool)."""
    keep_prob: float = 0.25
    """The chance that a prompt judged solved or hopeless is used when its turn comes."""
    pass_threshold: float = 1.0
    """A rollout passes when its reward is at least this."""

    def validate(self) -> None:
        keep = self.keep_prob
        require(0 < keep <= 1, "curriculum.keep_prob", keep, "must be in (0, 1]")


@dataclass
class EvalConfig:
    """`eval.*`: periodic evaluation on the environment's eval set."""

    every: int = 0
    """Evaluate on the environment's eval set every N steps (0: never); also at the end."""
    num_examples: int = 32
    rollouts_per_example: int = 1
    """Rollouts of each example: k > 1 also logs pass@1, 2, 4, ... k (`eval/pass@k`)."""
    at_start: bool = False
    pass_threshold: float = 1.0
    """A rollout passes for pass@k when its reward is at least this."""


@dataclass
class LoggingConfig:
    """`logging.*`: what is logged per step besides the metrics."""

    samples_per_step: int = 4
    """Rows of the sample-rollout table logged per step (0: none)."""
    table_every: int = 10
    """Log the sample table every N steps."""
    mismatch_kl_warn: float = 1e-2
    """Warn when the sampler/trainer KL on sampled tokens exceeds this."""
    progress_bar: bool = True
    """A progress bar on the console; false prints one line a step instead (reward, the
    environment's metrics, mismatch-KL, step time), which reads better in a log file."""


@dataclass
class Config:
    """A GRPO run (scripts/train.py): every section, validated as a whole by `validate`."""

    env: EnvConfig = field(default_factory=EnvConfig)
    envs: list[MixtureEnvConfig] = field(default_factory=list)
    """A mixture of environments (docs/training.md#mixtures): each step's groups are drawn from
    them by weight. Empty: the one environment `env`."""
    env_server: EnvServerConfig = field(default_factory=EnvServerConfig)
    """A verifiers 0.4 taskset trained through its own EnvServer instead of `env`
    (docs/training.md#verifiers-04-environments)."""
    model: ModelConfig = field(default_factory=ModelConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    batch: BatchConfig = field(default_factory=BatchConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    curriculum: CurriculumConfig = field(default_factory=CurriculumConfig)
    rollouts: RolloutsConfig = field(default_factory=RolloutsConfig)
    distill: DistillConfig = field(default_factory=DistillConfig)
    """On-policy distillation from a served teacher (docs/training.md#on-policy-distillation)."""
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    wandb: WandbConfig = field(default_factory=WandbConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    server: ServerConfig = field(default_factory=ServerConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    max_steps: int = 100
    seed: int = 0
    output_dir: str = "outputs/run"

    def validate(self) -> None:
        """Each section's own checks, and those that span sections."""
        self.batch.validate()
        require(self.max_steps >= 1, "max_steps", self.max_steps)
        self.optim.validate()
        self.sampling.validate()
        self._check_mixture()
        self.server.validate()
        self.distributed.validate()
        self.loss.validate()
        self.distill.validate()
        self.curriculum.validate()
        self.model.validate()
        self.lora.validate()
        check_quantized_base(self.model, self.lora)
        self.checkpoint.validate()

    def _check_mixture(self) -> None:
        """`envs:` replaces `env:`, `env_server:` replaces `env:` (in a mixture, an entry's own);
        each environment needs a name of its own and its own checks."""
        if self.env_server.enabled:
            require(
                self.env == EnvConfig() and not self.envs,
                "env_server.taskset",
                self.env_server.taskset,
                "replaces env: leave env and envs unset (in a mixture, set envs[i].env_server)",
            )
            self.env_server.validate()
        if not self.envs:
            return
        require(
            self.env == EnvConfig(),
            "env",
            self.env.id,
            "set env or envs, not both (envs lists every environment of a mixture)",
        )
        labels = [e.label for e in self.envs]
        require(
            len(set(labels)) == len(labels), "envs", labels, "give each environment its own name"
        )
        for i, entry in enumerate(self.envs):
            entry.validate(f"envs[{i}]")

    @property
    def env_label(self) -> str:
        """The run's environment for messages: its id, or the mixture's names."""
        if self.env_server.enabled:
            return self.env_server.taskset
        if not self.envs:
            return self.env.id
        return "mixture of " + ", ".join(e.label for e in self.envs)

    @property
    def examples_per_step(self) -> int:
        return self.batch.batch_size // self.batch.rollouts_per_example

    @property
    def served_model(self) -> str:
        return self.server.served_model or self.model.name
