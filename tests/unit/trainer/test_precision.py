"""Half-precision full fine-tuning keeps every update: float32 master weights, bf16 compute.

On the CPU in bfloat16, through the trainer's own pieces (load_policy, Optimization and the
GRPO micro-batch loss) on the tiny model: 10 AdamW steps at lr 1e-6 move weights of magnitude
~0.02 by ~1e-5, under half a bf16 step (6e-5), so bf16 weights would not move at all.
"""

from __future__ import annotations

import random

import pytest
import torch
from accelerate import Accelerator

from rlvr.batch import Sample
from rlvr.config import LoraConfig, ModelConfig, load_config
from rlvr.layout.micro_batches import collate
from rlvr.model.policy import load_policy
from rlvr.trainer.optimizer import Optimization
from rlvr.trainer.step import micro_batch_loss
from rlvr.weight_sync.merged_stream import MergedWeightSource

STEPS, LR = 10, 1e-6


def _samples(vocab: int) -> list[Sample]:
    rng = random.Random(0)
    samples = []
    for i in range(4):
        ids = [rng.randrange(vocab) for _ in range(24)]
        mask = [0] * 12 + [1] * 12
        logprobs = [0.0] * 12 + [-6.0] * 12
        samples.append(Sample(ids, mask, logprobs, advantage=1.0 if i % 2 else -1.0))
    return samples


def _train(
    model_dir, dtype: str
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], object]:
    """Weights before and after STEPS full fine-tuning steps in `dtype`; the policy."""
    cfg = load_config(overrides=[f"optim.lr={LR}", "lora.enabled=false"])
    accelerator = Accelerator(cpu=True)
    policy = load_policy(
        ModelConfig(name=str(model_dir), dtype=dtype), LoraConfig(enabled=False), accelerator
    )
    torch.manual_seed(0)
    opt = Optimization(accelerator, policy.model, cfg.optim, STEPS, micro_batch_size=4)
    model = opt.model
    before = {n: p.detach().float().clone() for n, p in model.named_parameters()}
    samples = _samples(model.config.vocab_size)
    tokens = sum(s.num_loss_tokens for s in samples)
    for _ in range(STEPS):
        mb = collate([[s] for s in samples], policy.pad_id)
        loss, _ = micro_batch_loss(model, mb, cfg, tokens, 1)
        opt.backward(loss, last=True)
        opt.step(has_gradient=True)
    after = {n: p.detach().float().clone() for n, p in model.named_parameters()}
    return before, after, policy


def _flat_delta(before, after) -> torch.Tensor:
    return torch.cat([(after[n] - before[n]).flatten() for n in before])


@pytest.mark.slow
def test_bf16_full_finetune_updates_like_float32(tiny_model_dir):
    before32, after32, _ = _train(tiny_model_dir, "float32")
    before16, after16, policy = _train(tiny_model_dir, "bfloat16")

    d32, d16 = _flat_delta(before32, after32), _flat_delta(before16, after16)
    moved32 = (d32 != 0).float().mean().item()
    moved16 = (d16 != 0).float().mean().item()
    cosine = torch.nn.functional.cosine_similarity(d32, d16, dim=0).item()
    ratio = (d16.norm() / d32.norm()).item()
    print(
        f"moved: float32 {moved32:.3f}, bf16 {moved16:.3f}; cosine {cosine:.4f}; "
        f"norm ratio {ratio:.4f}"
    )
    # Tolerance: bf16 matmuls change each gradient by ~1%, which flips the sign (and so
    # Adam's early update) only of the few near-zero gradient entries.
    assert moved16 > 0.9 * moved32
    # the same start: the master weights are the checkpoint's float32 values
    assert all(torch.equal(before32[n], before16[n]) for n in before32)
    assert cosine > 0.95
    assert ratio == pytest.approx(1.0, abs=0.05)

    # computing in bf16 over float32 weights; pushes stream bf16 to the server
    assert policy.compute_dtype == torch.bfloat16
    assert all(p.dtype == torch.float32 for p in policy.model.parameters())
    source = MergedWeightSource(policy.model, dtype=policy.compute_dtype)
    assert {m.dtype for m in source.metadata()} == {torch.bfloat16}
    name, tensor = next(iter(source))
    assert tensor.dtype == torch.bfloat16


def test_lora_and_float32_load_as_configured(tiny_model_dir):
    """Master weights only where they are missing: LoRA keeps a bf16 base (its adapter is
    float32), float32 needs no autocast."""
    accelerator = Accelerator(cpu=True)
    lora = LoraConfig(rank=4, target_modules=["q_proj"])
    policy = load_policy(ModelConfig(name=str(tiny_model_dir), dtype="bfloat16"), lora, accelerator)
    assert policy.compute_dtype is None
    frozen = {p.dtype for p in policy.model.parameters() if not p.requires_grad}
    trained = {p.dtype for p in policy.model.parameters() if p.requires_grad}
    assert frozen == {torch.bfloat16} and trained == {torch.float32}
    plain = load_policy(
        ModelConfig(name=str(tiny_model_dir), dtype="float32"),
        LoraConfig(enabled=False),
        accelerator,
    )
    assert plain.compute_dtype is None
