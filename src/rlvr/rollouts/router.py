"""Which server a group of rollouts runs on (`Router`): one server for the whole group (the
least busy), and the group run again from the start elsewhere, same seeds, when that server
fails under it. Who is to blame (`fault`): a refused or dropped connection is the server's at
once; a 5xx, a timeout or a 401/403/404 may be the server's or the request's, so the group runs
again on another server, and where it fails that way there too it is the request's (the rollout
errors, no server is blamed); a server is taken out after STRIKES such failures in a row with no
answer between. Ordinary request errors (other 4xx) stay the rollout's own.
Design: docs/scaling.md#several-inference-servers.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import httpx
import openai

from rlvr.batch import GroupResult
from rlvr.rollouts.servers import Server, ServerPool

log = logging.getLogger(__name__)

STRIKES = 3
"""Failures that may be a server's, in a row with no answered request between, that take it out
of rotation: a server that answers 5xx or 404 to everything leaves after three, not after
every group routed to it has failed."""
SERVER_STATE_STATUSES = frozenset({401, 403, 404})
"""4xx answers that say more about the server's state than the request (a restarted adapter
server no longer serving the policy's name answers 404)."""


class Fault(enum.Enum):
    """Whose a server failure is: `GONE` the server's at once; `SUSPECT` the server's or the
    request's (told apart by running the group on another server)."""

    GONE = "gone"
    SUSPECT = "suspect"


class UpstreamFailure(RuntimeError):
    """A server failure seen by a client that reaches the server through something else (the
    generate bridge of verifiers 0.4 environments), with whose it may be: the router weighs it
    as it weighs the same failure seen by its own HTTP client."""

    def __init__(self, message: str, fault: Fault):
        super().__init__(message)
        self.fault = fault


def server_failure(error: BaseException | None) -> BaseException | None:
    """The error in `error`'s chain (itself, or what it was raised from) that may be the
    server's: connection refused or dropped, a timeout, a 5xx or a 401/403/404 answer. None
    where the request itself was bad (another 4xx) or something else failed."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, openai.APIConnectionError | httpx.TransportError | UpstreamFailure):
            return error
        if isinstance(error, openai.APIStatusError) and (
            error.status_code >= 500 or error.status_code in SERVER_STATE_STATUSES
        ):
            return error
        error = error.__cause__ or error.__context__
    return None


def fault(failure: BaseException) -> Fault:
    """Whose a `server_failure` is: a connection refused or dropped is the server's."""
    if isinstance(failure, UpstreamFailure):
        return failure.fault
    suspect = openai.APITimeoutError | httpx.TimeoutException | openai.APIStatusError
    return Fault.SUSPECT if isinstance(failure, suspect) else Fault.GONE


def describe_failure(error: BaseException) -> str:
    status = getattr(error, "status_code", None)
    said = f" {status}" if status else ""
    return f"{type(error).__name__}{said}: {str(error)[:300]}"


@dataclass
class Attempt:
    """One try of one group on one server: the client reports each request, each answer and
    each server failure here (`rlvr.rollouts.client.RolloutClient`). `suspected`: an earlier
    try of the group failed in a way that may be the request's."""

    server: Server
    router: Router
    suspected: bool = False
    failures: list[BaseException] = field(default_factory=list)
    task: asyncio.Future | None = None

    def requested(self) -> None:
        self.router.pool.requested(self.server)

    def answered(self) -> None:
        self.router.pool.answered(self.server)

    def failed(self, error: BaseException) -> None:
        """A request of this try failed with `error` (a `server_failure`): the try is dropped
        and the server blamed, unless the group already failed so on an earlier try, where
        the failure is the request's (the rollout errors; `request_errors` counts it)."""
        if fault(error) is Fault.GONE:
            self.failures.append(error)
            self.router.take_out(self.server, describe_failure(error))
            return
        if self.suspected:
            self.router.request_errors += 1
            return
        dropped = bool(self.failures)  # the try's other requests fail with it: one strike
        self.failures.append(error)
        if not dropped:
            self.router.strike(self.server, describe_failure(error))
            if self.task is not None:
                self.task.cancel()


class Router:
    """Runs groups on the servers of `pool`, sticky least-loaded, retrying a group whose server
    fails (`retried_groups` counts them). Lives on the rollout worker's event loop."""

    def __init__(self, pool: ServerPool):
        self.pool = pool
        self.retried_groups = 0
        self.request_errors = 0
        """Requests that failed on two servers (or twice on the only one): the request's."""
        self._running: dict[int, set[asyncio.Future]] = defaultdict(set)

    async def run(
        self, version: int, group: Callable[[Attempt], Awaitable[GroupResult]]
    ) -> GroupResult:
        """`group(attempt)` on the server `attempt.server` the pool picks for weight `version`
        (one it has not tried yet where there is one), until one try ends without a server
        failure; NoServerLeftError when none is up."""
        tried: set[int] = set()
        suspected = False
        while True:
            attempt = Attempt(self.pool.pick(version, avoid=tried), self, suspected)
            result = await self._try(attempt, group)
            if result is not None:
                return result
            self.retried_groups += 1
            tried.add(attempt.server.index)
            suspected = suspected or any(fault(f) is Fault.SUSPECT for f in attempt.failures)
            log.warning("a group on %s runs again on another server", attempt.server.describe())

    async def _try(
        self, attempt: Attempt, group: Callable[[Attempt], Awaitable[GroupResult]]
    ) -> GroupResult | None:
        """The group's result, or None when its server failed under it (the try is dropped
        whole)."""
        server = attempt.server
        task = attempt.task = asyncio.ensure_future(group(attempt))
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

    def strike(self, server: Server, why: str) -> None:
        """Count a failure that may be `server`'s; the STRIKES-th in a row takes it out."""
        if self.pool.strike(server) >= STRIKES:
            self.take_out(server, f"{why} ({STRIKES} failed requests in a row)")

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
