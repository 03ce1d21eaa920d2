"""Hung servers leave rotation in seconds (`rlvr.rollouts.health.HealthWatch`): a server with
groups in flight that answers no health check for `hang_s` is taken out and its groups cancelled
(they run again elsewhere); one that answers, or has nothing in flight, stays. Health answers
come from httpx's mock transport, time from a hand-moved clock."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from rlvr.rollouts.health import HealthWatch
from rlvr.rollouts.router import Router
from rlvr.rollouts.servers import ServerPool

URLS = ["http://127.0.0.1:8001/v1", "http://127.0.0.1:8002/v1"]
EVERY_S, HANG_S = 5.0, 20.0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def health(answers: dict[int, int | None]) -> httpx.AsyncClient:
    """A client whose `/health` of server i answers status `answers[i]`, or never (None)."""

    async def handle(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/health", request.url
        status = answers[URLS.index(f"http://{request.url.netloc.decode()}/v1")]
        if status is None:
            await asyncio.Event().wait()
        return httpx.Response(status)

    return httpx.AsyncClient(transport=httpx.MockTransport(handle))


async def watch_for(seconds: float, watch: HealthWatch, http: httpx.AsyncClient, clock: Clock):
    """Tick the watch every EVERY_S of the clock for `seconds`, letting its asks answer."""
    for _ in range(int(seconds / EVERY_S) + 1):
        watch.tick(http)
        for _ in range(5):
            await asyncio.sleep(0)
        clock.now += EVERY_S


def run_on_both(answers: dict[int, int | None], seconds: float):
    """Both servers with a group in flight (one task each, as the router runs them), watched
    for `seconds`: the pool and whether each server's group was cancelled."""
    pool = ServerPool(URLS)
    router = Router(pool)
    clock = Clock()
    watch = HealthWatch(router, EVERY_S, HANG_S, clock=clock)

    async def main() -> list[bool]:
        tasks = []
        for server in (pool.pick(0), pool.pick(0)):
            task = asyncio.ensure_future(asyncio.Event().wait())
            router._running[server.index].add(task)
            tasks.append(task)
        async with health(answers) as http:
            await watch_for(seconds, watch, http, clock)
        await asyncio.sleep(0)
        for task in tasks:
            task.cancel()
        return [task.cancelled() and not pool.servers[i].up for i, task in enumerate(tasks)]

    cancelled = asyncio.run(main())
    return pool, cancelled


def test_a_silent_server_is_taken_out_after_hang_s():
    pool, cancelled = run_on_both({0: 200, 1: None}, HANG_S + EVERY_S)
    assert pool.servers[0].up and not pool.servers[1].up
    assert cancelled == [False, True]
    assert pool.servers[1].last_answer.startswith("answered no health check for 20 s")
    now = pool.counters()
    before = {i: c._replace(hangs=0, leaves=0) for i, c in now.items()}
    metrics = pool.metrics(before, now, 1.0)
    assert metrics["fleet/hung"] == metrics["fleet/left"] == 1 and pool.servers[1].hangs == 1


def test_a_silent_server_is_given_hang_s():
    pool, _ = run_on_both({0: 200, 1: None}, HANG_S - EVERY_S)
    assert all(s.up for s in pool.servers)


@pytest.mark.parametrize("status", [503, 500, 404])
def test_a_health_check_that_fails_is_no_answer(status):
    pool, _ = run_on_both({0: 200, 1: status}, HANG_S + EVERY_S)
    assert pool.servers[0].up and not pool.servers[1].up


def test_answering_servers_stay_however_long_their_groups_run():
    pool, cancelled = run_on_both({0: 200, 1: 200}, 10 * HANG_S)
    assert all(s.up for s in pool.servers) and cancelled == [False, False]


def test_idle_time_does_not_count_against_a_server():
    """A server is judged only over the time it has groups in flight: silent while idle
    (asked nothing), it gets the full `hang_s` once a group starts."""
    pool = ServerPool(URLS[:1])
    router = Router(pool)
    clock = Clock()
    watch = HealthWatch(router, EVERY_S, HANG_S, clock=clock)

    async def main() -> None:
        async with health({0: None}) as http:
            await watch_for(3 * HANG_S, watch, http, clock)  # idle: nothing asked
            assert pool.servers[0].up
            pool.pick(0)
            await watch_for(HANG_S - EVERY_S, watch, http, clock)
            assert pool.servers[0].up, "judged on time it was idle"
            await watch_for(2 * EVERY_S, watch, http, clock)
            assert not pool.servers[0].up

    asyncio.run(main())
