"""Several inference servers behind one run (`server.base_urls`): groups spread over them and
stay on one, every version reaches each, a server that dies or serves stale weights is taken
out and the run goes on, a returning one is given the current weights first, and a run trains
the same on two exact servers as on one. Real vf-vllm servers on the CPU, tiny model."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import serve_tiny
from support import (
    ADAPTER_TARGETS,
    chat_requests,
    config,
    one_element_off_while,
    recording_proxy,
    restore_base_weights,
    target_id,
)
from toy_env import multi_turn_target_env, target_share_env

from rlvr.config import ConfigError
from rlvr.rollouts.router import STRIKES
from rlvr.rollouts.servers import NoServerLeftError
from rlvr.trainer.checkpoint import list_checkpoints
from rlvr.trainer.grpo import Trainer
from rlvr.weight_sync.merged import MergedPush

integration = pytest.mark.integration
TRAINED = ("reward/mean", "loss/total", "grad_norm")
"""What a step trains: equal on one server and on two."""
EVERY_OTHER_ID = set(range(0, 512, 2))
"""A toy reward every group of the tiny model learns from: each step moves the weights."""


@pytest.fixture(scope="module")
def second_server(tiny_model_dir, tmp_path_factory):
    """A second vf-vllm on the tiny model, served like `tiny_server`; tests kill and restart it."""
    server = serve_tiny(tiny_model_dir, tmp_path_factory.mktemp("second-server"))
    yield server
    server.stop()


def on_servers(cfg, *servers):
    """`cfg` with its rollouts spread over `servers` (given as objects with a `base_url`)."""
    cfg.server.base_url = None
    cfg.server.base_urls = [s.base_url for s in servers]
    return cfg


def train(cfg, server, **run) -> list[dict]:
    return Trainer(cfg, env=target_share_env(target_id(server.model_dir))).run(**run)


def assert_trained_alike(ours: list[dict], reference: list[dict]) -> None:
    assert len(ours) == len(reference)
    for step, (a, b) in enumerate(zip(ours, reference, strict=True), start=1):
        for key in TRAINED:
            assert a[key] == pytest.approx(b[key], rel=1e-6, abs=1e-9), (step, key, a, b)


@pytest.fixture(scope="module")
def one_server_run(tiny_server, tmp_path_factory) -> list[dict]:
    """The reference: 4 steps of merged pushes on `tiny_server` alone."""
    return train(config(tiny_server, tmp_path_factory.mktemp("one"), "max_steps=4"), tiny_server)


@integration
@pytest.mark.parametrize("sync", ["merged", "adapter"])
def test_two_servers_train_like_one(tiny_server, second_server, one_server_run, tmp_path, sync):
    """Requests carry their seeds and every server holds the same float32 weights, so which
    server generated a group does not matter: 2 steps on two servers train what 2 steps on
    one do, under merged pushes and under adapter sync."""
    extra = ["max_steps=2"]
    reference = one_server_run[:2]
    if sync == "adapter":  # adapters go onto the servers' own base: the model's, not a run's
        restore_base_weights(tiny_server)
        restore_base_weights(second_server)
        extra += ["server.lora_sync=adapter", f"lora.target_modules={ADAPTER_TARGETS}"]
        reference = train(config(tiny_server, tmp_path / "one", *extra), tiny_server)
    cfg = on_servers(config(tiny_server, tmp_path / "two", *extra), tiny_server, second_server)
    history = train(cfg, tiny_server)
    assert_trained_alike(history, reference)
    for h in history:
        assert h["servers/up"] == 2 and h["rollouts/retried_groups"] == 0
        assert h["servers/0/groups"] > 0 and h["servers/1/groups"] > 0
        assert h["servers/0/groups"] + h["servers/1/groups"] == 4
        assert h["push/0/seconds"] > 0 and h["push/1/seconds"] > 0


@integration
def test_a_group_stays_on_one_server(tiny_server, second_server, tmp_path):
    """Every request of a group (8 rollouts x 3 turns) reaches one server, and the groups
    spread over both: recorded by a proxy in front of each."""
    cfg = config(tiny_server, tmp_path / "run", "max_steps=1")
    with recording_proxy(tiny_server) as (a, seen_a), recording_proxy(second_server) as (b, seen_b):
        cfg.server.base_url, cfg.server.base_urls = None, [a, b]
        env = multi_turn_target_env(target_id(tiny_server.model_dir), turns=3)
        history = Trainer(cfg, env=env).run()
    assert history[0]["rollouts/turns"] == 3

    def groups(requests) -> dict[str, int]:
        """Chat requests per group (a group's rows share their first user message)."""
        counts: dict[str, int] = {}
        for body in chat_requests(requests):
            first = next(m["content"] for m in body["messages"] if m["role"] == "user")
            counts[first] = counts.get(first, 0) + 1
        return counts

    on_a, on_b = groups(seen_a), groups(seen_b)
    assert on_a and on_b, "the groups did not spread over both servers"
    assert not set(on_a) & set(on_b), "a group's requests reached both servers"
    assert sorted([*on_a.values(), *on_b.values()]) == [24] * 4, (on_a, on_b)


@integration
def test_every_server_serves_every_version(tiny_server, second_server, tmp_path, monkeypatch):
    """After each push both servers pass the exact check; a server that misses the push of
    version 2 is not checked by it (no push ran), fails its probe and is taken out (step 3
    runs on the other one), and at the next push, answering again, it is given the current
    weights and comes back."""
    push = MergedPush.push

    def misses_version_2(self, version):
        if version == 2 and self.base_url == second_server.base_url:
            return 0.0
        return push(self, version)

    monkeypatch.setattr(MergedPush, "push", misses_version_2)
    cfg = on_servers(config(tiny_server, tmp_path, "max_steps=4"), tiny_server, second_server)
    history = Trainer(cfg, env=target_share_env(EVERY_OTHER_ID)).run()
    for step in (0, 2, 3):  # pushes of versions 1, 3, 4: both servers hold them exactly
        for i in (0, 1):
            assert history[step][f"push/{i}/failed_params"] == 0, (step, i)
            assert history[step][f"push/{i}/verified_params"] > 0, (step, i)
    assert "push/1/probe_kl" not in history[1], "the stale server's probe did not fail"
    assert history[2]["push/1/probe_kl"] < 1e-6, "the returning server's model was not probed"
    assert history[2]["servers/1/up"] == 0 and history[2]["servers/1/groups"] == 0
    assert history[2]["servers/0/groups"] == 4
    assert history[3]["servers/1/up"] == 1 and history[3]["servers/1/groups"] > 0


@integration
def test_stale_server_is_never_readmitted(tiny_server, second_server, tmp_path, monkeypatch):
    """The second server stops holding what it is pushed at version 2 (every transfer to it
    arrives one element off, so it answers but serves other weights) until version 5: it leaves
    rotation at the push of version 2, after the second try; at each later push it answers, is
    connected afresh and pushed the whole current version, fails the exact check again and
    stays out; the first push it holds exactly (version 5) brings it back."""
    stale = {"on": False}
    one_element_off_while(monkeypatch, lambda: stale["on"], "model.layers.1.mlp.down_proj.weight")
    push = MergedPush.push

    def push_to(self, version):
        stale["on"] = 2 <= version < 5 and self.base_url == second_server.base_url
        try:
            return push(self, version)
        finally:
            stale["on"] = False

    monkeypatch.setattr(MergedPush, "push", push_to)
    cfg = on_servers(config(tiny_server, tmp_path, "max_steps=6"), tiny_server, second_server)
    history = Trainer(cfg, env=target_share_env(EVERY_OTHER_ID)).run()
    restore_base_weights(second_server)
    assert history[0]["servers/1/groups"] > 0  # step 1, before it went stale
    for step in (2, 3, 4):  # after the pushes of versions 2, 3 and 4
        assert history[step]["servers/1/up"] == 0, step
        assert history[step]["servers/1/groups"] == 0, step
        assert history[step]["servers/0/groups"] == 4, step
    assert history[5]["servers/1/up"] == 1 and history[5]["servers/1/groups"] > 0


def engine_group(server) -> int:
    """The process group of the vLLM that `server`'s launcher started (its own session: API
    server, engine core, workers), not the launcher's nor its watchdog's."""
    tasks = Path(f"/proc/{server.proc.pid}/task")
    children = [int(c) for t in tasks.iterdir() for c in (t / "children").read_text().split()]
    (engine,) = [
        c
        for c in children
        if b"rlvr.server.lifetime" not in Path(f"/proc/{c}/cmdline").read_bytes()
    ]
    return os.getpgid(engine)


@integration
def test_a_run_starts_with_one_of_two_servers_up(tiny_server, second_server, tmp_path, monkeypatch):
    """The second server is stopped (SIGSTOP: it takes connections and answers nothing) when
    the run starts: the run starts on the first, the second out of rotation. Continued after
    the push of version 1, it answers at the push of version 2, is checked like a server at
    start, connected, pushed the whole current version and verified, and takes groups from
    step 3 on."""
    push = Trainer.push_weights
    group = engine_group(second_server)

    def continued_at_2(self, version, initial=False):
        if version == 2:
            os.killpg(group, signal.SIGCONT)
        return push(self, version, initial)

    monkeypatch.setattr(Trainer, "push_weights", continued_at_2)
    cfg = on_servers(
        config(tiny_server, tmp_path, "max_steps=3", "server.start_wait_s=5"),
        tiny_server,
        second_server,
    )
    os.killpg(group, signal.SIGSTOP)
    try:
        history = Trainer(cfg, env=target_share_env(EVERY_OTHER_ID)).run()
    finally:
        os.killpg(group, signal.SIGCONT)
    restore_base_weights(second_server)
    assert history[0]["servers/1/up"] == 0 and history[0]["servers/1/groups"] == 0
    assert history[0]["servers/0/groups"] == 4 and "push/1/verified_params" not in history[0]
    assert history[1]["push/1/failed_params"] == 0 and history[1]["push/1/verified_params"] > 0
    assert history[2]["servers/1/up"] == 1 and history[2]["servers/1/groups"] > 0


def disturbed_in_step_2(disturb: Callable[[], None], mend: Callable[[], None]):
    """A `Trainer.push_weights` that calls `disturb` once the second server has a group of
    step 2 in flight (routing starts after the push of version 1), and `mend` before the push
    of version 2."""
    push = Trainer.push_weights
    disturbed = threading.Event()

    def when_busy(server) -> None:
        deadline = time.monotonic() + 60
        while server.in_flight == 0 and time.monotonic() < deadline:
            time.sleep(0.001)
        disturb()
        disturbed.set()

    def pushing(self, version, initial=False):
        if version == 2:
            assert disturbed.wait(60)
            mend()
        pushed = push(self, version, initial)
        if version == 1:  # step 2's groups are being routed now
            threading.Thread(target=when_busy, args=(self.pool.servers[1],)).start()
        return pushed

    return pushing


@integration
def test_a_hung_server_is_taken_out_quickly(tiny_server, second_server, one_server_run, tmp_path):
    """The second server is stopped (SIGSTOP: connections accepted, nothing answered) while
    step 2 generates on it, with `server.timeout_s` 600: its health watch takes it out after
    `server.hang_s` (20 s), not the timeout, and its groups run again on the first with their
    seeds, so the run trains what one server trains. Continued before the push of version 2,
    it returns and takes groups again."""
    group = engine_group(second_server)
    stopping = disturbed_in_step_2(
        lambda: os.killpg(group, signal.SIGSTOP), lambda: os.killpg(group, signal.SIGCONT)
    )

    cfg = on_servers(
        config(tiny_server, tmp_path, "max_steps=3", "server.timeout_s=600"),
        tiny_server,
        second_server,
    )
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(Trainer, "push_weights", stopping)
            history = train(cfg, tiny_server)
    finally:
        os.killpg(group, signal.SIGCONT)
        restore_base_weights(second_server)
    step2, step3 = history[1], history[2]
    assert step2["fleet/hung"] == 1 and step2["rollouts/retried_groups"] >= 1
    assert step2["rollouts/errored"] == 0 and step2["servers/1/up"] == 0
    assert step3["servers/1/up"] == 1 and step3["servers/1/groups"] > 0
    assert_trained_alike(history, one_server_run[:3])


def poison_first_prompt() -> Callable[[str, dict | None], int | None]:
    """A proxy rule (`recording_proxy`): 500 to every chat request for the first prompt any
    proxy sharing the rule saw, on every server: a request that is bad, not a server."""
    first: dict[str, str] = {}

    def answer(path: str, body: dict | None) -> int | None:
        if not path.endswith("/chat/completions") or not body:
            return None
        prompt = json.dumps(body["messages"])
        return 500 if first.setdefault("prompt", prompt) == prompt else None

    return answer


@integration
@pytest.mark.parametrize("servers", [1, 3])
def test_a_request_error_is_not_the_servers(tiny_server, tmp_path, servers):
    """One prompt's requests fail with 500 on every server (proxies in front of
    `tiny_server`): its group runs again on another server (the same one where there is only
    one), fails there too, and is that request's error: its rollouts error, every server
    stays, and the run goes on."""
    answer = poison_first_prompt()
    with contextlib.ExitStack() as proxies:
        urls = [proxies.enter_context(recording_proxy(tiny_server, answer)) for _ in range(servers)]
        cfg = config(tiny_server, tmp_path, "max_steps=2")
        cfg.server.base_url, cfg.server.base_urls = None, [url for url, _ in urls]
        history = train(cfg, tiny_server)
    first = history[0]
    assert len(history) == 2 and first["rollouts/retried_groups"] == 1
    assert first["fleet/request_errors"] == 8 and first["rollouts/errored"] == 8
    assert first["servers/up"] == servers == history[1]["servers/up"]


@integration
def test_a_fast_failing_server_is_taken_out(tiny_server, tmp_path):
    """The second server answers 404 to every generation at once (a restarted adapter server
    that lost the policy's name): least-loaded routing would feed it most groups. Its groups
    run again on the first, no rollout errors, and after three failures in a row it is out."""

    def not_found(path: str, body: dict | None) -> int | None:
        return 404 if path.endswith("/chat/completions") else None

    with recording_proxy(tiny_server, not_found) as (failing, _):
        cfg = config(tiny_server, tmp_path, "max_steps=1", "batch.batch_size=64")
        cfg.server.base_url, cfg.server.base_urls = None, [tiny_server.base_url, failing]
        (step,) = train(cfg, tiny_server)
    assert step["servers/1/up"] == 0 and step["servers/1/groups"] == 0
    assert step["rollouts/errored"] == 0 and step["servers/0/groups"] == 8
    assert step["rollouts/retried_groups"] >= STRIKES


@pytest.fixture(scope="module")
def fleet_file_run(tiny_server, second_server, tmp_path_factory):
    """Five steps from a fleet file listing the first server (behind a proxy that can hold
    requests), under `batch.async_level=1` (step k+1 generates while step k trains). Before the
    push of version 1, once step 2 has generated, the file lists the second server too: it
    joins at that push. Requests reaching the first server are then held, so step 3's groups
    on it are in flight when the file, before the push of version 2, lists the second server
    alone: the first drains there, and is released after that push. Returns the history
    and, per version pushed, the first server's state (listed, up, in flight, last answer)
    and the servers that took the push."""
    out = tmp_path_factory.mktemp("fleet-file")
    fleet, holding, released = out / "fleet", threading.Event(), threading.Event()

    def held(path: str, body: dict | None) -> int | None:
        if holding.is_set() and path.endswith("/chat/completions"):
            released.wait(120)
        return None

    push, seen = Trainer.push_weights, {}

    def pushing(self, version, initial=False):
        first = self.pool.servers[0]
        if version == 1:  # step 2 generated its 4 groups (after step 1's 4), all on the first
            deadline = time.monotonic() + 60
            while first.groups < 8 and time.monotonic() < deadline:
                time.sleep(0.01)
            fleet.write_text(f"{first.url}\n{second_server.base_url}\n")
        if version == 2:
            deadline = time.monotonic() + 60
            while first.in_flight == 0 and time.monotonic() < deadline:
                time.sleep(0.01)
            fleet.write_text(f"{second_server.base_url}\n")
        pushed = push(self, version, initial)
        seen[version] = (first.listed, first.up, first.in_flight, first.last_answer)
        seen[version] += (list(self.weights.pushed),)
        if version == 1:
            holding.set()
        if version == 2:
            released.set()
        return pushed

    with recording_proxy(tiny_server, held) as (first_url, _):
        fleet.write_text(f"# the run's servers\n{first_url}\n")
        cfg = config(tiny_server, out, "max_steps=5", "batch.async_level=1")
        cfg.server.base_url, cfg.server.fleet_file = None, str(fleet)
        try:
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(Trainer, "push_weights", pushing)
                history = Trainer(cfg, env=target_share_env(EVERY_OTHER_ID)).run()
        finally:
            released.set()
            restore_base_weights(second_server)
    return history, seen


@integration
def test_a_server_added_to_the_fleet_file_joins(fleet_file_run):
    """The server listed anew is checked like one at start, pushed the current version and
    verified (exact check and model probe) at the push after it was listed, and takes groups
    from the next step on; `fleet/joined` counts it once."""
    history, seen = fleet_file_run
    assert history[1].get("servers/1/groups", 0) == 0 and seen[1][4] == [0, 1]
    assert history[0]["push/1/failed_params"] == 0 and history[0]["push/1/verified_params"] > 0
    assert history[0]["push/1/probe_kl"] < 1e-6
    assert history[2]["servers/1/up"] == 1 and history[2]["servers/1/groups"] > 0
    assert sum(h["fleet/joined"] for h in history) == 1
    assert all(h["rollouts/errored"] == 0 for h in history)


@integration
def test_a_server_removed_from_the_fleet_file_drains(fleet_file_run):
    """The server the file stops listing while step 3 has groups in flight on it takes no new
    group, keeps taking pushes while those groups finish there (none runs again elsewhere, none
    errors), and is let go at the first push after they have; `fleet/left` counts it once."""
    history, seen = fleet_file_run
    listed, up, in_flight, _, pushed = seen[2]
    assert not listed and up and in_flight > 0 and pushed == [0, 1]
    assert history[2]["servers/0/groups"] > 0 and history[2]["rollouts/retried_groups"] == 0
    listed, up, in_flight, why, pushed = seen[3]
    assert not up and in_flight == 0 and "no longer in the fleet file: let go" in why
    assert pushed == [1]
    for step in history[3:]:
        assert step["servers/0/groups"] == 0 and step["servers/total"] == 1
    assert sum(h["fleet/left"] for h in history) == 1
    assert all(h["rollouts/errored"] == 0 for h in history)


@pytest.fixture(scope="module")
def crash_run(tiny_server, second_server, tmp_path_factory):
    """Two servers, 3 steps, a checkpoint after each: the second server is SIGKILLed while step
    2 generates on it and started again before the push that ends step 2; then the run is
    resumed (`checkpoint.resume=auto`) for a 4th step."""
    out = tmp_path_factory.mktemp("crash")
    crashing = disturbed_in_step_2(second_server.kill, second_server.restart)
    cfg = on_servers(
        config(tiny_server, out, "max_steps=3", "checkpoint.every=1"), tiny_server, second_server
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Trainer, "push_weights", crashing)
        history = train(cfg, tiny_server)
    resumed = on_servers(
        config(tiny_server, out, "max_steps=4", "checkpoint.resume=auto"),
        tiny_server,
        second_server,
    )
    return history, train(resumed, tiny_server)


@integration
def test_a_server_killed_mid_run_is_survived(crash_run, one_server_run):
    """Every step completes; the groups in flight on the killed server ran again on the other
    (whole, with their seeds), so the run trained exactly what one server trains, and so
    did the resumed step."""
    history, resumed = crash_run
    assert len(history) == 3 and history[1]["rollouts/retried_groups"] >= 1
    assert history[1]["rollouts/errored"] == 0, "a failed server's rollouts were kept"
    assert_trained_alike(history, one_server_run[:3])
    assert_trained_alike(resumed, one_server_run[3:])


@integration
def test_a_server_that_returns_gets_the_current_weights(crash_run):
    """The restarted server was connected afresh, pushed version 2 and probed on it (a first
    push's probe: absolute mismatch, both sides float32) before it took any group."""
    history, resumed = crash_run
    step2, step3 = history[1], history[2]
    assert step2["servers/1/up"] == 0 and step2["servers/1/groups"] == 0
    assert step2["push/1/probe_kl"] < 1e-6, "the returning server does not serve version 2"
    assert step3["servers/1/up"] == 1 and step3["servers/1/groups"] > 0
    assert step3["servers/up"] == 2 and resumed[0]["servers/up"] == 2


@integration
def test_no_server_left_is_a_clear_error(tiny_server, tmp_path, monkeypatch):
    """Both servers (proxies in front of `tiny_server`) go away after step 1: the run stops
    with an error naming each and what it last answered, and step 1's checkpoint stands."""
    push = Trainer.push_weights
    with contextlib.ExitStack() as proxies:
        a, _ = proxies.enter_context(recording_proxy(tiny_server))
        b, _ = proxies.enter_context(recording_proxy(tiny_server))

        def vanishing(self, version, initial=False):
            pushed = push(self, version, initial)
            if version == 1:
                proxies.close()
            return pushed

        monkeypatch.setattr(Trainer, "push_weights", vanishing)
        cfg = config(tiny_server, tmp_path, "max_steps=3", "checkpoint.every=1")
        cfg.server.base_url, cfg.server.base_urls = None, [a, b]
        with pytest.raises(NoServerLeftError) as caught:
            train(cfg, tiny_server)
    text = str(caught.value)
    assert a in text and b in text and text.count("APIConnectionError") == 2, text
    assert [c.name for c in list_checkpoints(tmp_path)] == ["step_000001"]


@integration
def test_mismatched_servers_are_refused(tiny_server, smollm2_server, tmp_path):
    """A second server that does not serve the run's model is refused at start, naming it."""
    cfg = on_servers(config(tiny_server, tmp_path, "max_steps=1"), tiny_server, smollm2_server)
    with pytest.raises(ConfigError, match=r"server 1 \(.*\) does not serve model"):
        train(cfg, tiny_server)
