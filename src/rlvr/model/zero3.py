"""Reading ZeRO-3 partitioned parameters; imports nothing from `rlvr`, so every floor can use it."""

from __future__ import annotations

import contextlib

import torch


def zero3_gather(params: list[torch.nn.Parameter]):
    """Gather ZeRO-3 partitioned parameters for reading (a no-op for ordinary tensors)."""
    if any(hasattr(p, "ds_id") for p in params):
        import deepspeed

        return deepspeed.zero.GatheredParameters(params, modifier_rank=None)
    return contextlib.nullcontext()
