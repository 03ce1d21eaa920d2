"""The generate bridge in front of a real vf-vllm (the shared tiny server, `--enable-scale-out`):
what a verifiers 0.4 client receives through it is exactly what vLLM generated for what it sent,
and renderers' own `generate` (run in the side venv: tests/fixtures/envserver/side04_generate.py)
accepts every turn through it."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import httpx
import pytest

from rlvr.envserver.bridge import Bridge, derive_seed

TEMPERATURE = 1.0
SIDE_SCRIPT = Path(__file__).parents[1] / "fixtures" / "envserver" / "side04_generate.py"


@pytest.fixture(scope="module")
def scale_out_server(tiny_server):
    """The shared tiny vf-vllm: its generate route is on (vLLM's flag, passed through)."""
    return tiny_server


def generate_body(model: str, prompt_ids: list[int], seed: int | None) -> dict:
    """The body renderers 0.1.12 posts (renderers/client.py:310-319): 0.4's sampling (the
    episode's seed on every turn) plus stop_token_ids, logprobs=1 and skip_special_tokens."""
    params = {"temperature": TEMPERATURE, "max_tokens": 6, "stop_token_ids": [2], "logprobs": 1}
    params["skip_special_tokens"] = False
    if seed is not None:
        params["seed"] = seed
    return {
        "model": model,
        "token_ids": prompt_ids,
        "sampling_params": {**params, "skip_special_tokens": False},
    }


def post(root_url: str, body: dict) -> dict:
    reply = httpx.post(f"{root_url}/inference/v1/generate", json=body, timeout=120)
    assert reply.status_code == 200, reply.text
    return reply.json()


def episode(bridge: Bridge, model: str, seed: int, turns: int = 3) -> list[dict]:
    """`turns` generate calls of one episode: each prompt extends the last by its completion
    and a user turn's ids, as 0.4's train client does."""
    prompt, choices = [1, 53, 67, 91, 261, 2, 201, 1, 67, 295, 308, 201], []
    for _ in range(turns):
        choice = post(bridge.root_url, generate_body(model, prompt, seed))["choices"][0]
        choices.append(choice)
        prompt = [*prompt, *choice["token_ids"], 2, 201, 1, 371, 201, 35, 2, 201, 1, 67, 201]
    return choices


@pytest.mark.integration
def test_bridge_answers_what_vllm_generated(scale_out_server):
    """Every turn's answer through the bridge holds renderers' token spelling and the ids and
    log-probabilities vLLM generated for the body the bridge sent (per-turn seed included),
    which the same body sent straight to vLLM generates again."""
    model = scale_out_server.model
    with Bridge([scale_out_server.base_url], TEMPERATURE) as bridge:
        choices = episode(bridge, model, seed=7)
        calls = bridge.calls
    assert len({c.seed for c in calls}) == len(calls)
    for call, choice in zip(calls, choices, strict=True):
        assert call.model == model and call.seed == derive_seed(7, call.prompt_ids)
        entries = choice["logprobs"]["content"]
        assert [e["token"] for e in entries] == [f"token_id:{t}" for t in choice["token_ids"]]
        assert call.completion_ids == choice["token_ids"]
        assert call.weight_versions == choice["weight_versions"]
        assert call.completion_logprobs == [e["logprob"] for e in entries]
        direct = post(scale_out_server.root_url, generate_body(model, call.prompt_ids, call.seed))
        again = direct["choices"][0]
        assert again["token_ids"] == call.completion_ids
        assert [e["logprob"] for e in again["logprobs"]["content"]] == call.completion_logprobs
        assert "token" not in again["logprobs"]["content"][0]  # vLLM's own spelling


@pytest.mark.integration
def test_bridge_seeds_episodes_apart_and_reproducibly(scale_out_server):
    model = scale_out_server.model
    with Bridge([scale_out_server.base_url], TEMPERATURE) as bridge:
        runs = [episode(bridge, model, seed, turns=2) for seed in (1, 2, 1)]
    ids = [[c["token_ids"] for c in run] for run in runs]
    assert ids[0] == ids[2]
    assert ids[0][0] != ids[1][0]


@pytest.mark.integration
def test_renderers_accepts_every_turn_through_the_bridge(
    scale_out_server, tiny_model_dir, side_venv
):
    """renderers' own generate, several turns: rejected straight from vLLM (its logprob check),
    accepted through the bridge with exactly the recorded ids and log-probabilities."""

    def run(base_url: str) -> subprocess.CompletedProcess:
        args = [base_url, scale_out_server.model, str(tiny_model_dir), "7", "3"]
        cmd = [str(side_venv / "bin" / "python"), str(SIDE_SCRIPT), *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=300)

    direct = run(scale_out_server.base_url)
    assert direct.returncode != 0 and "MalformedGenerateResponseError" in direct.stderr
    with Bridge([scale_out_server.base_url], TEMPERATURE) as bridge:
        bridged = run(bridge.base_url)
        calls = bridge.calls
    assert bridged.returncode == 0, bridged.stderr
    turns = [json.loads(line) for line in bridged.stdout.splitlines()]
    assert len(turns) == len(calls) == 3
    for turn, call in zip(turns, calls, strict=True):
        assert turn["prompt_ids"] == call.prompt_ids
        assert turn["completion_ids"] == call.completion_ids
        assert turn["completion_logprobs"] == call.completion_logprobs
        assert turn["finish_reason"] == call.finish_reason
