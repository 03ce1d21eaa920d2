"""Shared-prefix training: every common token prefix of a step's samples is forwarded once.

In GRPO every rollout of a group starts from the same prompt, and a multi-turn rollout split
into several samples repeats its earlier turns in each; forwarding each sample on its own runs
those tokens through the model once per sample. Here the samples of a row fold into a prefix
tree (Liu et al., "Prefix Grouper", 2025, generalised from one shared prompt to a tree): the
tokens several samples share are placed once, each sample's remaining tokens after them, and
attention lets every token see exactly the tokens of its own sample before it. Each token's
hidden state is then the one the sample's own forward computes (same tokens, same positions,
same attended set), so log-probabilities, loss, gradients, the reference pass and the entropy
are those of the unshared layout: training-equivalent, not an approximation.

Layout. A row's samples are sorted lexicographically by token ids. In that order the tokens a
sample shares with all earlier ones are exactly its common prefix with its predecessor
(`lcp`), so the row is sample 0's tokens, then sample 1's tokens after lcp(0, 1), and so on:
the depth-first layout of the row's token trie, at any depth (a prompt shared by a group, and
deeper the earlier turns shared by one rollout's samples). Position ids are the tokens'
positions in their samples, so they continue from the end of the shared part.

Attention. A token at row index k is read by the samples from the one that placed it up to
the last sample that still shares it; they occupy the contiguous indices up to `scope_end[k]`.
So query q sees key k iff `k <= q < scope_end[k]`: one integer per token defines the whole
mask, at any depth. With sdpa (the CPU path) no mask is built: `rlvr.trainer.tree_sdpa` cuts
each row into the tree's nodes and attends each node's queries to its ancestors' keys and its
own, so a token's attention costs what it sees, never the square of the whole row; the plan
is made once per micro-batch (`collate_folded`) and the model's forward hands it to every
layer. With `attn_implementation=flex_attention` (GPUs) the same rule is a flex-attention
`mask_mod` whose block mask skips the blocks no query reads, and no W x W mask exists.
Everything else is shared by the two paths.

Predictions. Column t of a sample's next-token grid (predicting token t+1) reads the hidden
state of its token t wherever the tree placed it. The last shared token therefore feeds one
prediction per continuation: its hidden state is computed once and gathered once per sample
(`FoldedMicroBatch.hidden_index`), and autograd sums the continuations' gradients into it,
which is what the unshared layout's separate copies sum to. This is the paper's approach
(prefix outputs expanded back to every sample) rather than repeating the last prefix token
at the start of each continuation, which would add a token per sample and shift positions.
The loss, its masks, the sampler's log-probabilities, the advantages and the reasoning gate's
per-position rule all stay on the unshared [samples, longest - 1] grid of
`rlvr.trainer.micro_batches`: only the forward's input changes.

When it pays. Under the node split a folded step scores the query-key pairs the unshared
layout scores, less the shared tokens' repeats, and runs the shared tokens' projections and
MLPs once; what it adds is gathering each node's queries, keys and values and one SDPA call
per bucket of nodes. So a fold is faster wherever it saves tokens at all, and the thresholds
only keep out folds too small to repay that bookkeeping: a sample joins a row when it shares
at least `MIN_SHARED_FRACTION` of its tokens with it, and a step whose fold saves less than
`MIN_SAVED_FRACTION` of its tokens keeps the unshared layout (bench/train_step.py --parts
prefix measures both sides; docs/training.md has the numbers).

Micro-batches. A folded micro-batch costs no more activation memory than the unshared layout's
largest (`batch.micro_batch_tokens` slots, or `micro_batch_size` x the step's longest sample if
that binds first), which is what the memory check sized. Under the node split its cost in
slots of that layout is more than its folded slots: the split also keeps, in every layer, the
queries, keys and values cut into nodes, each node's ancestors' keys and values beside its own,
and each masked call's mask (`SplitCost`, derived from the model's shape by
`rlvr.trainer.memory.split_cost`: for SmolLM2 with LoRA, 0.17 of a slot more per folded slot
and 0.05 per gathered token). Rows are cut and micro-batches grouped by that cost. Rows, not
samples, are distributed over ranks (a group is never cut in two by sharding), balanced by
folded tokens.
"""

from __future__ import annotations

import functools
import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from rlvr.batch import MicroBatch, Row, Sample
from rlvr.config import BatchConfig
from rlvr.trainer.micro_batches import collate, largest_micro_batch, padding_micro_batch, slot_count
from rlvr.trainer.micro_batches import rank_micro_batches as unshared_micro_batches
from rlvr.trainer.tree_sdpa import NodePlan, node_plan
from rlvr.trainer.tree_sdpa import register as register_tree_sdpa

log = logging.getLogger(__name__)

MIN_SHARED_FRACTION = 0.15
"""A sample joins a folded row only when at least this share of its tokens is already there:
below it the saved tokens no longer clearly repay the node split's bookkeeping (the least
sharing measured faster folded: 60-token prompts before 256-token replies, 19%)."""

MIN_SAVED_FRACTION = 0.1
"""Below this share of a step's tokens saved by folding, the step keeps the unshared layout.
A fold is faster wherever measured (down to 14% saved, docs/training.md#shared-prefix-training
has the numbers); below this the gain would be within the bookkeeping's cost and the noise."""

TREE_ATTENTION = ("sdpa", "flex_attention")
"""Attention implementations that take the tree's mask: a dense boolean mask (sdpa) or a block
mask (flex attention). Others (flash_attention_2, eager's additive mask) train unshared."""


def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of two token lists."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


@dataclass(frozen=True)
class SplitCost:
    """What the sdpa node split (`rlvr.trainer.tree_sdpa`) keeps for backward beyond the
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


def visibility(scope_end: torch.Tensor) -> Callable[..., torch.Tensor]:
    """The tree's attention rule as a flex-attention `mask_mod(b, h, q, k)`: query q of row b
    sees key k iff k <= q < scope_end[b, k]. Broadcasts over tensors of indices, so the dense
    mask is the same function evaluated on a grid."""

    def visible(b: torch.Tensor, _h: Any, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        return (k <= q) & (q < scope_end[b, k])

    return visible


@functools.cache
def compiled_block_mask() -> Callable[..., Any]:
    """flex attention's `create_block_mask`, compiled once per process for any rows and width.

    Why compiled: run eagerly it evaluates the mask_mod on the whole dense [R, 1, W, W] grid
    before reducing it to blocks; compiled, the evaluation is fused into the block reduction
    and no W x W tensor exists (docs/troubleshooting.md has the time and memory of both). The
    price is one compilation at the first folded micro-batch."""
    from torch.nn.attention.flex_attention import create_block_mask

    return torch.compile(create_block_mask, dynamic=True)


def flex_block_mask(scope_end: torch.Tensor) -> Any:
    """flex attention's block mask of folded rows with `scope_end` [R, W] (see `visibility`):
    fully masked blocks skipped, built without a W x W tensor (`compiled_block_mask`)."""
    rows, width = scope_end.shape
    build = compiled_block_mask()
    return build(visibility(scope_end), rows, None, width, width, device=scope_end.device)


@dataclass
class FoldedMicroBatch(MicroBatch):
    """A micro-batch whose forward runs on folded rows. The inherited fields are the unshared
    layout of its samples (one sample per row, see `rlvr.trainer.micro_batches.collate`): the loss,
    the targets and the reasoning gate read them unchanged; only the forward and the gathering of
    its hidden states differ."""

    tree_ids: torch.Tensor | None = None
    """[R, W] the folded rows' tokens (padding after each row's end)."""
    tree_positions: torch.Tensor | None = None
    """[R, W] each token's position in its samples."""
    scope_end: torch.Tensor | None = None
    """[R, W] one past the last row index that may attend to each token."""
    hidden_index: torch.Tensor | None = None
    """[S, L-1] for each prediction of the unshared grid, the flat index (row * W + column)
    of the folded hidden state it is made from."""
    attention: str = "sdpa"
    """How the forward attends: the node split of `tree_plan` (sdpa) or a block mask built
    from `scope_end` (flex attention)."""
    tree_plan: NodePlan | None = None
    """sdpa: the nodes of the folded rows and how each attends (`rlvr.trainer.tree_sdpa`)."""

    def model_inputs(self) -> dict[str, Any]:
        inputs = {"input_ids": self.tree_ids, "position_ids": self.tree_positions}
        if self.attention == "flex_attention":
            return {**inputs, "attention_mask": flex_block_mask(self.scope_end)}
        # a 4-D mask stops transformers from building one (it would read the folded positions
        # as packed samples); `tree_sdpa` reads the plan instead. It hides every key, so a
        # model that does not hand `tree_plan` to its attention fails the start-up layout check
        rows, width = self.tree_ids.shape
        hidden = torch.zeros((), dtype=torch.bool, device=self.tree_ids.device)
        return {
            **inputs,
            "attention_mask": hidden.expand(rows, 1, width, width),
            "tree_plan": self.tree_plan,
        }

    def prediction_states(self, hidden: torch.Tensor, select: torch.Tensor) -> torch.Tensor:
        return hidden.flatten(0, 1)[self.hidden_index[select]]

    def to(self, device: torch.device | str) -> FoldedMicroBatch:
        moved = super().to(device)
        if self.tree_plan is not None:
            moved.tree_plan = self.tree_plan.to(device)
        return moved


def collate_folded(rows: list[Row], pad_id: int, attention: str) -> FoldedMicroBatch:
    """Tensors for a micro-batch of folded rows: the folded forward's inputs and the map from
    the unshared prediction grid to its hidden states."""
    samples = [s for row in rows for s in row]
    trees = [row_tree(row) for row in rows]
    width = max(len(t.ids) for t in trees)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    positions = torch.zeros((len(rows), width), dtype=torch.long)
    scope_end = torch.arange(1, width + 1).repeat(len(rows), 1)  # padding sees only itself
    longest = max(len(s) for s in samples)
    hidden_index = torch.zeros((len(samples), longest - 1), dtype=torch.long)
    s = 0
    for r, tree in enumerate(trees):
        n = len(tree.ids)
        ids[r, :n] = torch.tensor(tree.ids)
        positions[r, :n] = torch.tensor(tree.positions)
        scope_end[r, :n] = torch.tensor(tree.scope_end)
        for placed in tree.locations:
            hidden_index[s, : len(placed) - 1] = r * width + torch.tensor(placed[:-1])
            s += 1
    flat = collate([[sample] for sample in samples], pad_id)
    tree = {"tree_ids": ids, "tree_positions": positions, "scope_end": scope_end}
    plan = None
    if attention == "sdpa":
        register_tree_sdpa()
        plan = node_plan(scope_end, [len(t.ids) for t in trees])
    return FoldedMicroBatch(
        **vars(flat), **tree, hidden_index=hidden_index, attention=attention, tree_plan=plan
    )


def saved_fraction(samples: list[Sample], rows: list[Row]) -> float:
    """Share of the samples' tokens the folded rows do not forward."""
    total = sum(len(s) for s in samples)
    return 1 - _folded_tokens(rows) / max(total, 1)


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
    `rlvr.trainer.micro_batches.padding_micro_batch`)."""
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


@dataclass
class Plan:
    """A rank's micro-batches for one step and how to turn each into tensors."""

    micro_batches: list[list[Row]]
    collate: Callable[[list[Row]], MicroBatch]
    slots: Callable[[list[Row]], int]
    forwarded: Callable[[list[Row]], int]
    """Tokens of a micro-batch the forward runs on, padding aside."""


def plan_micro_batches(
    samples: list[Sample],
    rank: int,
    world_size: int,
    cfg: BatchConfig,
    pad_id: int,
    attention: str | None,
    cost: SplitCost = SplitCost(),
) -> Plan:
    """Folded micro-batches when `attention` (see `tree_attention`) can take the tree's mask
    and the fold saves at least `MIN_SAVED_FRACTION` of the step's tokens; otherwise the
    unshared layout of `rlvr.trainer.micro_batches`. Decided from the whole step, so every rank
    decides alike. `cost`: what the sdpa node split keeps beyond the unshared layout (see the
    module docstring; flex attention keeps nothing beyond it)."""
    longest = max((len(s) for s in samples), default=0)
    max_slots = largest_micro_batch(cfg.micro_batch_size, cfg.micro_batch_tokens, longest)
    if attention is not None:
        split = cost if attention == "sdpa" else SplitCost()
        rows = fold_rows(samples, max_slots, split)
        saved = saved_fraction(samples, rows)
        if saved >= MIN_SAVED_FRACTION:
            mine = rank_folded_micro_batches(rows, rank, world_size, max_slots, pad_id, split)
            fold = functools.partial(collate_folded, pad_id=pad_id, attention=attention)
            return Plan(mine, fold, folded_slot_count, _folded_tokens)
    mine = unshared_micro_batches(
        samples, rank, world_size, cfg.micro_batch_size, pad_id, cfg.packing, cfg.micro_batch_tokens
    )
    return Plan(mine, functools.partial(collate, pad_id=pad_id), slot_count, _sample_tokens)


def _folded_tokens(rows: list[Row]) -> int:
    return sum(map(folded_width, rows))


def _sample_tokens(rows: list[Row]) -> int:
    return sum(len(s) for row in rows for s in row)


def tree_attention(model: torch.nn.Module, max_seq_len: int | None = None) -> str | None:
    """The model's attention implementation when it can take a prefix tree's mask, else None
    (with a warning, once: the run trains unshared).

    The tree's mask replaces the model's own, and SDPA and flex attention apply a sliding
    window only through that mask: a model whose window can bind (shorter than
    `max_seq_len`, or any window when that is unknown) would silently attend past it, so it
    trains unshared."""
    from accelerate.utils import extract_model_from_parallel

    config = extract_model_from_parallel(model).config
    window = sliding_window(config)
    if window is not None and (max_seq_len is None or window < max_seq_len):
        _warn_unshared(f"sliding window of {window} tokens")
        return None
    name = config._attn_implementation
    if name in TREE_ATTENTION:
        return name
    _warn_unshared(f"attention {name!r}")
    return None


def sliding_window(config: Any) -> int | None:
    """The sliding window some layer of the model attends within, or None when every layer
    attends to the whole sequence (`layer_types` where the config lists them; else a set
    `sliding_window`, as Mistral and Phi-3 configs have, unless `use_sliding_window` is off)."""
    window = getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None:
        return window if any("sliding" in str(t) for t in layer_types) else None
    if getattr(config, "use_sliding_window", True) is False:
        return None
    return window if isinstance(window, int) and window > 0 else None


@functools.cache
def _warn_unshared(reason: str) -> None:
    log.warning(
        "batch.prefix_sharing: the model's %s cannot take a prefix tree's mask, so every "
        "sample is forwarded on its own (prefix sharing needs attn_implementation=sdpa or "
        "flex_attention and no sliding window shorter than batch.max_seq_len)",
        reason,
    )
