"""The folded micro-batch: a prefix tree's forward inputs and its attention.

`collate_folded` turns folded rows into a `FoldedMicroBatch`: the tree's tokens, positions and
`scope_end` for the forward, the unshared layout of the same samples for the loss, and the map
from each prediction to the folded hidden state it reads. Its attention is the sdpa node split
(`rlvr.layout.tree_sdpa`) or a flex-attention block mask; see
docs/training.md#how-the-micro-batch-layouts-work.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from rlvr.batch import MicroBatch, Row
from rlvr.layout.micro_batches import collate
from rlvr.layout.prefix_tree import row_tree
from rlvr.layout.tree_sdpa import NodePlan, node_plan
from rlvr.layout.tree_sdpa import register as register_tree_sdpa


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
    layout of its samples (one sample per row, see `rlvr.layout.micro_batches.collate`): the loss,
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
    """sdpa: the nodes of the folded rows and how each attends (`rlvr.layout.tree_sdpa`)."""

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
