"""Which attention implementations can take a prefix tree's mask.

`tree_attention` names the model's implementation when it can (sdpa, flex attention, and no
sliding window that could bind), else None with a warning, once: the run then trains unshared.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import torch

log = logging.getLogger(__name__)

TREE_ATTENTION = ("sdpa", "flex_attention")
"""Attention implementations that take the tree's mask: a dense boolean mask (sdpa) or a block
mask (flex attention). Others (flash_attention_2, eager's additive mask) train unshared."""


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
