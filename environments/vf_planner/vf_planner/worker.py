"""The frozen worker: any OpenAI-compatible endpoint that solves, subproblem-solves and combines.

By default the worker is the server that serves the policy (read from the rollout's client), asked
for the base model: under LoRA training vLLM lists the adapter with `parent` = base model, so the
worker never sees the planner's weight updates. Every call has a hard timeout and goes through a
bounded semaphore; any failure becomes a WorkerError, which the rubric turns into a zero reward.
"""

from __future__ import annotations

import asyncio
import logging
import os
import weakref
from dataclasses import dataclass
from typing import Any

from openai import AsyncOpenAI, OpenAIError

from vf_planner.answers import final_number, format_number
from vf_planner.prompts import (
    WORKER_COMBINE_SYSTEM,
    WORKER_DIRECT_SYSTEM,
    WORKER_SUBPROBLEM_SYSTEM,
    combine_prompt,
)

logger = logging.getLogger(__name__)


class WorkerError(RuntimeError):
    """A worker call failed (timeout, HTTP error, empty reply) or no worker could be reached."""


@dataclass(frozen=True)
class WorkerSettings:
    """How to reach and query the worker; `base_url=None` means the policy's own server."""

    model: str | None = None
    base_url: str | None = None
    api_key_var: str = "WORKER_API_KEY"
    temperature: float = 0.0
    max_tokens: int = 512
    timeout: float = 300.0
    max_concurrent: int = 32


@dataclass(frozen=True)
class WorkerReply:
    text: str
    tokens: int


def estimate_tokens(text: str) -> int:
    """Token count for servers that report no usage (about 4 characters per token)."""
    return (len(text) + 3) // 4


@dataclass
class Worker:
    """One worker bound to a client, a model name and the running loop's call semaphore."""

    client: AsyncOpenAI
    model: str
    settings: WorkerSettings
    semaphore: asyncio.Semaphore

    async def ask(self, system: str, user: str) -> WorkerReply:
        """One chat request under the semaphore and the hard timeout."""
        messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        async with self.semaphore:
            try:
                response = await asyncio.wait_for(
                    self.client.chat.completions.create(
                        model=self.model,
                        messages=messages,
                        temperature=self.settings.temperature,
                        max_tokens=self.settings.max_tokens,
                    ),
                    timeout=self.settings.timeout,
                )
            except TimeoutError as e:
                raise WorkerError(f"worker call timed out after {self.settings.timeout}s") from e
            except Exception as e:  # any reply we cannot use is the worker's failure, not ours
                raise WorkerError(f"worker call failed: {type(e).__name__}: {e}") from e
        if not response.choices:
            raise WorkerError("worker returned no choices")
        text = response.choices[0].message.content or ""
        usage = response.usage
        tokens = usage.completion_tokens if usage is not None else estimate_tokens(text)
        return WorkerReply(text=text, tokens=tokens)

    async def solve_direct(self, question: str) -> WorkerReply:
        return await self.ask(WORKER_DIRECT_SYSTEM, question)

    async def solve_subproblem(self, subproblem: str) -> WorkerReply:
        """The subproblem's text is the whole request: the worker is not shown the problem."""
        return await self.ask(WORKER_SUBPROBLEM_SYSTEM, subproblem)

    async def solve_subproblems(self, subproblems: list[str]) -> list[WorkerReply]:
        """All subproblems at once: wall time of one call, not k (see bench/planner_worker.py)."""
        return list(await asyncio.gather(*(self.solve_subproblem(s) for s in subproblems)))

    async def combine(
        self, plan: str, subproblems: list[str], replies: list[WorkerReply]
    ) -> WorkerReply:
        """Final answer from the plan and the subproblem results (their numbers, or their text if
        none); the problem itself is not sent."""
        results = []
        for sub, reply in zip(subproblems, replies, strict=True):
            number = final_number(reply.text)
            results.append((sub, reply.text.strip() if number is None else format_number(number)))
        return await self.ask(WORKER_COMBINE_SYSTEM, combine_prompt(plan, results))


def _parent_of(card: Any) -> str | None:
    parent = getattr(card, "parent", None)
    return parent if isinstance(parent, str) and parent else None


async def resolve_worker_model(
    client: AsyncOpenAI, policy_model: str, timeout: float
) -> str | None:
    """The frozen base model on the worker server, or None when the server cannot list models.

    The policy's `parent` when the policy is an adapter (vLLM's /v1/models), the policy model
    itself when it is a base model there, else the first base model the server lists.
    """
    try:
        page = await asyncio.wait_for(client.models.list(), timeout=timeout)
    except (TimeoutError, OpenAIError) as e:
        logger.warning("cannot list worker models (%s); using %r as worker", e, policy_model)
        return None
    parents = {card.id: _parent_of(card) for card in page.data}
    if policy_model in parents:
        return parents[policy_model] or policy_model
    bases = [name for name, parent in parents.items() if parent is None]
    return bases[0] if bases else policy_model


@dataclass
class _LoopResources:
    semaphore: asyncio.Semaphore
    client: AsyncOpenAI | None


class WorkerPool:
    """Hands each rollout a Worker and caches the per-problem direct-solve baseline.

    Semaphores and HTTP clients belong to one event loop, so they are created per running loop;
    resolved model names and finished baselines are plain values shared by all loops.
    """

    def __init__(self, settings: WorkerSettings) -> None:
        self.settings = settings
        self._loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopResources] = (
            weakref.WeakKeyDictionary()
        )
        self._models: dict[tuple[str, str], str] = {}
        self._baselines: dict[tuple[str, str, str], WorkerReply] = {}
        self._pending: dict[tuple[str, str, str], asyncio.Task[WorkerReply]] = {}

    def _resources(self) -> _LoopResources:
        loop = asyncio.get_running_loop()
        if loop not in self._loops:
            client = None
            if self.settings.base_url is not None:
                client = AsyncOpenAI(
                    base_url=self.settings.base_url,
                    api_key=os.environ.get(self.settings.api_key_var) or "EMPTY",
                    max_retries=0,
                )
            semaphore = asyncio.Semaphore(self.settings.max_concurrent)
            self._loops[loop] = _LoopResources(semaphore, client)
        return self._loops[loop]

    def _client(self, policy_client: Any) -> AsyncOpenAI:
        own = self._resources().client
        if own is not None:
            return own
        native = getattr(policy_client, "client", policy_client)
        if not isinstance(native, AsyncOpenAI):
            raise WorkerError(
                f"the policy client ({type(native).__name__}) is not an OpenAI-compatible client; "
                "pass worker_base_url (and worker_model) to load_environment"
            )
        return native.with_options(max_retries=0)

    async def worker_for(self, policy_client: Any, policy_model: str) -> Worker:
        """A worker on `worker_base_url`, or on the policy's own server when none was given."""
        client = self._client(policy_client)
        model = self.settings.model
        if model is None:
            key = (str(client.base_url), policy_model)
            if key not in self._models:
                resolved = await resolve_worker_model(client, policy_model, self.settings.timeout)
                if resolved is not None:  # a listing that failed (a timeout under load) is retried
                    logger.info("worker model %r (policy %r)", resolved, policy_model)
                    self._models[key] = resolved
            model = self._models.get(key, policy_model)
        return Worker(client, model, self.settings, self._resources().semaphore)

    async def baseline(self, worker: Worker, question: str) -> WorkerReply:
        """The worker's direct solve of `question`, computed once per (server, model, question).

        Concurrent rollouts of the same problem share one in-flight request; a failed request is
        not cached, so the next rollout retries it.
        """
        key = (str(worker.client.base_url), worker.model, question)
        if key in self._baselines:
            return self._baselines[key]
        task = self._pending.get(key)
        if task is None or task.get_loop() is not asyncio.get_running_loop():
            task = asyncio.ensure_future(worker.solve_direct(question))
            self._pending[key] = task
        try:
            reply = await asyncio.shield(task)
        finally:
            if task.done() and self._pending.get(key) is task:
                del self._pending[key]
        self._baselines[key] = reply
        return reply
