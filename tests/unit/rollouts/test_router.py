"""Routing groups over several servers: least-loaded and sticky, a failed server's groups run
again elsewhere, and the error when none is left (`rlvr.rollouts.router`, `.servers`)."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest
import verifiers as vf

from rlvr.batch import GroupResult, RolloutResult
from rlvr.config import ConfigError, load_config
from rlvr.rollouts.router import Router, server_failure
from rlvr.rollouts.servers import NoServerLeftError, ServerPool

URLS = ["http://127.0.0.1:8001/v1", "http://127.0.0.1:8002/v1"]


def request() -> httpx.Request:
    return httpx.Request("POST", URLS[0] + "/chat/completions")


def status_error(cls: type, code: int) -> openai.APIStatusError:
    return cls("boom", response=httpx.Response(code, request=request()), body=None)


def group(tokens: int = 3) -> GroupResult:
    rollout = RolloutResult(0, 1.0, {}, [], False, 1, tokens, "prompt", "reply")
    return GroupResult([rollout])


def test_server_failures_are_told_from_bad_requests():
    refused = openai.APIConnectionError(request=request())
    assert server_failure(refused) is refused
    timeout = openai.APITimeoutError(request=request())
    assert server_failure(timeout) is timeout
    broken = status_error(openai.InternalServerError, 500)
    assert server_failure(broken) is broken
    assert server_failure(httpx.ConnectError("refused")) is not None
    assert server_failure(status_error(openai.BadRequestError, 400)) is None
    assert server_failure(ValueError("a tool failed")) is None
    try:  # verifiers' client wraps what the server said: the server's own error is named
        raise vf.ModelError() from refused
    except vf.ModelError as wrapped:
        assert server_failure(wrapped) is refused


def test_a_new_group_goes_to_the_least_busy_server():
    pool = ServerPool(URLS)
    first, second, third = pool.pick(0), pool.pick(0), pool.pick(0)
    assert [first.index, second.index, third.index] == [0, 1, 0]
    pool.finished(first, 5)
    pool.finished(third, 5)
    assert pool.pick(0).index == 0, "server 0 has fewer in flight now"
    assert pool.counters() == {0: (0, 2, 10, 0), 1: (0, 0, 0, 0)}


def test_a_server_admitted_again_serves_only_newer_versions():
    pool = ServerPool(URLS)
    pool.mark_down(pool.servers[0], "refused")
    pool.admit(pool.servers[0], 5)
    assert pool.pick(4).index == 1, "server 0 lacks version 4"
    assert pool.pick(5).index == 0, "server 0 holds version 5 and is less busy"
    pool.mark_down(pool.servers[1], "refused")
    assert pool.pick(4).index == 0, "no server holds version 4: the newer one serves it"


def test_no_server_left_names_each_and_its_last_answer():
    pool = ServerPool(URLS)
    pool.mark_down(pool.servers[0], "ConnectError: refused")
    pool.mark_down(pool.servers[1], "failed the probe of weight version 3")
    with pytest.raises(NoServerLeftError) as caught:
        pool.pick(0)
    text = str(caught.value)
    assert URLS[0] in text and "ConnectError: refused" in text
    assert URLS[1] in text and "failed the probe of weight version 3" in text


def test_a_failed_server_s_groups_run_again_on_the_other():
    """Server 0 refuses a request of one group: both of its groups in flight (one still
    waiting on it) are dropped whole and run again on server 1, and it leaves rotation."""
    pool = ServerPool(URLS)
    router = Router(pool)
    tries: list[tuple[str, int]] = []
    waiting = asyncio.Event()

    def make(name: str, fails: bool):
        async def run(attempt) -> GroupResult:
            tries.append((name, attempt.server.index))
            attempt.requested()
            if attempt.server.index == 0:
                if fails:
                    await waiting.wait()
                    attempt.failed(openai.APIConnectionError(request=request()))
                    return GroupResult([], errored=1, errors=["refused"])
                waiting.set()
                await asyncio.sleep(60)  # cancelled when server 0 fails
            return group()

        return run

    async def main():
        return await asyncio.gather(
            router.run(0, make("a", fails=True)),
            router.run(0, make("b", fails=False)),
            router.run(0, make("c", fails=False)),
        )

    results = asyncio.run(asyncio.wait_for(main(), 30))
    assert all(len(r.rollouts) == 1 for r in results), "no half-kept group"
    assert tries[:3] == [("a", 0), ("b", 1), ("c", 0)]
    assert sorted(tries[3:]) == [("a", 1), ("c", 1)]
    assert router.retried_groups == 2
    assert [s.up for s in pool.servers] == [False, True]
    assert "APIConnectionError" in pool.servers[0].last_answer
    assert pool.counters()[1] == (3, 3, 9, 0) and pool.servers[1].in_flight == 0


def test_server_list_config():
    assert load_config(overrides=[]).server.urls == ["http://127.0.0.1:8000/v1"]
    two = load_config(overrides=[f"server.base_urls=[{URLS[0]},{URLS[1]}]"])
    assert two.server.urls == URLS
    with pytest.raises(ConfigError, match="server.base_url/base_urls"):
        load_config(overrides=[f"server.base_url={URLS[0]}", f"server.base_urls=[{URLS[1]}]"])
    with pytest.raises(ConfigError, match="lists a server twice"):
        load_config(overrides=[f"server.base_urls=[{URLS[0]},{URLS[0].removesuffix('/v1')}]"])
    with pytest.raises(ConfigError, match=r"server.base_urls\[1\]"):
        load_config(overrides=[f"server.base_urls=[{URLS[0]},localhost:8002]"])
