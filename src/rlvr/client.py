"""The OpenAI client the trainer's rollouts use, and the sampling arguments of each request.

vLLM 0.32 has no `/v1/chat/completions/tokens` route, so verifiers'
`OpenAIChatCompletionsTokenClient` fails from the second turn on. We use the plain
`OpenAIChatCompletionsClient` (messages in, so every environment works unchanged) and ask vLLM
for `logprobs` and `return_token_ids`: it then returns `prompt_token_ids` and each choice's
`token_ids`, which verifiers' own response parser stores in `trajectory[i]["tokens"]`.
"""

from __future__ import annotations

from typing import Any

from rlvr.config import SamplingConfig

# Sampling fields that make vLLM return what training needs: token ids of prompt and
# completion, and the sampler's log-probability of every generated token.
TOKEN_SAMPLING_ARGS: dict[str, Any] = {"logprobs": True, "extra_body": {"return_token_ids": True}}


def make_client(base_url: str, api_key: str | None, timeout_s: float, max_connections: int):
    """A verifiers chat client on vf-vllm.

    Idle connections are dropped before uvicorn's 5 s keep-alive timeout (reusing one the
    server is closing fails with a read error), and connection errors are retried; a request
    that still fails makes an errored rollout, which is counted."""
    import httpx
    from openai import AsyncOpenAI
    from verifiers.clients import OpenAIChatCompletionsClient

    http = httpx.AsyncClient(
        limits=httpx.Limits(
            max_connections=max_connections, max_keepalive_connections=64, keepalive_expiry=3.0
        ),
        timeout=httpx.Timeout(timeout_s, connect=10.0),
    )
    oai = AsyncOpenAI(
        base_url=base_url, api_key=api_key or "EMPTY", max_retries=2, http_client=http
    )
    return OpenAIChatCompletionsClient(oai)


def build_sampling_args(
    cfg: SamplingConfig, env_defaults: dict[str, Any] | None = None, seed: int | None = None
) -> dict[str, Any]:
    """The environment's own sampling defaults, then ours, then the token-return fields (those
    must win: training cannot run without them). `extra_body` is merged key by key."""
    args: dict[str, Any] = {k: v for k, v in (env_defaults or {}).items() if k != "extra_body"}
    args.update(temperature=cfg.temperature, top_p=cfg.top_p, max_tokens=cfg.max_tokens)
    args.pop("n", None)
    if seed is not None:
        args["seed"] = seed
    args["logprobs"] = True
    args["extra_body"] = {
        **(env_defaults or {}).get("extra_body", {}),
        **cfg.extra_body,
        **TOKEN_SAMPLING_ARGS["extra_body"],
    }
    return args


def request_seed(seed: int, step: int, position: int, rollout: int) -> int:
    """A per-rollout sampling seed: distinct across rollouts of a group (else they would be
    identical), identical across reruns of the same step (so a resumed run samples the same)."""
    value = seed
    for part in (step, position, rollout):
        value = (value * 1_000_003 + part + 1) % 2_147_483_647
    return value
