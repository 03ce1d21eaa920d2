"""Folding a step's samples into prefix trees: rows, their layout and their cost.

A row's samples, in lexicographic order of their ids, lay out as the depth-first walk of their
token trie (`row_tree`: tokens, positions, and each token's `scope_end`: query q sees key k iff
k <= q < scope_end[k]); `fold_rows` and `rank_folded_micro_batches` cut rows and micro-batches
by their memory cost (`SplitCost`). Training-equivalent to the unshared layout:
docs/training.md#how-the-micro-batch-layouts-work.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from rlvr.batch import Row, Sample
from rlvr.layout.micro_batches import padding_micro_batch

MIN_SHARED_FRACTION = 0.15
"""A sample joins a folded row only when at least this share of its tokens is already there:
below it the saved tokens no longer clearly repay the node split's bookkeeping
(docs/training.md#shared-prefix-training has the measurements)."""


def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of two token lists."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


@dataclass(frozen=True)
class SplitCost:
    """What the sdpa node split (`rlvr.layout.tree_sdpa`) keeps for backward beyond the
    unshared layout, in slots of that layout; `rlvr.trainer.memory.split_cost` derives it from
    the model's shape. All zero: no split to pay for (flex attention, or an unknown shape)."""

    per_slot: float = 0.0
    """Per folded slot: the queries, keys and values cut into the nodes' pieces."""
    per_gathered: float = 0.0
    """Per gathered token (`RowAccount.gathered`): the keys and values a node attends, and
    the hidden state the head predicts from for its sample."""
    per_pair: float = 0.0
    """Per query-key pair a masked call scores (`RowAccount.pairs`): its mask."""

    def micro_batch(self, accounts: list[RowAccount]) -> float:
        """A folded micro-batch's cost in slots of the unshared layout."""
        slots = len(accounts) * max(a.width for a in accounts)
        extra = sum(self.per_gathered * a.gathered + self.per_pair * a.pairs for a in accounts)
        return slots * (1 + self.per_slot) + extra


@dataclass(frozen=True)
class RowAccount:
    """A folded row's size in the terms its memory depends on, kept as samples join it."""

    width: int
    """Folded tokens."""
    tokens: int
    """Tokens of its samples."""
    samples: int
    first: int
    """Length of its first sample."""
    root: int
    """Tokens every sample shares (the row's root node)."""
    later_pairs: int
    """Each later sample's placed tokens x its length."""

    @classmethod
    def start(cls, length: int) -> RowAccount:
        return cls(length, length, 1, length, length, 0)

    def join(self, length: int, shared: int) -> RowAccount:
        """The row with a sample of `length` tokens sharing `shared` with the last one."""
        return RowAccount(
            self.width + length - shared,
            self.tokens + length,
            self.samples + 1,
            self.first,
            min(self.root, shared),
            self.later_pairs + (length - shared) * length,
        )

    @property
    def gathered(self) -> int:
        """Tokens whose keys and values the split gathers: every sample's (each node below the
        root attends its ancestors' and its own); none for one sample (one causal call)."""
        return self.tokens if self.samples > 1 else 0

    @property
    def pairs(self) -> int:
        """Query-key pairs the masked calls score, at most: each token below the root against
        the tokens of the sample that placed it."""
        if self.samples == 1:
            return 0
        return (self.first - self.root) * self.first + self.later_pairs


def row_account(row: Row) -> RowAccount:
    """The account of a row already formed (its samples in row order)."""
    account = RowAccount.start(len(row[0]))
    for prev, s in itertools.pairwise(row):
        account = account.join(len(s), common_prefix(prev.input_ids, s.input_ids))
    return account


def fold_rows(samples: list[Sample], max_cost: int, cost: SplitCost = SplitCost()) -> list[Row]:
    """Samples into rows of folded samples (see the module docstring): in lexicographic order
    of their ids, each joins the current row when it shares at least `MIN_SHARED_FRACTION` of
    its tokens with its predecessor and the row still costs at most `max_cost` slots."""
    rows: list[Row] = []
    account = RowAccount.start(0)
    for s in sorted(samples, key=lambda s: s.input_ids):
        shared = common_prefix(rows[-1][-1].input_ids, s.input_ids) if rows else 0
        joined = account.join(len(s), shared)
        if (
            rows
            and shared >= MIN_SHARED_FRACTION * len(s)
            and cost.micro_batch([joined]) <= max_cost
        ):
            rows[-1].append(s)
            account = joined
        else:
            rows.append([s])
            account = RowAccount.start(len(s))
    return rows


def folded_width(row: Row) -> int:
    """Tokens of the row once its samples are folded (each shared prefix counted once)."""
    return sum(
        len(s) - (common_prefix(row[i - 1].input_ids, s.input_ids) if i else 0)
        for i, s in enumerate(row)
    )


def folded_slot_count(rows: list[Row]) -> int:
    """Token positions a folded micro-batch's forward holds: rows x the widest folded row."""
    return len(rows) * max(map(folded_width, rows))


@dataclass
class RowTree:
    """One row's folded layout: the forward's tokens and positions, each token's
    `scope_end` (see the module docstring) and where each sample's tokens were placed."""

    ids: list[int]
    positions: list[int]
    scope_end: list[int]
    locations: list[list[int]]
    """Per sample, the row index of each of its tokens."""


def row_tree(row: Row) -> RowTree:
    """Lay out a row's samples (in lexicographic order) as the depth-first prefix tree."""
    ids: list[int] = []
    positions: list[int] = []
    scope_end: list[int] = []
    locations: list[list[int]] = []
    for i, s in enumerate(row):
        shared = common_prefix(row[i - 1].input_ids, s.input_ids) if i else 0
        start = len(ids)
        ids += s.input_ids[shared:]
        positions += range(shared, len(s))
        scope_end += [0] * (len(s) - shared)
        placed = (locations[-1][:shared] if i else []) + list(range(start, len(ids)))
        for k in placed:  # samples in order: the last one to read a token sets its scope
            scope_end[k] = len(ids)
        locations.append(placed)
    return RowTree(ids, positions, scope_end, locations)


def saved_fraction(samples: list[Sample], rows: list[Row]) -> float:
    """Share of the samples' tokens the folded rows do not forward."""
    total = sum(len(s) for s in samples)
    return 1 - folded_tokens(rows) / max(total, 1)


def rank_folded_micro_batches(
    rows: list[Row],
    rank: int,
    world_size: int,
    max_slots: int,
    pad_id: int,
    cost: SplitCost = SplitCost(),
) -> list[list[Row]]:
    """This rank's micro-batches of folded rows: rows go to ranks largest first, each to the
    rank with the fewest folded tokens so far; each rank groups its rows (widest first) into
    micro-batches that cost at most `max_slots` slots (`SplitCost.micro_batch`); every rank gets the
    busiest rank's count, topped up with padding micro-batches (see
    `rlvr.layout.micro_batches.padding_micro_batch`)."""
    shares: list[list[Row]] = [[] for _ in range(world_size)]
    load = [0] * world_size
    for row in sorted(rows, key=folded_width, reverse=True):
        r = load.index(min(load))
        shares[r].append(row)
        load[r] += folded_width(row)
    batches = [_group(share, max_slots, cost) for share in shares]
    count = max(len(b) for b in batches)
    return batches[rank] + [padding_micro_batch(pad_id)] * (count - len(batches[rank]))


def _group(rows: list[Row], max_slots: int, cost: SplitCost) -> list[list[Row]]:
    """Consecutive rows (widest first) into micro-batches costing at most `max_slots` slots."""
    batches: list[list[Row]] = []
    accounts: list[RowAccount] = []
    for row in rows:
        account = row_account(row)
        if batches and cost.micro_batch(accounts + [account]) <= max_slots:
            batches[-1].append(row)
            accounts.append(account)
        else:
            batches.append([row])
            accounts = [account]
    return batches


def folded_tokens(rows: list[Row]) -> int:
    """Tokens the forward runs on for folded rows, padding aside."""
    return sum(map(folded_width, rows))
