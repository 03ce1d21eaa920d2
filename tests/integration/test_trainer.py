"""The GRPO trainer end to end on the CPU: a real vf-vllm serving the tiny model, weights pushed
after every step through the gloo engine, the toy environment of `toy_env.py`.

Numbers (seed 0, LoRA rank 16 on every projection + lm_head, lr 1e-2, 32 rollouts of 16
tokens per step, measured on the 2-core dev machine): the target token's share starts near the
uniform 1/467 (mean of steps 1-3 ~0.001) and passes 0.5 by step 8-10; mismatch-KL stays around
1e-13 after every push. Without pushes the reward stays at the start level and mismatch-KL
passes 1e-3 after one step.
"""

from __future__ import annotations

import json
import logging
import math
import sys

import pytest
import torch
import verifiers as vf
from datasets import Dataset
from safetensors.torch import load_file
from support import (
    ADAPTER_TARGETS,
    chat_requests,
    config,
    json_server,
    launch,
    measured,
    recording_proxy,
    restore_base_weights,
    target_id,
)
from toy_env import completion_ids, multi_turn_target_env, target_share_env

from rlvr.config import ConfigError, load_config
from rlvr.rollouts.client import make_client
from rlvr.rollouts.worker import RolloutWorker
from rlvr.trainer.checkpoint import list_checkpoints
from rlvr.trainer.grpo import Trainer
from rlvr.trainer.optimizer import NonFiniteStepError
from rlvr.weight_sync.control import ServerControl

pytestmark = pytest.mark.integration

# Projections vLLM's LoRA serves (not the tied lm_head): adapter sync, one version per batch.


def mean(values):
    return sum(values) / len(values)


def test_grpo_raises_reward_with_weights_pushed_every_step(tiny_server, tmp_path):
    out = tmp_path / "run"
    cfg = config(
        tiny_server,
        out,
        "max_steps=12",
        "eval.every=6",
        "eval.num_examples=4",
        "wandb.mode=offline",
    )
    history = Trainer(cfg, env=target_share_env(target_id(tiny_server.model_dir))).run()

    rewards = [h["reward/mean"] for h in history]
    first, last = mean(rewards[:3]), mean(rewards[-3:])
    print(f"target-token share per step: {[round(r, 4) for r in rewards]}")
    assert first < 0.02, rewards
    assert last > first + 0.2, f"reward did not rise: first {first:.4f}, last {last:.4f}"
    # float32 on both sides, on-policy batches: sampler and trainer agree after every push
    kls = measured(history, "mismatch_kl")  # steps without signal train and measure nothing
    assert max(kls) < 1e-3, kls
    assert all(h["time/weight_push"] > 0 for h in history)

    # what the run leaves behind
    logged = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in logged if "reward/mean" in m]
    assert [m["step"] for m in steps] == list(range(1, 13))
    for key in (
        "env/target_share",
        "loss/total",
        "entropy",
        "ratio/max",
        "mismatch_kl",
        "time/wait_rollouts",
        "time/forward_backward",
        "time/optimizer",
        "time/weight_push",
        "throughput/gen_tokens_per_s",
        "rollouts/truncated",
        "memory/peak_gib",
    ):
        assert any(key in m for m in steps), key
    # a step whose groups all scored alike trains nothing: its loss logs as 0, and what it did
    # not measure (mismatch-KL, entropy, ratios) is left out rather than logged as 0
    for m in (m for m in steps if m["batch/zero_signal_frac"] == 1):
        assert m["loss/total"] == 0 and "mismatch_kl" not in m and "entropy" not in m, m
    evals = [m for m in logged if "eval/reward" in m]
    assert [m["step"] for m in evals] == [6, 12]
    assert (out / "samples.jsonl").stat().st_size > 0
    assert load_config(out / "config.yaml").optim.lr == 2e-2
    assert (out / "final" / "adapter_config.json").is_file()
    assert (out / "final" / "tokenizer.json").is_file()
    assert list((out / "wandb").glob("offline-run-*")), "W&B runs offline without a key"
    assert [p.name for p in list_checkpoints(out)] == ["step_000012"]


def test_without_pushes_the_server_goes_stale_and_the_trainer_warns(tiny_server, tmp_path, caplog):
    cfg = config(
        tiny_server,
        tmp_path / "run",
        "max_steps=4",
        "lora.enabled=false",
        "server.push_weights=false",
        "logging.mismatch_kl_warn=1e-3",
        "loss.beta=0.05",
    )
    with caplog.at_level(logging.WARNING, logger="rlvr.trainer.metrics"):
        history = Trainer(cfg, env=target_share_env(target_id(tiny_server.model_dir))).run()
    kls = [h["mismatch_kl"] for h in history]
    assert kls[0] < 1e-3 < kls[-1], kls
    # full fine-tuning with beta > 0 keeps a frozen reference copy: KL to it grows from 0
    assert history[0]["loss/kl_ref"] < 1e-9 < history[-1]["loss/kl_ref"]
    assert any("mismatch-KL" in r.getMessage() for r in caplog.records)


def test_resume_continues_exactly(tiny_server, tmp_path):
    env = target_share_env(target_id(tiny_server.model_dir))
    extra = [
        "max_steps=6",
        "lora.dropout=0.1",
        "optim.scheduler=cosine",
        "optim.warmup_steps=1",
        "loss.beta=0.01",
    ]
    straight = Trainer(config(tiny_server, tmp_path / "a", *extra), env=env).run()

    first = Trainer(config(tiny_server, tmp_path / "b", *extra), env=env).run(stop_after=3)
    assert len(first) == 3 and [p.name for p in list_checkpoints(tmp_path / "b")] == ["step_000003"]
    resumed = Trainer(
        config(tiny_server, tmp_path / "b", *extra, "checkpoint.resume=auto"), env=env
    ).run()
    assert len(resumed) == 3
    assert resumed[-1]["loss/kl_ref"] > 0  # the LoRA reference: the base with the adapter off
    for a, b in zip(straight[3:], resumed, strict=True):
        for key in ("reward/mean", "loss/total", "loss/kl_ref", "grad_norm", "lr"):
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-7), key
    wa = load_file(tmp_path / "a" / "final" / "adapter_model.safetensors")
    wb = load_file(tmp_path / "b" / "final" / "adapter_model.safetensors")
    assert wa.keys() == wb.keys()
    assert max((wa[k] - wb[k]).abs().max().item() for k in wa) < 1e-5


def test_async_resume_trains_on_the_batch_that_was_in_flight(tiny_server, tmp_path):
    """async_level 1: when the run stops after step 2, batch 3 is already being generated by
    policy 1. The checkpoint keeps it, and the resumed run trains step 3 on exactly that batch
    (one step of policy lag, as uninterrupted) instead of regenerating it with policy 2."""
    from rlvr.trainer.checkpoint import load_in_flight

    env = _env(tiny_server)
    extra = ["max_steps=4", "batch.async_level=1"]
    Trainer(config(tiny_server, tmp_path / "run", *extra), env=env).run(stop_after=2)
    (checkpoint,) = list_checkpoints(tmp_path / "run")
    (kept,) = load_in_flight(checkpoint)
    assert kept.step == 2 and kept.min_policy_version == 1
    resumed = Trainer(
        config(tiny_server, tmp_path / "run", *extra, "checkpoint.resume=auto"), env=env
    ).run()
    assert len(resumed) == 2 and resumed[0]["rollouts/policy_lag"] == 1
    rewards = [r.reward for r in kept.rollouts]
    assert resumed[0]["reward/mean"] == pytest.approx(sum(rewards) / len(rewards))


@pytest.mark.slow
def test_two_ranks_compute_the_same_step_as_one(tiny_server, tmp_path):
    """DDP on 2 CPU processes: samples broadcast from rank 0, sharded, micro-batch counts
    equalised, the loss normalised by the global token count; rank 1 takes part in every
    weight push without talking to the server. The first step's loss and gradient norm equal
    the single-process run's (same batch: seeded sampling from the same initial weights)."""
    extra = ["max_steps=2", "batch.micro_batch_size=3"]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    ranks = launch(tiny_server, tmp_path / "ddp", torchrun, extra, {"ACCELERATE_USE_CPU": "1"})
    single = Trainer(config(tiny_server, tmp_path / "one", *extra), env=_env(tiny_server))
    alone = single.run()
    assert [r["world"] for r in ranks] == [2, 2]
    first = [r["history"][0] for r in ranks]
    for key in ("loss/total", "grad_norm", "reward/mean", "loss_tokens"):
        expected = pytest.approx(alone[0][key], rel=1e-4, abs=1e-6)  # on-policy loss ~ 0
        assert first[0][key] == first[1][key] == expected, key
    assert all(kl < 1e-3 for r in ranks for kl in measured(r["history"], "mismatch_kl"))


def test_loss_choices_dynamic_sampling_and_pass_at_k_train_against_the_server(
    tiny_server, tmp_path
):
    """The algorithm-layer options through the real trainer and server: GSPO's sequence ratio,
    the per-sequence mean, the sequence mask, dynamic sampling and the curriculum train
    (finite losses, the weights move), the batch stays full, the evaluation logs pass@k and
    the checkpoint keeps the curriculum's estimates."""
    extra = [
        "max_steps=2",
        "loss.ratio_level=sequence",
        "loss.aggregation=seq_mean_token_mean",
        "loss.correction=sequence_mask",
        "batch.dynamic_sampling=true",
        "batch.max_refill_rounds=2",
        "eval.every=2",
        "eval.num_examples=4",
        "eval.rollouts_per_example=2",
        "eval.pass_threshold=0.1",
        "curriculum.enabled=true",
        "curriculum.pass_threshold=0.1",
        "checkpoint.every=1",
    ]
    trainer = Trainer(config(tiny_server, tmp_path, *extra), env=_env(tiny_server))
    history = trainer.run()
    assert len(history) == 2
    for step in history:
        assert math.isfinite(step["loss/total"]) and step["grad_norm"] > 0
        assert step["rollouts/count"] == 32  # refills replace groups, the batch keeps its size
        assert step["batch/refill_groups"] >= 0 and 0 <= step["batch/zero_signal_frac"] <= 1
        assert step["curriculum/tracked"] >= 4
    logged = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    (evaluation,) = [m for m in logged if "eval/reward" in m]
    assert 0 <= evaluation["eval/pass@1"] <= evaluation["eval/pass@2"] <= 1
    saved = json.loads((list_checkpoints(tmp_path)[-1] / "trainer_state.json").read_text())
    assert {int(k): v for k, v in saved["curriculum"].items()} == trainer.curriculum_state


def _env(server):
    return target_share_env(target_id(server.model_dir))


def _same_steps(a: list[dict], b: list[dict], keys: tuple[str, ...]) -> None:
    """The steps of `a` and `b` logged the same `keys` (a step without signal leaves its
    mismatch-KL out) with the same values."""
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        for key in keys:
            assert (key in x) == (key in y), key
            if key in x:
                assert y[key] == pytest.approx(x[key], rel=1e-4, abs=1e-7), key


def test_async_level_2_resumed_twice_matches_uninterrupted(tiny_server, tmp_path):
    """async_level 2: batch s is generated by policy max(0, s - 2) in every run. Stopped after
    step 2 and after step 3, each resume hands the batches that were in flight to the worker
    (the preloaded ones included), so the resumed steps train on what the uninterrupted run
    trained on: the same rewards, lags and losses. Adapter sync pins every request of a batch
    to its version; merged pushes land mid-batch, at a time the machine's load decides."""
    env = _env(tiny_server)
    extra = [
        "max_steps=5",
        "batch.async_level=2",
        "checkpoint.every=1",
        "server.lora_sync=adapter",
        f"lora.target_modules={ADAPTER_TARGETS}",
    ]
    restore_base_weights(tiny_server)  # adapters are served over the base other tests pushed
    straight = Trainer(config(tiny_server, tmp_path / "a", *extra), env=env).run()
    assert [h["rollouts/policy_lag"] for h in straight] == [0, 1, 2, 2, 2]

    out = tmp_path / "b"
    first = Trainer(config(tiny_server, out, *extra), env=env).run(stop_after=2)
    resume = [*extra, "checkpoint.resume=auto"]
    second = Trainer(config(tiny_server, out, *resume), env=env).run(stop_after=3)
    third = Trainer(config(tiny_server, out, *resume), env=env).run()
    keys = ("reward/mean", "rollouts/policy_lag", "loss/total", "grad_norm", "mismatch_kl")
    _same_steps(straight, first + second + third, keys)


def test_multi_turn_requests_use_a_distinct_seed_per_turn(tiny_server, tmp_path):
    """vLLM seeds a generator per request: every turn of every rollout sends its own seed,
    and the same step sends the same seeds again (recorded in front of the server)."""
    env = multi_turn_target_env(target_id(tiny_server.model_dir), turns=3)
    cfg = config(
        tiny_server, tmp_path, "batch.batch_size=8", "batch.rollouts_per_example=4", "max_steps=1"
    )
    runs = []
    for _ in range(2):
        with recording_proxy(tiny_server) as (url, requests):
            cfg.server.base_url = url
            worker = RolloutWorker(
                env,
                env.get_dataset(),
                cfg,
                lambda url: make_client(url, None, 300, 64),
                served_name=lambda v: tiny_server.model,
            ).start()
            try:
                batch = worker.get(0, timeout_s=600)
            finally:
                worker.close()
        assert batch.errored == 0 and [r.num_turns for r in batch.rollouts] == [3] * 8
        bodies = chat_requests(requests)
        turns = [sum(m["role"] == "assistant" for m in b["messages"]) for b in bodies]
        assert sorted(turns) == [0] * 8 + [1] * 8 + [2] * 8
        runs.append(sorted((t, b["seed"]) for t, b in zip(turns, bodies, strict=True)))
    seeds = [seed for _, seed in runs[0]]
    assert len(set(seeds)) == len(seeds) == 24, "a seed repeats across turns or rollouts"
    assert runs[0] == runs[1], "the same step must send the same seeds"


def test_multi_turn_resume_samples_the_same_turns(tiny_server, tmp_path):
    """A multi-turn run stopped after step 1 and resumed samples every turn of the later steps
    as the uninterrupted run did: the same rewards, tokens and losses. Adapter sync pins each
    batch to its version; with merged pushes the push after step 1 lands in the middle of the
    in-flight batch at a time the machine's load decides, and the later turns' server
    log-probabilities (the loss's behaviour policy) move with it."""
    env = multi_turn_target_env(target_id(tiny_server.model_dir), turns=3)
    extra = [
        "max_steps=3",
        "batch.batch_size=16",
        "batch.async_level=1",
        "server.lora_sync=adapter",
        f"lora.target_modules={ADAPTER_TARGETS}",
    ]
    restore_base_weights(tiny_server)  # adapters are served over the base other tests pushed
    straight = Trainer(config(tiny_server, tmp_path / "a", *extra), env=env).run()
    assert all(h["rollouts/turns"] == 3 for h in straight)
    out = tmp_path / "b"
    first = Trainer(config(tiny_server, out, *extra), env=env).run(stop_after=1)
    rest = Trainer(config(tiny_server, out, *extra, "checkpoint.resume=auto"), env=env).run()
    keys = ("reward/mean", "rollouts/completion_tokens", "loss/total", "grad_norm")
    _same_steps(straight, first + rest, keys)


def test_raw_logprobs_server_is_refused(tiny_server, tmp_path):
    """A server started with plain `vllm serve` returns logprobs before the temperature: its
    configuration (the real server's, with vLLM's default mode) is refused at connect."""
    control = ServerControl(tiny_server.base_url)
    info = control.get("/server_info", params={"config_format": "json"})
    assert control.logprobs_mode() == "processed_logprobs"  # vf-vllm's own choice
    info["vllm_config"]["model_config"]["logprobs_mode"] = "raw_logprobs"
    with json_server({"/server_info": info, "/health": {}}) as url:  # up, as vllm serve is
        cfg = config(tiny_server, tmp_path, f"server.base_url={url}", "sampling.temperature=0.7")
        with pytest.raises(ConfigError, match="--logprobs-mode processed_logprobs"):
            Trainer(cfg, env=_env(tiny_server)).setup()


def _trainable_finite(trainer: Trainer) -> bool:
    return all(torch.isfinite(p).all() for p in trainer.model.parameters() if p.requires_grad)


def test_nan_rewards_never_reach_the_weights(tiny_server, tmp_path):
    """A reward function that returns NaN for every fifth rollout, in the real loop: the
    rollouts count as errored, every logged metric stays finite, and so does every weight
    (taken as a number, one NaN reward makes all 28 adapter tensors NaN after one step)."""
    target, calls = target_id(tiny_server.model_dir), iter(range(10**6))

    def target_share(state) -> float:
        ids = completion_ids(state)
        return math.nan if next(calls) % 5 == 4 else ids.count(target) / max(len(ids), 1)

    rows = [{"question": f"Write a line about item {i}.", "answer": ""} for i in range(16)]
    env = vf.SingleTurnEnv(dataset=Dataset.from_list(rows), rubric=vf.Rubric(funcs=[target_share]))
    trainer = Trainer(config(tiny_server, tmp_path, "max_steps=1"), env=env)
    history = trainer.run()
    assert [h["rollouts/errored"] for h in history] == [6]  # calls 4, 9, ..., 29 of 32
    assert all(math.isfinite(v) for h in history for v in h.values()), history
    assert _trainable_finite(trainer)


def test_a_nan_loss_stops_the_run_and_it_resumes_from_the_last_checkpoint(
    tiny_server, tmp_path, monkeypatch
):
    """A NaN that gets past the rollouts (here: one advantage of step 2) stops the run before
    the optimizer step, naming the step; the checkpoint of step 1 is intact and a resumed run
    continues from it."""
    from rlvr.trainer import grpo

    real = grpo.build_train_batch

    def poisoned(batch, cfg, hooks=None):
        train = real(batch, cfg, hooks)
        if batch.step == 1:
            train.samples[0] = train.samples[0].with_advantage(math.nan)
        return train

    monkeypatch.setattr(grpo, "build_train_batch", poisoned)
    extra = ["max_steps=2", "checkpoint.every=1"]
    trainer = Trainer(config(tiny_server, tmp_path, *extra), env=_env(tiny_server))
    with pytest.raises(NonFiniteStepError, match="^step 2: the loss is nan; the optimizer did"):
        trainer.run()
    assert _trainable_finite(trainer)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_000001"]

    monkeypatch.setattr(grpo, "build_train_batch", real)
    resumed = Trainer(
        config(tiny_server, tmp_path, *extra, "checkpoint.resume=auto"), env=_env(tiny_server)
    )
    assert len(resumed.run()) == 1 and resumed.start_step == 1
    assert _trainable_finite(resumed)


def test_v1_environment_trains(tiny_server, tmp_path):
    """A verifiers v1 environment (`vf.Env(Taskset, Harness)`, `toy_env.v1_target_env`) trains
    like its classic twin `target_share_env`: the same prompts and request seeds give the same
    rewards, losses and gradient norms step for step, its own reward and metric reach the logs,
    the evaluation reads its eval set, and the weights move (the tiny random model hits the
    target token in step 1; a step whose groups all score 0 has no gradient, as in the twin)."""
    from toy_env import v1_target_env

    target = target_id(tiny_server.model_dir)
    extra = ["max_steps=2", "eval.every=2", "eval.num_examples=4"]
    history = Trainer(config(tiny_server, tmp_path / "v1", *extra), env=v1_target_env(target)).run()
    classic = Trainer(
        config(tiny_server, tmp_path / "classic", *extra), env=_env(tiny_server)
    ).run()
    assert len(history) == 2
    for step, twin in zip(history, classic, strict=True):
        assert step["rollouts/count"] == 32 and step["rollouts/errored"] == 0
        assert step["rollouts/samples"] > 0
        assert math.isfinite(step["loss/total"])
        assert step["env/target_share"] == pytest.approx(step["reward/mean"])
        assert step["env/completion_length"] > 0
        for key in ("reward/mean", "loss/total", "grad_norm"):
            assert step[key] == pytest.approx(twin[key], rel=1e-5, abs=1e-9), key
    assert history[0]["reward/mean"] > 0 and history[0]["grad_norm"] > 0
    logged = [
        json.loads(line) for line in (tmp_path / "v1" / "metrics.jsonl").read_text().splitlines()
    ]
    (evaluation,) = [m for m in logged if "eval/reward" in m]
    assert evaluation["eval/rollouts"] >= 4 and evaluation["eval/errored"] == 0
    assert evaluation["eval/target_share"] == pytest.approx(evaluation["eval/reward"])


def test_mixture_draws_by_weight_and_logs_per_env(tiny_server, tmp_path, shared_data):
    """Two real environments in one run (`envs:` loads them by id, as verifiers' EnvGroup):
    each step takes 3 groups of boxed math for 1 tic-tac-toe game (weights 3 and 1), the
    math replies keep to their own reply length, and the logs, the evaluation and the sample
    table are per environment."""
    boxed = {
        "id": "vf-deepscaler",
        "name": "math",
        "weight": 3,
        "max_tokens": 6,
        "args": {"data_files": str(shared_data / "deepscaler" / "preview_first803.jsonl")},
    }
    games = {
        "id": "vf-openspiel",
        "name": "games",
        "eval_examples": 1,
        "args": {"cases": "tic_tac_toe", "num_tasks_per_case": 8},
    }
    extra = [
        f"envs={json.dumps([boxed, games])}",
        "max_steps=2",
        "batch.batch_size=16",
        "batch.rollouts_per_example=4",
        "batch.max_prompt_len=512",
        "eval.every=2",
        "eval.num_examples=2",
        "logging.samples_per_step=16",
        "logging.table_every=1",
    ]
    history = Trainer(config(tiny_server, tmp_path, *extra)).run()
    assert len(history) == 2
    for step in history:
        assert (step["env/math/groups"], step["env/games/groups"]) == (3, 1)
        assert math.isfinite(step["loss/total"])
        assert "env/math/reward/mean" in step and "env/games/reward/mean" in step
        assert step["env/math/completion_len"] <= 6 < 16  # its own cap, not sampling.max_tokens
        own = {k.split("/")[2] for k in step if k.startswith("env/games/")}
        assert own - {"groups", "reward", "completion_len"}  # the game rubric's own metrics
    logged = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    (evaluation,) = [m for m in logged if "eval/reward" in m]
    assert evaluation["eval/math/rollouts"] + evaluation["eval/math/errored"] == 2
    assert evaluation["eval/games/rollouts"] + evaluation["eval/games/errored"] == 1
    rows = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert {row["env"] for row in rows} == {"math", "games"}
