"""Each environment's default sampling arguments reach every model request that leaves them
unset, the way vf-eval 0.1.14 calls `generate` without `-t` (`max_tokens: None`, which replaces
the environment's own `sampling_args` in verifiers' merge), and never override a value the
caller set; the trainer takes them unless its run config sets `sampling.max_tokens`. The same
through `vf-eval` itself on a real server: tests/integration/test_readme_commands.py."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import verifiers as vf
from datasets import Dataset
from vf_deepscaler.sampling import fill_unset

from rlvr.config import load_config
from rlvr.rollouts.request_args import FALLBACK_MAX_TOKENS, build_sampling_args
from rlvr.scripted import ScriptedClient

ENV_ARGS = {
    "vf-deepscaler": lambda data: {"max_examples": 2},
    "vf-musique": lambda data: {"data_files": str(data / "musique" / "fixture_small.jsonl")},
    "vf-openspiel": lambda data: {"game_types": "tic_tac_toe", "num_tasks_per_case": 2},
    "vf-planner": lambda data: {"data_files": str(data / "gsm8k" / "test.jsonl")},
}


class RecordingClient(ScriptedClient):
    """A scripted model that answers nothing useful and records each request's arguments."""

    def __init__(self) -> None:
        super().__init__(lambda prompt: "I am not sure.")
        self.requests: list[dict[str, Any]] = []

    async def get_native_response(self, prompt, model, sampling_args, tools=None, **kwargs):
        self.requests.append(dict(sampling_args))
        return await super().get_native_response(prompt, model, sampling_args, tools, **kwargs)


def requests_of(env: vf.Environment, sampling_args: dict[str, Any]) -> list[dict[str, Any]]:
    """The arguments of every model request of two rollouts, through `generate` as vf-eval
    drives it."""
    client = RecordingClient()
    inputs = env.get_eval_dataset(n=2).to_list()
    asyncio.run(env.generate(inputs, client=client, model="scripted", sampling_args=sampling_args))
    assert client.requests
    return client.requests


@pytest.mark.parametrize("env_id", sorted(ENV_ARGS))
def test_default_max_tokens_survives_vf_eval_without_t(env_id, shared_data):
    env = vf.load_environment(env_id, **ENV_ARGS[env_id](shared_data))
    default = env.sampling_args["max_tokens"]
    assert isinstance(default, int) and 0 < default <= 2048
    requests = requests_of(env, {"max_tokens": None})  # vf-eval without -t
    assert {r["max_tokens"] for r in requests} == {default}


@pytest.mark.parametrize("env_id", ["vf-openspiel"])
def test_callers_max_tokens_wins(env_id, shared_data):
    env = vf.load_environment(env_id, **ENV_ARGS[env_id](shared_data))
    requests = requests_of(env, {"max_tokens": 7, "temperature": 0.5})  # vf-eval -t 7 -T 0.5
    assert {(r["max_tokens"], r["temperature"]) for r in requests} == {(7, 0.5)}


def test_fill_unset_fills_missing_and_none_fields_and_extra_body_by_key():
    defaults = {"max_tokens": 64, "temperature": 0.7, "extra_body": {"stop": ["x"], "a": 1}}
    args = {"max_tokens": None, "temperature": 1.0, "extra_body": {"a": 2}}
    assert fill_unset(args, defaults) == {
        "max_tokens": 64,
        "temperature": 1.0,
        "extra_body": {"a": 2, "stop": ["x"]},
    }
    assert fill_unset(None, {"max_tokens": 64}) == {"max_tokens": 64}
    assert args["max_tokens"] is None  # the caller's dict is left alone


@pytest.mark.parametrize(
    ("override", "env_defaults", "expected"),
    [
        ([], {"max_tokens": 256}, 256),  # the run config says nothing: the environment's
        (["sampling.max_tokens=32"], {"max_tokens": 256}, 32),  # the run config wins
        ([], {}, FALLBACK_MAX_TOKENS),  # neither: the trainer's fallback
    ],
)
def test_trainer_takes_env_max_tokens_unless_the_run_config_sets_one(
    override, env_defaults, expected
):
    cfg = load_config(overrides=override).sampling
    assert build_sampling_args(cfg, {"n": 1, **env_defaults})["max_tokens"] == expected


def test_extra_body_temperature_is_refused():
    """The trainer divides its logits by sampling.temperature, so a temperature anywhere else
    that vLLM would sample at (extra_body is merged over the request's own fields) is refused
    unless equal: in the run config, in an environment's sampling_args (its trainer start-up
    check included) and on any request an environment sends."""
    from rlvr.config import ConfigError
    from rlvr.config.sampling import SamplingFilterError, check_reproducible
    from rlvr.trainer.grpo import Trainer
    from rlvr.trainer.rollout_setup import load_env

    with pytest.raises(ConfigError) as refused:
        load_config(overrides=["sampling.temperature=0.7", "sampling.extra_body={temperature: 1}"])
    message = str(refused.value)
    assert "extra_body.temperature=1" in message and "sampling.temperature=0.7" in message
    equal = ["sampling.temperature=0.7", "sampling.extra_body={temperature: 0.7}"]
    cfg = load_config(overrides=equal).sampling
    assert build_sampling_args(cfg, {"temperature": 0.7})["temperature"] == 0.7
    for env_args, field in [
        ({"temperature": 0.5}, "temperature=0.5"),
        ({"extra_body": {"temperature": 0.5}}, "extra_body.temperature=0.5"),
    ]:
        with pytest.raises(SamplingFilterError, match=f"sampling_args asks for {field} .*0.7"):
            build_sampling_args(cfg, env_args)
    env = vf.SingleTurnEnv(
        dataset=Dataset.from_list([{"question": "q", "answer": "1"}]),
        sampling_args={"extra_body": {"temperature": 1.3}},
    )
    trainer = Trainer(load_config(overrides=[*equal, "env.id=inline"]), env=env)
    with pytest.raises(ConfigError, match=r"environment inline: .*extra_body.temperature=1.3"):
        load_env(trainer.cfg, trainer.env)
    request = {"temperature": 1.0, "extra_body": {"temperature": 0.3}}
    with pytest.raises(SamplingFilterError, match="rollout request asks for extra_body.temp"):
        check_reproducible(request, "a rollout request")
    check_reproducible({"temperature": 1.0, "extra_body": {"temperature": 1}}, "a request")
    # a request that got another temperature at run time, through the trainer's own client
    from rlvr.rollouts.client import make_client

    client = make_client("http://127.0.0.1:9/v1", None, 1.0, 1, temperature=0.7)
    with pytest.raises(SamplingFilterError, match="temperature=1.0 but .*sampling.temperature=0.7"):
        asyncio.run(client.get_response([], "m", {"temperature": 1.0}))


@pytest.mark.parametrize(
    "extra_body",
    [{"use_beam_search": True}, {"watermarking": True}, {"thinking_token_budget": 0}],
)
def test_draws_other_than_softmax_sampling_are_refused(extra_body):
    from rlvr.config import ConfigError

    key = next(iter(extra_body))
    with pytest.raises(ConfigError, match=f"sampling asks for {key}="):
        load_config(overrides=[f"sampling.extra_body={extra_body}"])
