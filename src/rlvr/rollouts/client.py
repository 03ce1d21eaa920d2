"""The OpenAI client the trainer's rollouts use: verifiers' plain `OpenAIChatCompletionsClient`
(messages in, every environment unchanged) asking vLLM for `logprobs` and `return_token_ids`.
`RolloutClient` adds each turn's own seed and, for training, a last check that nothing the
trainer cannot reproduce reaches the sampler; with `rollouts.token_in` later turns go as token
ids (`extend_prompt_ids`). Design: docs/training.md#token-in-multi-turn.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from typing import Any

import httpx
from openai import APITimeoutError, BadRequestError
from verifiers.clients import OpenAIChatCompletionsClient

from rlvr.config import RolloutsConfig
from rlvr.config.sampling import check_reproducible
from rlvr.rollouts.request_args import turn_seed
from rlvr.rollouts.router import server_failure
from rlvr.rollouts.to_samples import MissingTokensError

log = logging.getLogger(__name__)

# The assistant reply of the reference conversation whose rendering shows what the template
# puts after a reply's text (`extend_prompt_ids`).
MARKER = "x"


class TokenInError(MissingTokensError):
    """The server generated from other prompt ids than the token-in ids sent: it does not
    honour `kv_transfer_params.prompt_token_ids` (vLLM before 0.32?), so the trainer would
    train on a context the sampler never saw. A `MissingTokensError`: it stops the run."""


def extend_prompt_ids(
    previous: list[int],
    completion: list[int],
    stopped: bool,
    reference: list[int],
    rendered: list[int],
    marker: list[int],
) -> list[int] | None:
    """The next turn's prompt ids: `previous` + `completion` verbatim + the template's closing
    of a reply + the new messages, or None where the renderings do not extend each other.

    `reference` renders [assistant `MARKER`] without a generation prompt, `rendered` [assistant
    `MARKER`, *new messages] with it; the ids after `marker` in `reference` are the closing
    (ChatML: `<|im_end|>`, `\\n`). A reply that `stopped` on its first id sampled it, so it is
    not repeated. A lone assistant message keeps templates that treat the last assistant turn
    specially (Qwen3's `<think>`) from rendering it differently in the two conversations."""
    n = len(marker)
    ends = [i for i in range(n, len(reference) + 1) if reference[i - n : i] == marker]
    if not n or not ends or rendered[: len(reference)] != reference:
        return None
    end = ends[-1]
    closing = reference[end:]
    sampled_end = stopped and bool(completion) and bool(closing) and completion[-1] == closing[0]
    return [*previous, *completion, *rendered[end + int(sampled_end) :]]


def _dump(message: Any) -> Any:
    return message.model_dump() if hasattr(message, "model_dump") else message


def _role(message: Any) -> Any:
    return message.get("role") if isinstance(message, dict) else getattr(message, "role", None)


class RolloutClient(OpenAIChatCompletionsClient):
    """verifiers' chat client with per-turn seeds; with `training`, a request that samples what
    the trainer cannot reproduce (a temperature other than `temperature` included) raises
    SamplingFilterError. With an `attempt` (`with_attempt`), requests and server failures are
    reported to it (`rlvr.rollouts.router.Attempt`)."""

    def __init__(
        self,
        client: Any,
        training: bool = True,
        temperature: float | None = None,
        rollouts: RolloutsConfig | None = None,
    ):
        super().__init__(client)
        self.training = training
        self.temperature = temperature
        self.rollouts = rollouts or RolloutsConfig()
        self._marker: list[int] | None = None
        self.attempt: Any = None

    def with_attempt(self, attempt: Any) -> RolloutClient:
        """This client (same connection pool) reporting to `attempt`."""
        other = copy.copy(self)
        other.attempt = attempt
        return other

    async def get_response(
        self, prompt: Any, model: str, sampling_args: dict[str, Any], tools: Any = None, **kwargs
    ) -> Any:
        if self.attempt is not None:
            self.attempt.requested()
        try:
            response = await self._respond(prompt, model, sampling_args, tools, **kwargs)
        except Exception as e:
            failure = server_failure(e)
            if self.attempt is not None and failure is not None:
                self.attempt.failed(failure)
            raise
        if self.attempt is not None:
            self.attempt.answered()
        return response

    async def _respond(
        self, prompt: Any, model: str, sampling_args: dict[str, Any], tools: Any, **kwargs
    ) -> Any:
        if self.training:
            check_reproducible(sampling_args, "a rollout request", self.temperature)
        state = kwargs.get("state")
        seed = sampling_args.get("seed")
        if seed is not None and state is not None:
            turn = len(state.get("trajectory") or [])
            sampling_args = {**sampling_args, "seed": turn_seed(seed, turn)}
        ids = None
        if self.rollouts.token_in and state is not None:
            ids = await self.token_in_ids(prompt, model, sampling_args, tools, state)
        if ids is None:
            return await super().get_response(prompt, model, sampling_args, tools, **kwargs)
        extra = dict(sampling_args.get("extra_body") or {})
        extra["kv_transfer_params"] = {"prompt_token_ids": ids}
        sampling_args = {**sampling_args, "extra_body": extra}
        response = await super().get_response(prompt, model, sampling_args, tools, **kwargs)
        seen = response.message.tokens.prompt_ids if response.message.tokens else None
        if seen is not None and list(seen) != ids:
            raise TokenInError(
                f"rollouts.token_in sent {len(ids)} prompt ids but the server generated from "
                f"{len(seen)} others: it ignores kv_transfer_params.prompt_token_ids (needs "
                "vLLM >= 0.32); set rollouts.token_in=false"
            )
        return response

    async def token_in_ids(
        self, prompt: Any, model: str, sampling_args: dict[str, Any], tools: Any, state: Any
    ) -> list[int] | None:
        """This turn's token-in prompt ids (`extend_prompt_ids`), or None where the turn is
        rendered from its messages: the first turn, a conversation that does not continue the
        last turn's messages (an environment that rewrote them), a new user message under
        `keep_thinking=tool_calls`, or a template whose renderings cannot be extended."""
        trajectory = state.get("trajectory") or []
        if not trajectory:
            return None
        step = trajectory[-1]
        reply = getattr(step.get("response"), "message", None)
        tokens = getattr(reply, "tokens", None)
        before = [*step.get("prompt", []), *step.get("completion", [])]
        if tokens is None or [_dump(m) for m in prompt[: len(before)]] != [
            _dump(m) for m in before
        ]:
            log.warning("token_in: turn %d is rendered from its messages", len(trajectory))
            return None
        new = list(prompt[len(before) :])
        if not new or (
            self.rollouts.keep_thinking == "tool_calls" and any(_role(m) == "user" for m in new)
        ):
            return None
        native, _ = await self.to_native_prompt(new)
        native_tools = await self.to_native_tools(tools)
        template = {
            k: v
            for k, v in (sampling_args.get("extra_body") or {}).items()
            if k in ("chat_template", "chat_template_kwargs")
        }
        lone = {"role": "assistant", "content": MARKER}
        if self._marker is None:
            self._marker = await self._tokenize({"model": model, "prompt": MARKER})
        try:
            reference, rendered = await asyncio.gather(
                self._chat_ids(model, [lone], native_tools, template, generation_prompt=False),
                self._chat_ids(model, [lone, *native], native_tools, template),
            )
        except BadRequestError as e:  # a template that refuses the lone reply's conversation
            log.warning("token_in: turn %d is rendered from its messages (%s)", len(trajectory), e)
            return None
        ids = extend_prompt_ids(
            list(tokens.prompt_ids),
            list(tokens.completion_ids),
            reply.finish_reason in ("stop", "tool_calls"),
            reference,
            rendered,
            self._marker,
        )
        if ids is None:
            log.warning(
                "token_in: the chat template's renderings of turn %d do not extend each other; "
                "the turn is rendered from its messages",
                len(trajectory),
            )
        return ids

    async def _chat_ids(
        self,
        model: str,
        messages: list[dict],
        tools: Any,
        template: dict[str, Any],
        generation_prompt: bool = True,
    ) -> list[int]:
        body = {
            "model": model,
            "messages": messages,
            "add_generation_prompt": generation_prompt,
            **template,
        }
        if tools:
            body["tools"] = tools
        return await self._tokenize(body)

    async def _tokenize(self, body: dict[str, Any]) -> list[int]:
        """vLLM's `/tokenize` (at the server's root, beside `/v1`) of a prompt or messages."""
        root = str(self.client.base_url).rstrip("/").removesuffix("/v1")
        answer = await self.client.with_options(base_url=root).post(
            "/tokenize", body={"add_special_tokens": False, **body}, cast_to=dict
        )
        return list(answer["tokens"])


class TimeoutsNotRetried(httpx.AsyncBaseTransport):
    """An httpx transport that raises a timeout as openai's `APITimeoutError`, which the
    OpenAI client passes on instead of retrying: its two retries would make a request on a
    server that stopped answering cost three `server.timeout_s` before the router sees it."""

    def __init__(self, inner: httpx.AsyncBaseTransport):
        self.inner = inner

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        try:
            return await self.inner.handle_async_request(request)
        except httpx.TimeoutException as e:
            raise APITimeoutError(request=request) from e

    async def aclose(self) -> None:
        await self.inner.aclose()


def make_client(
    base_url: str,
    api_key: str | None,
    timeout_s: float,
    max_connections: int,
    training: bool = True,
    temperature: float | None = None,
    rollouts: RolloutsConfig | None = None,
) -> RolloutClient:
    """A verifiers chat client on vf-vllm (arguments: see `RolloutClient`). Idle connections
    drop before uvicorn's 5 s keep-alive (reusing one the server closes fails with a read
    error); connection errors are retried, and one that still fails errors the rollout or
    blames the server (`rlvr.rollouts.router`); a timeout is not retried
    (`TimeoutsNotRetried`)."""
    from openai import AsyncOpenAI

    limits = httpx.Limits(
        max_connections=max_connections, max_keepalive_connections=64, keepalive_expiry=3.0
    )
    http = httpx.AsyncClient(
        transport=TimeoutsNotRetried(httpx.AsyncHTTPTransport(limits=limits)),
        timeout=httpx.Timeout(timeout_s, connect=10.0),
    )
    oai = AsyncOpenAI(
        base_url=base_url, api_key=api_key or "EMPTY", max_retries=2, http_client=http
    )
    return RolloutClient(oai, training, temperature, rollouts)
