"""verifiers 0.4 environments through their own EnvServer, end to end on the CPU: the fixture
tasksets (tests/fixtures/envserver) served from the side venv, the generate bridge in front of
the shared tiny vf-vllm, our wire client, and the trainer."""

from __future__ import annotations

import asyncio
import json
import math
import os
import subprocess
import time

import pytest
from support import config

from rlvr.config import SamplingConfig
from rlvr.config.env_server import EnvServerConfig
from rlvr.envserver.bridge import derive_seed
from rlvr.envserver.environment import EnvServerEnv, load_env_server
from rlvr.envserver.launcher import descendants, health
from rlvr.rollouts.client import make_client
from rlvr.rollouts.request_args import build_sampling_args, request_seed
from rlvr.trainer.grpo import Trainer

pytestmark = pytest.mark.integration

TEMPERATURE = 1.0


def start_env(side_venv, server, out, taskset: str, temperature=TEMPERATURE, **fields):
    cfg = EnvServerConfig(taskset=taskset, venv=str(side_venv), max_concurrent=16, **fields)
    return load_env_server(cfg, str(server.model_dir), temperature, out)


@pytest.fixture(scope="module")
def user_env(side_venv, tiny_server, tmp_path_factory):
    """The 3-turn scripted-user taskset behind its EnvServer (one per module)."""
    env = start_env(side_venv, tiny_server, tmp_path_factory.mktemp("user"), "vf04-scripted-user")
    yield env
    env.close()


def args_for(seeds, max_tokens=8, temperature=TEMPERATURE) -> list[dict]:
    cfg = SamplingConfig(temperature=temperature, max_tokens=max_tokens)
    return [build_sampling_args(cfg, {}, seed) for seed in seeds]


def rollouts(env: EnvServerEnv, server, row: dict, args: list[dict]) -> list[dict]:
    """One rollout per sampling-argument set, concurrently, as a group runs them."""

    async def run():
        client = make_client(server.base_url, None, 120, 16, temperature=TEMPERATURE)
        return await asyncio.gather(*(env.rollout(row, client, server.model, a) for a in args))

    return asyncio.run(run())


def bridge_of(env: EnvServerEnv):
    (bridge,) = env.bridges.values()
    return bridge


def trained_turns(state: dict) -> list[dict]:
    """The turns that carry loss tokens (a sampled node repeated on a later branch has none)."""
    return [t["tokens"] for t in state["trajectory"] if any(t["tokens"]["completion_mask"])]


def test_envserver_traces_are_what_vllm_generated(user_env, tiny_server):
    """Each sampled turn of a served 3-turn episode is exactly one generate call: the prompt ids
    the bridge sent, the completion ids and log-probabilities vLLM returned, and a loss mask of
    1 on exactly those completion tokens; every call appears once."""
    row = user_env.get_dataset()[0]
    rollouts(user_env, tiny_server, row, args_for([11]))  # starts the bridge
    first = len(bridge_of(user_env).calls)
    (state,) = rollouts(user_env, tiny_server, row, args_for([12]))
    calls = bridge_of(user_env).calls_since(first)
    assert state["error"] is None and len(calls) == 3
    turns = trained_turns(state)
    assert len(turns) == len(calls)
    for turn, call in zip(turns, calls, strict=True):
        assert turn["prompt_ids"] == call.prompt_ids
        assert turn["completion_ids"] == call.completion_ids
        assert turn["completion_logprobs"] == call.completion_logprobs
        assert turn["completion_mask"] == [1] * len(call.completion_ids)
        assert call.model == tiny_server.model
    untrained = [t for t in state["trajectory"] if not any(t["tokens"]["completion_mask"])]
    for turn in untrained:  # a repeated sampled node: the same tokens as the turn that trains
        assert any(turn["tokens"]["completion_ids"] == c.completion_ids for c in calls)


def test_envserver_group_seeds_differ(user_env, tiny_server):
    """A group's rollouts carry their own request seeds; the bridge derives one per turn from
    it, so all 12 calls of 4 three-turn episodes sample with distinct seeds, and a rollout run
    again with its seed samples the same turns."""
    row = user_env.get_dataset()[1]
    seeds = [request_seed(0, 1, 1, r) for r in range(4)]
    first = len(bridge_of(user_env).calls) if user_env.bridges else 0
    states = rollouts(user_env, tiny_server, row, args_for(seeds))
    calls = bridge_of(user_env).calls_since(first)
    assert all(s["error"] is None for s in states) and len(calls) == 12
    assert len({c.seed for c in calls}) == 12
    owner = [
        [r for r, s in enumerate(seeds) if derive_seed(s, c.prompt_ids) == c.seed] for c in calls
    ]
    assert sorted(o for (o,) in owner) == sorted(r for r in range(4) for _ in range(3))
    replies = [[t["completion_ids"] for t in trained_turns(s)] for s in states]
    assert len({json.dumps(r) for r in replies}) > 1
    (again,) = rollouts(user_env, tiny_server, row, args_for(seeds[:1]))
    assert [t["completion_ids"] for t in trained_turns(again)] == replies[0]


def test_envserver_cancel_leaves_nothing_behind(side_venv, tiny_server, tmp_path):
    """An episode past its deadline is cancelled on the server: it counts as errored, no call of
    it reaches vLLM afterwards, the programs it ran are gone, the server serves the next
    episode, and closing the environment leaves no process of the server."""
    env = start_env(side_venv, tiny_server, tmp_path, "vf04-scripted-user", episode_timeout_s=1.0)
    try:
        server = env.server.proc.pid
        idle = set(descendants(server))
        row = env.get_dataset()[0]
        (state,) = rollouts(env, tiny_server, row, args_for([5], max_tokens=32))
        assert "deadline" in state["error"] and env.deadlines == 1
        calls = len(bridge_of(env).calls)
        time.sleep(4.0)
        assert len(bridge_of(env).calls) == calls
        assert set(descendants(server)) <= idle
        assert health(env.server.address)
        env.cfg.episode_timeout_s = 120.0
        (state,) = rollouts(env, tiny_server, row, args_for([5]))
        assert state["error"] is None and state["trajectory"]
    finally:
        env.close()
    with pytest.raises(ProcessLookupError):
        os.killpg(server, 0)


EVAL_TOML = """
model = "{model}"
push = false
output_dir = "{out}"
[run]
dir = "own-eval"
[client]
type = "train"
base_url = "{base_url}"
api_key_var = "RLVR_ENVSERVER_API_KEY"
[sampling]
temperature = 0.0
max_tokens = 12
seed = 3
[env.taskset]
id = "vf04-reverse-text"
seed = 0
num_rows = {rows}
[env.agent.harness]
id = "null"
[env.agent.runtime]
type = "subprocess"
"""


def test_envserver_rewards_match_its_own_eval(side_venv, tiny_server, tmp_path):
    """The same rows at temperature 0 through our EnvServer path and through verifiers 0.4's
    own `vf-eval` (in-process, the same bridge): the same replies and the same rewards."""
    rows = 4
    env = start_env(
        side_venv,
        tiny_server,
        tmp_path / "ours",
        "vf04-reverse-text",
        temperature=0.0,
        taskset_args={"num_rows": rows},
    )
    try:
        dataset = env.get_dataset()
        ours = [
            rollouts(env, tiny_server, dataset[i], args_for([3], max_tokens=12, temperature=0.0))[0]
            for i in range(rows)
        ]
        toml = tmp_path / "eval.toml"
        base_url = bridge_of(env).base_url
        out = tmp_path / "own"
        toml.write_text(
            EVAL_TOML.format(model=tiny_server.model, out=out, rows=rows, base_url=base_url)
        )
        bin_dir = side_venv / "bin"
        done = subprocess.run(
            [str(bin_dir / "vf-eval"), "@", str(toml), "--no-rich"],
            env={**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"},
            capture_output=True,
            text=True,
            timeout=600,
        )
    finally:
        env.close()
    assert done.returncode == 0, done.stderr[-3000:]
    (traces,) = out.glob("**/traces.jsonl")
    theirs = {}
    for line in traces.read_text().splitlines():
        episode = json.loads(line)
        (trace,) = episode["traces"]
        total = sum(r["score"] * r["weight"] for r in trace["rewards"].values() if r)
        theirs[json.dumps(trace["task"]["data"]["text"])] = (trace["nodes"][-1], total)
    assert len(theirs) == rows
    for i, state in enumerate(ours):
        text = json.loads(dataset[i]["info"]["task_data"])["text"]
        node, reward = theirs[json.dumps(text)]
        assert state["completion"][-1]["content"] == node["message"]["content"]
        assert state["reward"] == pytest.approx(reward, abs=1e-12)


def test_envserver_environment_trains(side_venv, tiny_server, tmp_path):
    """A GRPO step on a 0.4 fixture taskset from the run config (`env_server:`): the server
    starts with the run, every rollout trains (no errors), its named scores reach the logs, the
    weights move, and the run's end stops the server."""
    cfg = config(
        tiny_server,
        tmp_path / "run",
        "max_steps=1",
        "batch.batch_size=16",
        "batch.rollouts_per_example=4",
        "batch.micro_batch_size=4",
        "env_server.taskset=vf04-reverse-text",
        f"env_server.venv={side_venv}",
        "env_server.taskset_args={num_rows: 16}",
    )
    trainer = Trainer(cfg)
    (step,) = trainer.run()
    assert step["rollouts/count"] == 16 and step["rollouts/errored"] == 0
    assert step["rollouts/samples"] > 0 and math.isfinite(step["loss/total"])
    assert 0 <= step["env/similarity"] <= 1
    assert step["reward/mean"] == pytest.approx(
        step["env/similarity"] + 0.5 * step["env/exact"], abs=1e-6
    )
    assert step["grad_norm"] > 0
    (env,) = [trainer.env]
    assert env.server.proc is None  # stopped with the run


def test_a_mixture_trains_a_classic_and_an_envserver_environment(
    side_venv, tiny_server, tmp_path, shared_data
):
    """`envs:` may mix a classic environment (boxed math, in-process) with a 0.4 taskset (its
    EnvServer): each step draws both by weight, each logs its own metrics, and the evaluation
    runs both."""
    boxed = {
        "id": "vf-deepscaler",
        "name": "math",
        "max_tokens": 6,
        "args": {"data_files": str(shared_data / "deepscaler" / "preview_first803.jsonl")},
    }
    served = {
        "id": "reverse",
        "env_server": {
            "taskset": "vf04-reverse-text",
            "venv": str(side_venv),
            "taskset_args": {"num_rows": 8},
        },
    }
    extra = [
        f"envs={json.dumps([boxed, served])}",
        "max_steps=1",
        "batch.batch_size=16",
        "batch.rollouts_per_example=4",
        "batch.max_prompt_len=512",
        "eval.every=1",
        "eval.num_examples=2",
    ]
    (step,) = Trainer(config(tiny_server, tmp_path, *extra)).run()
    assert (step["env/math/groups"], step["env/reverse/groups"]) == (2, 2)
    assert step["rollouts/errored"] == 0 and math.isfinite(step["loss/total"])
    assert "env/reverse/similarity" in step and "env/math/reward/mean" in step
    logged = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    (evaluation,) = [m for m in logged if "eval/reward" in m]
    assert evaluation["eval/reverse/rollouts"] == 2 and evaluation["eval/reverse/errored"] == 0
