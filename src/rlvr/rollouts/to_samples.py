"""Rollouts -> training samples: the token ids vLLM reported and the loss mask over them.

A multi-turn rollout stays one sample while each turn's prompt ids start with the previous turn's
prompt + completion ids (the environment's tokens between turns get loss mask 0); a turn that
breaks that prefix starts a new sample, so no turn trains on a context the sampler never saw.
The ids are exactly those vLLM reported, never re-tokenized text. Design:
docs/training.md#what-a-step-does and docs/training.md#token-in-multi-turn.
"""

from __future__ import annotations

import sys
from typing import Any, NamedTuple

from rlvr.batch import RolloutResult, Sample
from rlvr.finite import finite_number
from rlvr.messages import render_messages


class MissingTokensError(RuntimeError):
    """The server did not return token ids / logprobs, so nothing can be trained."""


class NonFiniteRewardError(ValueError):
    """A scored rollout's reward is NaN, infinite or not a number: an error of the
    environment, never a number to train on (the rollout counts as errored)."""


def trajectory_samples(trajectory: list[dict], max_seq_len: int) -> list[Sample]:
    """Turn a rollout's trajectory into samples (see the module docstring for when turns are
    merged). Loss mask 1 only on completion tokens the sampler produced (and that the
    environment's completion mask keeps); everything else, including every prompt, system,
    user and tool token, gets 0."""
    samples: list[Sample] = []
    ids: list[int] = []
    mask: list[int] = []
    logprobs: list[float] = []
    for turn, step in enumerate(trajectory):
        tokens = step.get("tokens")
        if tokens is None:
            raise MissingTokensError(
                f"turn {turn} of a rollout has no token data: the server must return "
                "prompt_token_ids/token_ids and logprobs (vLLM with return_token_ids)"
            )
        prompt = list(tokens["prompt_ids"])
        completion = list(tokens["completion_ids"])
        completion_mask = list(tokens.get("completion_mask") or [1] * len(completion))
        completion_logprobs = [float(x) for x in tokens["completion_logprobs"]]
        if len(completion_logprobs) != len(completion):
            raise MissingTokensError(
                f"turn {turn}: {len(completion)} completion ids but "
                f"{len(completion_logprobs)} logprobs"
            )
        extends = (
            bool(ids) and prompt[: len(ids)] == ids and len(prompt) + len(completion) <= max_seq_len
        )
        if not extends and ids:
            samples.append(Sample(ids, mask, logprobs))
            ids, mask, logprobs = [], [], []
        new_prompt = prompt[len(ids) :]
        ids = ids + new_prompt + completion
        mask = mask + [0] * len(new_prompt) + [int(bool(m)) for m in completion_mask]
        logprobs = logprobs + [0.0] * len(new_prompt) + completion_logprobs
    if ids:
        samples.append(Sample(ids, mask, logprobs))
    return samples


def is_v1(obj: Any, name: str) -> bool:
    """Is `obj` an instance of `verifiers.v1.<name>` (`Env`, `State`)? Read through
    sys.modules because such an object exists only once verifiers.v1 is imported, and
    importing it just to check costs seconds."""
    v1 = sys.modules.get("verifiers.v1")
    return v1 is not None and isinstance(obj, getattr(v1, name))


def reference_answer(state: Any) -> Any:
    """The row's reference answer: a verifiers v1 state keeps it in `state["task"]` (its own
    `state["answer"]` is the answer the rollout submitted); a classic state at the top level."""
    if is_v1(state, "State"):
        return (state.get("task") or {}).get("answer")
    return state.get("answer")


class TurnReply(NamedTuple):
    """A model turn's reply as the server generated it (the overlong penalty's measure)."""

    tokens: int
    """Its length, counted before verifiers cuts the turn to `max_seq_len`."""
    capped: bool
    """It stopped at its token limit (finish reason length): unfinished."""


def turn_reply(step: dict) -> TurnReply:
    """What the server generated in `step`, from the response verifiers keeps beside the
    step's (possibly cut) tokens. A step without one (an environment server's episode, which
    is not cut) says both in its own tokens and `is_truncated`."""
    kept = (step.get("tokens") or {}).get("completion_ids") or []
    message = _field(step.get("response"), "message")
    if message is None:
        return TurnReply(len(kept), bool(step.get("is_truncated")))
    generated = _field(_field(message, "tokens"), "completion_ids")
    finished_at_cap = _field(message, "finish_reason") == "length"
    return TurnReply(len(kept if generated is None else generated), finished_at_cap)


def fit_turn(step: dict, max_seq_len: int) -> dict:
    """`step` cut to `max_seq_len` tokens as verifiers cuts a classic turn: its completion to
    what fits after the prompt (a prompt alone too long keeps none of it), marked truncated;
    unchanged where it fits. Classic turns arrive cut already; an environment server's do not,
    and are cut here alike."""
    tokens = step.get("tokens")
    if tokens is None:
        return step
    prompt, completion = tokens["prompt_ids"], tokens["completion_ids"]
    room = max(max_seq_len - len(prompt), 0)
    if len(prompt) + len(completion) <= max_seq_len:
        return step
    cut = {**tokens, "prompt_ids": list(prompt)[:max_seq_len]}
    for name in ("completion_ids", "completion_mask", "completion_logprobs"):
        if tokens.get(name) is not None:
            cut[name] = list(tokens[name])[:room]
    return {**step, "tokens": cut, "is_truncated": True}


def _field(record: Any, name: str) -> Any:
    """`record.name` or `record[name]` (a response kept as an object or as its dict); None
    where there is none."""
    if isinstance(record, dict):
        return record.get(name)
    return getattr(record, name, None)


def rollout_result(state: Any, max_seq_len: int, mask_truncated: bool) -> RolloutResult:
    """A scored rollout's state reduced to a `RolloutResult` (its longest reply and whether a
    reply stopped at its token limit are measured on what the server generated, not on what
    is left of a turn cut to `max_seq_len`). Raises `NonFiniteRewardError` for a reward that
    is not a finite number; rubric metrics that are not finite numbers are left out (a mean
    of them would be NaN or raise)."""
    reward = finite_number(state.get("reward"))
    if reward is None:
        raise NonFiniteRewardError(f"reward {state.get('reward')!r} is not a finite number")
    generated = state.get("trajectory") or []
    replies = [turn_reply(step) for step in generated]
    trajectory = [fit_turn(step, max_seq_len) for step in generated]
    truncated = bool(state.get("is_truncated")) or any(s.get("is_truncated") for s in trajectory)
    samples = trajectory_samples(trajectory, max_seq_len)
    if truncated and mask_truncated:
        samples = []
    turn_tokens = [len((s.get("tokens") or {}).get("completion_ids", [])) for s in trajectory]
    completion_tokens = sum(turn_tokens)
    return RolloutResult(
        example_id=int(state.get("example_id", 0)),
        reward=reward,
        metrics={
            name: number
            for name, value in (state.get("metrics") or {}).items()
            if (number := finite_number(value)) is not None
        },
        samples=samples,
        truncated=truncated,
        num_turns=len(trajectory),
        completion_tokens=completion_tokens,
        prompt_text=render_messages(state.get("prompt")),
        completion_text=render_messages(state.get("completion")),
        answer=str(reference_answer(state) or ""),
        longest_reply=max((r.tokens for r in replies), default=0),
        capped_reply=any(r.capped for r in replies),
    )
