"""The OpenAI client the trainer's rollouts use.

vLLM 0.32 has no `/v1/chat/completions/tokens` route, so verifiers'
`OpenAIChatCompletionsTokenClient` fails from the second turn on. We use the plain
`OpenAIChatCompletionsClient` (messages in, so every environment works unchanged) and ask vLLM
for `logprobs` and `return_token_ids`: it then returns `prompt_token_ids` and each choice's
`token_ids`, which verifiers' own response parser stores in `trajectory[i]["tokens"]`.

Verifiers sends a rollout's one `sampling_args` on every turn. `RolloutClient` adds what only
the request itself knows: the turn's own seed (`rlvr.rollouts.request_args.turn_seed`, from the
number of turns the rollout has taken) and, for training, a last check that nothing the trainer
cannot reproduce (a forced tool call, a response format an environment sets per request) reaches the
sampler.
"""

from __future__ import annotations

from typing import Any

from verifiers.clients import OpenAIChatCompletionsClient

from rlvr.rollouts.request_args import check_reproducible, turn_seed


class RolloutClient(OpenAIChatCompletionsClient):
    """verifiers' chat client with per-turn seeds; with `training`, every request is checked
    for sampling the trainer cannot reproduce (SamplingFilterError), including a temperature
    other than `temperature` (the one the trainer divides by) however the request got it."""

    def __init__(self, client: Any, training: bool = True, temperature: float | None = None):
        super().__init__(client)
        self.training = training
        self.temperature = temperature

    async def get_response(
        self, prompt: Any, model: str, sampling_args: dict[str, Any], tools: Any = None, **kwargs
    ) -> Any:
        if self.training:
            check_reproducible(sampling_args, "a rollout request", self.temperature)
        state = kwargs.get("state")
        seed = sampling_args.get("seed")
        if seed is not None and state is not None:
            turn = len(state.get("trajectory") or [])
            sampling_args = {**sampling_args, "seed": turn_seed(seed, turn)}
        return await super().get_response(prompt, model, sampling_args, tools, **kwargs)


def make_client(
    base_url: str,
    api_key: str | None,
    timeout_s: float,
    max_connections: int,
    training: bool = True,
    temperature: float | None = None,
) -> RolloutClient:
    """A verifiers chat client on vf-vllm (`training`, `temperature`: see `RolloutClient`).

    Idle connections are dropped before uvicorn's 5 s keep-alive timeout (reusing one the
    server is closing fails with a read error), and connection errors are retried; a request
    that still fails makes an errored rollout, which is counted."""
    import httpx
    from openai import AsyncOpenAI

    http = httpx.AsyncClient(
        limits=httpx.Limits(
            max_connections=max_connections, max_keepalive_connections=64, keepalive_expiry=3.0
        ),
        timeout=httpx.Timeout(timeout_s, connect=10.0),
    )
    oai = AsyncOpenAI(
        base_url=base_url, api_key=api_key or "EMPTY", max_retries=2, http_client=http
    )
    return RolloutClient(oai, training, temperature)
