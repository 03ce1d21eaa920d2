"""Every version to every server (`rlvr.weight_sync.fleet`) and the start-up checks that the
servers serve alike (`rlvr.weight_sync.connect`), with pushes that record what they were asked."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from rlvr.config import ConfigError, load_config
from rlvr.rollouts.servers import NoServerLeftError, ServerPool
from rlvr.weight_sync import connect
from rlvr.weight_sync.base import WeightPush
from rlvr.weight_sync.connect import ServerWay, check_same_push, check_same_serving
from rlvr.weight_sync.fingerprint import Verified
from rlvr.weight_sync.fleet import FleetPush
from rlvr.weight_sync.probe import WeightsNotServedError

URLS = ["http://127.0.0.1:8001/v1", "http://127.0.0.1:8002/v1", "http://127.0.0.1:8003/v1"]


class Recorded(WeightPush):
    """A push that records versions and releases, or fails like a server that is gone."""

    def __init__(self, fails: bool = False):
        self.fails = fails
        self.pushed: list[int] = []
        self.released: list[set[int]] = []
        self.closed = False

    def push(self, version: int) -> float:
        if self.fails:
            raise ConnectionError("refused")
        self.pushed.append(version)
        return 1.0

    def served_name(self, version: int) -> str:
        return f"policy-v{version}"

    def release(self, in_use) -> None:
        self.released.append(set(in_use))

    def close(self) -> None:
        self.closed = True


def fleet(pushes: list[Recorded], answering: set[int] = frozenset()) -> FleetPush:
    """A FleetPush over `pushes` on one rank; down servers in `answering` answer their health
    check and are connected afresh as a new `Recorded`."""
    pool = ServerPool(URLS[: len(pushes)])
    weights = FleetPush(pool, list(pushes), lambda i: Recorded(), lambda x: x, rank=0)
    weights._answers = lambda server: server.index in answering
    return weights


def test_a_push_that_fails_on_one_server_goes_on_with_the_rest():
    pushes = [Recorded(), Recorded(fails=True), Recorded()]
    weights = fleet(pushes)
    assert weights.push(1) == 2.0
    assert weights.pushed == [0, 2] and pushes[0].pushed == pushes[2].pushed == [1]
    assert [s.up for s in weights.pool.servers] == [True, False, True]
    assert "the push of weight version 1 failed: refused" in weights.pool.servers[1].last_answer
    weights.push(2)
    assert pushes[1].pushed == [] and weights.pushed == [0, 2], "a down server gets no push"


def test_a_down_server_that_answers_is_connected_afresh_and_pushed():
    pushes = [Recorded(), Recorded(fails=True)]
    weights = fleet(pushes, answering={1})
    weights.push(1)
    assert weights.pool.servers[1].up is False
    weights.push(2)
    assert weights.returned == [1] and weights.pushed == [0, 1]
    assert pushes[1].closed and weights.pushes[1].pushed == [2]
    assert not weights.pool.servers[1].up, "admitted only after its probe"
    weights.admit(1, 2)
    assert weights.pool.servers[1].up and weights.pool.servers[1].since == 2
    weights.release({1, 3})
    assert pushes[0].released == [{1, 3}]
    assert weights.pushes[1].released == [{2, 3}], "it holds no version before 2"
    assert weights.served_name(1) == "policy-v1"


def test_no_server_left_after_a_push_is_a_clear_error():
    weights = fleet([Recorded(fails=True), Recorded(fails=True)])
    with pytest.raises(NoServerLeftError, match="refused"):
        weights.push(1)


def test_a_probe_failure_takes_the_server_out_until_none_is_left():
    weights = fleet([Recorded(), Recorded()])
    weights.take_out(0, "failed the probe of weight version 1")
    assert [s.up for s in weights.pool.servers] == [False, True]
    with pytest.raises(NoServerLeftError, match="failed the probe"):
        weights.take_out(1, "failed the probe of weight version 1")


def on_fleet_file(tmp_path, listed: list[int]) -> tuple[FleetPush, Callable[[list[int]], None]]:
    """A fleet of the servers `listed` (indices into URLS) read from a fleet file, every one
    answering, and a function that rewrites the file to list others."""
    path = tmp_path / "fleet"

    def write(indices: list[int]) -> None:
        path.write_text("".join(f"{URLS[i]}\n" for i in indices))

    write(listed)
    pushes = [Recorded() for _ in listed]
    weights = FleetPush(
        ServerPool([URLS[i] for i in listed]),
        pushes,
        lambda server: Recorded(),
        lambda x: x,
        rank=0,
        fleet_file=str(path),
    )
    weights._answers = lambda server: True
    return weights, write


def test_a_server_listed_in_the_fleet_file_joins_after_its_push(tmp_path):
    """A URL added to the file is a new server, numbered on, connected and pushed the
    current version at the next push, and routed to only once admitted (its checks passed)."""
    weights, write = on_fleet_file(tmp_path, [0])
    weights.push(1)
    write([0, 2])
    weights.push(2)
    pool = weights.pool
    assert [s.url for s in pool.servers] == [URLS[0], URLS[2]]
    assert weights.returned == [1] and weights.pushed == [0, 1]
    assert weights.pushes[1].pushed == [2]
    assert not pool.servers[1].up and pool.pick(2).index == 0, "not routed before admitted"
    weights.admit(1, 2)
    assert pool.pick(2).index == 1
    before = {i: c._replace(joins=0) for i, c in pool.counters().items()}
    assert pool.metrics(before, pool.counters(), 1.0)["fleet/joined"] == 1


def test_a_server_dropped_from_the_fleet_file_drains_then_is_let_go(tmp_path):
    """A URL removed from the file takes no new groups at once, keeps every version while
    its groups finish, and is let go (closed, out of rotation) at the first push after they
    have; listed again, it returns like any server that answers."""
    weights, write = on_fleet_file(tmp_path, [0, 1])
    pool, first = weights.pool, weights.pushes[1]
    busy = pool.pick(0)
    assert busy.index == 0
    write([1])
    weights.push(1)
    assert not pool.servers[0].listed and pool.servers[0].up
    assert weights.pushed == [0, 1], "a draining server still takes every version"
    assert {pool.pick(1).index for _ in range(3)} == {1}, "no new group on a draining server"
    pool.finished(busy, 5)
    weights.push(2)
    assert not pool.servers[0].up and weights.pushed == [1]
    assert "no longer in the fleet file: let go" in pool.servers[0].last_answer
    assert weights.pushes[0] is not first and pool.servers[1].up
    weights.push(3)
    assert weights.returned == [] and not pool.servers[0].up, "let go, though it answers"
    write([1, 0])
    weights.push(4)
    assert weights.returned == [0] and weights.pushes[0].pushed == [4]
    weights.admit(0, 4)
    assert [s.up for s in pool.servers] == [True, True]


def test_a_server_listed_again_while_draining_takes_groups_at_once(tmp_path):
    weights, write = on_fleet_file(tmp_path, [0, 1])
    pool = weights.pool
    busy = pool.pick(0)
    write([1])
    weights.push(1)
    write([0, 1])
    weights.push(2)
    pool.finished(busy, 5)
    assert pool.servers[0].listed and pool.servers[0].up and weights.pushed == [0, 1]
    assert {pool.pick(2).index for _ in range(2)} == {0, 1}


def test_an_unreadable_or_empty_fleet_file_changes_nothing(tmp_path):
    weights, write = on_fleet_file(tmp_path, [0, 1])
    for change in ["", "# being rewritten\n", None]:
        path = tmp_path / "fleet"
        if change is None:
            path.unlink()
        else:
            path.write_text(change)
        weights.push(1)
        assert weights.pushed == [0, 1] and all(s.listed for s in weights.pool.servers)


def test_no_server_listed_and_up_is_a_clear_error(tmp_path):
    """The file lists only a server that cannot join: the push lets the idle server go and
    stops the run naming each server."""
    weights, write = on_fleet_file(tmp_path, [0])
    weights._answers = lambda server: False
    write([2])
    with pytest.raises(NoServerLeftError, match="no longer in the fleet file(.|\n)*8003"):
        weights.push(1)


def test_servers_that_take_weights_differently_are_refused():
    check_same_push({0: ServerWay("adapter"), 1: ServerWay("adapter")}, URLS)
    check_same_push({0: ServerWay("shm"), 2: ServerWay("gloo")}, URLS)  # merged either way
    with pytest.raises(ConfigError, match=r"server 1 \(.*8002.*\) cannot load LoRA adapters"):
        check_same_push({0: ServerWay("adapter"), 1: ServerWay("shm")}, URLS)
    with pytest.raises(ConfigError, match=r"server 2 \(.*8003.*\) can load .* server 1 \("):
        check_same_push({2: ServerWay("adapter"), 1: ServerWay("shm")}, URLS)  # a joiner


def test_servers_that_serve_differently_are_refused(monkeypatch):
    cfg = load_config(overrides=[f"server.base_urls=[{URLS[0]},{URLS[1]},{URLS[2]}]"])
    prints = {
        URLS[0]: {"max_model_len": 4096, "logprobs_mode": "processed_logprobs"},
        URLS[1]: {"max_model_len": 4096, "logprobs_mode": "processed_logprobs"},
        URLS[2]: {"max_model_len": 2048, "logprobs_mode": "processed_logprobs"},
    }
    monkeypatch.setattr(connect, "serving_fingerprint", lambda cfg, i, url: prints[url])
    with pytest.raises(ConfigError, match=r"server 2 \(.*8003.*\) serves max_model_len=2048 but"):
        check_same_serving(cfg, dict(enumerate(URLS)))
    check_same_serving(cfg, {0: URLS[0], 1: URLS[1]})  # server 2 down at start
    prints[URLS[2]]["max_model_len"] = 4096
    check_same_serving(cfg, dict(enumerate(URLS)))


class Checked(Recorded):
    """A push whose exact check fails for its first `bad` pushes."""

    def __init__(self, bad: int = 0):
        super().__init__()
        self.bad = bad

    def push(self, version: int) -> float:
        seconds = super().push(version)
        failed = ["lm_head.weight"] if len(self.pushed) <= self.bad else []
        self.verified = Verified(version, 0.1, 10, failed)
        return seconds

    def failed_check(self, version: int) -> Exception | None:
        if self.verified is None or self.verified.version != version or not self.verified.failed:
            return None
        return WeightsNotServedError(f"{self.verified.failed} differ")


def test_a_failed_exact_check_is_pushed_again_once_then_taken_out():
    pushes = [Checked(), Checked(bad=1), Checked(bad=2)]
    weights = fleet(pushes)
    weights.push(1)
    assert [p.pushed for p in pushes] == [[1], [1, 1], [1, 1]]
    assert weights.pushed == [0, 1], "the server that failed twice took the version"
    assert [s.up for s in weights.pool.servers] == [True, True, False]
    assert "failed the exact check twice" in weights.pool.servers[2].last_answer
    assert sorted(weights.verified) == [0, 1]
    assert all(not v.failed for v in weights.verified.values())


def test_one_server_failing_the_exact_check_twice_stops_the_run():
    weights = fleet([Checked(bad=2)])
    with pytest.raises(WeightsNotServedError, match="lm_head.weight.*after a second push too"):
        weights.push(1)


def probed_fleet(
    monkeypatch, pushes: list[WeightPush], served: dict[int, float], probe: bool = True, **kw
):
    """`PushProbes` (with the probe on or off) over a fleet of `pushes` whose server i scores
    the probe `served[i]` away from the trainer; the trainer's forward is skipped."""
    from types import SimpleNamespace

    import torch

    import rlvr.trainer.push_probes as push_probes
    from rlvr.weight_sync.connect import Connection
    from rlvr.weight_sync.probe import ModelProbe

    trainer = torch.linspace(-4.0, -1.0, 8, dtype=torch.float64)
    monkeypatch.setattr(push_probes, "trainer_logprobs", lambda *a: trainer)
    monkeypatch.setattr(
        push_probes, "served_logprobs", lambda control, name, ids: trainer - served[control]
    )
    for i, push in enumerate(pushes):
        push.control = i
    weights = fleet(pushes, **kw)
    weights.connect_one = lambda server: pushes[server.index]
    model_probe = ModelProbe([0] * 9) if probe else None
    probes = push_probes.PushProbes(Connection(weights, weights.pool, model_probe))
    accelerator = SimpleNamespace(device="cpu", is_main_process=True)
    return weights, lambda version, initial=False: probes.check(None, accelerator, version, initial)


def test_the_probe_runs_at_first_pushes_returns_and_pushes_no_exact_check_covered(monkeypatch):
    """Every server at the initial push; later only a server whose push had no exact check
    (here server 1) and a returning one, which is admitted when it passes and stays out of
    rotation when its model is not the trainer's."""
    served = {0: 0.0, 1: 0.01, 2: 0.0}
    weights, check = probed_fleet(
        monkeypatch, [Checked(), Recorded(), Checked()], served, answering={2}
    )
    weights.push(0)
    assert sorted(check(0, initial=True)) == [f"push/{i}/probe_kl" for i in range(3)] + [
        "push/probe_kl"
    ]
    weights.push(1)
    metrics = check(1)
    assert sorted(metrics) == ["push/1/probe_kl", "push/probe_kl"]
    assert metrics["push/probe_kl"] == metrics["push/1/probe_kl"] > 0
    for version, offset, up in [(2, 0.0, True), (3, 0.5, False)]:
        weights.pool.mark_down(weights.pool.servers[2], "SIGKILLed")
        served[2] = offset  # back with the trainer's model, then with another one
        weights.push(version)
        assert weights.returned == [2] and not weights.pool.servers[2].up
        assert ("push/2/probe_kl" in check(version)) is up, "a failed probe has no metric"
        assert weights.pool.servers[2].up is up


def test_without_the_probe_a_returning_server_is_admitted_on_its_exact_check(monkeypatch):
    pushes = [Checked(), Checked(), Checked(bad=2)]
    weights, check = probed_fleet(monkeypatch, pushes, {}, probe=False, answering={1, 2})
    for server in weights.pool.servers[1:]:
        weights.pool.mark_down(server, "SIGKILLed")
    weights.push(1)
    assert weights.returned == [1], "server 2 failed its exact check twice"
    assert check(1) == {}
    assert [s.up for s in weights.pool.servers] == [True, True, False]


class Unverified(Recorded):
    """A server with an exact check whose pushes return without sending (nor verifying)."""

    def __init__(self, url: str):
        super().__init__()
        from types import SimpleNamespace

        self.check = SimpleNamespace(control=SimpleNamespace(root=url))


def test_a_push_that_ran_no_exact_check_fails_it():
    """Where a server has an exact check, a push that left no verification of its version did
    not reach the server: pushed again once, then out (the last server: the run stops)."""
    weights = fleet([Checked(), Unverified(URLS[1])])
    weights.push(1)
    assert weights.pushed == [0] and weights.pushes[1].pushed == [1, 1]
    assert "weight version 1 ran no exact check" in weights.pool.servers[1].last_answer
    with pytest.raises(WeightsNotServedError, match="ran no exact check"):
        fleet([Unverified(URLS[0])]).push(1)


def free_urls(n: int) -> list[str]:
    """`n` distinct URLs on ports nothing listens on (bound together, then released)."""
    import socket

    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [f"http://127.0.0.1:{s.getsockname()[1]}/v1" for s in sockets]
    finally:
        for s in sockets:
            s.close()


def test_start_up_waits_for_a_server_that_comes_up_and_names_one_that_never_does():
    """A trainer started beside a server still loading waits for its health check (and says
    so); with several servers it starts with those that answer (the rest join later); when
    none answers it stops with their URLs and how to start one."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from rlvr.weight_sync.connect import wait_for_servers

    class Health(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()

        def log_message(self, *args):
            pass

    url, *gone = free_urls(3)
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    said, asked = [], threading.Event()
    servers = []

    def serve_once_asked():
        asked.wait()  # the trainer has said it waits
        servers.append(ThreadingHTTPServer(("127.0.0.1", port), Health))
        servers[0].serve_forever(poll_interval=0.05)

    threading.Thread(target=serve_once_asked, daemon=True).start()

    def say(line):
        said.append(line)
        asked.set()

    def urls(*chosen, wait=120):
        return load_config(
            overrides=[f"server.base_urls=[{','.join(chosen)}]", f"server.start_wait_s={wait}"]
        )

    try:
        assert wait_for_servers(urls(url), say, poll_s=0.05) == [0]
        assert len(said) == 1 and f"waiting for vf-vllm at {url}" in said[0], said
        assert wait_for_servers(urls(gone[0], url, wait=1), say, poll_s=0.05) == [1]
        assert f"starting without {gone[0]}: not answering yet" in said[-1], said
    finally:
        for server in servers:
            server.shutdown()
    with pytest.raises(ConfigError, match=f"no vf-vllm answers at {gone[0]}, {gone[1]} .*--model"):
        wait_for_servers(urls(*gone, wait=0), said.append)
