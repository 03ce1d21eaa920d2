"""Micro-batch layouts (rlvr.batch): packing several samples into one row changes neither the
loss nor its gradients, keeps attention inside each sample, and keeps the ranks' micro-batch
counts equal."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from rlvr.batch import Sample, collate, pack_rows, rank_micro_batches, split_micro_batches
from rlvr.config import load_config
from rlvr.logprobs import sequence_scores
from rlvr.trainer import micro_batch_loss

VOCAB = 64


def tiny_policy() -> torch.nn.Module:
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, head_dim=16,
    )  # fmt: skip
    return Qwen2ForCausalLM(config).float()


def make_samples(n: int = 9) -> list[Sample]:
    g = torch.Generator().manual_seed(1)
    samples = []
    for i in range(n):
        prompt, completion = 2 + i % 4, 1 + (5 * i) % 9  # lengths 3..13: rows can pack
        ids = torch.randint(1, VOCAB, (prompt + completion,), generator=g).tolist()
        logprobs = [0.0] * prompt + (-torch.rand(completion, generator=g) * 3).tolist()
        samples.append(Sample(ids, [0] * prompt + [1] * completion, logprobs, i % 3 - 1.0))
    return samples


def step(model, micro_batches) -> tuple[float, torch.Tensor]:
    """Summed loss and accumulated gradient of one step over `micro_batches`."""
    cfg = load_config(overrides=["sampling.temperature=0.8", "loss.clip_low=0.2",
                                 "loss.clip_high=0.2"])  # fmt: skip
    samples = [s for rows in micro_batches for row in rows for s in row]
    global_tokens = sum(s.num_loss_tokens for s in samples)
    model.zero_grad()
    total = 0.0
    for rows in micro_batches:
        loss, _ = micro_batch_loss(model, collate(rows, 0), cfg, global_tokens, 1)
        loss.backward()
        total += loss.item()
    return total, torch.cat([p.grad.flatten() for p in model.parameters()])


@pytest.mark.parametrize("width, micro_batch_size", [(16, 2), (16, 8), (40, 1)])
def test_packed_and_padded_micro_batches_give_the_same_loss_and_gradients(width, micro_batch_size):
    model = tiny_policy()
    samples = make_samples()
    padded_loss, padded_grad = step(model, split_micro_batches(samples, 4))
    packed = split_micro_batches(samples, micro_batch_size, width)
    assert any(len(row) > 1 for rows in packed for row in rows)
    packed_loss, packed_grad = step(model, packed)
    assert padded_grad.abs().sum() > 0
    assert packed_loss == pytest.approx(padded_loss, abs=1e-5)
    assert torch.allclose(packed_grad, padded_grad, atol=1e-5)


def test_packed_samples_do_not_attend_to_each_other():
    """Changing every token of one sample leaves its row-mates' log-probabilities unchanged."""
    model = tiny_policy()
    first, second, third = make_samples(3)
    mb = collate([[first, second, third]], 0)
    assert "attention_mask" not in mb.model_inputs()
    assert mb.position_ids[0].tolist() == [*range(len(first)), *range(len(second)),
                                           *range(len(third))]  # fmt: skip
    changed = Sample([(t + 7) % VOCAB for t in second.input_ids], second.loss_mask,
                     second.sampler_logprobs)  # fmt: skip
    other = collate([[first, changed, third]], 0)
    with torch.no_grad():
        before = sequence_scores(model, mb).logprobs[0]
        after = sequence_scores(model, other).logprobs[0]
    start, end = len(first) - 1, len(first) + len(second) - 1  # second's predictions
    assert not torch.allclose(before[start:end], after[start:end])
    assert torch.allclose(before[:start], after[:start], atol=1e-6)
    assert torch.allclose(before[end:], after[end:], atol=1e-6)
    # the first token of a sample is never predicted from its predecessor's last token
    assert mb.loss_mask[0, len(first) - 1].item() == 0


def test_pack_rows_places_each_sample_once_within_the_width():
    samples = make_samples(20)
    rows = pack_rows(samples, 16)
    assert sorted(id(s) for row in rows for s in row) == sorted(id(s) for s in samples)
    assert all(sum(len(s) for s in row) <= 16 for row in rows)
    assert len(rows) < len(samples)
    wide = Sample([1] * 30, [0] * 30, [0.0] * 30)
    assert [len(row) for row in pack_rows([wide], 16)] == [1]  # too long: a row of its own


@pytest.mark.parametrize("packing", [False, True])
def test_ranks_run_the_same_number_of_micro_batches(packing):
    samples = make_samples(11)
    counts = {len(rank_micro_batches(samples, rank, 3, 2, 0, packing)) for rank in range(3)}
    assert len(counts) == 1
    everything = [s for r in range(3) for mb in rank_micro_batches(samples, r, 3, 2, 0, packing)
                  for row in mb for s in row if s.num_loss_tokens]  # fmt: skip
    assert sorted(map(id, everything)) == sorted(map(id, samples))
