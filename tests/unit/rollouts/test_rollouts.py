"""Rollouts -> samples: loss masks of a multi-turn tool trajectory, merging and splitting of
turns, sampling args, data order, and the background worker's bound on running ahead.

The multi-turn test runs a real `vf.ToolEnv` through verifiers' own rollout loop and response
parser; only the network is replaced, by a scripted client that renders prompts with the tiny
model's real chat template and answers like vLLM does (prompt_token_ids, token_ids, logprobs).
"""

from __future__ import annotations

import asyncio
import functools
import json
import math
import time
from collections.abc import Callable

import pytest
import verifiers as vf
from datasets import Dataset
from openai.types.chat import ChatCompletion
from transformers import AutoTokenizer

from rlvr.batch import GroupResult, RolloutResult, Sample, StepBatch
from rlvr.config import ConfigError, load_config
from rlvr.config.sampling import SamplingFilterError
from rlvr.pass_at_k import mean_pass_at_k, succeeded
from rlvr.rollouts.client import RolloutClient
from rlvr.rollouts.curriculum import Curriculum
from rlvr.rollouts.groups import EveryRolloutErroredError, run_group
from rlvr.rollouts.prompts import PromptOrder
from rlvr.rollouts.request_args import (
    FALLBACK_MAX_TOKENS,
    build_sampling_args,
    request_seed,
    turn_seed,
)
from rlvr.rollouts.servers import NoServerLeftError, ServerPool
from rlvr.rollouts.to_samples import (
    MissingTokensError,
    NonFiniteRewardError,
    rollout_result,
    trajectory_samples,
)
from rlvr.rollouts.worker import RolloutWorker
from rlvr.trainer.advantages import group_advantages
from rlvr.trainer.train_batch import build_train_batch

TOOL_CALL = '<tool_call>\n{"name": "lookup", "arguments": {"key": "a"}}\n</tool_call>'
FINAL = "The value is \\boxed{42}."
TOOL_RESULT = "value of a is 42"


class ScriptedClient(RolloutClient):
    """Answers like vLLM with return_token_ids: turn k of a rollout replies `replies[k]`.

    Records every (prompt_ids, completion_ids, logprobs) it returned, so tests can compare the
    training samples with exactly what the 'sampler' produced.
    """

    def __init__(self, tokenizer, replies: list[str]):
        super().__init__(object())
        self.tok = tokenizer
        self.replies = replies
        self.returned: list[tuple[list[int], list[int], list[float]]] = []
        self.sampling_args: list[dict] = []

    async def get_native_response(self, prompt, model, sampling_args, tools=None, **kwargs):
        self.sampling_args.append(sampling_args)
        text = self.tok.apply_chat_template(
            prompt, tools=tools, add_generation_prompt=True, tokenize=False
        )
        prompt_ids = self.tok.encode(text, add_special_tokens=False)
        turn = sum(1 for m in prompt if m["role"] == "assistant")
        reply = self.replies[min(turn, len(self.replies) - 1)]
        completion_ids = self.tok.encode(reply, add_special_tokens=False)
        completion_ids.append(self.tok.convert_tokens_to_ids("<|im_end|>"))
        logprobs = [-0.01 * (i + 1) - turn for i in range(len(completion_ids))]
        self.returned.append((prompt_ids, completion_ids, logprobs))
        message: dict = {"role": "assistant", "content": reply}
        finish = "stop"
        if reply.startswith("<tool_call>"):
            call = json.loads(reply.removeprefix("<tool_call>").removesuffix("</tool_call>"))
            message = {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"call_{turn}",
                        "type": "function",
                        "function": {
                            "name": call["name"],
                            "arguments": json.dumps(call["arguments"]),
                        },
                    }
                ],
            }
            finish = "tool_calls"
        return ChatCompletion.model_validate(
            {
                "id": "x",
                "object": "chat.completion",
                "created": 0,
                "model": model,
                "prompt_token_ids": prompt_ids,
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": finish,
                        "message": message,
                        "token_ids": completion_ids,
                        "logprobs": {
                            "content": [
                                {"token": str(t), "logprob": lp, "bytes": [], "top_logprobs": []}
                                for t, lp in zip(completion_ids, logprobs, strict=True)
                            ]
                        },
                    }
                ],
            }
        )

    async def close(self) -> None:
        return None


def publish(worker: RolloutWorker, version: int) -> None:
    """Publish weight `version` as the trainer does once its push is done."""
    with worker.publishing(version, release=lambda in_use: None, timeout_s=60):
        pass


def lookup(key: str) -> str:
    """Look up the value stored under a key.

    Args:
        key: The key to look up.
    """
    return f"value of {key} is 42"


def correct(completion, answer) -> float:
    return float(answer in (completion[-1].content or ""))


def tool_env() -> vf.ToolEnv:
    dataset = Dataset.from_list([{"question": "What is the value of a?", "answer": "42"}])
    return vf.ToolEnv(
        tools=[lookup], dataset=dataset, rubric=vf.Rubric(funcs=[correct]), max_turns=4
    )


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def run_tool_group(tokenizer, replies, max_seq_len=4096, group=2):
    env = tool_env()
    env.set_max_seq_len(max_seq_len)
    client = ScriptedClient(tokenizer, replies)
    row = env.get_dataset()[0]
    args = [build_sampling_args(load_config().sampling, env.sampling_args, s) for s in range(group)]
    result = asyncio.run(run_group(env, client, "m", row, args, max_seq_len, True))
    return result, client


def tokens_where(samples, field: str, mask_value: int) -> list:
    """The values of `field` at positions whose loss mask equals `mask_value`, in order."""
    return [
        value
        for s in samples
        for value, m in zip(getattr(s, field), s.loss_mask, strict=True)
        if m == mask_value
    ]


def test_multi_turn_tool_trajectory_masks_exactly_the_sampled_tokens(tokenizer):
    result, client = run_tool_group(tokenizer, [TOOL_CALL, FINAL])
    assert result.errored == 0 and len(result.rollouts) == 2
    # every request asked vLLM for token ids and logprobs
    for args in client.sampling_args:
        assert args["logprobs"] is True and args["extra_body"]["return_token_ids"] is True
    per_rollout = len(client.returned) // 2
    for n, rollout in enumerate(result.rollouts):
        assert rollout.reward == 1.0 and rollout.num_turns == 2 and not rollout.truncated
        turns = client.returned[n * per_rollout : (n + 1) * per_rollout]
        sampled = [t for _, completion, _ in turns for t in completion]
        sampled_lp = [lp for _, _, lps in turns for lp in lps]
        masked = tokens_where(rollout.samples, "input_ids", 1)
        assert masked == sampled, "loss mask must cover exactly the sampled tokens"
        masked_lp = tokens_where(rollout.samples, "sampler_logprobs", 1)
        assert masked_lp == pytest.approx(sampled_lp)
        unmasked = tokenizer.decode(tokens_where(rollout.samples, "input_ids", 0))
        assert TOOL_RESULT in unmasked and "What is the value of a?" in unmasked
        assert "lookup" in unmasked  # the tool schema in the system prompt
        # the second turn's prompt extends the first turn exactly -> one sample per rollout
        first_prompt, first_completion, _ = turns[0]
        second_prompt = turns[1][0]
        if second_prompt[: len(first_prompt) + len(first_completion)] == (
            first_prompt + first_completion
        ):
            assert len(rollout.samples) == 1
            assert rollout.samples[0].input_ids == second_prompt + turns[1][1]
        else:
            assert len(rollout.samples) == 2


def _step(prompt, completion, logprobs=None, mask=None):
    return {
        "tokens": {
            "prompt_ids": prompt,
            "completion_ids": completion,
            "completion_logprobs": logprobs or [-0.5] * len(completion),
            "completion_mask": mask or [1] * len(completion),
        },
        "is_truncated": False,
    }


def test_turns_merge_when_the_prefix_holds():
    steps = [_step([1, 2, 3], [4, 5]), _step([1, 2, 3, 4, 5, 9, 9], [6])]
    (sample,) = trajectory_samples(steps, max_seq_len=100)
    assert sample.input_ids == [1, 2, 3, 4, 5, 9, 9, 6]
    assert sample.loss_mask == [0, 0, 0, 1, 1, 0, 0, 1]
    assert sample.sampler_logprobs == [0, 0, 0, -0.5, -0.5, 0, 0, -0.5]


def test_turns_split_when_retokenization_breaks_the_prefix():
    steps = [_step([1, 2, 3], [4, 5]), _step([1, 2, 3, 7, 9], [6])]
    first, second = trajectory_samples(steps, max_seq_len=100)
    assert first.input_ids == [1, 2, 3, 4, 5] and first.loss_mask == [0, 0, 0, 1, 1]
    assert second.input_ids == [1, 2, 3, 7, 9, 6] and second.loss_mask == [0, 0, 0, 0, 0, 1]


def test_turns_split_at_max_seq_len_and_respect_env_masks():
    steps = [_step([1, 2], [3], mask=[0]), _step([1, 2, 3, 8], [4, 5])]
    first, second = trajectory_samples(steps, max_seq_len=5)
    assert first.loss_mask == [0, 0, 0]
    assert second.input_ids == [1, 2, 3, 8, 4, 5] and second.loss_mask == [0, 0, 0, 0, 1, 1]


def test_missing_tokens_is_a_clear_error():
    with pytest.raises(MissingTokensError, match="return_token_ids"):
        trajectory_samples([{"tokens": None}], max_seq_len=10)


def test_truncated_rollouts_are_counted_and_masked(tokenizer):
    result, _ = run_tool_group(tokenizer, [TOOL_CALL, FINAL], max_seq_len=40)
    assert all(r.truncated for r in result.rollouts)
    assert all(r.samples == [] for r in result.rollouts)


def test_sampling_args_force_token_fields_and_neutral_filters():
    """Every request states the neutral filters: vLLM would otherwise fill unset fields from
    the model's generation_config.json, which the trainer cannot see."""
    cfg = load_config(
        overrides=["sampling.extra_body={skip_special_tokens: false, return_token_ids: false}"]
    ).sampling
    env_defaults = {"n": 1, "stop": ["</answer>"], "extra_body": {"include_stop_str_in_output": 1}}
    args = build_sampling_args(cfg, env_defaults, seed=3)
    assert args["logprobs"] is True and args["seed"] == 3 and "n" not in args
    assert args["stop"] == ["</answer>"] and args["max_tokens"] == FALLBACK_MAX_TOKENS
    assert args["top_p"] == 1.0 and args["presence_penalty"] == args["frequency_penalty"] == 0.0
    assert args["extra_body"] == {
        "include_stop_str_in_output": 1,
        "skip_special_tokens": False,
        "top_k": -1,
        "min_p": 0.0,
        "repetition_penalty": 1.0,
        "return_token_ids": True,
    }


@pytest.mark.parametrize(
    "override",
    [
        "sampling.top_p=0.9",
        "sampling.extra_body={top_k: 20}",
        "sampling.extra_body={min_p: 0.05}",
        "sampling.extra_body={repetition_penalty: 1.1}",
        "sampling.extra_body={presence_penalty: 0.5}",
        "sampling.extra_body={min_tokens: 4}",
        "sampling.extra_body={logit_bias: {'7': 5}}",
    ],
)
def test_sampling_parity_refuses_filters_the_trainer_cannot_reproduce(override):
    with pytest.raises(ConfigError, match="bias every importance ratio"):
        load_config(overrides=[override])


def test_sampling_parity_accepts_neutral_values_and_refuses_env_defaults():
    cfg = load_config(overrides=["sampling.extra_body={top_k: -1, repetition_penalty: 1.0}"])
    with pytest.raises(SamplingFilterError, match="environment's sampling_args asks for top_k"):
        build_sampling_args(cfg.sampling, {"extra_body": {"top_k": 50}})


CONSTRAINED = [
    {"response_format": {"type": "json_object"}},
    {"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {}}}},
    {"tool_choice": "required"},
    {"tool_choice": {"type": "function", "function": {"name": "lookup"}}},
    {"extra_body": {"structured_outputs": {"regex": "[0-9]+"}}},
    {"extra_body": {"guided_json": {"type": "object"}}},
    {"extra_body": {"guided_choice": ["yes", "no"]}},
]


@pytest.mark.parametrize("args", CONSTRAINED)
def test_constrained_decoding_is_refused(args, tokenizer):
    """Constrained decoding masks tokens before vLLM computes logprobs: refused from the
    environment's defaults, from the run config, and on any request an environment sends."""
    cfg = load_config().sampling
    with pytest.raises(SamplingFilterError, match="environment's sampling_args asks for"):
        build_sampling_args(cfg, args)
    with pytest.raises(ConfigError, match="bias every importance ratio"):
        load_config(
            overrides=[f"sampling.extra_body={json.dumps({**args, **args.get('extra_body', {})})}"]
        )
    client = ScriptedClient(tokenizer, [FINAL])
    request = {**build_sampling_args(cfg), **args}
    with pytest.raises(SamplingFilterError, match="a rollout request asks for"):
        asyncio.run(client.get_response([{"role": "user", "content": "q"}], "m", request))
    assert client.returned == []  # refused before it reached the server


def test_unconstrained_choices_are_accepted():
    neutral = {"tool_choice": "auto", "response_format": {"type": "text"}}
    assert build_sampling_args(load_config().sampling, neutral)["tool_choice"] == "auto"


def test_a_forced_tool_call_stops_the_run_instead_of_erroring_rollouts(tokenizer):
    """An environment that forces a tool call on its requests fails the group loudly: its
    rollouts could never train, so counting them as errored would hide the cause."""
    env = vf.SingleTurnEnv(
        dataset=Dataset.from_list([{"question": "q", "answer": "42"}]),
        rubric=vf.Rubric(funcs=[correct]),
    )
    args = {**build_sampling_args(load_config().sampling), "tool_choice": "required"}
    client = ScriptedClient(tokenizer, [FINAL])
    row = env.get_dataset()[0]
    with pytest.raises(SamplingFilterError, match="tool_choice"):
        asyncio.run(run_group(env, client, "m", row, [args], 512, False))


def test_turn_seeds_are_distinct_and_keep_the_rollout_seed_on_the_first_turn():
    rollout_seeds = [request_seed(0, 5, 2, r) for r in range(8)]
    seeds = {turn_seed(s, t) for s in rollout_seeds for t in range(10)}
    assert len(seeds) == 80
    assert turn_seed(rollout_seeds[0], 0) == rollout_seeds[0]
    assert turn_seed(rollout_seeds[0], 3) == turn_seed(rollout_seeds[0], 3)


def test_request_seeds_differ_within_a_group_and_repeat_across_runs():
    seeds = {request_seed(0, 5, 2, r) for r in range(8)}
    assert len(seeds) == 8
    assert request_seed(0, 5, 2, 1) == request_seed(0, 5, 2, 1) != request_seed(1, 5, 2, 1)


def test_prompt_order_is_a_resumable_permutation():
    order = PromptOrder(10, seed=1)
    first_epoch = order.rows(0, 10)
    assert sorted(first_epoch) == list(range(10))
    assert PromptOrder(10, seed=1).rows(7, 6) == first_epoch[7:] + order.rows(10, 3)
    assert order.rows(10, 10) != first_epoch  # a new shuffle each epoch


def test_worker_runs_at_most_async_level_steps_ahead(tokenizer):
    env = vf.SingleTurnEnv(
        dataset=Dataset.from_list([{"question": f"q{i}", "answer": "42"} for i in range(4)]),
        rubric=vf.Rubric(funcs=[correct]),
    )
    for async_level in (0, 1):
        cfg = load_config(
            overrides=[
                "batch.batch_size=4",
                "batch.rollouts_per_example=2",
                f"batch.async_level={async_level}",
                "max_steps=4",
            ]
        )
        worker = RolloutWorker(
            env, env.get_dataset(), cfg, lambda url: ScriptedClient(tokenizer, [FINAL])
        ).start()
        try:
            batch = worker.get(0)
            assert len(batch.groups) == 2 and all(len(g.rollouts) == 2 for g in batch.groups)
            assert batch.rollouts[0].reward == 1.0
            # without a new weight version, only async_level more batches may appear: take
            # those (a loaded machine may take a while), then give a further one time to show
            ahead = [worker.get(step, timeout_s=60) for step in range(1, 1 + async_level)]
            assert [b.min_policy_version for b in ahead] == [0] * async_level
            with pytest.raises(TimeoutError):
                worker.get(1 + async_level, timeout_s=0.5)
            publish(worker, 1)
            assert worker.get(1 + async_level).min_policy_version == 1
        finally:
            worker.close()


def test_a_checkpoint_hands_in_flight_batches_to_the_resumed_worker(tokenizer):
    """With async_level 1, batch s+1 is generated by policy s while step s trains. A
    checkpoint after s+1 steps keeps that batch; the resumed worker serves it instead of
    regenerating it with the newer policy, then continues with the next rows."""
    env = vf.SingleTurnEnv(
        dataset=Dataset.from_list([{"question": f"q{i}", "answer": "42"} for i in range(10)]),
        rubric=vf.Rubric(funcs=[correct]),
    )
    cfg = load_config(
        overrides=[
            "batch.batch_size=4",
            "batch.rollouts_per_example=2",
            "batch.async_level=1",
            "max_steps=4",
        ]
    )

    def worker(**kwargs):
        return RolloutWorker(
            env, env.get_dataset(), cfg, lambda url: ScriptedClient(tokenizer, [FINAL]), **kwargs
        ).start()

    original = worker()
    try:
        first = original.get(0)
        deadline = time.monotonic() + 60
        while not (batches := original.in_flight(1, timeout_s=60)):  # until it has started
            assert time.monotonic() < deadline
            time.sleep(0.01)
        (in_flight,) = batches  # started under version 0
        assert in_flight.step == 1 and in_flight.min_policy_version == 0
        publish(original, 1)
        assert original.get(1) is in_flight
        publish(original, 2)
        fresh = original.get(2)
    finally:
        original.close()
    resumed = worker(
        start_step=1, version=1, data_position=first.data_position, preloaded=[in_flight]
    )
    try:
        assert resumed.get(1) is in_flight
        publish(resumed, 2)
        again = resumed.get(2)
    finally:
        resumed.close()
    prompts = [[r.prompt_text for r in b.rollouts] for b in (fresh, again)]
    assert prompts[0] == prompts[1] and again.data_position == fresh.data_position


def _rollout(reward: float) -> RolloutResult:
    sample = Sample([1, 2, 3], [0, 1, 1], [0.0, -1.0, -1.0])
    return RolloutResult(0, reward, {}, [sample], False, 1, 2, "p", "c")


def test_groups_with_too_many_errored_rollouts_get_no_loss():
    """Errors correlate with behaviour (long generations, broken tool calls): the baseline of a
    group's survivors is biased, so past batch.max_errored_frac the group is dropped."""
    cfg = load_config(overrides=["batch.max_errored_frac=0.25"])
    kept = GroupResult([_rollout(r) for r in (1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0)], errored=1)
    biased = GroupResult([_rollout(1.0), _rollout(0.0)], errored=2)
    batch = StepBatch(
        0, [kept, biased], data_position=2, skipped_prompts=0, generate_s=1.0, min_policy_version=0
    )
    train = build_train_batch(batch, cfg)
    samples, metrics = train.samples, train.metrics
    assert len(samples) == 7  # only the group with 1 error in 8 trains
    assert metrics["rollouts/dropped_errored_groups"] == 1
    assert metrics["rollouts/errored"] == 3
    strict = load_config(overrides=["batch.max_errored_frac=0.0"])
    train = build_train_batch(batch, strict)
    samples, metrics = train.samples, train.metrics
    assert samples == [] and metrics["rollouts/dropped_errored_groups"] == 2


NAN, INF = float("nan"), float("inf")


def test_nan_reward_is_an_errored_rollout(tokenizer, caplog):
    """A third-party reward function that returns NaN for some rollouts (a ratio of two zero
    counts) or infinity: through the worker, run_group and build_train_batch, as in training. Such
    a rollout counts as errored, its group is judged by batch.max_errored_frac like any other
    errored rollout, a warning names the environment, the row and the value, and no NaN reaches
    the advantages or the step's metrics (where statistics.pstdev raises a riddle on NaN)."""
    script = {"a": [1.0, NAN, 0.0, 1.0], "b": [NAN, INF, 1.0, 0.0], "c": [1.0, 0.0, 1.0, 0.0]}
    calls = {answer: iter(rewards) for answer, rewards in script.items()}

    def ratio(answer) -> float:
        return next(calls[answer])

    env = vf.SingleTurnEnv(
        dataset=Dataset.from_list([{"question": f"q {a}", "answer": a} for a in script]),
        rubric=vf.Rubric(funcs=[ratio]),
    )
    env.env_id = "vf-nan-ratio"
    cfg = load_config(
        overrides=[
            "batch.batch_size=12",
            "batch.rollouts_per_example=4",
            "batch.async_level=0",
            "batch.max_errored_frac=0.25",
        ]
    )
    worker = RolloutWorker(
        env, env.get_dataset(), cfg, lambda url: ScriptedClient(tokenizer, [FINAL])
    )
    with caplog.at_level("WARNING"):
        worker.start()
        try:
            batch = worker.get(0)
        finally:
            worker.close()
    train = build_train_batch(batch, cfg)
    samples, metrics, rows = train.samples, train.metrics, train.table

    by_answer = {g.rollouts[0].answer: g for g in batch.groups}
    assert {a: g.errored for a, g in by_answer.items()} == {"a": 1, "b": 2, "c": 0}
    assert metrics["rollouts/errored"] == 3
    assert metrics["rollouts/dropped_errored_groups"] == 1  # b: 2 of 4 > 0.25; a: 1 of 4 trains
    assert len(samples) == 3 + 4
    assert all(math.isfinite(s.advantage) for s in samples)
    kept_a = by_answer["a"].rollouts
    (expected,), _ = group_advantages([[r.reward for r in kept_a]], cfg.loss.scale_rewards)
    assert sorted(r.reward for r in kept_a) == [0.0, 1.0, 1.0]  # the baseline: finite rewards
    trained = [g for g in batch.groups if g is not by_answer["b"]]  # in the batch's order
    start = sum(
        len(r.samples) for g in trained[: trained.index(by_answer["a"])] for r in g.rollouts
    )
    assert [s.advantage for s in samples[start : start + 3]] == pytest.approx(expected)
    assert all(s.advantage == 0.0 for r in kept_a for s in r.samples)  # rollouts keep theirs
    assert all(math.isfinite(v) for v in metrics.values()), metrics
    assert metrics["reward/mean"] == pytest.approx(5 / 9)  # a: 1 0 1, b: 1 0, c: 1 0 1 0
    assert metrics["env/ratio"] == pytest.approx(5 / 9)
    assert all(math.isfinite(row["reward"]) for row in rows)

    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    ids = {g.rollouts[0].answer: g.rollouts[0].example_id for g in batch.groups}
    for answer, values in (("a", "nan"), ("b", "nan, inf")):
        where = f"environment vf-nan-ratio, example_id {ids[answer]}"
        assert any(where in w and f"({values})" in w for w in warnings), warnings
    assert not any(f"example_id {ids['c']}:" in w for w in warnings)


def test_a_reward_that_is_not_a_number_is_an_errored_rollout(tokenizer, caplog):
    """A group reward function that returns None breaks verifiers' own weighted sum
    (TypeError inside score_group): the group's rollouts count as errored, named, instead of
    stopping the run. A reward that is a string or missing is refused per rollout."""

    def judge(completions) -> list:
        return [None] * len(completions)

    env = vf.SingleTurnEnv(
        dataset=Dataset.from_list([{"question": "q", "answer": "42"}]),
        rubric=vf.Rubric(funcs=[judge]),
    )
    row = env.get_dataset()[0]
    args = [build_sampling_args(load_config().sampling)] * 2
    client = ScriptedClient(tokenizer, [FINAL])
    with caplog.at_level("WARNING"):
        result = asyncio.run(run_group(env, client, "m", row, args, 512, False))
    assert result.rollouts == [] and result.errored == 2
    assert all("SingleTurnEnv, example_id 0: scoring raised TypeError" in e for e in result.errors)
    assert any("its 2 rollouts count as errored" in r.getMessage() for r in caplog.records)
    for reward in ("0.5", None, True):
        with pytest.raises(NonFiniteRewardError, match=f"reward {reward!r} is not a finite"):
            rollout_result({"reward": reward, "trajectory": []}, 512, False)


def test_pass_at_k_estimator(tokenizer):
    """pass@k while training: the worker's evaluation tallies each eval example's rollouts
    (an errored one counts as a failure) and averages the unbiased estimator over examples,
    for k = 1, 2, 4 up to the rollouts per example."""
    assert mean_pass_at_k([(4, 1), (4, 2)]) == pytest.approx({1: 3 / 8, 2: 2 / 3, 4: 1.0})
    assert mean_pass_at_k([(4, 0), (2, 2)]) == pytest.approx({1: 0.5, 2: 0.5})  # k <= fewest
    assert mean_pass_at_k([(3, 3)]) == {1: 1.0, 2: 1.0} and mean_pass_at_k([]) == {}
    assert succeeded(0.9999999999999999, 1.0) and not succeeded(0.99, 1.0)

    script = {"a": [1.0, 0.0, 0.0, 0.0], "b": [1.0, 1.0, NAN, 0.0]}
    calls = {answer: iter(rewards) for answer, rewards in script.items()}

    def scripted(answer) -> float:
        return next(calls[answer]) if answer in calls else 0.0

    env = vf.SingleTurnEnv(
        dataset=Dataset.from_list([{"question": "train", "answer": "t"}] * 4),
        eval_dataset=Dataset.from_list([{"question": f"q {a}", "answer": a} for a in script]),
        rubric=vf.Rubric(funcs=[scripted]),
    )
    cfg = load_config(overrides=["batch.batch_size=4", "batch.rollouts_per_example=2"])
    worker = RolloutWorker(
        env, env.get_dataset(), cfg, lambda url: ScriptedClient(tokenizer, [FINAL])
    ).start()
    try:
        result = worker.evaluate(num_examples=2, rollouts_per_example=4, timeout_s=120)
    finally:
        worker.close()
    assert (result.num_rollouts, result.errored) == (7, 1)
    assert result.pass_at_k == pytest.approx({1: 3 / 8, 2: 2 / 3, 4: 1.0})


class SeededClient(ScriptedClient):
    """Replies "yes" or "no" by its request seed's parity: each rollout's answer is fixed by
    (seed, step, position, rollout), so reruns and resumed runs reply alike."""

    async def get_native_response(self, prompt, model, sampling_args, tools=None, **kwargs):
        self.replies = ["yes" if sampling_args["seed"] % 2 else "no"]
        return await super().get_native_response(prompt, model, sampling_args, tools, **kwargs)


def graded(completion, answer) -> float:
    """`solved` rows always score 1, `hopeless` 0, `mixed` 1 for a "yes"."""
    if answer != "mixed":
        return float(answer == "solved")
    return float("yes" in completion[-1]["content"])


def signal_env() -> vf.SingleTurnEnv:
    answers = ["solved", "hopeless", "solved", "hopeless", "mixed", "mixed"]
    rows = [{"question": f"q{i} {a}", "answer": a} for i, a in enumerate(answers)]
    return vf.SingleTurnEnv(dataset=Dataset.from_list(rows), rubric=vf.Rubric(funcs=[graded]))


def signal_worker(tokenizer, *overrides: str, **kwargs) -> RolloutWorker:
    cfg = load_config(overrides=["batch.batch_size=8", "batch.rollouts_per_example=2", *overrides])
    env = signal_env()
    return RolloutWorker(
        env, env.get_dataset(), cfg, lambda url: SeededClient(tokenizer, [""]), **kwargs
    ).start()


def first_batch(tokenizer, *overrides: str) -> StepBatch:
    """Step 0's batch of a synchronous one-step run on `signal_env`."""
    worker = signal_worker(tokenizer, "batch.async_level=0", "max_steps=1", *overrides)
    try:
        return worker.get(0, timeout_s=120)
    finally:
        worker.close()


def test_closing_a_failed_worker_leaves_its_failure_to_be_seen(tokenizer):
    """The worker's thread fails (no server left) and closes its loop; the trainer, closing
    the worker as the failure travels up, may still see the thread alive: closing must not
    raise `Event loop is closed` over the failure (the order forced here)."""
    pool = ServerPool(["http://127.0.0.1:8000/v1"])
    pool.mark_down(pool.servers[0], "refused")
    worker = signal_worker(tokenizer, "batch.async_level=0", "max_steps=1", pool=pool)
    with pytest.raises(NoServerLeftError, match="refused"):
        worker.get(0, timeout_s=60)
    worker._thread.join(60)
    assert worker._loop.is_closed()
    worker._thread.is_alive = lambda: True  # the check ran before the loop closed
    worker.close()


class BrokenClient(ScriptedClient):
    """Every request fails as a broken renderer or environment would (not the server's
    failure: the router blames the request)."""

    async def get_native_response(self, prompt, model, sampling_args, tools=None, **kwargs):
        raise ValueError("DefaultRenderer does not support tools")


@pytest.mark.parametrize("refills", ["false", "true"])
def test_a_run_of_only_errored_rollouts_stops(tokenizer, refills):
    """A step whose every rollout errored (after dynamic sampling's refills, where on) stops
    the run with the first errors' text, instead of training nothing step after step."""
    cfg = load_config(
        overrides=[
            "batch.batch_size=8",
            "batch.rollouts_per_example=2",
            "batch.async_level=0",
            "max_steps=2",
            f"batch.dynamic_sampling={refills}",
            "batch.max_refill_rounds=1",
        ]
    )
    env = signal_env()
    client = BrokenClient(tokenizer, [""])
    worker = RolloutWorker(env, env.get_dataset(), cfg, lambda url: client).start()
    try:
        with pytest.raises(EveryRolloutErroredError) as told:
            worker.get(0, timeout_s=120)
    finally:
        worker.close()
    message = str(told.value)
    assert message.startswith("step 0: every one of its 8 rollouts errored")
    assert "DefaultRenderer does not support tools" in message


def test_dynamic_sampling_fills_the_batch_with_signal(tokenizer):
    """Groups whose rewards all agree are replaced by groups of the next prompts until every
    group of the step carries signal; without it, 4 of the 6 prompts can never make one, so
    a batch of 4 groups always has at least 2 without signal."""
    limit = 0.25
    plain = first_batch(tokenizer)
    assert plain.refill_groups == 0
    assert sum(not g.carries_signal(limit) for g in plain.groups) >= 2
    assert plain.data_position == 4

    full = first_batch(tokenizer, "batch.dynamic_sampling=true", "batch.max_refill_rounds=40")
    assert len(full.groups) == 4 and all(g.carries_signal(limit) for g in full.groups)
    assert {g.rollouts[0].answer for g in full.groups} == {"mixed"}
    assert full.refill_groups > 0
    assert full.zero_signal_groups == full.refill_groups  # each replaced once, none left
    assert full.data_position == 4 + full.refill_groups  # refills take the next prompts
    metrics = build_train_batch(full, load_config()).metrics
    assert metrics["batch/refill_groups"] == full.refill_groups
    assert metrics["batch/zero_signal_frac"] == pytest.approx(
        full.refill_groups / (4 + full.refill_groups)
    )

    once = first_batch(tokenizer, "batch.dynamic_sampling=true", "batch.max_refill_rounds=1")
    first_round = sum(not g.carries_signal(limit) for g in plain.groups)
    assert len(once.groups) == 4 and once.refill_groups == first_round  # one round, then stop


def test_dynamic_sampling_resume_is_exact(tokenizer):
    """async_level 1 with refills: the batch in flight at a checkpoint (refills and all) is
    handed to the resumed worker, and the next batch, refills included, is the one the
    uninterrupted run generated: the same prompts, replies and rewards."""
    overrides = (
        "batch.async_level=1",
        "max_steps=3",
        "batch.dynamic_sampling=true",
        "batch.max_refill_rounds=40",
    )

    def contents(batch: StepBatch) -> list:
        return [(r.prompt_text, r.completion_text, r.reward) for r in batch.rollouts]

    straight, resumed = straight_and_resumed(
        functools.partial(signal_worker, tokenizer, *overrides), 3
    )
    in_flight, fresh = straight[1:]
    assert in_flight.refill_groups + fresh.refill_groups > 0  # the refills are exercised
    assert resumed[0] is in_flight
    again = resumed[1]
    assert contents(again) == contents(fresh)
    assert (again.refill_groups, again.data_position) == (fresh.refill_groups, fresh.data_position)


def straight_and_resumed(
    make: Callable[..., RolloutWorker], steps: int
) -> tuple[list[StepBatch], list[StepBatch]]:
    """The batches of an async_level-1 worker (`make(**kwargs)`) over `steps` steps, and of a
    second one resumed after step 1 as from a checkpoint (step 1's batch, in flight then, handed
    over, the data position saved): steps 1.. of each."""
    original = make()
    try:
        straight = [original.get(0, timeout_s=120)]
        deadline = time.monotonic() + 120
        while not (batches := original.in_flight(1, timeout_s=120)):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        (in_flight,) = batches
        for step in range(1, steps):
            publish(original, step)
            straight.append(original.get(step, timeout_s=120))
    finally:
        original.close()
    assert straight[1] is in_flight
    position = straight[0].data_position
    resumed = make(start_step=1, version=1, data_position=position, preloaded=[in_flight])
    try:
        again = [resumed.get(1, timeout_s=120)]
        for step in range(2, steps):
            publish(resumed, step)
            again.append(resumed.get(step, timeout_s=120))
    finally:
        resumed.close()
    return straight, again


def test_curriculum_downweights_solved_and_hopeless(tokenizer):
    """Each example's pass rate is estimated from its last group; one that all passed or all
    failed comes up again only with chance keep_prob (a seeded draw per position of the
    prompt order), while unseen and sometimes-solved examples always do. Over a run, the
    groups spent on the solved and hopeless prompts of `signal_env` fall from most of them
    to few, and the step's metrics say what the curriculum holds."""
    cfg = load_config(overrides=["curriculum.enabled=true", "curriculum.keep_prob=0.25"])
    curriculum = Curriculum(cfg.curriculum, seed=0, rates={1: 1.0, 2: 0.0, 3: 0.5})
    for example in (0, 3):  # unseen, sometimes solved
        assert all(curriculum.keeps(example, p) for p in range(200))
    for example in (1, 2):  # solved, hopeless
        kept = [curriculum.keeps(example, p) for p in range(4000)]
        assert 0.2 < sum(kept) / len(kept) < 0.3
        assert kept == [curriculum.keeps(example, p) for p in range(4000)]  # seeded draws

    def run(*overrides: str) -> list[StepBatch]:
        worker = signal_worker(
            tokenizer,
            "batch.rollouts_per_example=4",
            "batch.batch_size=16",
            "batch.async_level=0",
            "max_steps=6",
            *overrides,
        )
        batches = []
        try:
            for step in range(6):
                batches.append(worker.get(step, timeout_s=120))
                publish(worker, step + 1)
        finally:
            worker.close()
        return batches

    def settled_share(batches: list[StepBatch]) -> float:
        """The share of groups after the first step spent on solved or hopeless prompts."""
        groups = [g for b in batches[1:] for g in b.groups]
        return sum(g.rollouts[0].answer != "mixed" for g in groups) / len(groups)

    plain = run()
    guided = run("curriculum.enabled=true", "curriculum.keep_prob=0.05")
    assert all(b.curriculum_state is None and b.set_aside_prompts == 0 for b in plain)
    assert settled_share(plain) > 0.5 and settled_share(guided) < 0.35
    last = guided[-1]
    assert last.curriculum_state[0] == 1.0 and last.curriculum_state[1] == 0.0  # ids 0, 1
    metrics = build_train_batch(last, cfg).metrics
    assert metrics["curriculum/tracked"] == len(last.curriculum_state) == 6
    assert (
        metrics["curriculum/solved_frac"] >= 2 / 6 and metrics["curriculum/hopeless_frac"] >= 2 / 6
    )
    assert sum(b.set_aside_prompts for b in guided) > 0


MIXTURE = (
    "envs=[{id: vf-a, name: wide, weight: 3, max_tokens: 5},"
    " {id: vf-b, name: narrow, eval_examples: 1}]"
)


def mixture_worker(tokenizer, *overrides: str, **kwargs) -> RolloutWorker:
    """A worker on a mixture of two `signal_env`s, weighted 3 to 1, the first with its own
    reply length, the second with its own eval size."""
    cfg = load_config(
        overrides=["batch.batch_size=8", "batch.rollouts_per_example=2", MIXTURE, *overrides]
    )
    env = vf.EnvGroup([signal_env(), signal_env()], env_names=["wide", "narrow"])
    return RolloutWorker(
        env, env.get_dataset(), cfg, lambda url: SeededClient(tokenizer, [""]), **kwargs
    ).start()


def test_mixture_resume_is_exact(tokenizer):
    """A mixture's step takes its groups by weight (3 of `wide`, 1 of `narrow` in every step),
    each environment samples with its own reply length, and a resumed run (the batch in flight
    handed over, the rest from the saved data position) generates what the uninterrupted run
    did: the same environments, prompts, replies and rewards. The evaluation covers each
    environment on its own eval set."""
    overrides = ("batch.async_level=1", "max_steps=4")

    def contents(batch: StepBatch) -> list:
        return [
            (g.env, r.example_id, r.completion_text, r.reward)
            for g in batch.groups
            for r in g.rollouts
        ]

    make = functools.partial(mixture_worker, tokenizer, *overrides)
    straight, resumed = straight_and_resumed(make, 4)
    for batch in straight:
        envs = [g.env for g in batch.groups]
        assert sorted(envs) == ["narrow", "wide", "wide", "wide"]
        assert {g.env: g.reply_cap for g in batch.groups} == {
            "wide": 5,
            "narrow": FALLBACK_MAX_TOKENS,
        }
        for g in batch.groups:
            assert (g.rollouts[0].example_id < 6) == (g.env == "wide")  # ids unique in the mixture
    assert resumed[0] is straight[1]
    assert [contents(b) for b in resumed[1:]] == [contents(b) for b in straight[2:]]
    assert [b.data_position for b in resumed] == [b.data_position for b in straight[1:]]

    worker = mixture_worker(tokenizer, "max_steps=1", "batch.async_level=0")
    try:
        evaluation = worker.evaluate(num_examples=2, rollouts_per_example=2, timeout_s=120)
    finally:
        worker.close()
    assert set(evaluation.per_env) == {"wide", "narrow"}
    assert evaluation.per_env["wide"].num_rollouts == 4  # eval.num_examples 2 x 2
    assert evaluation.per_env["narrow"].num_rollouts == 2  # its own eval_examples: 1
    assert evaluation.num_rollouts == 6
