"""Tree attention through SDPA that scores only the keys each query may see.

A folded row is cut into nodes (runs of tokens with the same `scope_end`); each node's queries
attend to its ancestors' keys and its own causally, nodes with the same ancestors batched into
one padded call (`Bucket`). `register` installs `tree_sdpa` as transformers' "sdpa": it takes
this path only when a forward carries a `tree_plan`, and is transformers' own sdpa otherwise.
Gradients are plain autograd. Design: docs/training.md#the-node-split-sdpa.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch

CALL_PAIRS = 4096
"""One SDPA call's fixed cost, counted in query-key pairs scored (an estimate, not tuned): nodes
share a padded call while the pairs padding adds stay below the calls it saves."""


@dataclass(frozen=True)
class Node:
    """A run of a row's tokens that attend alike: flat indices [start, end) (row * width +
    column) and the indices (in the micro-batch's node list) of its ancestor nodes."""

    start: int
    end: int
    ancestors: tuple[int, ...]

    @property
    def size(self) -> int:
        return self.end - self.start


def row_nodes(scope_end: list[int], length: int, offset: int, first: int) -> list[Node]:
    """A row's nodes (see the module docstring) in row order, then its padding (the columns
    from `length` on, which see only themselves) as one node without ancestors; `offset`: the
    row's first flat index, `first`: its first node's index. Ancestors come from a stack of
    the nodes whose scope is still open: scopes nest, so a node's ancestors are exactly the
    enclosing nodes whose scope reaches past its start."""
    nodes: list[Node] = []
    open_: list[tuple[int, int]] = []  # (node index, reach) of the enclosing nodes
    start = 0
    while start < length:
        reach = scope_end[start]
        end = start + 1
        while end < length and scope_end[end] == reach:
            end += 1
        while open_ and open_[-1][1] <= start:
            open_.pop()
        nodes.append(Node(offset + start, offset + end, tuple(i for i, _ in open_)))
        open_.append((first + len(nodes) - 1, reach))
        start = end
    if length < len(scope_end):
        nodes.append(Node(offset + length, offset + len(scope_end), ()))
    return nodes


@dataclass
class Bucket:
    """Nodes (`members`, indices in the node list) attended in one SDPA call, padded to the
    largest. Roots (`mask` None): causal attention over their own tokens. Otherwise the nodes
    share the ancestor nodes `ancestors` (their tokens gathered once and expanded over the
    members), and `mask` [G, 1, Lq, A + Lq] shows each query every ancestor token and its own
    node's tokens up to itself (a padding query sees key 0 only)."""

    members: list[int]
    ancestors: tuple[int, ...] = ()
    mask: torch.Tensor | None = None

    def attend(
        self,
        q: list[torch.Tensor],
        k: list[torch.Tensor],
        v: list[torch.Tensor],
        dropout: float,
        scaling: float | None,
    ) -> list[torch.Tensor]:
        """The members' outputs [size, H, D] from every node's queries `q` [size, H, D] and
        keys and values `k`, `v` [size, Hkv, D]."""
        from torch.nn.functional import pad
        from transformers.integrations.sdpa_attention import repeat_kv, use_gqa_in_sdpa

        width = max(len(q[i]) for i in self.members)

        def batch(x: list[torch.Tensor]) -> torch.Tensor:  # [G, heads, Lq, D]
            if len(self.members) == 1:
                return x[self.members[0]][None].transpose(1, 2)
            # pad and stack (not pad_sequence, whose backward clears the padded batch once
            # per member)
            pieces = [x[i] for i in self.members]
            padded = [
                p if len(p) == width else pad(p, (0, 0, 0, 0, 0, width - len(p))) for p in pieces
            ]
            return torch.stack(padded).transpose(1, 2)

        qb, kb, vb = batch(q), batch(k), batch(v)
        if self.ancestors:
            groups = len(self.members)

            def with_ancestors(x: list[torch.Tensor], own: torch.Tensor) -> torch.Tensor:
                seen = torch.cat([x[i] for i in self.ancestors]).transpose(0, 1)
                return torch.cat([seen[None].expand(groups, -1, -1, -1), own], dim=2)

            kb, vb = with_ancestors(k, kb), with_ancestors(v, vb)
        gqa = {}
        n_rep = qb.shape[1] // kb.shape[1]
        if n_rep > 1:
            # the CPU kernel takes grouped heads with a mask too: no copy of the keys per head
            if use_gqa_in_sdpa(self.mask, kb, vb) or qb.device.type == "cpu":
                gqa["enable_gqa"] = True
            else:
                kb, vb = repeat_kv(kb, n_rep), repeat_kv(vb, n_rep)
        out = torch.nn.functional.scaled_dot_product_attention(
            qb,
            kb,
            vb,
            attn_mask=self.mask,
            dropout_p=dropout,
            scale=scaling,
            is_causal=self.mask is None,
            **gqa,
        ).transpose(1, 2)
        sizes = [len(q[i]) for i in self.members]
        return [
            o if n == out.shape[1] else o[:n] for o, n in zip(out.unbind(0), sizes, strict=True)
        ]

    def to(self, device: torch.device | str) -> Bucket:
        mask = None if self.mask is None else self.mask.to(device)
        return Bucket(self.members, self.ancestors, mask)


@dataclass
class NodePlan:
    """A folded micro-batch's attention plan: the sizes of its nodes in flat order (they cut
    the [R * W] token axis), the buckets they are attended in and the padding nodes."""

    sizes: list[int]
    buckets: list[Bucket]
    padding: list[int]

    def to(self, device: torch.device | str) -> NodePlan:
        return NodePlan(self.sizes, [b.to(device) for b in self.buckets], self.padding)


def node_plan(scope_end: torch.Tensor, lengths: list[int]) -> NodePlan:
    """The plan of folded rows with `scope_end` [R, W] and `lengths` tokens each (the rest
    is padding)."""
    rows, width = scope_end.shape
    nodes: list[Node] = []
    for r, (reach, length) in enumerate(zip(scope_end.tolist(), lengths, strict=True)):
        nodes += row_nodes(reach, length, r * width, len(nodes))
    padding = {i for i, n in enumerate(nodes) if n.start % width >= lengths[n.start // width]}
    sizes = [n.size for n in nodes]
    real = [i for i in range(len(nodes)) if i not in padding]
    buckets = [_bucket(nodes, members) for members in _batch_nodes(nodes, real)]
    return NodePlan(sizes, buckets, sorted(padding))


def _batch_nodes(nodes: list[Node], real: list[int]) -> list[list[int]]:
    """The `real` nodes into buckets: nodes with the same ancestors (all roots alike), by size,
    share a padded call while it scores no more query-key pairs than separate calls would,
    counting each call's fixed cost `CALL_PAIRS`."""
    families: dict[tuple[int, ...], list[int]] = {}
    for i in real:
        families.setdefault(nodes[i].ancestors, []).append(i)
    buckets: list[list[int]] = []
    for ancestors, family in families.items():
        seen = sum(nodes[a].size for a in ancestors)
        current: list[int] = []
        alone = 0
        for i in sorted(family, key=lambda i: nodes[i].size):
            size = nodes[i].size
            cost = size * (seen + size) + CALL_PAIRS
            padded = (len(current) + 1) * size * (seen + size) + CALL_PAIRS  # i is the widest
            if current and padded <= alone + cost:
                current.append(i)
                alone += cost
            else:
                if current:
                    buckets.append(current)
                current, alone = [i], cost
        buckets.append(current)
    return buckets


def _bucket(nodes: list[Node], members: list[int]) -> Bucket:
    """A bucket of nodes with the same ancestors, with its mask unless they are roots."""
    ancestors = nodes[members[0]].ancestors
    if not ancestors:
        return Bucket(members)
    seen = sum(nodes[a].size for a in ancestors)
    size = torch.tensor([nodes[i].size for i in members])[:, None, None]
    width = int(size.max())
    q = torch.arange(width)[None, :, None]
    k = torch.arange(seen + width)[None, None, :]
    mask = torch.where(q < size, k <= seen + q, k == 0)
    return Bucket(members, ancestors, mask[:, None])


def tree_sdpa(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Any,
    *args: Any,
    tree_plan: NodePlan | None = None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention function under "sdpa": the node split of `tree_plan` when the
    forward carries one, transformers' `sdpa_attention_forward` otherwise (see the module
    docstring). Returns [R, W, H, D] and no weights, as sdpa does."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if tree_plan is None:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, *args,
            dropout=dropout, scaling=scaling, **kwargs,
        )  # fmt: skip
    rows, heads, width, dim = query.shape

    def nodes(x: torch.Tensor) -> list[torch.Tensor]:  # each node's [size, heads, D]
        return list(x.transpose(1, 2).reshape(rows * width, -1, dim).split(tree_plan.sizes))

    q, k, v = nodes(query), nodes(key), nodes(value)
    outs: list[torch.Tensor | None] = [None] * len(q)
    for bucket in tree_plan.buckets:
        for i, out in zip(bucket.members, bucket.attend(q, k, v, dropout, scaling), strict=True):
            outs[i] = out
    for i in tree_plan.padding:  # a token that sees only itself reads its own value
        outs[i] = v[i].repeat_interleave(heads // v[i].shape[1], dim=1)
    return torch.cat(outs).view(rows, width, heads, dim), None


@functools.cache
def register() -> None:
    """Put `tree_sdpa` in transformers' attention functions under "sdpa" (once a process)."""
    from transformers import AttentionInterface

    AttentionInterface.register("sdpa", tree_sdpa)
