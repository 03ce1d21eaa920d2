"""Training samples and their packing into padded micro-batches.

A `Sample` is one token sequence exactly as vLLM saw it (the trainer never re-tokenizes text,
so the ids, the loss mask and the sampler's logprobs cannot drift apart), with a mask that is 1
only on tokens the policy sampled. SFT reuses samples and their packing: its mask marks the
assistant's tokens (see `rlvr.sft_data`) and the sampler fields stay zero.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Sample:
    input_ids: list[int]
    loss_mask: list[int]
    """1 where the token was sampled by the policy (gets loss), 0 for prompt/env tokens."""
    sampler_logprobs: list[float]
    """vLLM's log-probability of each token where loss_mask is 1 (0.0 elsewhere)."""
    advantage: float = 0.0

    def __post_init__(self) -> None:
        if not len(self.input_ids) == len(self.loss_mask) == len(self.sampler_logprobs):
            raise ValueError(
                f"sample fields differ in length: ids {len(self.input_ids)}, mask "
                f"{len(self.loss_mask)}, logprobs {len(self.sampler_logprobs)}"
            )

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def num_loss_tokens(self) -> int:
        return sum(self.loss_mask)


@dataclass
class MicroBatch:
    """Right-padded tensors. The last four are aligned with next-token predictions: column i
    describes token i+1 of `input_ids` (position 0 is never predicted)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor
    sampler_logprobs: torch.Tensor
    advantages: torch.Tensor

    @property
    def num_loss_tokens(self) -> int:
        return int(self.loss_mask.sum().item())

    def to(self, device: torch.device | str) -> MicroBatch:
        return MicroBatch(*(t.to(device) for t in vars(self).values()))


def collate(samples: list[Sample], pad_id: int) -> MicroBatch:
    width = max(len(s) for s in samples)
    n = len(samples)
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    attention = torch.zeros((n, width), dtype=torch.long)
    mask = torch.zeros((n, width), dtype=torch.float32)
    logprobs = torch.zeros((n, width), dtype=torch.float32)
    advantages = torch.zeros((n, width), dtype=torch.float32)
    for row, s in enumerate(samples):
        length = len(s)
        ids[row, :length] = torch.tensor(s.input_ids)
        attention[row, :length] = 1
        mask[row, :length] = torch.tensor(s.loss_mask, dtype=torch.float32)
        logprobs[row, :length] = torch.tensor(s.sampler_logprobs, dtype=torch.float32)
        advantages[row, :length] = s.advantage
    return MicroBatch(ids, attention, mask[:, 1:], logprobs[:, 1:], advantages[:, 1:])


def split_micro_batches(samples: list[Sample], micro_batch_size: int) -> list[list[Sample]]:
    """Chunks of at most `micro_batch_size`, longest first, so similar lengths share padding.
    (The loss is a sum over tokens, so the order does not change it.)"""
    ordered = sorted(samples, key=len, reverse=True)
    return [ordered[i : i + micro_batch_size] for i in range(0, len(ordered), micro_batch_size)]


def shard(samples: list[Sample], rank: int, world_size: int) -> list[Sample]:
    """This rank's share of the step's samples (round-robin over the length-sorted list keeps
    the ranks' token counts close)."""
    ordered = sorted(samples, key=len, reverse=True)
    return ordered[rank::world_size]


def padding_micro_batch(pad_id: int) -> list[Sample]:
    """A micro-batch that contributes no loss. Ranks with fewer micro-batches run these so
    every rank makes the same number of forward/backward passes: ZeRO-3 gathers parameters
    with collectives inside them, and mismatched counts would deadlock."""
    return [Sample([pad_id, pad_id], [0, 0], [0.0, 0.0], 0.0)]


def rank_micro_batches(
    samples: list[Sample], rank: int, world_size: int, micro_batch_size: int, pad_id: int
) -> list[list[Sample]]:
    """This rank's micro-batches of the step's samples, topped up with padding micro-batches
    to the count of the busiest rank (see `padding_micro_batch`)."""
    shards = [
        split_micro_batches(shard(samples, r, world_size), micro_batch_size)
        for r in range(world_size)
    ]
    count = max(len(s) for s in shards)
    mine = shards[rank]
    return mine + [padding_micro_batch(pad_id)] * (count - len(mine))
