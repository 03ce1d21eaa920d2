"""The nouns of one training step, in data-flow order, on the ground floor for every floor to share:
RolloutResult   one finished, scored rollout and its token samples (rlvr.rollouts)
GroupResult     the rollouts of one prompt, and how many errored      (rlvr.rollouts)
StepBatch       every group of one step, as the rollout worker hands it over
TrainBatch      the samples a step trains on, advantages set, and its rollout metrics
Sample / Row    one token sequence exactly as vLLM saw it; samples laid end to end
MicroBatch      rows as tensors, ready for a forward pass                (rlvr.layout)
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

import torch


@dataclass(frozen=True)
class Sample:
    """One token sequence with a loss mask that is 1 only on tokens the policy sampled.

    The trainer never re-tokenizes text, so the ids, the mask and the sampler's log-probabilities
    cannot drift apart. SFT reuses samples: its mask marks the assistant's tokens (see
    `rlvr.data.sft_rows`) and the sampler fields stay zero."""

    input_ids: list[int]
    loss_mask: list[int]
    """1 where the token was sampled by the policy (gets loss), 0 for prompt/env tokens."""
    sampler_logprobs: list[float]
    """vLLM's log-probability of each token where loss_mask is 1 (0.0 elsewhere)."""
    advantage: float = 0.0
    rollout: int | None = None
    """The index of the step's rollout this sample is part of (a multi-turn rollout may be
    several samples); None: a rollout of its own."""
    rollout_tokens: int | None = None
    """Loss tokens of the whole rollout, over all its samples; None: this sample's own."""
    teacher_logprobs: list[float] | None = None
    """On-policy distillation: the teacher's log-probability of each token where loss_mask is
    1 (0.0 elsewhere), scored on exactly these ids (`rlvr.distill.teacher`); None: no teacher."""
    token_advantages: list[float] | None = None
    """A per-token term added to `advantage` (distillation's, `rlvr.trainer.advantages`);
    None: `advantage` alone."""

    def __post_init__(self) -> None:
        lengths = {
            "ids": len(self.input_ids),
            "mask": len(self.loss_mask),
            "logprobs": len(self.sampler_logprobs),
            "teacher logprobs": len(self.teacher_logprobs or self.input_ids),
            "token advantages": len(self.token_advantages or self.input_ids),
        }
        if len(set(lengths.values())) > 1:
            told = ", ".join(f"{name} {n}" for name, n in lengths.items())
            raise ValueError(f"sample fields differ in length: {told}")

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def num_loss_tokens(self) -> int:
        return sum(self.loss_mask)

    def with_advantage(self, advantage: float) -> Sample:
        """This sample scored with `advantage` (a new sample: rollouts keep their own)."""
        return replace(self, advantage=advantage)

    def scored(
        self,
        advantage: float,
        rollout: int,
        rollout_tokens: int,
        token_advantages: list[float] | None = None,
    ) -> Sample:
        """This sample with `advantage` (plus `token_advantages`, per token), as part of the
        step's rollout `rollout` of `rollout_tokens` loss tokens (a new sample: rollouts keep
        their own)."""
        return replace(
            self,
            advantage=advantage,
            rollout=rollout,
            rollout_tokens=rollout_tokens,
            token_advantages=token_advantages,
        )

    @property
    def carries_advantage(self) -> bool:
        """Some loss token of this sample has a non-zero advantage."""
        if not self.num_loss_tokens:
            return False
        if self.advantage != 0.0:
            return True
        if self.token_advantages is None:
            return False
        pairs = zip(self.token_advantages, self.loss_mask, strict=True)
        return any(a != 0.0 for a, m in pairs if m)

    @property
    def rollout_loss_tokens(self) -> int:
        """Loss tokens of the rollout this sample is part of."""
        return self.num_loss_tokens if self.rollout_tokens is None else self.rollout_tokens


Row = list[Sample]
"""Samples laid end to end in one row of a micro-batch."""


@dataclass
class MicroBatch:
    """Rows right-padded to the widest, as tensors.

    `loss_mask`, `sampler_logprobs` and `advantages` are aligned with next-token predictions:
    column i describes token i+1 of `input_ids` (the first token of each sample is never
    predicted). Built by `rlvr.layout.micro_batches.collate`."""

    input_ids: torch.Tensor
    loss_mask: torch.Tensor
    sampler_logprobs: torch.Tensor
    advantages: torch.Tensor
    attention_mask: torch.Tensor
    """1 on tokens, 0 on padding (what the model need not see: see `model_inputs`)."""
    position_ids: torch.Tensor | None = None
    """Positions restarting at 0 where each sample starts; the padding after the last sample
    of a row counts as a sample of its own, so nothing attends to it or from it."""
    sequence_ids: torch.Tensor | None = None
    """[B, T-1] which of the micro-batch's rollouts each prediction belongs to (0, 1, ...: the
    samples of one rollout share an id; the padding has an id of its own), for the losses that
    reduce per sequence (`rlvr.trainer.loss`)."""
    rollout_tokens: torch.Tensor | None = None
    """[B, T-1] the loss tokens of each prediction's whole rollout, over every micro-batch and
    rank (`Sample.rollout_loss_tokens`)."""

    @property
    def num_loss_tokens(self) -> int:
        return int(self.loss_mask.sum().item())

    def model_inputs(self) -> dict[str, torch.Tensor]:
        """Keyword arguments for the model's forward.

        No attention mask: under causal attention no token sees the padding after it, and the
        loss never reads the padding's outputs, so attention takes its causal fast path.
        transformers builds packed rows' block-diagonal mask from the position ids."""
        if self.position_ids is not None:
            return {"input_ids": self.input_ids, "position_ids": self.position_ids}
        return {"input_ids": self.input_ids}

    def prediction_states(self, hidden: torch.Tensor, select: torch.Tensor) -> torch.Tensor:
        """The final hidden states [n, H] that make the predictions `select` [B, T-1] picks,
        from the forward's `hidden` [B, T, H] (a folded micro-batch gathers them instead:
        `rlvr.layout.prefix_tree`)."""
        return hidden[:, :-1][select]

    def to(self, device: torch.device | str) -> MicroBatch:
        fields = vars(self).items()
        return type(self)(**{k: v.to(device) if torch.is_tensor(v) else v for k, v in fields})


@dataclass
class RolloutResult:
    """One finished rollout, reduced to what training and logging need."""

    example_id: int
    reward: float
    metrics: dict[str, float]
    samples: list[Sample]
    truncated: bool
    num_turns: int
    completion_tokens: int
    prompt_text: str
    completion_text: str
    answer: str = ""
    longest_reply: int = 0
    """Tokens of the rollout's longest model reply as generated, before any cut to
    `max_seq_len` (the overlong penalty's length)."""
    capped_reply: bool = False
    """Some model reply stopped at its token limit (finish reason length): the overlong
    penalty counts it as reaching its reply cap. A reply that stopped on its own is measured
    by its length, even where its turn was cut to `max_seq_len` after a long prompt."""


@dataclass
class GroupResult:
    """The rollouts of one prompt that finished without error, and how many errored."""

    rollouts: list[RolloutResult]
    errored: int = 0
    errors: list[str] = field(default_factory=list)
    env: str | None = None
    """The mixture environment the group ran in (`rlvr.rollouts.mixture`); None outside one."""
    reply_cap: int | None = None
    """The most tokens a model turn could take (the requests' max_tokens)."""

    def too_errored(self, max_errored_frac: float) -> bool:
        """More than `max_errored_frac` of the group's rollouts errored: it gets no loss."""
        return self.errored > max_errored_frac * (len(self.rollouts) + self.errored)

    def carries_signal(self, max_errored_frac: float) -> bool:
        """The group trains: not too errored, and its rewards are not all equal."""
        rewards = [r.reward for r in self.rollouts]
        return not self.too_errored(max_errored_frac) and not rewards_equal(rewards)


def rewards_equal(rewards: list[float]) -> bool:
    """A group whose rewards are all equal (or that has fewer than two) has zero advantage
    everywhere: it teaches nothing."""
    return len(rewards) < 2 or max(rewards) - min(rewards) <= 1e-12


@dataclass
class StepBatch:
    """All groups for one training step, with the bookkeeping the logs need."""

    step: int
    groups: list[GroupResult]
    data_position: int
    """Position in the prompt order after this batch (where the next batch starts)."""
    skipped_prompts: int
    """Rows passed over because their prompt is longer than batch.max_prompt_len."""
    generate_s: float
    """Wall time from starting the step's rollouts to the last group finishing."""
    min_policy_version: int
    """The weight version the server held when these rollouts started: under adapter sync the
    version that generated all of them; merged pushes may change the weights mid-batch."""
    errors: list[str] = field(default_factory=list)
    max_policy_version: int | None = None
    """The newest weight version that may have served some of these rollouts: a merged push
    that began before the batch finished serves its later requests (and the rest of any
    completion in progress) under the same name. None (a batch saved before this field
    existed): `min_policy_version`."""
    refill_groups: int = 0
    """Groups generated to replace groups without signal (`batch.dynamic_sampling`)."""
    zero_signal_groups: int = 0
    """Groups generated for this step, refills included, that carried no signal."""
    set_aside_prompts: int = 0
    """Rows the difficulty curriculum passed over (`rlvr.rollouts.curriculum`)."""
    curriculum_state: dict[int, float] | None = None
    """The curriculum's pass-rate estimates once this batch was generated (None: off)."""
    retried_groups: int = 0
    """Groups run again from the start because their server failed under them."""
    request_errors: int = 0
    """Requests that failed on two servers, or twice on the only one: blamed on the request
    (the rollout errored), not on a server (`rlvr.rollouts.router`)."""
    servers: dict[str, float] = field(default_factory=dict)
    """Per-server metrics of its generation (`servers/<i>/*`, `rlvr.rollouts.servers`)."""
    teacher_s: float = 0.0
    """On-policy distillation: seconds of the teacher's scoring requests, summed."""
    teacher_wait_s: float = 0.0
    """How much later the batch was ready than its last group was generated: the time spent
    waiting for the teacher alone (its scoring otherwise runs beside generation)."""

    @property
    def newest_policy_version(self) -> int:
        """The newest weight version that may have served these rollouts."""
        newest = self.max_policy_version
        return self.min_policy_version if newest is None else newest

    @property
    def rollouts(self) -> list[RolloutResult]:
        return [r for g in self.groups for r in g.rollouts]

    @property
    def errored(self) -> int:
        return sum(g.errored for g in self.groups)

    @property
    def completion_tokens(self) -> int:
        return sum(r.completion_tokens for r in self.rollouts)


@dataclass
class TrainBatch:
    """What every rank trains on at one step: the samples with their advantages, the step's
    rollout metrics, the sample-table rows, and where the next step's prompts start."""

    samples: list[Sample]
    metrics: dict[str, float]
    table: list[dict[str, Any]]
    data_position: int

    # Counted once per step (the step reads them several times; every sample's mask is
    # summed to count them).
    @cached_property
    def loss_tokens(self) -> int:
        """Loss tokens of the whole step (the loss's normaliser under `token_mean`)."""
        return sum(s.num_loss_tokens for s in self.samples)

    @cached_property
    def has_signal(self) -> bool:
        """Some loss token carries a non-zero advantage; without one the policy-gradient loss
        and its gradient are exactly 0."""
        return any(s.carries_advantage for s in self.samples)

    @cached_property
    def loss_sequences(self) -> int:
        """Rollouts with at least one loss token (G of the per-sequence aggregations: a
        rollout of several samples counts once)."""
        keys = {
            ("rollout", s.rollout) if s.rollout is not None else ("sample", i)
            for i, s in enumerate(self.samples)
            if s.num_loss_tokens
        }
        return len(keys)

    @cached_property
    def tokens(self) -> int:
        return sum(len(s) for s in self.samples)
