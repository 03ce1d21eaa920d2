"""The generate bridge against a fake vLLM (with a real one: test_envserver_bridge.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from rlvr.envserver.bridge import (
    ROLLOUT_HEADER,
    Bridge,
    RequestRefused,
    derive_seed,
    prepare,
    reshape_logprobs,
)
from rlvr.rollouts.router import Fault
from rlvr.weight_sync.rendezvous import free_port

MODEL = "policy-v3"


def vllm_answer(prompt_ids: list[int], seed: int | None) -> dict:
    """What vLLM 0.32's generate route answers (its shape, trimmed): ids that depend on the
    prompt and seed, so a test can tell calls apart."""
    ids = [(sum(prompt_ids) + (seed or 0) + i) % 500 for i in range(3)]
    content = [
        {
            "token_id": t,
            "logprob": -1.0 - i / 8,
            "rank": 2,
            "top_logprobs": [{"token_id": t, "logprob": -1.0 - i / 8, "rank": 2}],
        }
        for i, t in enumerate(ids)
    ]
    choice = {"index": 0, "finish_reason": "length", "stop_reason": None, "token_ids": ids}
    choice["weight_versions"] = [{"version": "3", "start": 0, "end": 3}]
    return {
        "request_id": "generate-tokens-1",
        "model": MODEL,
        "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": 3},
        "prompt_token_ids": None,
        "output_mode": "tokens",
        "choices": [{**choice, "logprobs": {"content": content}}],
    }


class FakeVLLM:
    """A stand-in for vf-vllm's generate and models routes that keeps the bodies it got and
    each call's Authorization header; `fail_with` makes generate answer that (status, text)
    instead."""

    def __init__(self):
        self.bodies: list[dict] = []
        self.keys: list[str | None] = []
        self.delay_s = 0.0
        self.fail_with: tuple[int, str] | None = None
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, status: int, payload: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload.encode())

            def do_GET(self):
                self._send(200, json.dumps({"data": [{"id": MODEL, "max_model_len": 4096}]}))

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fake.bodies.append(body)
                fake.keys.append(self.headers.get("Authorization"))
                time.sleep(fake.delay_s)
                if fake.fail_with is not None:
                    self._send(fake.fail_with[0], fake.fail_with[1])
                    return
                seed = body["sampling_params"].get("seed")
                self._send(200, json.dumps(vllm_answer(body["token_ids"], seed)))

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/v1"
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def upstream():
    fake = FakeVLLM()
    yield fake
    fake.close()


@pytest.fixture
def bridge(upstream):
    with Bridge([upstream.url], temperature=0.7) as b:
        yield b


def generate_body(prompt_ids: list[int], **sampling) -> dict:
    """The body renderers.client.generate posts (client.py: sampling_params plus its own
    stop_token_ids, logprobs=1, skip_special_tokens)."""
    params = {"max_tokens": 3, **sampling, "stop_token_ids": [2], "logprobs": 1}
    params.setdefault("skip_special_tokens", False)
    return {"model": MODEL, "token_ids": prompt_ids, "sampling_params": params}


def post(bridge: Bridge, body: dict) -> httpx.Response:
    return httpx.post(f"{bridge.root_url}/inference/v1/generate", json=body, timeout=30)


def renderers_logprobs(choice: dict) -> list[float]:
    """The check renderers 0.1.12 applies to each sampled token (client.py:163-187)."""
    out = []
    for entry, token_id in zip(choice["logprobs"]["content"], choice["token_ids"], strict=True):
        assert entry["token"] == f"token_id:{token_id}"
        out.append(float(entry["logprob"]))
    return out


def test_reshape_spells_token_ids_as_renderers_reads_them():
    data = vllm_answer([1, 2, 3], seed=None)
    reshaped = reshape_logprobs(json.loads(json.dumps(data)))
    choice = reshaped["choices"][0]
    assert renderers_logprobs(choice) == [
        e["logprob"] for e in data["choices"][0]["logprobs"]["content"]
    ]
    for entry in choice["logprobs"]["content"]:
        assert entry["top_logprobs"][0]["token"] == f"token_id:{entry['token_id']}"
        assert entry["rank"] == 2
    assert {k: v for k, v in reshaped.items() if k != "choices"} == {
        k: v for k, v in data.items() if k != "choices"
    }


def test_seed_differs_per_turn_and_per_episode_and_is_stable():
    turn1 = [1, 5, 9]
    turn2 = [*turn1, 40, 41, 2, 1, 7]
    seeds = {derive_seed(s, p) for s in (11, 12) for p in (turn1, turn2)}
    assert len(seeds) == 4
    assert derive_seed(11, turn2) == derive_seed(11, list(turn2))
    assert all(0 <= s < 2**31 - 1 for s in seeds)


def test_prepare_derives_the_seed_and_fills_the_run_temperature():
    sent = prepare(generate_body([1, 2], seed=11), temperature=0.7)["sampling_params"]
    assert sent["seed"] == derive_seed(11, [1, 2])
    assert sent["temperature"] == 0.7
    assert "seed" not in prepare(generate_body([1, 2]), temperature=0.7)["sampling_params"]
    kept = prepare(generate_body([1, 2], temperature=0.7, top_k=-1, top_p=1.0), 0.7)
    assert kept["sampling_params"]["top_k"] == -1


@pytest.mark.parametrize(
    "setting",
    [
        {"top_p": 0.9},
        {"top_k": 20},
        {"min_p": 0.05},
        {"repetition_penalty": 1.1},
        {"presence_penalty": 0.5},
        {"frequency_penalty": 0.5},
        {"logit_bias": {"5": 3.0}},
        {"min_tokens": 4},
        {"allowed_token_ids": [3, 4]},
        {"structured_outputs": {"regex": "[0-9]+"}},
        {"temperature": 1.0},
    ],
)
def test_refuses_sampling_the_trainer_cannot_reproduce(bridge, upstream, setting):
    reply = post(bridge, generate_body([1, 2, 3], **setting))
    assert reply.status_code == 400
    message = reply.json()["error"]["message"]
    assert next(iter(setting)) in message
    assert upstream.bodies == [] and bridge.calls == []


def test_refuses_what_it_cannot_serve():
    for body, words in [
        ({**generate_body([1]), "stream": True}, "stream"),
        (generate_body([1], n=2), "n=2"),
        (generate_body([1], seed="7"), "seed='7'"),
        ({"model": MODEL, "token_ids": "1 2", "sampling_params": {}}, "token_ids"),
        ({**generate_body([1]), "features": {"mm_hashes": ["h"]}}, "multimodal"),
        ({**generate_body([1]), "content_parts": [{"type": "image"}]}, "multimodal"),
    ]:
        with pytest.raises(RequestRefused, match=words):
            prepare(body, temperature=1.0)


def test_each_call_is_recorded_as_sent_and_generated(bridge, upstream):
    turn1 = [1, 5, 9]
    first = post(bridge, generate_body(turn1, seed=11)).json()["choices"][0]
    turn2 = [*turn1, *first["token_ids"], 2, 1]
    second = post(bridge, generate_body(turn2, seed=11)).json()["choices"][0]

    calls = bridge.calls
    assert [c.prompt_ids for c in calls] == [b["token_ids"] for b in upstream.bodies]
    assert [c.seed for c in calls] == [derive_seed(11, turn1), derive_seed(11, turn2)]
    assert [c.seed for c in calls] == [b["sampling_params"]["seed"] for b in upstream.bodies]
    assert calls[0].seed != calls[1].seed
    for call, choice in zip(calls, (first, second), strict=True):
        assert call.model == MODEL
        assert call.upstream == upstream.url.removesuffix("/v1")
        assert call.completion_ids == choice["token_ids"]
        assert call.completion_logprobs == renderers_logprobs(choice)
        assert call.finish_reason == "length"
        assert call.weight_versions == [{"version": "3", "start": 0, "end": 3}]
    assert bridge.calls_since(1) == calls[1:]


def test_calls_beyond_keep_calls_are_dropped_loudly(upstream):
    with Bridge([upstream.url], temperature=1.0, keep_calls=2) as bridge:
        for i in range(3):
            assert post(bridge, generate_body([1, i])).status_code == 200
        assert [c.prompt_ids for c in bridge.calls_since(1)] == [[1, 1], [1, 2]]
        with pytest.raises(LookupError, match="no longer kept"):
            bridge.calls_since(0)


def test_the_runs_api_key_replaces_the_clients(upstream):
    """0.4's client sends its own placeholder key; a vf-vllm started with --api-key answers
    401 to it, so the bridge sends the run's `server.api_key` instead (and, without one,
    passes the client's on)."""
    placeholder = {"Authorization": "Bearer EMPTY"}
    with Bridge([upstream.url], 0.7, api_key="secret") as keyed:
        body = generate_body([1, 2])
        httpx.post(f"{keyed.root_url}/inference/v1/generate", json=body, headers=placeholder)
    with Bridge([upstream.url], 0.7) as plain:
        httpx.post(f"{plain.root_url}/inference/v1/generate", json=body, headers=placeholder)
    assert upstream.keys == ["Bearer secret", "Bearer EMPTY"]


def test_a_server_that_wants_a_key_is_a_clear_error_at_start(upstream):
    from rlvr.envserver.environment import check_generate_route
    from rlvr.rollouts.to_samples import MissingTokensError

    upstream.fail_with = (401, json.dumps({"error": "Unauthorized"}))
    with pytest.raises(MissingTokensError, match="answered 401.*set server.api_key"):
        check_generate_route(upstream.url, "wrong")
    assert upstream.keys == ["Bearer wrong"]
    upstream.fail_with = (400, json.dumps({"error": "token_ids missing"}))
    check_generate_route(upstream.url, "right")  # the route is there: the empty body is refused


def test_models_pass_through(bridge):
    models = httpx.get(f"{bridge.base_url}/models", timeout=30).json()
    assert models["data"][0] == {"id": MODEL, "max_model_len": 4096}


def test_upstream_errors_pass_through_unrecorded(bridge, upstream):
    upstream.fail_with = (404, json.dumps({"error": {"message": "model policy-v9 not found"}}))
    reply = post(bridge, generate_body([1, 2]))
    assert reply.status_code == 404
    assert reply.json()["error"]["message"] == "model policy-v9 not found"
    assert bridge.calls == []


def test_dead_upstream_is_a_502_with_its_error():
    dead = f"http://127.0.0.1:{free_port()}/v1"
    with Bridge([dead], temperature=1.0) as bridge:
        for reply in (
            post(bridge, generate_body([1, 2])),
            httpx.get(f"{bridge.base_url}/models", timeout=30),
        ):
            assert reply.status_code == 502
            message = reply.json()["error"]["message"]
            assert dead.removesuffix("/v1") in message and "Cannot connect" in message


class Heard:
    """A `CallReport` that writes down what it hears: (event, mark, fault)."""

    def __init__(self):
        self.events: list[tuple] = []

    def requested(self, mark):
        self.events.append(("requested", mark))

    def answered(self, mark):
        self.events.append(("answered", mark))

    def failed(self, mark, failure):
        self.events.append(("failed", mark, failure.fault))


def call(bridge: Bridge, mark: str, body: dict | None = None) -> httpx.Response:
    url = f"{bridge.root_url}/inference/v1/generate"
    body = body or generate_body([1, 2])
    return httpx.post(url, json=body, headers={ROLLOUT_HEADER: mark}, timeout=30)


def test_reports_hear_each_rollouts_calls_answers_and_server_failures(upstream):
    """The rollout mark (ROLLOUT_HEADER) comes with every report: each call, each answer, and
    each server failure with whose it may be, as the router's own client would weigh it: a
    5xx, a 404 or a call past the deadline may be the request's (SUSPECT, passed on as it
    came, or a 502 for the deadline); an upstream no one can reach is the server's (GONE); a
    400 is the request's alone (no failure)."""
    heard = Heard()
    with Bridge([upstream.url], 1.0, timeout_s=0.5, report=heard) as bridge:
        assert call(bridge, "ok").status_code == 200
        for status, mark in [(503, "busy"), (404, "lost"), (400, "bad")]:
            upstream.fail_with = (status, json.dumps({"error": {"message": "no"}}))
            assert call(bridge, mark).status_code == status
        upstream.fail_with, upstream.delay_s = None, 2.0
        assert call(bridge, "slow").status_code == 502
    upstream.delay_s = 0.0
    with Bridge([f"http://127.0.0.1:{free_port()}/v1"], 1.0, report=heard) as dead:
        assert call(dead, "gone").status_code == 502
    assert heard.events == [
        ("requested", "ok"),
        ("answered", "ok"),
        ("requested", "busy"),
        ("failed", "busy", Fault.SUSPECT),
        ("requested", "lost"),
        ("failed", "lost", Fault.SUSPECT),
        ("requested", "bad"),
        ("requested", "slow"),
        ("failed", "slow", Fault.SUSPECT),
        ("requested", "gone"),
        ("failed", "gone", Fault.GONE),
    ]


def test_a_dead_upstream_is_skipped(upstream):
    dead = f"http://127.0.0.1:{free_port()}"
    with Bridge([dead, upstream.url], temperature=1.0) as bridge:
        for i in range(4):
            assert post(bridge, generate_body([1, i])).status_code == 200
        assert {c.upstream for c in bridge.calls} == {upstream.url.removesuffix("/v1")}


def test_upstreams_are_picked_by_calls_in_flight():
    bridge = Bridge(["http://a:1/v1", "http://b:1", "http://c:1"], temperature=1.0)
    bridge._in_flight.update({"http://a:1": 2, "http://b:1": 0, "http://c:1": 1})
    assert bridge._by_load() == ["http://b:1", "http://c:1", "http://a:1"]
    bridge._in_flight.update({"http://a:1": 0, "http://b:1": 0, "http://c:1": 0})
    assert len({bridge._by_load()[0] for _ in range(3)}) == 3  # ties rotate


def test_runs_alone(upstream):
    cmd = [sys.executable, "-m", "rlvr.envserver.bridge", "--upstream", upstream.url]
    proc = subprocess.Popen(
        [*cmd, "--temperature", "1"], stdout=subprocess.PIPE, text=True, env=os.environ
    )
    try:
        base_url = proc.stdout.readline().strip()
        reply = httpx.post(
            base_url.removesuffix("/v1") + "/inference/v1/generate",
            json=generate_body([4, 5], seed=3),
            timeout=30,
        )
        assert renderers_logprobs(reply.json()["choices"][0])
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
