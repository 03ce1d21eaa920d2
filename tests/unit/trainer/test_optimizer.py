"""The optimizer step's guards: a NaN or infinite loss or gradient norm stops the step before
the weights move, warm-up starts above learning rate 0, and a leftover accelerate
gradient-accumulation variable does not scale the gradients.

On the tiny model with LoRA through the trainer's own pieces (load_policy, Optimization, the
GRPO micro-batch loss), as in a run: a single AdamW step on one NaN advantage would make every
one of its 28 adapter tensors NaN.
"""

from __future__ import annotations

import json
import math
import os
import subprocess

import pytest
import torch
from accelerate import Accelerator
from support import zero3_launch
from transformers import get_scheduler

from rlvr.batch import Sample, TrainBatch
from rlvr.config import LoraConfig, ModelConfig, OptimConfig, load_config
from rlvr.layout.micro_batches import collate
from rlvr.model.policy import load_policy
from rlvr.trainer.optimizer import NonFiniteStepError, Optimization, lr_factor, make_accelerator
from rlvr.trainer.step import has_gradient, micro_batch_loss


def _samples(vocab: int, advantage: float) -> list[Sample]:
    g = torch.Generator().manual_seed(0)
    samples = []
    for i in range(4):
        ids = torch.randint(vocab, (16,), generator=g).tolist()
        sign = 1.0 if i % 2 else -1.0
        samples.append(Sample(ids, [0] * 8 + [1] * 8, [0.0] * 8 + [-6.0] * 8, sign * advantage))
    return samples


@pytest.fixture
def lora_run(tiny_model_dir):
    """A LoRA policy of the tiny model and its Optimization, after one ordinary step (so AdamW
    has momentum that a bad step could also spoil); and `backward(advantage)`, one step's
    gradients on a batch whose advantages are +-advantage."""
    cfg = load_config(overrides=["optim.lr=1e-2"])
    accelerator = Accelerator(cpu=True)
    policy = load_policy(ModelConfig(name=str(tiny_model_dir)), LoraConfig(), accelerator)
    opt = Optimization(accelerator, policy.model, cfg.optim, total_steps=10, micro_batch_size=4)

    def backward(advantage: float) -> None:
        samples = _samples(opt.model.config.vocab_size, advantage)
        tokens = sum(s.num_loss_tokens for s in samples)
        loss, _ = micro_batch_loss(
            opt.model, collate([[s] for s in samples], policy.pad_id), cfg, tokens, 1
        )
        opt.backward(loss, last=True)

    backward(1.0)
    assert math.isfinite(opt.step(has_gradient=True))
    return opt, backward


def _trainable(opt: Optimization) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in opt.named_params}


def test_non_finite_gradients_stop_the_step(lora_run):
    opt, backward = lora_run
    before = _trainable(opt)
    assert len(before) == 28  # 7 projections x 2 layers x (A, B)
    moments = {n: opt.optimizer.state[p]["exp_avg"].clone() for n, p in opt.named_params}

    backward(math.nan)  # a NaN advantage: the loss and every gradient are NaN
    with pytest.raises(NonFiniteStepError) as error:
        opt.step(has_gradient=True)
    message = str(error.value)
    assert error.value.step == 2 and message.startswith("step 2: the gradient norm is nan")
    assert "first non-finite gradient: base_model.model.model.layers.0." in message
    assert "did not step" in message and "checkpoint.resume=auto" in message
    after = _trainable(opt)
    assert all(torch.equal(before[n], after[n]) for n in before)  # every trainable tensor
    assert all(
        torch.equal(moments[n], opt.optimizer.state[p]["exp_avg"]) for n, p in opt.named_params
    )
    assert opt.next_step == 2  # the LR schedule did not advance either

    with pytest.raises(NonFiniteStepError, match=r"^step 2: the loss is nan; the optimizer"):
        opt.check_loss(math.nan)
    opt.check_loss(0.25)


def test_a_step_without_signal_leaves_the_weights_where_they_are(lora_run):
    """A batch whose every advantage is 0 has no gradient, and the trainer skips its optimizer
    step: stepping AdamW on that zero gradient after a step with signal would still move the
    weights, by two thirds of the last update. The KL penalty, or one group with signal,
    gives a step its gradient back; a batch without loss tokens has none either way."""
    opt, backward = lora_run
    vocab = opt.model.config.vocab_size

    def batch(samples: list[Sample]) -> TrainBatch:
        return TrainBatch(samples, metrics={}, table=[], data_position=0)

    flat = batch(_samples(vocab, 0.0))
    assert not has_gradient(flat, beta=0.0)
    assert has_gradient(flat, beta=0.04)
    assert has_gradient(batch(_samples(vocab, 0.0) + _samples(vocab, 1.0)), beta=0.0)
    unmasked = [Sample(s.input_ids, [0] * len(s), [0.0] * len(s), 1.0) for s in flat.samples]
    assert not has_gradient(batch(unmasked), beta=0.04)

    before, lr = _trainable(opt), opt.lr
    backward(0.0)
    assert all(not p.grad.any() for _, p in opt.named_params)  # the gradient is exactly 0
    opt.step(has_gradient=False)  # what the trainer does
    assert all(torch.equal(before[n], p) for n, p in opt.named_params)
    backward(0.0)
    opt.step(has_gradient=True)  # what it must not do: AdamW's momentum alone moves them
    moved = max((p - before[n]).abs().max().item() for n, p in opt.named_params)
    assert moved == pytest.approx(0.67 * lr, rel=0.01)  # Adam's bias-corrected momentum


def test_one_infinite_gradient_is_named(lora_run):
    """The error names the first parameter whose gradient is not finite (checked before
    clipping, which would spread the NaN to every gradient)."""
    opt, backward = lora_run
    before = _trainable(opt)
    backward(1.0)
    name, param = opt.named_params[5]
    param.grad[0, 0] = math.inf
    with pytest.raises(
        NonFiniteStepError, match=f"norm is inf \\(first non-finite gradient: {name}\\)"
    ):
        opt.step(has_gradient=True)
    assert all(torch.equal(before[n], p) for n, p in opt.named_params)


def test_warmup_starts_above_zero_and_then_follows_the_schedule():
    """A first step at learning rate 0 (transformers' warm-up) moves nothing, under DeepSpeed
    too; after warm-up the schedules are transformers' own."""
    warmup, total = 4, 20
    assert [lr_factor(s, "constant", warmup, total) for s in range(6)] == [
        0.25,
        0.5,
        0.75,
        1.0,
        1.0,
        1.0,
    ]
    for name in ("linear", "cosine"):
        reference = get_scheduler(
            name,
            torch.optim.SGD([torch.zeros(1)], lr=1.0),
            num_warmup_steps=warmup,
            num_training_steps=total,
        )
        theirs = reference.lr_lambdas[0]
        assert lr_factor(0, name, warmup, total) == 0.25 and theirs(0) == 0.0
        for step in range(warmup, total):
            assert lr_factor(step, name, warmup, total) == pytest.approx(theirs(step))
        assert lr_factor(total - 1, name, warmup, total) > 0
    assert lr_factor(0, "linear", 0, total) == 1.0


def test_first_warmup_step_moves_the_weights():
    model = torch.nn.Linear(4, 2)
    cfg = OptimConfig(lr=1e-2, warmup_steps=10)
    opt = Optimization(Accelerator(cpu=True), model, cfg, total_steps=20, micro_batch_size=1)
    before = _trainable(opt)
    assert opt.lr == pytest.approx(1e-3)
    opt.backward(opt.model(torch.ones(1, 4)).sum(), last=True)
    opt.step(has_gradient=True)
    assert all(not torch.equal(before[n], p) for n, p in opt.named_params)
    assert opt.lr == pytest.approx(2e-3)


def test_leftover_gradient_accumulation_steps_do_not_scale_gradients(monkeypatch, caplog):
    """Without DeepSpeed, accelerate divides every loss by ACCELERATE_GRADIENT_ACCUMULATION_STEPS
    (4: gradients x 0.25): the trainer accumulates itself, so the variable is ignored, said."""
    monkeypatch.setenv("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "4")
    with caplog.at_level("WARNING"):
        accelerator = make_accelerator(60)
    assert accelerator.gradient_accumulation_steps == 1
    assert any(
        "ignoring gradient_accumulation_steps=4 (ACCELERATE_GRADIENT_ACCUMULATION_STEPS=4"
        in r.getMessage()
        for r in caplog.records
    )
    model = torch.nn.Linear(3, 1)
    opt = Optimization(accelerator, model, OptimConfig(), total_steps=1, micro_batch_size=1)
    x = torch.tensor([[1.0, 2.0, 3.0]])
    opt.backward(opt.model(x).sum(), last=True)
    assert torch.equal(model.weight.grad, x)


DEEPSPEED_RANK = """
import json, math, sys
import torch
from transformers import AutoModelForCausalLM
from rlvr.config import load_config
from rlvr.trainer.step import micro_batch_loss
from rlvr.batch import Sample
from rlvr.layout.micro_batches import collate
from rlvr.trainer.optimizer import NonFiniteStepError, Optimization, make_accelerator

model_dir, report = sys.argv[1], sys.argv[2]
cfg = load_config(overrides=["optim.lr=1e-2", "optim.warmup_steps=5", "lora.enabled=false"])
acc = make_accelerator(120)
model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
vocab = model.config.vocab_size
opt = Optimization(acc, model, cfg.optim, 10, micro_batch_size=2)
shards = lambda: [p.ds_tensor.detach().clone() for p in opt.params]  # this rank's partitions

def backward(advantage):
    g = torch.Generator().manual_seed(acc.process_index)
    samples = [Sample(torch.randint(vocab, (16,), generator=g).tolist(), [0] * 8 + [1] * 8,
                      [0.0] * 8 + [-6.0] * 8, advantage * (1 if i else -1)) for i in range(2)]
    mb = collate([[s] for s in samples], 0)
    loss, _ = micro_batch_loss(opt.model, mb, cfg, 16 * acc.num_processes, acc.num_processes)
    opt.backward(loss, last=True)

start = shards()
backward(1.0)
opt.step(True)
first = shards()
backward(math.nan if acc.process_index == 1 else 1.0)  # only rank 1 has a NaN
try:
    opt.step(True)
    message = None
except NonFiniteStepError as e:
    message = str(e)
json.dump({"world": acc.num_processes, "message": message,
           "moved": all(not torch.equal(a, b) for a, b in zip(start, first) if a.numel()),
           "untouched": all(torch.equal(a, b) for a, b in zip(first, shards()))},
          open(f"{report}.{acc.process_index}.json", "w"))
"""


@pytest.mark.slow
def test_non_finite_gradients_stop_the_step_under_deepspeed(tiny_model_dir, tmp_path):
    """ZeRO-3 on two CPU ranks (DeepSpeed's CPU accelerator, ~1 min): a NaN on one rank only
    stops the step on both, before DeepSpeed's optimizer touches either rank's partition of the
    weights; and the first warm-up step moves them (transformers' warm-up runs it at learning
    rate 0)."""
    script = tmp_path / "rank.py"
    script.write_text(DEEPSPEED_RANK)
    launch = zero3_launch()
    done = subprocess.run(
        [*launch, str(script), str(tiny_model_dir), str(tmp_path / "report")],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "DS_ACCELERATOR": "cpu"},
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    reports = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("report.*.json"))]
    assert len(reports) == 2 and all(r["world"] == 2 for r in reports)
    for r in reports:
        assert r["moved"] and r["untouched"]
        assert r["message"].startswith("step 2: the gradient norm is inf (DeepSpeed")
        assert "the optimizer did not step" in r["message"]
