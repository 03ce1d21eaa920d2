"""QLoRA against a real vf-vllm on the CPU: LoRA trains on a 4- or 8-bit base, and the server
serves the base the trainer computes with (the dequantized one), so the importance ratio and
the push probe stay exact. The naive setup (the server on the unquantized original) is the
baseline that shows why: docs/training.md#quantized-bases-qlora has the measured numbers.
"""

from __future__ import annotations

import math

import pytest
import torch
from safetensors.torch import load_file
from support import assert_push_checked, config, measured, restore_base_weights, target_id
from toy_env import target_share_env
from transformers import AutoTokenizer

from rlvr.trainer.grpo import Trainer
from rlvr.weight_sync.probe import WeightsNotServedError

pytestmark = pytest.mark.integration

# Projections vLLM's LoRA serves: adapter sync (support.LORA_TARGETS adds lm_head: merged pushes).
ADAPTER_TARGETS = "lora.target_modules=[q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj]"
QLORA = (ADAPTER_TARGETS, "model.quantization=nf4")
SMALL_BATCH = (
    "batch.batch_size=8",
    "batch.rollouts_per_example=4",
    "batch.micro_batch_size=4",
    "sampling.max_tokens=8",
)


@pytest.fixture
def restored(request):
    """The named server with its original weights, and again after the test (a QLoRA run
    leaves the dequantized base in it)."""
    server = request.getfixturevalue(request.param)
    restore_base_weights(server)
    yield server
    restore_base_weights(server)


COMMON_WORDS = ["Ġthe", "Ġa", ".", ",", "Ġof", "Ġand", "Ġto", "Ġis"]
"""SmolLM2 seldom writes the tiny model's target ("42"): its reward counts common tokens, so a
group's rollouts differ and the advantages are not all zero."""


def run(server, out, *extra, stop_after=None) -> list[dict]:
    target = target_id(server.model_dir)
    if "smollm2" in server.model_dir.name:
        tokenizer = AutoTokenizer.from_pretrained(server.model_dir)
        target = set(tokenizer.convert_tokens_to_ids(COMMON_WORDS))
    env = target_share_env(target)
    return Trainer(config(server, out, *extra), env=env).run(stop_after=stop_after)


def lora_b_norm(directory) -> float:
    weights = load_file(directory / "adapter_model.safetensors")
    return sum(w.abs().sum().item() for k, w in weights.items() if "lora_B" in k)


@pytest.mark.parametrize(
    ("restored", "quantization", "extra"),
    [
        ("tiny_server", "nf4", (ADAPTER_TARGETS,)),
        ("tiny_server", "int8", ()),
        ("smollm2_server", "nf4", (ADAPTER_TARGETS, *SMALL_BATCH)),
    ],
    indirect=["restored"],
    ids=["tiny-nf4-adapter-sync", "tiny-int8-merged", "smollm2-nf4-adapter-sync"],
)
def test_qlora_trains_on_cpu(restored, quantization, extra, tmp_path, capsys):
    out = tmp_path / "run"
    history = run(
        restored,
        out,
        "max_steps=2",
        "model.gradient_checkpointing=true",
        f"model.quantization={quantization}",
        *extra,
    )
    printed = capsys.readouterr().out
    assert f"(LoRA on a {quantization} base)" in printed
    way = "adapter" if extra and extra[0] == ADAPTER_TARGETS else "shm"
    assert f"weight push: {way}" in printed
    assert ("pushed the dequantized" in printed) == (way == "adapter")
    assert len(history) == 2
    for h in history:
        for key in ("reward/mean", "loss/total", "grad_norm"):
            assert math.isfinite(h[key]), (key, h)
        assert_push_checked(h)
    assert all(kl < 1e-3 for kl in measured(history, "mismatch_kl"))
    assert lora_b_norm(out / "final") > 0  # the adapter moved from its zero start
    assert (out / "final" / "base_quantization.json").is_file()


@pytest.mark.parametrize(
    ("restored", "extra"),
    [("tiny_server", ()), ("smollm2_server", SMALL_BATCH)],
    indirect=["restored"],
    ids=["tiny", "smollm2"],
)
def test_qlora_sampler_matches_trainer(restored, extra, tmp_path, monkeypatch, capsys):
    """First-batch mismatch-KL: unquantized LoRA (the level to reach), nf4 with the dequantized
    base pushed (adapter sync and merged pushes), and nf4 with the server left on the original
    base (naive): the probe refuses it, or the batch shows the mismatch."""
    one = ("max_steps=1", *extra)
    plain = run(restored, tmp_path / "plain", *one, ADAPTER_TARGETS)[0]["mismatch_kl"]
    adapter = run(restored, tmp_path / "nf4", *one, *QLORA)
    merged = run(restored, tmp_path / "nf4-merged", *one, *QLORA, "server.lora_sync=merged")
    restore_base_weights(restored)
    monkeypatch.setattr("rlvr.weight_sync.connect.push_trained_base", lambda *a, **k: None)
    naive_kl, refused = None, None
    try:
        naive = run(restored, tmp_path / "naive", *one, *QLORA)
        naive_kl = naive[0]["mismatch_kl"]
    except WeightsNotServedError as e:
        refused = str(e)
    fixed = [adapter[0]["mismatch_kl"], merged[0]["mismatch_kl"]]
    print(f"first-batch mismatch-KL: unquantized {plain:.3g}, nf4 base pushed {fixed}, ")
    print(f"naive {naive_kl}, probe refused: {refused}")
    with capsys.disabled():
        print(f"\nQLoRA mismatch-KL: plain {plain:.3g} nf4 {fixed} naive {naive_kl} ({refused})")
    bound = max(10 * plain, 1e-9)
    assert all(kl <= bound for kl in fixed), (plain, fixed)
    for h in (adapter[0], merged[0]):  # and the check after the step passed
        assert_push_checked(h)
    if refused is None:
        assert naive_kl > 1e3 * max(fixed) and naive_kl > 1e-6, (naive_kl, fixed)
    else:
        assert "push/probe_kl" in refused


@pytest.mark.parametrize("restored", ["tiny_server"], indirect=True)
def test_qlora_resume_is_exact(restored, tmp_path):
    extra = ["max_steps=4", "model.quantization=nf4", "loss.beta=0.01", ADAPTER_TARGETS]
    straight = run(restored, tmp_path / "a", *extra)
    first = run(restored, tmp_path / "b", *extra, stop_after=2)
    assert len(first) == 2
    resumed = run(restored, tmp_path / "b", *extra, "checkpoint.resume=auto")
    assert len(resumed) == 2
    keys = ("reward/mean", "loss/total", "loss/kl_ref", "grad_norm", "mismatch_kl")
    expected = [h[k] for h in straight[2:] for k in keys]
    assert [h[k] for h in resumed for k in keys] == pytest.approx(expected, rel=1e-4, abs=1e-7)
    final = [load_file(tmp_path / run / "final" / "adapter_model.safetensors") for run in "ab"]
    torch.testing.assert_close(final[1], final[0], rtol=0, atol=1e-5)
