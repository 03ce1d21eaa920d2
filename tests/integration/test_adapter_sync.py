"""LoRA adapter sync: the trainer pushes only the adapter, vf-vllm serves it on its frozen base
under its own name, and the base name keeps serving the base (vf_planner's frozen worker)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from support import (
    ADAPTER_TARGETS,
    config,
    measured,
    restore_base_weights,
    server_logprobs,
    target_id,
    trainer_logprobs,
)
from toy_env import target_share_env

from rlvr.config import ConfigError, LoraConfig
from rlvr.trainer.grpo import Trainer
from rlvr.weight_sync.adapter import AdapterPush

integration = pytest.mark.integration
IDS = list(range(3, 60, 3))


class Served:
    """One name on a server, for `server_logprobs`."""

    def __init__(self, server, name: str):
        self.base_url, self.model = server.base_url, name


def peft_model(model_dir, targets=("q_proj", "v_proj", "down_proj"), seed: int = 0):
    from transformers import AutoModelForCausalLM

    from rlvr.model.policy import apply_lora

    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    torch.manual_seed(seed)  # lora_A's random init: the same adapter in every process
    model = apply_lora(base, LoraConfig(rank=8, alpha=16, target_modules=list(targets)))
    perturb(model, seed)
    return model


def perturb(model, seed: int) -> None:
    """Pretend a training step happened: move every lora_B (they start at zero)."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.05)


@integration
def test_adapter_sync_serves_base_plus_adapter_and_leaves_the_base_alone(tiny_server):
    restore_base_weights(tiny_server)
    from rlvr.weight_sync.adapter import AdapterPush
    from rlvr.weight_sync.control import ServerControl

    model = peft_model(tiny_server.model_dir)
    with model.disable_adapter():
        base = trainer_logprobs(model, IDS)
    base_name = Served(tiny_server, tiny_server.model)
    control = ServerControl(tiny_server.base_url)
    pushed = {}
    with AdapterPush(control, tiny_server.base_url, "policy") as sync:
        sync.connect(model)
        for version, seed in ((0, 1), (1, 2)):
            perturb(model, seed)
            sync.push(version)
            pushed[version] = trainer_logprobs(model, IDS)
            assert sync.served_name(version) == f"policy-v{version}"
            assert (server_logprobs(base_name, IDS) - base).abs().max() < 1e-4
        for version, expected in pushed.items():  # each version keeps serving its own adapter
            served = server_logprobs(Served(tiny_server, f"policy-v{version}"), IDS)
            assert (served - expected).abs().max() < 1e-4
        (newest,) = [p for p in sync.directory.iterdir() if p.name.endswith("000001")]
        size = sum(f.stat().st_size for f in newest.iterdir())
        sync.release(in_use=[])  # no request needs version 0 any more: unloaded, files gone
        assert [p.name for p in sync.directory.iterdir()] == ["v000001"]
        assert served_names(tiny_server) & {"policy-v0", "policy-v1"} == {"policy-v1"}
    model_size = sum(p.numel() * 4 for p in model.get_base_model().parameters())
    assert size < model_size / 5, (size, model_size)  # the adapter, not the model
    assert not sync.directory.exists()  # cleaned up on close
    assert "policy-v1" not in served_names(tiny_server)  # no name left pointing at no files


def served_names(server) -> set[str]:
    import httpx

    models = httpx.get(f"{server.base_url}/models", timeout=30).json()["data"]
    return {m["id"] for m in models}


@integration
def test_adapter_sync_uploads_to_a_server_on_another_host(tiny_server):
    """A server elsewhere cannot read the trainer's /dev/shm: the adapter's bytes travel in
    the request to vf-vllm's worker extension, which writes them where vLLM reads."""
    restore_base_weights(tiny_server)
    from rlvr.weight_sync.adapter import AdapterPush
    from rlvr.weight_sync.control import ServerControl

    model = peft_model(tiny_server.model_dir, seed=3)
    with AdapterPush(ServerControl(tiny_server.base_url), tiny_server.base_url, "remote") as sync:
        sync.local = False  # as if the URL named another host (same machine here)
        sync.connect(model)
        sync.push(0)
        served = server_logprobs(Served(tiny_server, sync.served_name(0)), IDS)
    assert (served - trainer_logprobs(model, IDS)).abs().max() < 1e-4


@integration
@pytest.mark.slow
def test_adapter_sync_grpo_raises_reward(smollm2_server, tmp_path):
    """GRPO pushing only the adapter learns. On SmolLM2, not the tiny model: a random model's
    output head is too weak for LoRA on the projections alone to move its distribution (the
    merged-sync learning test gets there through LoRA on lm_head, which vLLM cannot serve).
    The reward is the share of capitalised tokens (SmolLM2 starts near 0.15; measured 0.87
    after 6 steps)."""
    from transformers import AutoTokenizer

    vocab = AutoTokenizer.from_pretrained(smollm2_server.model_dir).get_vocab()
    capitalised = {i for token, i in vocab.items() if token.lstrip("Ġ")[:1].isupper()}
    cfg = config(
        smollm2_server,
        tmp_path / "run",
        "max_steps=6",
        "server.lora_sync=adapter",
        "batch.batch_size=16",
        f"lora.target_modules={ADAPTER_TARGETS}",
        "optim.lr=2e-3",
    )
    trainer = Trainer(cfg, env=target_share_env(capitalised))
    history = trainer.run()
    assert all(isinstance(push, AdapterPush) for push in trainer.weights.pushes)
    rewards = [h["reward/mean"] for h in history]
    print(f"capitalised-token share per step (adapter sync): {[round(r, 3) for r in rewards]}")
    assert sum(rewards[-2:]) / 2 > sum(rewards[:2]) / 2 + 0.2, rewards
    kls = measured(history, "mismatch_kl")
    assert max(kls) < 1e-3, kls  # base + adapter in vLLM vs the PEFT forward, every push
    assert all(h["time/weight_push"] > 0 for h in history)


@integration
def test_adapter_sync_auto_falls_back_to_merged_for_an_unservable_adapter(tiny_server, tmp_path):
    cfg = config(tiny_server, tmp_path / "run", "max_steps=1")  # lm_head is a LoRA target
    trainer = Trainer(cfg, env=target_share_env(target_id(tiny_server.model_dir)))
    history = trainer.run()
    assert trainer.weights.pushes[0].backend == "shm"
    assert trainer.weights.served_name(1) == tiny_server.model
    assert history[0]["mismatch_kl"] < 1e-3
    explicit = config(tiny_server, tmp_path / "run2", "max_steps=1", "server.lora_sync=adapter")
    with pytest.raises(ConfigError, match="lora_sync=adapter: vLLM's LoRA layers do not cover"):
        Trainer(explicit, env=target_share_env(target_id(tiny_server.model_dir))).run()


@integration
def test_adapter_sync_async_level_2_keeps_serving(tiny_server, tmp_path, monkeypatch):
    """async_level 2: a batch tagged with version v may still be generating while v+1 and
    v+2 are pushed. Each push used to reload one adapter name in place, so such a batch mixed
    versions, and the engine died once it reloaded a version whose files were deleted. Now
    every rollout must come from the version its batch is tagged with (its sampler logprobs
    are that version's, recomputed from what the trainer pushed as it), with no error.

    So that pushes do land mid-batch whatever the machine's speed, half the rollouts of a
    batch two versions behind start only once the next version is pushed (the others are in
    flight)."""
    restore_base_weights(tiny_server)  # the adapters' base (the push probe checks it too)
    from rlvr.layout.micro_batches import collate
    from rlvr.model.policy import trainable_state
    from rlvr.rollouts.worker import RolloutWorker
    from rlvr.trainer.logprobs import sequence_scores
    from rlvr.weight_sync.control import ServerControl

    cfg = config(
        tiny_server,
        tmp_path / "run",
        "max_steps=4",
        "batch.async_level=2",
        "server.lora_sync=adapter",
        f"lora.target_modules={ADAPTER_TARGETS}",
        "sampling.max_tokens=32",
    )
    env = target_share_env(set(range(0, 512, 2)))
    trainer = Trainer(cfg, env=env)
    pushed, batches, spans = {}, [], []
    started = {"version": None, "rollouts": 0}
    push, generate, rollout = trainer.push_weights, RolloutWorker.generate_step, env.rollout

    def recording_push(version, initial=False):
        seconds = push(version, initial)
        pushed[version] = trainable_state(trainer.accelerator.unwrap_model(trainer.model))
        return seconds

    async def recording_generate(worker, step, version):
        # batch s is generated by version s - 2 (0 for the first two); the trainer pushes the
        # next version once it has started
        started["version"] = version if step - version == 2 else None
        batch = await generate(worker, step, version)
        spans.append(worker.clock.current - version)  # pushes that landed while it generated
        batches.append(batch)
        return batch

    async def late_rollout(*args, **kwargs):
        started["rollouts"] += 1
        after = started["version"] if started["rollouts"] % 2 else None
        while after is not None and trainer.worker.clock.current <= after:
            await asyncio.sleep(0.05)
        return await rollout(*args, **kwargs)

    trainer.push_weights = recording_push
    env.rollout = late_rollout
    monkeypatch.setattr(RolloutWorker, "generate_step", recording_generate)
    history = trainer.run()

    assert ServerControl(tiny_server.base_url).health()
    assert [h["rollouts/errored"] for h in history] == [0, 0, 0, 0]
    assert max(spans) >= 1, spans
    model = trainer.accelerator.unwrap_model(trainer.model).eval()
    for batch in batches:
        model.load_state_dict(pushed[batch.min_policy_version], strict=False)
        mb = collate([[s] for r in batch.rollouts for s in r.samples], trainer.pad_id)
        with torch.no_grad():
            mine = sequence_scores(model, mb, cfg.sampling.temperature).logprobs
        gap = ((mine - mb.sampler_logprobs).abs() * mb.loss_mask).max().item()
        assert gap < 1e-3, (batch.step, batch.min_policy_version, gap)


DYING_TRAINER = textwrap.dedent(
    """
    import os, sys
    sys.path.insert(0, {tests!r})
    from integration.test_adapter_sync import peft_model
    from rlvr.weight_sync.adapter import AdapterPush
    from rlvr.weight_sync.control import ServerControl

    model = peft_model({model_dir!r}, seed=7)
    control = ServerControl({url!r})
    sync = AdapterPush(control, {url!r}, "takeover")
    sync.connect(model)
    sync.push(0)
    print("pushed", flush=True)

    def die(*args, **kwargs):
        os._exit(3)  # new adapter written, load never requested

    control.post = lambda path, **kw: die() if path == "/v1/load_lora_adapter" else (
        ServerControl.post(control, path, **kw))
    sync.push(1)
    """
)


@integration
def test_adapter_sync_trainer_killed_mid_push_leaves_the_previous_adapter(tiny_server):
    restore_base_weights(tiny_server)
    from rlvr.weight_sync.adapter import AdapterPush
    from rlvr.weight_sync.control import ServerControl

    tests = str(Path(__file__).resolve().parents[1])
    script = DYING_TRAINER.format(
        tests=tests, model_dir=str(tiny_server.model_dir), url=tiny_server.base_url
    )
    dead = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert dead.returncode == 3 and "pushed" in dead.stdout, dead.stderr[-2000:]
    served = Served(tiny_server, "takeover-v0")
    previous = peft_model(tiny_server.model_dir, seed=7)
    # Until a new trainer starts, the dead one's version 0 serves what it pushed.
    assert (server_logprobs(served, IDS) - trainer_logprobs(previous, IDS)).abs().max() < 1e-4
    # A new trainer under the same name (a resumed run) unloads what the dead one left and
    # loads its own version 0.
    with AdapterPush(ServerControl(tiny_server.base_url), tiny_server.base_url, "takeover") as sync:
        newer = peft_model(tiny_server.model_dir, seed=8)
        sync.connect(newer)
        assert "takeover-v0" not in served_names(tiny_server)
        sync.push(0)
        assert (server_logprobs(served, IDS) - trainer_logprobs(newer, IDS)).abs().max() < 1e-4


def planner_env(shared_data, **extra):
    """vf_planner on real GSM8K rows, its worker on the policy's server. A random model's plans
    never parse (reward 0 for all), so a small length term gives GRPO a gradient: what this
    checks is which weights move, not what the planner learns."""
    import verifiers as vf

    env = vf.load_environment(
        "vf-planner",
        data_files=str(shared_data / "gsm8k" / "test.jsonl"),
        split="test",
        max_examples=8,
        worker_max_tokens=16,
        **extra,
    )

    def length(completion) -> float:
        return len(str(completion)) / 1000

    env.rubric.add_reward_func(length, weight=0.01)
    return env


def greedy(server, model: str, prompt: str) -> tuple[str, torch.Tensor]:
    import httpx

    body = {"model": model, "prompt": prompt, "max_tokens": 24, "temperature": 0, "logprobs": 1}
    choice = httpx.post(f"{server.base_url}/completions", json=body, timeout=120).json()
    choice = choice["choices"][0]
    return choice["text"], torch.tensor(choice["logprobs"]["token_logprobs"])


@integration
def test_adapter_sync_planner_worker_stays_frozen_while_the_policy_trains(
    tiny_server, shared_data, tmp_path
):
    """Policy and frozen worker on one server: two GRPO steps push the planner's adapter; the
    worker (the server's base model, the adapter's parent) answers a fixed prompt exactly as
    before, while the policy's answers change."""
    env = planner_env(shared_data)
    assert env.frozen_model_on_policy_server
    prompt = "Natalia sold clips to 48 of her friends. How many clips did she sell?"
    worker_before = greedy(tiny_server, tiny_server.model, prompt)
    cfg = config(
        tiny_server,
        tmp_path / "run",
        "max_steps=2",
        "batch.batch_size=8",
        "batch.rollouts_per_example=4",
        "sampling.max_tokens=32",
        f"lora.target_modules={ADAPTER_TARGETS}",
        "server.lora_sync=adapter",
        "env.id=vf-planner",
    )
    trainer = Trainer(cfg, env=env)
    trainer.setup()  # the initial push: the adapter is zero, the policy is the base
    try:
        policy_before = greedy(tiny_server, trainer.weights.served_name(0), prompt)
        assert torch.allclose(policy_before[1], worker_before[1], atol=1e-4)
        for step in range(2):
            trainer.train_step(step)
        policy_after = greedy(tiny_server, trainer.weights.served_name(2), prompt)
        worker_after = greedy(tiny_server, tiny_server.model, prompt)
    finally:
        trainer.close()
    assert worker_after[0] == worker_before[0]
    assert torch.allclose(worker_after[1], worker_before[1], atol=1e-5)
    assert (policy_after[1] - policy_before[1]).abs().max() > 1e-3


@integration
def test_adapter_sync_planner_refuses_merged_pushes_into_its_worker_server(
    tiny_server, shared_data, tmp_path
):
    cfg = config(
        tiny_server, tmp_path / "run", "max_steps=1", "server.lora_sync=merged", "env.id=vf-planner"
    )
    with pytest.raises(ConfigError, match="worker_base_url"):
        Trainer(cfg, env=planner_env(shared_data)).run()
    separate = planner_env(shared_data, worker_base_url=tiny_server.base_url)
    assert not separate.frozen_model_on_policy_server
