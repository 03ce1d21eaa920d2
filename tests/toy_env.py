"""A toy environment a tiny random model can learn: reward = share of one target token among
the completion's sampled tokens (read from the token ids vLLM returned, so it is exact).

Used by the trainer's integration tests and benchmarks; not an installable environment.
"""

from __future__ import annotations

import verifiers as vf
from datasets import Dataset


def completion_ids(state) -> list[int]:
    return [
        t
        for step in state["trajectory"]
        for t in (step.get("tokens") or {}).get("completion_ids", [])
    ]


def target_share_env(target: int | set[int], num_prompts: int = 16) -> vf.SingleTurnEnv:
    """Prompts are varied short instructions; the reward, in [0, 1], is the share of sampled
    tokens that are `target` (one id, or any id of a set)."""
    targets = {target} if isinstance(target, int) else set(target)

    def target_share(state) -> float:
        ids = completion_ids(state)
        return sum(t in targets for t in ids) / len(ids) if ids else 0.0

    def completion_length(state) -> float:
        return float(len(completion_ids(state)))

    rubric = vf.Rubric(funcs=[target_share, completion_length], weights=[1.0, 0.0])
    rows = [{"question": f"Write a line about item {i}.", "answer": ""} for i in range(num_prompts)]
    dataset = Dataset.from_list(rows)
    return vf.SingleTurnEnv(dataset=dataset, eval_dataset=dataset, rubric=rubric)


class _KeepTalking(vf.MultiTurnEnv):
    """Answers every reply with 'Go on.' until `max_turns` model turns."""

    async def env_response(self, messages, state, **kwargs):
        return [{"role": "user", "content": "Go on."}]


def multi_turn_target_env(target: int, turns: int = 3, num_prompts: int = 16) -> vf.MultiTurnEnv:
    """`target_share_env` over `turns` model turns: the environment's user messages between
    turns carry no loss, and the reward reads every turn's sampled tokens."""
    single = target_share_env(target, num_prompts)
    dataset = single.get_dataset()
    return _KeepTalking(
        dataset=dataset, eval_dataset=dataset, rubric=single.rubric, max_turns=turns
    )


def v1_target_env(target: int, num_prompts: int = 16):
    """`target_share_env` written against verifiers' v1 API: a `Taskset` of one-turn tasks
    whose reward is the target token's share, run by the default `Harness` through `vf.Env`."""
    import verifiers.v1 as v1

    @v1.reward(weight=1.0)
    async def target_share(task, state) -> float:
        ids = completion_ids(state)
        return sum(t == target for t in ids) / len(ids) if ids else 0.0

    @v1.metric
    async def completion_length(task, state) -> float:
        return float(len(completion_ids(state)))

    rows = [
        {"prompt": [{"role": "user", "content": f"Write a line about item {i}."}], "max_turns": 1}
        for i in range(num_prompts)
    ]
    taskset = v1.Taskset(source=rows, rewards=[target_share], metrics=[completion_length])
    return v1.Env(taskset=taskset, harness=v1.Harness())
