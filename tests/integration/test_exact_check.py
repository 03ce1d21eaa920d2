"""The exact check of every merged push, against real vf-vllm servers on the CPU: what the
server's layers compute with is what was sent, to the bit, at float32 and bfloat16, at any step
size; and a tied output layer is served as the embedding that was pushed."""

from __future__ import annotations

import math

import pytest
import torch
from support import (
    config,
    in_transit,
    one_element_off_while,
    restore_base_weights,
    server_logprobs,
    target_id,
    trainer_logprobs,
)
from toy_env import target_share_env
from transformers import AutoModelForCausalLM

from rlvr.trainer.checkpoint import list_checkpoints
from rlvr.trainer.grpo import Trainer
from rlvr.weight_sync.merged import MergedPush
from rlvr.weight_sync.merged_stream import MergedWeightSource
from rlvr.weight_sync.probe import WeightsNotServedError

pytestmark = pytest.mark.integration

LAYER = "model.layers.1."
DTYPES = ["float32", "bfloat16"]


@pytest.fixture
def served(request, tiny_server, bf16_server):
    """The tiny model's server at the test's dtype, holding the base weights again after."""
    if request.param == "float32":
        server = tiny_server
    elif bf16_server.server is None:
        pytest.skip(bf16_server.why)
    else:
        server = bf16_server.server
    restore_base_weights(server)
    yield server
    restore_base_weights(server)


@torch.no_grad()
def optimizer_like_step(model: torch.nn.Module, lr: float, seed: int) -> None:
    """Move every parameter by lr per element, as Adam's first steps do (sign of a gradient)."""
    generator = torch.Generator().manual_seed(seed)
    for param in model.parameters():
        param.add_(torch.randn(param.shape, generator=generator).sign() * lr)


def connected(server, model: torch.nn.Module) -> MergedPush:
    push = MergedPush(server.base_url, server.model, backend="shm")
    push.connect(MergedWeightSource(model))
    assert push.check is not None, "the server was not checked exactly"
    return push


@pytest.mark.parametrize("served", DTYPES, indirect=True)
def test_verification_catches_one_changed_element(served, monkeypatch):
    """The trainer moves one element of one layer and the transfer loses that change: the
    check names that parameter and no other; a complete push passes."""
    model = AutoModelForCausalLM.from_pretrained(served.model_dir, dtype=torch.float32)
    name = f"{LAYER}mlp.down_proj.weight"
    weight = model.get_parameter(name)
    old = weight[3, 5].item()
    with torch.no_grad():
        weight[3, 5] += abs(old) * 0.02 + 1e-3  # a change a bfloat16 server holds too

    def lose_it(tensor_name: str, tensor: torch.Tensor) -> torch.Tensor:
        if tensor_name != name:
            return tensor
        tensor = tensor.clone()
        tensor[3, 5] = old
        return tensor

    with connected(served, model) as push:
        push.push(1)
        assert push.verified.failed == [] and push.verified.params > 0
        in_transit(monkeypatch, lose_it)
        push.push(2)
    failed = push.verified.failed
    assert [m.name for m in failed] == [name], [m.describe() for m in failed]
    assert failed[0].sent.bits != failed[0].served.bits
    assert name in str(push.failed_check(2))


@pytest.mark.parametrize("lr", [1e-5, 1e-7])
@pytest.mark.parametrize("served", DTYPES, indirect=True)
def test_verification_catches_a_skipped_layer_at_any_dtype(served, lr, monkeypatch):
    """A step of `lr` on every weight, pushed with one layer left at its old values: the
    check names parameters of that layer only (the ones whose served values the step moved),
    at float32 and bfloat16, at lr 1e-5 and 1e-7."""
    model = AutoModelForCausalLM.from_pretrained(served.model_dir, dtype=torch.float32)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer_like_step(model, lr, seed=1)
    in_transit(monkeypatch, lambda n, t: before[n] if n.startswith(LAYER) else t)
    with connected(served, model) as push:
        push.push(1)
    failed = [m.name for m in push.verified.failed]
    assert failed and all(n.startswith(LAYER) for n in failed), failed
    assert any("mlp" in n for n in failed) and any("self_attn" in n for n in failed), failed


def cosine_with_a_spike(pushes: int, peak: float, spike_at: int) -> list[float]:
    """lr per push: cosine from `peak` to exactly 0, ten times higher at `spike_at`."""
    lrs = [peak * 0.5 * (1 + math.cos(math.pi * t / (pushes - 1))) for t in range(pushes)]
    lrs[spike_at] *= 10
    return lrs


@pytest.mark.parametrize("served", DTYPES, indirect=True)
def test_verification_has_no_false_alarm_over_a_schedule(served):
    """30 complete pushes over a cosine schedule down to lr 0, with a 10x spike: every one
    passes, at float32 and bfloat16."""
    model = AutoModelForCausalLM.from_pretrained(served.model_dir, dtype=torch.float32)
    lrs = cosine_with_a_spike(30, 1e-5, spike_at=20)
    assert lrs[-1] == pytest.approx(0, abs=1e-20)
    with connected(served, model) as push:
        for version, lr in enumerate(lrs, start=1):
            optimizer_like_step(model, lr, seed=version)
            push.push(version)
            failed = [m.describe() for m in push.verified.failed]
            assert not failed, (version, lr, failed)


def test_full_finetune_of_tied_embeddings_is_served(smollm2_server, tmp_path):
    """SmolLM2 ties its output layer to its embedding: after a push that moves the embedding,
    the server's log-probabilities equal the trainer's to the initial offset (the output
    layer moved with the embedding), and the exact check passes, the output layer included;
    two GRPO steps of a full fine-tune pass it at every push."""
    from rlvr.model.names import ensure_embedded_model

    model = AutoModelForCausalLM.from_pretrained(ensure_embedded_model(), dtype=torch.float32)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    ids = list(range(100, 164))
    try:
        with connected(smollm2_server, model) as push:
            push.push(1)
            offset = (server_logprobs(smollm2_server, ids) - trainer_logprobs(model, ids)).abs()
            before = trainer_logprobs(model, ids)
            with torch.no_grad():
                embedding = model.model.embed_tokens.weight
                generator = torch.Generator().manual_seed(0)
                embedding.add_(torch.randn(embedding.shape, generator=generator).sign() * 1e-3)
            push.push(2)
            assert push.verified.failed == [], [m.describe() for m in push.verified.failed]
            assert "lm_head.weight" in push.check.expected.prints
        after = trainer_logprobs(model, ids)
        served = server_logprobs(smollm2_server, ids)
        moved = (after - before).abs().max().item()
        assert moved > 100 * offset.max().item(), (moved, offset.max())  # the step shows
        assert (served - after).abs().max().item() <= 3 * offset.max().item() + 1e-6
        cfg = config(
            smollm2_server,
            tmp_path,
            "max_steps=2",
            "lora.enabled=false",
            "optim.lr=1e-5",
            "batch.batch_size=8",
            "batch.rollouts_per_example=4",
            "batch.micro_batch_size=4",
        )
        env = target_share_env(target_id(smollm2_server.model_dir))
        for step in Trainer(cfg, env=env).run():
            assert step["push/failed_params"] == 0 and step["push/verified_params"] > 0, step
    finally:
        restore_base_weights(smollm2_server)


def test_one_server_that_never_holds_a_push_stops_the_run_after_saving(
    tiny_server, tmp_path, monkeypatch
):
    """With one server, a push whose exact check fails again after the second push stops the
    run with the error naming the parameter, and the step it trained is saved first (a resume
    pushes it again): nothing trained is lost."""
    lossy = {"on": False}
    one_element_off_while(monkeypatch, lambda: lossy["on"], LAYER + "mlp.down_proj.weight")
    push = Trainer.push_weights

    def push_weights(self, version, initial=False):
        lossy["on"] = version >= 1
        return push(self, version, initial)

    monkeypatch.setattr(Trainer, "push_weights", push_weights)
    cfg = config(tiny_server, tmp_path, "max_steps=3")
    env = target_share_env(target_id(tiny_server.model_dir))
    try:
        with pytest.raises(WeightsNotServedError, match="down_proj.*after a second push too"):
            Trainer(cfg, env=env).run()
    finally:
        restore_base_weights(tiny_server)
    assert [c.name for c in list_checkpoints(tmp_path)] == ["step_000001"]


def adapter_policy(model_dir, quantization: str) -> torch.nn.Module:
    """The tiny model (4-bit where `quantization` says so, as QLoRA trains it) with a LoRA
    adapter on q, v and down_proj (alpha / r = 2: vLLM folds that scaling into B)."""
    from rlvr.config import LoraConfig, ModelConfig
    from rlvr.model.policy import apply_lora, load_model

    cfg = ModelConfig(name=str(model_dir), quantization=quantization)
    base = load_model(str(model_dir), cfg, dtype=torch.float32)
    torch.manual_seed(0)
    lora = LoraConfig(rank=8, alpha=16, target_modules=["q_proj", "v_proj", "down_proj"])
    return apply_lora(base, lora)


@torch.no_grad()
def train_adapter(model: torch.nn.Module, seed: int) -> None:
    """Stand in for a step: move every adapter matrix."""
    generator = torch.Generator().manual_seed(seed)
    for name, param in model.named_parameters():
        if "lora_" in name:
            param.add_(torch.randn(param.shape, generator=generator) * 0.05)


@pytest.mark.parametrize("quantization", ["none", "nf4"], ids=["lora", "qlora"])
def test_adapter_push_is_verified(tiny_server, quantization, monkeypatch):
    """Adapter sync (LoRA, and QLoRA's adapter on its 4-bit base) checks every push exactly
    against the adapter the server stored: a push passes; one the transfer leaves one lora_B
    of at its previous values fails, naming that fused matrix and no other; pushing the
    version again (in place) repairs it."""
    import rlvr.weight_sync.adapter as adapter_sync
    from rlvr.weight_sync.control import ServerControl

    model = adapter_policy(tiny_server.model_dir, quantization)
    dropped = "base_model.model.model.layers.1.self_attn.v_proj.lora_B.default.weight"
    control = ServerControl(tiny_server.base_url)
    with adapter_sync.AdapterPush(control, tiny_server.base_url, f"check-{quantization}") as push:
        push.connect(model)
        assert push.check is not None, "the server's adapters were not checked exactly"
        train_adapter(model, seed=1)
        seconds = push.push(1)
        assert push.failed_check(1) is None and push.verified.failed == []
        print(f"adapter push {seconds:.3f} s, of it the exact check {push.verified.seconds:.4f} s")
        assert push.verified.params == 2 * 2 * 2  # (qkv, down) x (A, B) x 2 layers
        previous = model.get_parameter(dropped).detach().clone()
        train_adapter(model, seed=2)
        save = adapter_sync.save_adapter
        monkeypatch.setattr(
            adapter_sync,
            "save_adapter",
            lambda model, state, directory: save(model, {**state, dropped: previous}, directory),
        )
        push.push(2)
        error = str(push.failed_check(2))
        assert "1 of 8 parameters differ" in error, error
        assert "model.layers.1.self_attn.qkv_proj.lora_b: sent" in error, error
        monkeypatch.setattr(adapter_sync, "save_adapter", save)
        push.push(2)
        assert push.failed_check(2) is None


def test_resume_onto_other_kernels_passes(tiny_server, bf16_server, tmp_path):
    """A run stopped on a float32 server resumes onto a bfloat16 one: the same weights computed
    with other kernels and another dtype. The resume's push is checked exactly at the new
    server's dtype and probed afresh against its absolute limit, and training goes on."""
    if bf16_server.server is None:
        pytest.skip(bf16_server.why)
    env = target_share_env(target_id(tiny_server.model_dir))
    try:
        Trainer(config(tiny_server, tmp_path, "max_steps=2"), env=env).run(stop_after=1)
        assert [c.name for c in list_checkpoints(tmp_path)] == ["step_000001"]
        resumed = config(bf16_server.server, tmp_path, "max_steps=2", "checkpoint.resume=auto")
        (step,) = Trainer(resumed, env=env).run()  # step 2 only
        assert step["push/failed_params"] == 0 and step["push/verified_params"] > 0, step
    finally:
        restore_base_weights(tiny_server)
        restore_base_weights(bf16_server.server)
