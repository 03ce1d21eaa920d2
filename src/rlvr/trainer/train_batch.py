"""A step's rollouts -> what it trains on (`build_train_batch`): group advantages on the samples,
the rollout metrics, and the rows of the sample table."""

from __future__ import annotations

from typing import Any

from rlvr.batch import GroupResult, RolloutResult, Sample, StepBatch, TrainBatch
from rlvr.config import Config
from rlvr.finite import metric_means
from rlvr.reasoning_vocab.hooks import PolicyHooks
from rlvr.rollouts.curriculum import curriculum_metrics
from rlvr.trainer.advantages import distill_advantages, group_advantages, overlong_penalty
from rlvr.trainer.metrics import distribution, mean


def build_train_batch(
    batch: StepBatch, cfg: Config, hooks: PolicyHooks | None = None
) -> TrainBatch:
    """The samples of every group that may train, each scored with its rollout's advantage.

    Groups where more than `batch.max_errored_frac` of the rollouts errored get no loss;
    groups whose environment rewards are all equal (counted in `rollouts/zero_variance_groups`
    whatever their overlong penalties) are dropped when `loss.drop_zero_variance`, unless a
    teacher grades them (`distill:`: its per-token term carries signal there too). Pure
    distillation (`distill.rewards=false`) trains on the teacher's term alone. The rollouts
    keep their own samples: the advantages go on new ones (`rollout_samples`)."""
    hooks = hooks or PolicyHooks()
    limit = cfg.batch.max_errored_frac
    groups = [g for g in batch.groups if g.rollouts and not g.too_errored(limit)]
    penalties = [[overlong_penalty(r, g.reply_cap, cfg.loss) for r in g.rollouts] for g in groups]
    rewards = [[r.reward for r in g.rollouts] for g in groups]
    advantages, flat = group_advantages(rewards, cfg.loss.scale_rewards, penalties)
    distill = cfg.distill.coef if cfg.distill.enabled else None
    if distill is not None and not cfg.distill.rewards:  # pure distillation
        advantages = [[0.0] * len(group) for group in advantages]
    samples: list[Sample] = []
    scored: list[tuple[RolloutResult, float, str | None]] = []
    dropped = 0
    for group, group_adv, is_flat in zip(groups, advantages, flat, strict=True):
        if is_flat and cfg.loss.drop_zero_variance and distill is None:
            dropped += 1
            continue
        for rollout, adv in zip(group.rollouts, group_adv, strict=True):
            samples += rollout_samples(rollout, adv, len(scored), distill)
            scored.append((rollout, adv, group.env))
    kept = {
        "rollouts/zero_variance_groups": sum(flat),
        "rollouts/dropped_groups": dropped,
        "rollouts/dropped_errored_groups": sum(g.too_errored(limit) for g in batch.groups),
    }
    metrics = rollout_metrics(batch, kept, len(samples))
    if cfg.loss.overlong_buffer:
        metrics["rollouts/overlong_penalty"] = mean([p for ps in penalties for p in ps])
    if distill is not None:
        metrics.update(distill_metrics(samples, batch))
    metrics.update(mixture_metrics(batch.groups))
    metrics.update(hooks.rollout_metrics(s for r in batch.rollouts for s in r.samples))
    if batch.curriculum_state is not None:
        metrics.update(curriculum_metrics(batch.curriculum_state, batch.set_aside_prompts))
    table = [table_row(r, adv, env) for r, adv, env in scored[: cfg.logging.samples_per_step]]
    return TrainBatch(samples, metrics, table, batch.data_position)


def rollout_samples(
    rollout: RolloutResult, advantage: float, index: int, distill: float | None = None
) -> list[Sample]:
    """`rollout`'s samples scored with `advantage`, each marked as part of the step's rollout
    `index` with the rollout's loss tokens (the per-sequence losses reduce over rollouts);
    with a distillation coefficient `distill`, each token also gains the teacher's term."""
    tokens = sum(s.num_loss_tokens for s in rollout.samples)
    return [
        s.scored(
            advantage,
            index,
            tokens,
            None if distill is None else distill_advantages(s, distill),
        )
        for s in rollout.samples
    ]


def distill_metrics(samples: list[Sample], batch: StepBatch) -> dict[str, float]:
    """The teacher's view of the step's trained tokens: `distill/reverse_kl` (the mean over
    loss tokens of log pi_sampler - log pi_teacher at the sampled token, an estimate of the
    reverse KL), `distill/advantage_abs` (the mean size of the distillation term per token),
    `distill/teacher_seconds` (its scoring requests' time, summed) and
    `distill/teacher_wait_s` (how much later the batch was ready than its last group was
    generated: `rlvr.trainer.metrics.distill_wait` makes it a share of the step)."""
    gaps: list[float] = []
    terms: list[float] = []
    for s in samples:  # every one graded: `distill_advantages` refuses a sample without scores
        rows = zip(
            s.loss_mask, s.sampler_logprobs, s.teacher_logprobs, s.token_advantages, strict=True
        )
        for m, sampler, graded, term in rows:
            if m:
                gaps.append(sampler - graded)
                terms.append(abs(term))
    return {
        "distill/reverse_kl": mean(gaps),
        "distill/advantage_abs": mean(terms),
        "distill/teacher_seconds": batch.teacher_s,
        "distill/teacher_wait_s": batch.teacher_wait_s,
    }


def rollout_metrics(batch: StepBatch, kept: dict[str, int], samples: int) -> dict[str, float]:
    """The step's rewards, environment metrics (`env/`), rollout and group counts (`kept`: how
    many groups were dropped, and why) and generation time."""
    rollouts = batch.rollouts
    gen_tokens = batch.completion_tokens
    return {
        **distribution("reward", [r.reward for r in rollouts]),
        **dict(sorted(metric_means([r.metrics for r in rollouts], "env").items())),
        "rollouts/count": len(rollouts),
        "rollouts/errored": batch.errored,
        "rollouts/truncated": sum(r.truncated for r in rollouts),
        **kept,
        "rollouts/skipped_long_prompts": batch.skipped_prompts,
        "rollouts/samples": samples,
        "rollouts/completion_tokens": gen_tokens,
        "rollouts/completion_len": gen_tokens / max(len(rollouts), 1),
        "rollouts/turns": mean([r.num_turns for r in rollouts]),
        "rollouts/policy_lag": batch.step - batch.min_policy_version,
        "rollouts/policy_lag_min": batch.step - batch.newest_policy_version,
        "batch/refill_groups": batch.refill_groups,
        "batch/zero_signal_frac": batch.zero_signal_groups
        / max(len(batch.groups) + batch.refill_groups, 1),
        "time/generate": batch.generate_s,
        "throughput/gen_tokens_per_s": gen_tokens / max(batch.generate_s, 1e-9),
    }


def mixture_metrics(groups: list[GroupResult]) -> dict[str, float]:
    """A mixture's step per environment (`env/<name>/`): its groups, completion tokens per
    rollout, rewards and its rubric's metrics; empty outside a mixture."""
    names = sorted({g.env for g in groups if g.env is not None})
    metrics: dict[str, float] = {}
    for name in names:
        rollouts = [r for g in groups if g.env == name for r in g.rollouts]
        metrics[f"env/{name}/groups"] = sum(g.env == name for g in groups)
        metrics[f"env/{name}/completion_len"] = mean([r.completion_tokens for r in rollouts])
        metrics.update(distribution(f"env/{name}/reward", [r.reward for r in rollouts]))
        metrics.update(metric_means([r.metrics for r in rollouts], f"env/{name}"))
    return metrics


def table_row(rollout: RolloutResult, advantage: float, env: str | None = None) -> dict[str, Any]:
    """One row of the sample table (`samples.jsonl`, W&B's `samples`); a mixture's rows name
    their environment."""
    return {
        **({"env": env} if env is not None else {}),
        "example_id": rollout.example_id,
        "prompt": rollout.prompt_text,
        "completion": rollout.completion_text,
        "answer": rollout.answer,
        "reward": rollout.reward,
        "advantage": advantage,
    }
