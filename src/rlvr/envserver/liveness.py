"""Liveness of an environment's EnvServer (`Liveness`): while episodes run, the server is asked
every `WATCH_S` whether it serves (its process alive, a health answer within its deadline). A dead
or wedged server is restarted, at most `MAX_RESTARTS` times in a run, and the episodes that were
running on it run again on the new one from the same requests (the same seeds); past that,
`EnvironmentDown` stops the run, naming why, instead of steps of episodes that each wait out
their deadline. Design: docs/training.md#verifiers-04-environments.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

from rlvr.envserver.launcher import EnvServerStartError
from rlvr.rollouts.groups import EnvironmentDown

log = logging.getLogger(__name__)

MAX_RESTARTS = 2
"""Restarts of one environment server in a run before the run stops."""
WATCH_S = 5.0
"""How often a server with episodes in flight is asked whether it serves."""

T = TypeVar("T")


class Restartable(Protocol):
    """What `Liveness` needs of a server (`rlvr.envserver.launcher.EnvServerProcess`)."""

    def trouble(self) -> str | None: ...

    def restart(self) -> object: ...


class Liveness:
    """Runs episodes on `server`, restarting it when it stops serving (see the module doc)."""

    def __init__(
        self,
        server: Restartable,
        name: str,
        max_restarts: int = MAX_RESTARTS,
        watch_s: float = WATCH_S,
    ):
        self.server = server
        self.name = name
        self.max_restarts = max_restarts
        self.watch_s = watch_s
        self.restarts = 0
        self.generation = 0
        """How many times the server was started afresh: an episode started on an older
        generation ran on a server that is gone."""
        self._lock = threading.Lock()
        self._asked_at = -math.inf
        self._trouble: str | None = None

    async def run(self, episode: Callable[[], Awaitable[T]]) -> T:
        """The result of `episode()`, called afresh on the restarted server each time the
        server stops serving while it runs; EnvironmentDown once it may not be restarted."""
        while True:
            generation = self.generation
            task = asyncio.ensure_future(episode())
            try:
                why = await self._watch(task, generation)
            finally:
                task.cancel()  # a no-op once done; else the episode of a server that is gone
            if why is None:
                return task.result()
            await asyncio.to_thread(self._restart, generation, why)

    async def _watch(self, task: asyncio.Future, generation: int) -> str | None:
        """None once `task` is done; else why its server no longer serves it."""
        while True:
            done, _ = await asyncio.wait({task}, timeout=self.watch_s)
            if done:
                return None
            if self.generation != generation:
                return "it was restarted"
            why = await asyncio.to_thread(self.trouble)
            if why is not None:
                return why

    def trouble(self) -> str | None:
        """Why the server is not serving, or None; asked of the server at most once per
        `watch_s` however many episodes are in flight."""
        with self._lock:
            now = time.monotonic()
            if now - self._asked_at >= self.watch_s:
                self._trouble, self._asked_at = self.server.trouble(), now
            return self._trouble

    def _restart(self, generation: int, why: str) -> None:
        """Start the server of `generation` afresh, once whatever the episodes that found it
        gone; EnvironmentDown past `max_restarts` or when it does not start (a start that
        failed counts as a restart)."""
        with self._lock:
            if self.generation != generation:
                return  # another episode restarted it
            if self.restarts >= self.max_restarts:
                raise EnvironmentDown(
                    f"the environment server of {self.name} stopped serving after "
                    f"{self.restarts} restarts: {why}"
                )
            self.restarts += 1
            log.warning(
                "the environment server of %s stopped serving (%s): restarting it (%d of %d); "
                "its episodes in flight run again",
                self.name,
                why,
                self.restarts,
                self.max_restarts,
            )
            try:
                self.server.restart()
            except EnvServerStartError as e:
                why = f"the environment server of {self.name} did not restart: {e}"
                raise EnvironmentDown(why) from None
            self.generation += 1
            self._asked_at = -math.inf
