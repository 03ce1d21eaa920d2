"""Which server a group of rollouts runs on (`Router`): one server for the whole group (the
least busy), and the group run again from the start elsewhere, same seeds, when that server
refuses, times out or answers 5xx; ordinary request errors stay the rollout's own.
Design: docs/scaling.md#several-inference-servers.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import httpx
import openai

from rlvr.batch import GroupResult
from rlvr.rollouts.servers import Server, ServerPool

log = logging.getLogger(__name__)


def server_failure(error: BaseException | None) -> BaseException | None:
    """The error in `error`'s chain (itself, or what it was raised from) that says the server
    is gone or broken: connection refused or dropped, a timeout, a 5xx answer. None where the
    request itself was bad (a 4xx) or something else failed."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, openai.APIConnectionError | httpx.TransportError):
            return error
        if isinstance(error, openai.APIStatusError) and error.status_code >= 500:
            return error
        error = error.__cause__ or error.__context__
    return None


def describe_failure(error: BaseException) -> str:
    status = getattr(error, "status_code", None)
    said = f" {status}" if status else ""
    return f"{type(error).__name__}{said}: {str(error)[:300]}"


@dataclass
class Attempt:
    """One try of one group on one server: the client reports each request and each server
    failure here (`rlvr.rollouts.client.RolloutClient`)."""

    server: Server
    router: Router
    failures: list[BaseException] = field(default_factory=list)

    def requested(self) -> None:
        self.router.pool.requested(self.server)

    def failed(self, error: BaseException) -> None:
        self.failures.append(error)
        self.router.take_out(self.server, describe_failure(error))


class Router:
    """Runs groups on the servers of `pool`, sticky least-loaded, retrying a group whose server
    fails (`retried_groups` counts them). Lives on the rollout worker's event loop."""

    def __init__(self, pool: ServerPool):
        self.pool = pool
        self.retried_groups = 0
        self._running: dict[int, set[asyncio.Future]] = defaultdict(set)

    async def run(
        self, version: int, group: Callable[[Attempt], Awaitable[GroupResult]]
    ) -> GroupResult:
        """`group(attempt)` on the server `attempt.server` the pool picks for weight `version`,
        until one try ends without a server failure; NoServerLeftError when none is up."""
        while True:
            attempt = Attempt(self.pool.pick(version), self)
            result = await self._try(attempt, group)
            if result is not None:
                return result
            self.retried_groups += 1
            log.warning("a group on %s runs again on another server", attempt.server.describe())

    async def _try(
        self, attempt: Attempt, group: Callable[[Attempt], Awaitable[GroupResult]]
    ) -> GroupResult | None:
        """The group's result, or None when its server failed under it (the try is dropped
        whole)."""
        server = attempt.server
        task = asyncio.ensure_future(group(attempt))
        self._running[server.index].add(task)
        try:
            await asyncio.wait({task})
        except asyncio.CancelledError:  # the caller itself was cancelled
            task.cancel()
            self.pool.finished(server, None)
            raise
        finally:
            self._running[server.index].discard(task)
        if task.cancelled() or attempt.failures:
            if not task.cancelled() and task.exception() is not None:
                task.exception()  # retrieved: the server's failure is what counts
            self.pool.finished(server, None)
            return None
        try:
            result = task.result()
        except BaseException:
            self.pool.finished(server, None)
            raise
        self.pool.finished(server, sum(r.completion_tokens for r in result.rollouts))
        return result

    def take_out(self, server: Server, why: str, hung: bool = False) -> None:
        """Mark `server` down and cancel every group in flight on it (they run again
        elsewhere); `hung`: it answered no health check (`rlvr.rollouts.health`)."""
        if not self.pool.mark_down(server, why, hung):
            return
        log.warning(
            "%s is out of rotation (%s); its %d groups in flight run again on the others",
            server.describe(),
            why,
            len(self._running[server.index]),
        )
        for task in list(self._running[server.index]):
            task.cancel()
