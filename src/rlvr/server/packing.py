"""Packing parameters into flat byte buffers, shared by our CPU weight-transfer engines.

Both sides derive every offset from the same metadata (names, dtypes, shapes) in the same
order, so only raw bytes need to travel and nothing is serialised per tensor.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch
from vllm.distributed.weight_transfer.base import ParamMeta, WeightTransferUpdateInfo


@dataclass
class PackedUpdateInfo(WeightTransferUpdateInfo):
    """Per-push metadata sent over HTTP; the bytes travel separately."""

    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]

    def __post_init__(self) -> None:
        if not len(self.names) == len(self.dtype_names) == len(self.shapes):
            raise ValueError(
                f"names, dtype_names and shapes differ in length: "
                f"{len(self.names)}, {len(self.dtype_names)}, {len(self.shapes)}"
            )

    @classmethod
    def from_metas(cls, metas: list[ParamMeta], **extra) -> PackedUpdateInfo:
        return cls(
            names=[m.name for m in metas],
            dtype_names=[str(m.dtype).removeprefix("torch.") for m in metas],
            shapes=[list(m.shape) for m in metas],
            **extra,
        )

    def metas(self) -> list[ParamMeta]:
        return [
            ParamMeta(name, getattr(torch, dtype), tuple(shape))
            for name, dtype, shape in zip(self.names, self.dtype_names, self.shapes, strict=True)
        ]


def nbytes(meta: ParamMeta) -> int:
    """Return the size in bytes of the parameter `meta` describes."""
    numel = 1
    for dim in meta.shape:
        numel *= dim
    return numel * torch.empty((), dtype=meta.dtype).element_size()


def plan_chunks(metas: list[ParamMeta], chunk_bytes: int) -> list[list[ParamMeta]]:
    """Split parameters, in order, into chunks of at most `chunk_bytes` (an oversized
    parameter gets a chunk of its own)."""
    chunks: list[list[ParamMeta]] = []
    current: list[ParamMeta] = []
    size = 0
    for meta in metas:
        n = nbytes(meta)
        if current and size + n > chunk_bytes:
            chunks.append(current)
            current, size = [], 0
        current.append(meta)
        size += n
    if current:
        chunks.append(current)
    return chunks


def pack_into(buffer: torch.Tensor, tensors: Iterable[torch.Tensor]) -> int:
    """Copy tensors back to back into a uint8 buffer (one copy, no temporaries)."""
    offset = 0
    for tensor in tensors:
        flat = tensor.detach().to("cpu").contiguous().view(-1).view(torch.uint8)
        buffer[offset : offset + flat.numel()].copy_(flat)
        offset += flat.numel()
    return offset


def unpack(buffer: torch.Tensor, metas: list[ParamMeta]) -> Iterator[tuple[str, torch.Tensor]]:
    """Views into the buffer, one per parameter (no copies)."""
    offset = 0
    for meta in metas:
        n = nbytes(meta)
        yield meta.name, buffer[offset : offset + n].view(meta.dtype).view(meta.shape)
        offset += n


def checked(source: Iterable[tuple[str, torch.Tensor]], metas: list[ParamMeta]):
    """Yield the source's tensors, failing loudly (naming the parameter) where iteration
    disagrees with the declared metadata: the receiver cuts its buffers from the metadata and
    would otherwise load garbage."""
    for (name, tensor), meta in zip(source, metas, strict=True):
        if (name, tensor.dtype, tuple(tensor.shape)) != (meta.name, meta.dtype, meta.shape):
            raise ValueError(
                f"weight source yielded {name} {tensor.dtype} {tuple(tensor.shape)} where "
                f"metadata declared {meta.name} {meta.dtype} {meta.shape}"
            )
        yield tensor


def load_atomically(model: torch.nn.Module, model_config, weights: list) -> None:
    """Load complete weights through vLLM's layerwise reload (handles fused and processed
    layers). Called only once every byte is local, so a failed transfer never leaves layers
    half-reloaded (they sit on the meta device until complete). Layers that share a tied
    parameter are processed again afterwards: the reload rebuilds only the kernels of layers that
    received weights, and a tied output layer receives none (it is the embedding)."""
    from vllm.model_executor.model_loader.reload import (
        finalize_layerwise_reload,
        initialize_layerwise_reload,
    )

    from rlvr.server.held_weights import kernel_records, reprocess_shared

    before = kernel_records(model)
    initialize_layerwise_reload(model)
    model.load_weights(weights)
    finalize_layerwise_reload(model, model_config)
    reprocess_shared(model, before)
