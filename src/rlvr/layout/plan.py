"""A step's micro-batch layout, decided once: the one place a run's layout is chosen.

`plan_step` takes a step's samples and the model and returns this rank's `Plan`: its
micro-batches and the `Layout` that turns each into tensors, `Folded` (prefix trees, when the
model's attention can take the tree's mask and the fold saves enough) or `Unshared` (padded or
packed rows). Every rank decides alike, from the whole step. The design:
docs/training.md#how-the-micro-batch-layouts-work.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlvr.batch import MicroBatch, Row, Sample
from rlvr.config import BatchConfig
from rlvr.layout.attention import tree_attention
from rlvr.layout.folded import collate_folded
from rlvr.layout.micro_batches import (
    collate,
    largest_micro_batch,
    rank_micro_batches,
    slot_count,
)
from rlvr.layout.prefix_tree import (
    SplitCost,
    fold_rows,
    folded_slot_count,
    folded_tokens,
    rank_folded_micro_batches,
    saved_fraction,
)

MIN_SAVED_FRACTION = 0.1
"""Below this share of a step's tokens saved by folding, the step keeps the unshared layout
(docs/training.md#shared-prefix-training has the measurements)."""

NO_SPLIT = SplitCost()
"""The cost of a layout that keeps nothing beyond the unshared one (flex attention)."""


@dataclass(frozen=True)
class Unshared:
    """Every sample forwarded on its own: padded or packed rows (`rlvr.layout.micro_batches`)."""

    pad_id: int

    def collate(self, rows: list[Row]) -> MicroBatch:
        return collate(rows, self.pad_id)

    def slots(self, rows: list[Row]) -> int:
        """Token positions the micro-batch's tensors hold, padding included."""
        return slot_count(rows)

    def forwarded(self, rows: list[Row]) -> int:
        """Tokens the forward runs on, padding aside."""
        return sum(len(s) for row in rows for s in row)


@dataclass(frozen=True)
class Folded:
    """Each row a prefix tree under `attention`'s tree mask (`rlvr.layout.folded`)."""

    pad_id: int
    attention: str

    def collate(self, rows: list[Row]) -> MicroBatch:
        return collate_folded(rows, self.pad_id, self.attention)

    def slots(self, rows: list[Row]) -> int:
        """Token positions the folded forward holds, padding included."""
        return folded_slot_count(rows)

    def forwarded(self, rows: list[Row]) -> int:
        """Tokens the forward runs on (a shared prefix once), padding aside."""
        return folded_tokens(rows)


Layout = Unshared | Folded


@dataclass(frozen=True)
class Plan:
    """A rank's micro-batches for one step and the layout that turns each into tensors."""

    micro_batches: list[list[Row]]
    layout: Layout


def plan_step(
    samples: list[Sample],
    model: torch.nn.Module,
    cfg: BatchConfig,
    rank: int,
    world_size: int,
    pad_id: int,
    cost: SplitCost,
) -> Plan:
    """This rank's micro-batches of a step's `samples`: folded when `cfg.prefix_sharing` is on
    and the model's attention can take the tree's mask (`tree_attention`), else unshared.
    `cost`: what the sdpa node split keeps beyond the unshared layout, in its slots."""
    attention = tree_attention(model, cfg.max_seq_len) if cfg.prefix_sharing else None
    return plan_micro_batches(samples, rank, world_size, cfg, pad_id, attention, cost)


def plan_micro_batches(
    samples: list[Sample],
    rank: int,
    world_size: int,
    cfg: BatchConfig,
    pad_id: int,
    attention: str | None,
    cost: SplitCost = NO_SPLIT,
) -> Plan:
    """Folded micro-batches when `attention` is not None and the fold saves at least
    `MIN_SAVED_FRACTION` of the step's tokens; otherwise the unshared layout. `cost`: what the
    sdpa node split keeps beyond the unshared layout (flex attention keeps nothing beyond it)."""
    longest = max((len(s) for s in samples), default=0)
    max_slots = largest_micro_batch(cfg.micro_batch_size, cfg.micro_batch_tokens, longest)
    if attention is not None:
        split = cost if attention == "sdpa" else NO_SPLIT
        rows = fold_rows(samples, max_slots, split)
        if saved_fraction(samples, rows) >= MIN_SAVED_FRACTION:
            mine = rank_folded_micro_batches(rows, rank, world_size, max_slots, pad_id, split)
            return Plan(mine, Folded(pad_id, attention))
    mine = rank_micro_batches(
        samples, rank, world_size, cfg.micro_batch_size, pad_id, cfg.packing, cfg.micro_batch_tokens
    )
    return Plan(mine, Unshared(pad_id))
