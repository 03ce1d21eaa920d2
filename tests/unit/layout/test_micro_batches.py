"""Micro-batch layouts (rlvr.layout.micro_batches): packing several samples into one row changes
neither the loss nor its gradients, keeps attention inside each sample, and keeps the ranks'
micro-batch counts equal."""

from __future__ import annotations

import pytest
import torch

from rlvr.batch import Sample
from rlvr.config import load_config
from rlvr.layout.micro_batches import (
    collate,
    largest_micro_batch,
    pack_rows,
    rank_micro_batches,
    slot_count,
    split_micro_batches,
)
from rlvr.trainer.logprobs import sequence_scores
from rlvr.trainer.step import micro_batch_loss

from ..trainer.tiny_models import VOCAB, tiny_qwen2


def tiny_policy() -> torch.nn.Module:
    return tiny_qwen2(layers=2, tied=False)


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
    cfg = load_config(
        overrides=["sampling.temperature=0.8", "loss.clip_low=0.2", "loss.clip_high=0.2"]
    )
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
    assert mb.position_ids[0].tolist() == [
        *range(len(first)),
        *range(len(second)),
        *range(len(third)),
    ]
    changed = Sample(
        [(t + 7) % VOCAB for t in second.input_ids], second.loss_mask, second.sampler_logprobs
    )
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
    everything = [
        s
        for r in range(3)
        for mb in rank_micro_batches(samples, r, 3, 2, 0, packing)
        for row in mb
        for s in row
        if s.num_loss_tokens
    ]
    assert sorted(map(id, everything)) == sorted(map(id, samples))


def check_bounds(micro_batches: list, max_rows: int | None, budget: int) -> None:
    """At most `max_rows` rows and `budget` slots per micro-batch (a sample longer than the
    budget alone), and each one as full as the bounds allow: the next row would not fit."""
    for mb in micro_batches:
        assert max_rows is None or len(mb) <= max_rows
        if slot_count(mb) > budget:
            assert [len(row) for row in mb] == [1]  # one sample, longer than the budget
    for mb, following in zip(micro_batches, micro_batches[1:], strict=False):
        full = max_rows is not None and len(mb) == max_rows
        assert full or slot_count([*mb, following[0]]) > budget


@pytest.mark.parametrize("packing", [False, True])
@pytest.mark.parametrize("world_size", [1, 3])
def test_micro_batch_tokens_bounds_every_micro_batch(packing, world_size):
    """Every micro-batch holds at most `max_tokens` slots (rows x widest row), except a sample
    longer than the budget, which gets one of its own; the rows bound still applies, every
    sample is trained exactly once and the ranks run the same number of micro-batches."""
    long = Sample([1] * 40, [0] * 20 + [1] * 20, [0.0] * 20 + [-1.0] * 20, 1.0)
    samples = [*make_samples(30), long]
    budget = 24
    for max_rows in (5, None):
        per_rank = [
            rank_micro_batches(samples, r, world_size, max_rows, 0, packing, max_tokens=budget)
            for r in range(world_size)
        ]
        assert len({len(mbs) for mbs in per_rank}) == 1
        trained = []
        for mbs in per_rank:
            mine = [mb for mb in mbs if any(s.num_loss_tokens for row in mb for s in row)]
            check_bounds(mine, max_rows, budget)
            trained += mine
        assert any(slot_count(mb) > budget for mb in trained)  # the long sample, alone
        everything = [s for mb in trained for row in mb for s in row]
        assert sorted(map(id, everything)) == sorted(map(id, samples))


def test_largest_micro_batch_is_the_tighter_bound_but_at_least_one_sample():
    assert largest_micro_batch(None, 8192, 2048) == 8192
    assert largest_micro_batch(2, 8192, 2048) == 4096
    assert largest_micro_batch(16, None, 600) == 9600
    assert largest_micro_batch(None, 1024, 2048) == 2048  # a whole sample fits in any case
