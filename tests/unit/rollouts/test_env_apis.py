"""The verifiers APIs beside the classic single environment, through `run_group`: a v1
environment (`vf.Env(taskset, harness)`) and an `EnvGroup`, with only the network replaced by
the scripted vLLM-like client of test_rollouts."""

from __future__ import annotations

import asyncio

import pytest
import verifiers as vf
import verifiers.v1 as v1
from datasets import Dataset

from rlvr.config import load_config
from rlvr.rollouts.groups import (
    UnsupportedEnvironmentError,
    check_rollout_stage_only,
    run_group,
)
from rlvr.rollouts.request_args import build_sampling_args

from .test_rollouts import ScriptedClient, tokenizer  # noqa: F401 (the fixture)


@v1.reward(weight=1.0)
async def says_blue(task, state) -> float:
    return float(task["answer"] in str(state["completion"]))


@v1.metric
async def turns(task, state) -> float:
    return float(len(state["trajectory"]))


def blue_env(*more_rewards) -> v1.Env:
    rows = [{"prompt": [{"role": "user", "content": "Say blue."}], "answer": "blue"}]
    taskset = v1.Taskset(source=rows, rewards=[says_blue, *more_rewards], metrics=[turns])
    return v1.Env(taskset=taskset)


def run_two(env, row: dict, tokenizer, reply: str):  # noqa: F811 (the fixture)
    """A group of two rollouts of `row`, every turn answered with `reply`."""
    client = ScriptedClient(tokenizer, [reply])
    args = [build_sampling_args(load_config().sampling, env.sampling_args, s) for s in range(2)]
    return asyncio.run(run_group(env, client, "m", row, args, 4096, True)), client


@pytest.mark.parametrize("reply, reward", [("blue", 1.0), ("red", 0.0)])
def test_v1_environment_keeps_its_own_scores(tokenizer, reply, reward):  # noqa: F811
    """The harness scores each v1 rollout; the Env's placeholder rubric must not reset the
    reward to 0. The samples are exactly the tokens the sampler returned, and the sample
    table's answer is the task's reference answer."""
    env = blue_env()
    result, client = run_two(env, env.get_dataset()[0], tokenizer, reply)
    assert result.errored == 0
    assert [r.reward for r in result.rollouts] == [reward, reward]
    assert [r.metrics for r in result.rollouts] == [{"says_blue": reward, "turns": 1.0}] * 2
    for rollout, (prompt, completion, logprobs) in zip(
        result.rollouts, client.returned, strict=True
    ):
        (sample,) = rollout.samples
        assert sample.input_ids == prompt + completion
        assert sample.loss_mask == [0] * len(prompt) + [1] * len(completion)
        assert sample.sampler_logprobs == [0.0] * len(prompt) + logprobs
        assert rollout.answer == "blue"


def test_v1_environment_with_group_signals_is_refused():
    @v1.reward(stage="group")
    async def group_reward(tasks, states) -> list[float]:
        return [0.0] * len(states)

    check_rollout_stage_only(blue_env())
    with pytest.raises(UnsupportedEnvironmentError, match="group-stage"):
        check_rollout_stage_only(blue_env(group_reward))


def says(word: str):
    def reward(completion, answer) -> float:
        return float(answer in (completion[-1]["content"] or ""))

    reward.__name__ = f"says_{word}"
    return reward


def test_env_group_routes_each_row_to_its_environment(tokenizer):  # noqa: F811
    """An `EnvGroup` row runs and is scored by the environment it came from (its rubric
    reports every member's metrics, 0 for the other members')."""
    envs = [
        vf.SingleTurnEnv(
            dataset=Dataset.from_list([{"question": f"Say {w}.", "answer": w}]),
            rubric=vf.Rubric(funcs=[says(w)]),
        )
        for w in ("blue", "red")
    ]
    group = vf.EnvGroup(envs=envs, env_names=["blue", "red"])
    blue_row, red_row = group.get_dataset()
    blue, _ = run_two(group, blue_row, tokenizer, "blue")
    red, _ = run_two(group, red_row, tokenizer, "blue")
    assert blue.errored == red.errored == 0
    assert [r.reward for r in blue.rollouts + red.rollouts] == [1.0, 1.0, 0.0, 0.0]
    assert blue.rollouts[0].metrics == {"num_turns": 1.0, "says_blue": 1.0, "says_red": 0.0}
    assert [r.answer for r in red.rollouts] == ["red", "red"]
