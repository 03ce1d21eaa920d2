"""Routing groups over several servers: least-loaded and sticky, a failed server's groups run
again elsewhere, whose a failure is (the server's or the request's), and the error when none is
left (`rlvr.rollouts.router`, `.servers`)."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest
import verifiers as vf

from rlvr.batch import GroupResult, RolloutResult
from rlvr.config import ConfigError, load_config
from rlvr.rollouts.router import STRIKES, Fault, Router, UpstreamFailure, fault, server_failure
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
    missing = status_error(openai.NotFoundError, 404)  # a restarted adapter server's answer
    assert server_failure(missing) is missing
    assert fault(refused) is Fault.GONE and fault(httpx.ConnectError("refused")) is Fault.GONE
    assert {fault(timeout), fault(broken), fault(missing)} == {Fault.SUSPECT}
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
    assert pool.counters() == {0: (0, 2, 10, 0, 0, 0), 1: (0, 0, 0, 0, 0, 0)}


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
    assert pool.counters()[1] == (3, 3, 9, 0, 0, 0) and pool.servers[1].in_flight == 0


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


def test_fleet_file_config(tmp_path):
    """`server.fleet_file` lists the servers one a line (comments and blank lines skipped)
    instead of base_url(s); a file that cannot be read, lists none, or lists a bad or repeated
    URL is refused at start, naming the file."""
    fleet = tmp_path / "fleet"
    fleet.write_text(f"# the run's servers\n{URLS[0]}  # node a\n\n{URLS[1]}\n")
    assert load_config(overrides=[f"server.fleet_file={fleet}"]).server.urls == URLS
    with pytest.raises(ConfigError, match="server.base_urls/fleet_file"):
        load_config(overrides=[f"server.fleet_file={fleet}", f"server.base_urls=[{URLS[0]}]"])
    for text, message in [
        (None, "cannot be read"),
        ("# none yet\n", "lists no server URL"),
        (f"{URLS[0]}\nlocalhost:8002\n", r"server.fleet_file \(.*\)\[1\]='localhost:8002'"),
        (f"{URLS[0]}\n{URLS[0].removesuffix('/v1')}/\n", "lists a server twice"),
    ]:
        path = tmp_path / "other"
        path.unlink(missing_ok=True)
        if text is not None:
            path.write_text(text)
        with pytest.raises(ConfigError, match=message):
            load_config(overrides=[f"server.fleet_file={path}"])


def requests_on(router: Router, failing: dict[int, BaseException], names: list[str]):
    """Run one group per name, each one request: on server i it fails with `failing[i]`
    (where given) and the group's rollout errors, as the client reports it; a name starting
    with "poison" fails with a 500 on every server. Returns (results, tries)."""
    tries: list[tuple[str, int]] = []

    def make(name: str):
        async def run(attempt) -> GroupResult:
            tries.append((name, attempt.server.index))
            attempt.requested()
            await asyncio.sleep(0)
            error = failing.get(attempt.server.index)
            if name.startswith("poison"):
                error = status_error(openai.InternalServerError, 500)
            if error is None:
                attempt.answered()
                return group()
            attempt.failed(error)
            return GroupResult([], errored=1, errors=[str(error)])

        return run

    async def main():
        results = []
        for name in names:  # one after another: the order of strikes is the names'
            results.append(await router.run(0, make(name)))
        return results

    return asyncio.run(asyncio.wait_for(main(), 30)), tries


@pytest.mark.parametrize("servers", [1, 3])
def test_a_request_that_fails_on_two_servers_is_the_requests(servers):
    """A 5xx runs the group again, on another server where there is one; failing there too,
    it is the request's: its rollout errors and every server stays (with one server, one bad
    request used to end the run)."""
    pool = ServerPool([f"http://127.0.0.1:{8001 + i}/v1" for i in range(servers)])
    router = Router(pool)
    results, tries = requests_on(router, {}, ["ok", "poison", "ok"])
    assert [r.errored for r in results] == [0, 1, 0]
    poisoned = [server for name, server in tries if name == "poison"]
    assert len(poisoned) == 2 and (servers == 1 or poisoned[0] != poisoned[1])
    assert router.request_errors == 1 and router.retried_groups == 1
    assert all(s.up for s in pool.servers)


def test_a_bridge_reported_failure_weighs_as_the_clients_own():
    """A verifiers 0.4 group reaches its server through the generate bridge, which reports
    failures as UpstreamFailure with whose they may be: a SUSPECT one (the bridge saw a 5xx
    or a deadline) runs the group again on the other server and counts a strike; a GONE one
    (unreachable) takes the server out at once, as a refused connection does."""
    suspect = UpstreamFailure("server 0 answered 503", Fault.SUSPECT)
    assert server_failure(suspect) is suspect and fault(suspect) is Fault.SUSPECT
    pool = ServerPool(URLS)
    router = Router(pool)
    results, tries = requests_on(router, {0: suspect}, ["g"])
    assert results[0].errored == 0 and tries == [("g", 0), ("g", 1)]
    assert pool.servers[0].up and pool.servers[0].strikes == 1
    gone = UpstreamFailure("no upstream could be reached", Fault.GONE)
    pool = ServerPool(URLS)
    results, tries = requests_on(Router(pool), {0: gone}, ["h"])
    assert results[0].errored == 0 and tries == [("h", 0), ("h", 1)]
    assert [s.up for s in pool.servers] == [False, True]


@pytest.mark.parametrize("status", [500, 404])
def test_a_server_failing_every_request_is_taken_out_after_strikes(status):
    """Server 0 answers `status` to everything: each of its groups runs again on server 1
    (no rollout errors), and after STRIKES failures in a row it leaves rotation, so it is no
    black hole that least-loaded routing keeps feeding."""
    pool = ServerPool(URLS)
    router = Router(pool)
    cls = openai.InternalServerError if status == 500 else openai.NotFoundError
    results, tries = requests_on(router, {0: status_error(cls, status)}, ["g"] * 8)
    assert all(r.errored == 0 for r in results)
    assert [s.up for s in pool.servers] == [False, True]
    assert sum(server == 0 for _, server in tries) == STRIKES
    assert f"({STRIKES} failed requests in a row)" in pool.servers[0].last_answer
    assert router.request_errors == 0


def test_an_answer_clears_a_servers_strikes():
    """Failures count against a server only in a row: one answered request between them and
    a server that fails now and then stays."""
    pool = ServerPool(URLS[:1])
    router = Router(pool)
    names = ["poison", "ok"] * STRIKES
    results, _ = requests_on(router, {}, names)
    assert pool.servers[0].up and pool.servers[0].strikes == 0
    assert router.request_errors == STRIKES


def test_a_try_whose_requests_all_fail_is_one_strike():
    """The rollouts of a group fail together on a bad request: its try strikes the server
    once, not once per rollout (four rollouts would take a healthy server out)."""
    pool = ServerPool(URLS)
    router = Router(pool)
    failed_on: list[int] = []

    async def run(attempt) -> GroupResult:
        answers = asyncio.Event()  # the four answers arrive together

        async def one() -> None:
            attempt.requested()
            if sum(s.requests for s in pool.servers) % 4 == 0:
                answers.set()
            await answers.wait()
            if attempt.server.index == 0:
                failed_on.append(0)
                attempt.failed(status_error(openai.InternalServerError, 500))
                return
            attempt.answered()

        # its own tasks, as a group's rollouts may be: the try's cancel does not reach them
        await asyncio.wait([asyncio.ensure_future(one()) for _ in range(4)])
        return group()

    result = asyncio.run(asyncio.wait_for(router.run(0, run), 30))
    assert result.errored == 0 and failed_on == [0] * 4
    assert pool.servers[0].up and pool.servers[0].strikes == 1


def test_a_timeout_is_asked_once_and_told_to_the_router():
    """A server that takes the connection and never answers: the trainer's client gives up
    after one `server.timeout_s` (the OpenAI client would try three times), with an
    `APITimeoutError` the router counts as a failure that may be the server's."""
    import socket
    import threading

    from rlvr.rollouts.client import make_client

    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                accepted.append(listener.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}/v1"
    client = make_client(url, None, 0.5, 1, training=False)
    try:
        with pytest.raises(Exception) as caught:
            asyncio.run(client.get_response([vf.UserMessage(content="hi")], "m", {}))
    finally:
        listener.close()
        for connection in accepted:
            connection.close()
    failure = server_failure(caught.value)
    assert isinstance(failure, openai.APITimeoutError) and fault(failure) is Fault.SUSPECT
    assert len(accepted) == 1, f"asked {len(accepted)} times"
