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


def think_stripping_template() -> str:
    """The tiny model's chat template made Qwen3-like (thinking off): the generation prompt
    opens with an empty `<think>` block, and past assistant turns are rendered without it (and
    without any text up to a `</think>`). Re-rendering a conversation therefore changes every
    earlier turn, as Qwen3's template does."""
    from rlvr.model.chat_template import TOOL_CHAT_TEMPLATE

    past = "{%- if message.content -%}{{- text(message.content) -}}{%- endif -%}"
    stripped = (
        "{%- if message.content -%}"
        "{{- text(message.content).split('</think>')[-1].lstrip('\\n') -}}{%- endif -%}"
    )
    prompt = "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
    thinking_off = (
        "{%- if add_generation_prompt -%}"
        "{{- '<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n' -}}{%- endif -%}"
    )
    assert past in TOOL_CHAT_TEMPLATE and prompt in TOOL_CHAT_TEMPLATE
    return TOOL_CHAT_TEMPLATE.replace(past, stripped).replace(prompt, thinking_off)


class _ToolAnswers(vf.MultiTurnEnv):
    """Answers each model turn as a tool would (a tool result), and the last one before
    `max_turns` with a user message: a tool rollout for a model too random to call tools."""

    async def env_response(self, messages, state, **kwargs):
        turn = len(state["trajectory"])
        if turn == self.max_turns - 1:
            return [vf.UserMessage(content="Now answer.")]
        return [vf.ToolMessage(tool_call_id=f"call_{turn}", content=f"result {turn}")]


def tool_answers_env(target: int, turns: int = 3, num_prompts: int = 16) -> vf.MultiTurnEnv:
    """`target_share_env` over `turns` model turns whose environment messages are tool
    results, then a user message (see `_ToolAnswers`)."""
    single = target_share_env(target, num_prompts)
    dataset = single.get_dataset()
    return _ToolAnswers(
        dataset=dataset, eval_dataset=dataset, rubric=single.rubric, max_turns=turns
    )
