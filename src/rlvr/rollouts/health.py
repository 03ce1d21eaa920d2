"""Hung servers leave rotation in seconds (`HealthWatch`): while a server has groups in flight,
its `/health` is asked every few seconds, and a server that answers none for `hang_s` is taken
out (its groups run again elsewhere with the same seeds), whatever `server.timeout_s` is.

A request's own timeout cannot do this: generation on a CPU may rightly take minutes, so
`server.timeout_s` is long, and a server that accepts connections but never answers (SIGSTOP, a
stuck host) would hold its groups that long. vLLM answers `/health` from its API server process,
beside the engine, so a busy engine still answers it. Design: "Hangs" in
docs/scaling.md#several-inference-servers.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import httpx

from rlvr.config.server import auth_header, server_root
from rlvr.rollouts.router import Router
from rlvr.rollouts.servers import Server


class HealthWatch:
    """Asks every live server with groups in flight for its health each `every_s`; the
    router takes out one that answered none for `hang_s` seconds. Runs on the rollout worker's
    event loop (`run`, cancelled at close)."""

    def __init__(
        self,
        router: Router,
        every_s: float,
        hang_s: float,
        api_key: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.router = router
        self.pool = router.pool
        self.every_s = every_s
        self.hang_s = hang_s
        self.clock = clock
        self._headers = auth_header(api_key)
        self._answered: dict[int, float] = {}
        """When each watched server last answered (or, until it does, when watching began)."""
        self._asking: dict[int, asyncio.Task] = {}

    async def run(self) -> None:
        async with httpx.AsyncClient(timeout=self.every_s, headers=self._headers) as http:
            try:
                while True:
                    self.tick(http)
                    await asyncio.sleep(self.every_s)
            finally:
                for task in self._asking.values():
                    task.cancel()

    def tick(self, http: httpx.AsyncClient) -> None:
        """One round: start watching servers that took groups, stop watching idle ones, take
        out those silent for `hang_s`, and ask the rest (one question at a time each)."""
        now = self.clock()
        for server in self.pool.live():
            if server.in_flight == 0:
                self._answered.pop(server.index, None)
                continue
            since = self._answered.setdefault(server.index, now)
            if now - since >= self.hang_s:
                self._answered.pop(server.index)
                why = f"answered no health check for {now - since:.0f} s"
                self.router.take_out(server, why, hung=True)
                continue
            asking = self._asking.get(server.index)
            if asking is None or asking.done():
                self._asking[server.index] = asyncio.ensure_future(self._ask(http, server))

    async def _ask(self, http: httpx.AsyncClient, server: Server) -> None:
        try:
            answer = await http.get(f"{server_root(server.url)}/health")
        except httpx.HTTPError:
            return
        if answer.status_code == 200 and server.index in self._answered:
            self._answered[server.index] = self.clock()
