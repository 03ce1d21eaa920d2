"""The OpenAI client the trainer's rollouts use.

vLLM 0.32 has no `/v1/chat/completions/tokens` route, so verifiers'
`OpenAIChatCompletionsTokenClient` fails from the second turn on. We use the plain
`OpenAIChatCompletionsClient` (messages in, so every environment works unchanged) and ask vLLM
for `logprobs` and `return_token_ids`: it then returns `prompt_token_ids` and each choice's
`token_ids`, which verifiers' own response parser stores in `trajectory[i]["tokens"]`.
"""

from __future__ import annotations


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
