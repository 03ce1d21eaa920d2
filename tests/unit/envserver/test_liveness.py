"""An environment server that dies or wedges while episodes run is restarted and the episodes
run again from their requests; past the restarts allowed the run stops with EnvironmentDown
(`rlvr.envserver.liveness`). A stand-in server here; the real one in test_launcher.py."""

from __future__ import annotations

import asyncio

import pytest

from rlvr.envserver.launcher import EnvServerStartError
from rlvr.envserver.liveness import Liveness
from rlvr.rollouts.groups import EnvironmentDown

WATCH_S = 0.02


class Server:
    """A server that serves until `kill`ed, and serves again once restarted (`starts` of them
    fail first, with `EnvServerStartError`)."""

    def __init__(self, failing_starts: int = 0):
        self.serving = True
        self.restarts = 0
        self.asked = 0
        self.failing_starts = failing_starts

    def kill(self) -> None:
        self.serving = False

    def trouble(self) -> str | None:
        self.asked += 1
        return None if self.serving else "it exited with -9"

    def restart(self) -> Server:
        self.restarts += 1
        if self.failing_starts:
            self.failing_starts -= 1
            raise EnvServerStartError("did not answer health within 1.0s")
        self.serving = True
        return self


def episode_on(server: Server, liveness: Liveness, calls: list[int], kill_first: bool = True):
    """An episode that, run on a generation the server still serves, answers after a few
    watches; the first call kills the server and then hangs, as one on a dead server does."""

    async def episode() -> str:
        calls.append(liveness.generation)
        if kill_first and len(calls) == 1:
            server.kill()
            await asyncio.Event().wait()
        await asyncio.sleep(3 * WATCH_S)
        return f"done on generation {liveness.generation}"

    return episode


def test_a_dead_server_is_restarted_and_its_episode_runs_again():
    server = Server()
    liveness = Liveness(server, "reverse-text", watch_s=WATCH_S)
    calls: list[int] = []
    result = asyncio.run(liveness.run(episode_on(server, liveness, calls)))
    assert result == "done on generation 1" and calls == [0, 1]
    assert server.restarts == liveness.restarts == 1


def test_episodes_on_one_dead_server_restart_it_once():
    """Every episode in flight on the dead server runs again; the server starts once."""
    server = Server()
    liveness = Liveness(server, "reverse-text", watch_s=WATCH_S)
    calls: list[int] = []

    async def hangs_until_restarted() -> str:
        calls.append(liveness.generation)
        if liveness.generation == 0:
            await asyncio.Event().wait()
        return "done"

    async def main():
        first = episode_on(server, liveness, calls)
        return await asyncio.gather(
            liveness.run(first), *(liveness.run(hangs_until_restarted) for _ in range(3))
        )

    assert asyncio.run(main()) == ["done on generation 1", "done", "done", "done"]
    assert server.restarts == 1 and sorted(calls) == [0, 0, 0, 0, 1, 1, 1, 1]


def test_a_healthy_server_is_asked_once_per_watch_whatever_the_episodes():
    server = Server()
    liveness = Liveness(server, "reverse-text", watch_s=0.05)
    calls: list[int] = []

    async def main():
        episodes = [episode_on(server, liveness, calls, kill_first=False) for _ in range(8)]
        return await asyncio.gather(*(liveness.run(e) for e in episodes))

    results = asyncio.run(main())
    assert results == ["done on generation 0"] * 8 and server.restarts == 0
    assert server.asked <= 2, "8 episodes in flight asked the server more than once per watch"


@pytest.mark.parametrize("failing_starts", [0, 1])
def test_past_the_restarts_allowed_the_run_stops_naming_why(failing_starts):
    """The server dies at every episode: after `max_restarts` restarts (or at a restart that
    does not start) the episode raises EnvironmentDown, which stops the run; a later one may
    try the restarts left, no more."""
    server = Server(failing_starts)
    liveness = Liveness(server, "reverse-text", max_restarts=2, watch_s=WATCH_S)

    async def dies() -> str:
        server.kill()
        await asyncio.Event().wait()
        return "never"

    match = (
        "reverse-text did not restart: did not answer health"
        if failing_starts
        else "reverse-text stopped serving after 2 restarts: it exited with -9"
    )
    with pytest.raises(EnvironmentDown, match=match):
        asyncio.run(liveness.run(dies))
    assert server.restarts == (1 if failing_starts else 2)
    with pytest.raises(EnvironmentDown):
        asyncio.run(liveness.run(dies))
    assert server.restarts == liveness.restarts == 2
