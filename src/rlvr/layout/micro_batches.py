"""How a step's samples (`rlvr.batch.Sample`) are laid out in micro-batches, unshared.

A micro-batch is a list of rows, a row a list of samples laid end to end; `collate` turns it
into a `rlvr.batch.MicroBatch`. Padded (one sample per row, the default) or packed
(`packing=True`: first-fit-decreasing, position ids restarting per sample). Micro-batches hold
at most `batch.micro_batch_size` rows and `batch.micro_batch_tokens` slots; every rank runs the
same count. SFT uses the same layout. Design: docs/training.md#how-the-micro-batch-layouts-work.
"""

from __future__ import annotations

import sys

import torch

from rlvr.batch import MicroBatch, Row, Sample


def collate(rows: list[Row], pad_id: int) -> MicroBatch:
    """Tensors for a micro-batch of rows (see the module docstring for the two layouts)."""
    width = max(sum(len(s) for s in row) for row in rows)
    n = len(rows)
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    attention = torch.zeros((n, width), dtype=torch.long)
    positions = torch.zeros((n, width), dtype=torch.long)
    mask = torch.zeros((n, width), dtype=torch.float32)
    logprobs = torch.zeros((n, width), dtype=torch.float32)
    advantages = torch.zeros((n, width), dtype=torch.float32)
    sequences = torch.full((n, width), sum(len(row) for row in rows), dtype=torch.long)
    rollout_tokens = torch.zeros((n, width), dtype=torch.float32)
    ids_of: dict[tuple[str, int], int] = {}  # a rollout's samples share its id
    index = 0
    for r, row in enumerate(rows):
        start = 0
        for s in row:
            end = start + len(s)
            key = ("sample", index) if s.rollout is None else ("rollout", s.rollout)
            sequences[r, start:end] = ids_of.setdefault(key, len(ids_of))
            rollout_tokens[r, start:end] = s.rollout_loss_tokens
            index += 1
            ids[r, start:end] = torch.tensor(s.input_ids)
            attention[r, start:end] = 1
            positions[r, start:end] = torch.arange(len(s))
            mask[r, start:end] = torch.tensor(s.loss_mask, dtype=torch.float32)
            mask[r, start] = 0  # not predicted from the previous sample's last token
            logprobs[r, start:end] = torch.tensor(s.sampler_logprobs, dtype=torch.float32)
            advantages[r, start:end] = s.advantage
            if s.token_advantages is not None:
                advantages[r, start:end] += torch.tensor(s.token_advantages)
            start = end
        positions[r, start:] = torch.arange(width - start)
    packed = any(len(row) > 1 for row in rows)
    return MicroBatch(
        ids,
        mask[:, 1:],
        logprobs[:, 1:],
        advantages[:, 1:],
        attention,
        positions if packed else None,
        sequences[:, 1:],
        rollout_tokens[:, 1:],
    )


def slot_count(rows: list[Row]) -> int:
    """Token positions the micro-batch's tensors hold: rows x the widest row. Everything
    beyond the samples' own tokens is padding, forward/backward work that trains nothing."""
    return len(rows) * max(sum(len(s) for s in row) for row in rows)


def pack_rows(samples: list[Sample], width: int) -> list[Row]:
    """First-fit decreasing: each sample, longest first, goes into the first row with room
    for it (a sample longer than `width` gets a row of its own)."""
    rows: list[Row] = []
    room: list[int] = []
    for s in sorted(samples, key=len, reverse=True):
        for i, free in enumerate(room):
            if len(s) <= free:
                rows[i].append(s)
                room[i] -= len(s)
                break
        else:
            rows.append([s])
            room.append(width - len(s))
    return rows


def split_micro_batches(
    samples: list[Sample],
    micro_batch_size: int | None,
    width: int | None = None,
    max_tokens: int | None = None,
) -> list[list[Row]]:
    """Micro-batches of at most `micro_batch_size` rows and `max_tokens` slots (see
    `group_rows`; None: no bound): one sample per row, longest first (so similar lengths share
    padding), or with `width`, samples packed into rows that wide.
    (The loss is a sum over tokens, so neither the order nor the layout changes it.)"""
    rows = (
        pack_rows(samples, width)
        if width
        else [[s] for s in sorted(samples, key=len, reverse=True)]
    )
    return group_rows(rows, micro_batch_size, max_tokens)


def group_rows(rows: list[Row], max_rows: int | None, max_tokens: int | None) -> list[list[Row]]:
    """Consecutive rows into micro-batches of at most `max_rows` rows whose `slot_count` (rows
    x the widest row: padding costs the memory and compute a token does) is at most
    `max_tokens`. A row wider than `max_tokens` gets a micro-batch of its own rather than
    being dropped: the start-up memory check sizes the largest micro-batch as at least one
    whole sample (`largest_micro_batch`)."""

    def fits(batch: list[Row]) -> bool:
        rows_ok = max_rows is None or len(batch) <= max_rows
        return rows_ok and (max_tokens is None or slot_count(batch) <= max_tokens)

    batches: list[list[Row]] = []
    for row in rows:
        if batches and fits(batches[-1] + [row]):
            batches[-1].append(row)
        else:
            batches.append([row])
    return batches


def largest_micro_batch(max_rows: int | None, max_tokens: int | None, max_seq_len: int) -> int:
    """The most slots a micro-batch of samples of up to `max_seq_len` tokens can hold under
    these bounds (at least one whole sample: see `group_rows`)."""
    bounds = [b for b in (max_tokens, max_rows and max_rows * max_seq_len) if b]
    return max(min(bounds, default=max_seq_len), max_seq_len)  # no samples: no bound binds


def shard(samples: list[Sample], rank: int, world_size: int) -> list[Sample]:
    """This rank's share of the step's samples, longest first. A rollout's samples stay on one
    rank (on two, each part would take its own GSPO or MIS sequence ratio, and no micro-batch
    budget could join them); rollouts go, longest first, to the rank with the fewest tokens so
    far (ties to the lowest), which keeps the ranks' token counts close. Every rank deals
    alike from the same list."""
    rollouts: dict[tuple[str, int], list[Sample]] = {}
    for i, s in enumerate(samples):
        key = ("sample", i) if s.rollout is None else ("rollout", s.rollout)
        rollouts.setdefault(key, []).append(s)
    tokens = [0] * world_size
    mine: list[Sample] = []
    for rollout in sorted(rollouts.values(), key=lambda r: sum(map(len, r)), reverse=True):
        least = min(range(world_size), key=lambda r: tokens[r])
        tokens[least] += sum(map(len, rollout))
        if least == rank:
            mine += rollout
    return sorted(mine, key=len, reverse=True)


def padding_micro_batch(pad_id: int) -> list[Row]:
    """A micro-batch that contributes no loss. Ranks with fewer micro-batches run these so
    every rank makes the same number of forward/backward passes: ZeRO-3 gathers parameters
    with collectives inside them, and mismatched counts would deadlock."""
    return [[Sample([pad_id, pad_id], [0, 0], [0.0, 0.0], 0.0)]]


def rank_micro_batches(
    samples: list[Sample],
    rank: int,
    world_size: int,
    micro_batch_size: int | None,
    pad_id: int,
    packing: bool = False,
    max_tokens: int | None = None,
) -> list[list[Row]]:
    """This rank's micro-batches of the step's samples (at most `micro_batch_size` rows and
    `max_tokens` slots each, see `group_rows`), topped up with padding micro-batches to the
    count of the busiest rank (see `padding_micro_batch`). With `packing`, rows are as wide
    as the step's longest sample, or `max_tokens` when that is narrower (a longer sample
    then has a row of its own)."""
    width = None
    if packing:
        width = min(max((len(s) for s in samples), default=0), max_tokens or sys.maxsize)
    shards = [
        split_micro_batches(shard(samples, r, world_size), micro_batch_size, width, max_tokens)
        for r in range(world_size)
    ]
    count = max(len(s) for s in shards)
    mine = shards[rank]
    return mine + [padding_micro_batch(pad_id)] * (count - len(mine))
