"""The sampling arguments of every training request, and their seeds.

`build_sampling_args` layers the environment's defaults, the run's `sampling.*`, the neutral
filters and the token-return fields, refusing what the trainer cannot reproduce
(`rlvr.config.sampling`). Seeds derive from (run seed, step, dataset position, rollout, turn):
distinct per turn, reproducible on resume. Design: docs/training.md#sampling-parity.
"""

from __future__ import annotations

from typing import Any

from rlvr.config.sampling import (
    NEUTRAL_OPENAI,
    NEUTRAL_VLLM,
    SamplingConfig,
    check_reproducible,
    check_run_sampling,
)

# Sampling fields that make vLLM return what training needs: token ids of prompt and
# completion, and the sampler's log-probability of every generated token.
TOKEN_SAMPLING_ARGS: dict[str, Any] = {"logprobs": True, "extra_body": {"return_token_ids": True}}


# Reply budget of a run whose config and environment both leave max_tokens unset.
FALLBACK_MAX_TOKENS = 512


def max_tokens(cfg: SamplingConfig, env_defaults: dict[str, Any]) -> int:
    """The run config's `sampling.max_tokens` when it sets one, else the environment's default
    (a length that fits its task), else FALLBACK_MAX_TOKENS."""
    if cfg.max_tokens is not None:
        return cfg.max_tokens
    return env_defaults.get("max_tokens") or FALLBACK_MAX_TOKENS


def build_sampling_args(
    cfg: SamplingConfig, env_defaults: dict[str, Any] | None = None, seed: int | None = None
) -> dict[str, Any]:
    """The environment's own sampling defaults, then ours, then the neutral filters and the
    token-return fields (those must win: training cannot run without them). `extra_body` is
    merged key by key; `max_tokens` comes from `max_tokens()`. Raises SamplingFilterError for a
    filter the trainer cannot reproduce."""
    env_defaults = env_defaults or {}
    check_reproducible(env_defaults, "the environment's sampling_args", cfg.temperature)
    check_run_sampling(cfg)
    args: dict[str, Any] = {k: v for k, v in env_defaults.items() if k != "extra_body"}
    args.update(
        temperature=cfg.temperature, max_tokens=max_tokens(cfg, env_defaults), **NEUTRAL_OPENAI
    )
    args.pop("n", None)
    if seed is not None:
        args["seed"] = seed
    args["logprobs"] = True
    args["extra_body"] = {
        **env_defaults.get("extra_body", {}),
        **cfg.extra_body,
        **NEUTRAL_VLLM,
        **TOKEN_SAMPLING_ARGS["extra_body"],
    }
    return args


def request_seed(seed: int, step: int, position: int, rollout: int) -> int:
    """A per-rollout sampling seed: distinct across rollouts of a group (else they would be
    identical), identical across reruns of the same step (so a resumed run samples the same).
    Each turn of the rollout then sends `turn_seed` of it."""
    return _mix(seed, step, position, rollout)


def turn_seed(rollout_seed: int, turn: int) -> int:
    """The seed of turn `turn` (0-based) of a rollout: the rollout's own seed on the first turn,
    a distinct one derived from it on every later turn (vLLM seeds a fresh generator per
    request, so one seed on every turn would draw the same noise for each turn's j-th token)."""
    return rollout_seed if turn == 0 else _mix(rollout_seed, turn)


def _mix(value: int, *parts: int) -> int:
    for part in parts:
        value = (value * 1_000_003 + part + 1) % 2_147_483_647
    return value
