"""One prompt's group of rollouts, generated and scored together (`run_group`)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from rlvr.batch import GroupResult, RolloutResult
from rlvr.config.sampling import SamplingFilterError
from rlvr.rollouts.to_samples import (
    MissingTokensError,
    NonFiniteRewardError,
    is_v1,
    rollout_result,
)

log = logging.getLogger(__name__)


class EnvironmentDown(RuntimeError):
    """An environment that can run no rollout any more (its server died and was restarted as
    often as allowed): the run stops, naming why, instead of training steps of errors."""


class EveryRolloutErroredError(RuntimeError):
    """Every rollout of a training step errored (after any refills): nothing can train, and a
    run that went on would train nothing step after step. The message holds the first errors."""

    def __init__(self, step: int, errors: list[str]):
        first = "; ".join(dict.fromkeys(errors[:10]))[:2000]
        super().__init__(
            f"step {step}: every one of its {len(errors)} rollouts errored, so nothing can "
            f"train; the first errors: {first}"
        )


def error_text(error: Any) -> str:
    """What an errored rollout says: the error and the chain of its causes (verifiers wraps a
    model's failure in a `ModelError` of its own that says nothing by itself)."""
    if not isinstance(error, BaseException):
        return repr(error)
    parts = []
    while error is not None and len(parts) < 4:
        parts.append(f"{type(error).__name__}: {error}" if str(error) else type(error).__name__)
        error = error.__cause__ or error.__context__
    return " <- ".join(parts)


def environment_name(env: Any) -> str:
    """The name that identifies `env` in warnings: its verifiers id, else its class."""
    return getattr(env, "env_id", "") or type(env).__name__


def scores_own_rollouts(env: Any) -> bool:
    """True for a verifiers v1 `Env` (`vf.Env(taskset, harness)`): its harness scores each
    rollout inside `env.rollout`, and its rubric is an empty placeholder whose `score_group`
    would reset every reward to 0. Also true for an environment that says so
    (`scores_own_rollouts = True`: a 0.4 taskset scored on its EnvServer)."""
    return is_v1(env, "Env") or getattr(type(env), "scores_own_rollouts", False) is True


class UnsupportedEnvironmentError(ValueError):
    """An environment the trainer cannot run faithfully (raised when it is loaded)."""


def check_rollout_stage_only(env: Any) -> None:
    """Raise UnsupportedEnvironmentError for a v1 Env that needs its group stage (group
    rewards, advantages, updates or cleanups, or a custom `Taskset.init_group`): `run_group`
    runs a v1 Env's rollouts one by one, each with its own sampling seed, so that stage
    would never run."""
    if scores_own_rollouts(env) and env.requires_group_rollouts:
        raise UnsupportedEnvironmentError(
            "a verifiers v1 environment with group-stage signals or handlers (or a custom "
            "Taskset.init_group) is not supported: the trainer runs and scores a v1 "
            "environment's rollouts one at a time"
        )


async def score(env: Any, states: list[dict], where: str) -> list[str]:
    """Score `states` together as the environment asks (a v1 Env has already scored them);
    returns one error per rollout when scoring itself raises (a group reward function that
    returns None or a string breaks verifiers' weighted sum), else none."""
    if not states or scores_own_rollouts(env):
        return []
    try:
        if env.score_rollouts:
            await env.rubric.score_group(states)
        else:
            await env.rubric.dummy_score_group(states)
    except Exception as e:
        message = f"{where}: scoring raised {type(e).__name__}: {e}"
        log.warning("%s; its %d rollouts count as errored", message, len(states))
        return [message] * len(states)
    return []


def results(
    states: list[dict], max_seq_len: int, mask_truncated: bool, where: str
) -> tuple[list[RolloutResult], list[str]]:
    """Each scored state as a `RolloutResult`, and an error for each whose reward is not a
    finite number (warned once per group, naming the environment, the row and the values)."""
    rollouts: list[RolloutResult] = []
    errors: list[str] = []
    bad: list[Any] = []
    for state in states:
        try:
            rollouts.append(rollout_result(state, max_seq_len, mask_truncated))
        except NonFiniteRewardError as e:
            errors.append(f"{where}: {e}")
            bad.append(state.get("reward"))
    if bad:
        log.warning(
            "%s: %d of %d rollouts have a reward that is not a finite number (%s); they count "
            "as errored rollouts (rollouts/errored) and never train, and the group gets no "
            "loss when more than batch.max_errored_frac of it errored",
            where,
            len(bad),
            len(states),
            ", ".join(map(repr, bad)),
        )
    return rollouts, errors


async def run_group(
    env: Any,
    client: Any,
    model: str,
    row: dict,
    sampling_args: list[dict[str, Any]],
    max_seq_len: int,
    mask_truncated: bool,
) -> GroupResult:
    """Generate and score one group (len(sampling_args) rollouts of `row`), as verifiers' group
    runner does but keeping the token trajectory (its public `run_group` drops it). A rollout
    that raises, errors or scores a non-finite reward is dropped and counted."""
    outcomes = await asyncio.gather(
        *(env.rollout(dict(row), client, model, args) for args in sampling_args),
        return_exceptions=True,
    )
    states = []
    errors = []
    for result in outcomes:
        if isinstance(result, MissingTokensError | SamplingFilterError | EnvironmentDown):
            raise result  # no rollout of this run could train: stop it, naming the cause
        if isinstance(result, BaseException):
            errors.append(error_text(result))
        elif result.get("error") is not None:
            errors.append(error_text(result["error"]))
        else:
            states.append(result)
    where = f"environment {environment_name(env)}, example_id {row.get('example_id')}"
    scoring_errors = await score(env, states, where)
    for state in states:
        await env.rubric.cleanup(state)
    rollouts: list[RolloutResult] = []
    if scoring_errors:
        errors += scoring_errors
    else:
        rollouts, reward_errors = results(states, max_seq_len, mask_truncated, where)
        errors += reward_errors
    return GroupResult(rollouts, errored=len(errors), errors=errors)
