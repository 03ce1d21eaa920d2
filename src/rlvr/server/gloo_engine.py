"""A CPU-capable weight-transfer backend (`gloo`) for vLLM's RL weight-update routes.

vLLM ships `nccl` and `ipc` engines, both CUDA-only. This one moves the same checkpoint-format
weights over a gloo process group made outside torch's global state, so a trainer can update a
vLLM served on the CPU (or on another host without a shared GPU fabric).

Wire format: parameters are packed in metadata order into flat byte chunks of at most
`chunk_bytes`; both sides cut the chunks from the same metadata, so only the bytes travel. A
few large broadcasts are far cheaper over TCP than one per tensor.

Every collective has a timeout (`timeout_s`), so a trainer that dies mid-update makes the
worker's receive fail instead of hanging the server; a new trainer can then initialise again.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import ClassVar, Self

import torch
from vllm.distributed.weight_transfer.base import (
    ParamMeta,
    TrainerInitInfo,
    TrainerWeightTransferEngine,
    VLLMWeightSyncClient,
    WeightSource,
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)

log = logging.getLogger(__name__)

BACKEND = "gloo"
DEFAULT_CHUNK_BYTES = 256 * 1024 * 1024
DEFAULT_TIMEOUT_S = 120.0


@dataclass
class GlooWorkerInitInfo(WeightTransferInitInfo):
    """What a vLLM worker needs to join the trainer's group (sent over HTTP as JSON)."""

    master_address: str
    master_port: int
    rank_offset: int
    world_size: int
    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    timeout_s: float = DEFAULT_TIMEOUT_S


@dataclass
class GlooTrainerInitInfo(TrainerInitInfo):
    """Trainer-side init info; the trainer is rank 0 and hosts the rendezvous store."""

    backend: ClassVar[str] = BACKEND
    master_address: str
    master_port: int
    world_size: int
    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    timeout_s: float = DEFAULT_TIMEOUT_S


@dataclass
class GlooUpdateInfo(WeightTransferUpdateInfo):
    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]

    def __post_init__(self) -> None:
        if not len(self.names) == len(self.dtype_names) == len(self.shapes):
            raise ValueError(
                f"names, dtype_names and shapes differ in length: "
                f"{len(self.names)}, {len(self.dtype_names)}, {len(self.shapes)}"
            )

    def metas(self) -> list[ParamMeta]:
        return [
            ParamMeta(name, getattr(torch, dtype), tuple(shape))
            for name, dtype, shape in zip(self.names, self.dtype_names, self.shapes, strict=True)
        ]


def _nbytes(meta: ParamMeta) -> int:
    numel = 1
    for dim in meta.shape:
        numel *= dim
    return numel * torch.empty((), dtype=meta.dtype).element_size()


def plan_chunks(metas: list[ParamMeta], chunk_bytes: int) -> list[list[ParamMeta]]:
    """Split parameters, in order, into chunks of at most `chunk_bytes` (one oversized param
    gets a chunk of its own). Both sides call this on the same metadata."""
    chunks: list[list[ParamMeta]] = []
    current: list[ParamMeta] = []
    size = 0
    for meta in metas:
        n = _nbytes(meta)
        if current and size + n > chunk_bytes:
            chunks.append(current)
            current, size = [], 0
        current.append(meta)
        size += n
    if current:
        chunks.append(current)
    return chunks


def _open_group(address: str, port: int, rank: int, world_size: int, timeout_s: float):
    from vllm.distributed.utils import stateless_init_torch_distributed_process_group

    return stateless_init_torch_distributed_process_group(
        address, port, rank, world_size, backend="gloo", timeout=timedelta(seconds=timeout_s)
    )


def _broadcast(group, buffer: torch.Tensor) -> None:
    # Called on the ProcessGroup object itself: root 0 is the group rank, whatever the
    # (unrelated) global torch.distributed state of either process.
    group.broadcast(buffer, 0).wait()


def _unpack(buffer: torch.Tensor, chunk: list[ParamMeta]) -> Iterator[tuple[str, torch.Tensor]]:
    offset = 0
    for meta in chunk:
        n = _nbytes(meta)
        yield meta.name, buffer[offset : offset + n].view(meta.dtype).view(meta.shape)
        offset += n


class GlooWeightTransferEngine(WeightTransferEngine[GlooWorkerInitInfo, GlooUpdateInfo]):
    """Worker side: receives chunks and loads them with the model's own `load_weights`."""

    init_info_cls = GlooWorkerInitInfo
    update_info_cls = GlooUpdateInfo

    def __init__(self, config, vllm_config, device, model) -> None:
        super().__init__(config, vllm_config, device, model)
        self.group = None
        self.chunk_bytes = DEFAULT_CHUNK_BYTES

    def init_transfer_engine(self, init_info: GlooWorkerInitInfo) -> None:
        # A new trainer replaces whatever group a previous (possibly dead) trainer left.
        self.shutdown()
        pc = self.parallel_config
        rank = init_info.rank_offset + pc.data_parallel_index * pc.world_size + pc.rank
        self.chunk_bytes = init_info.chunk_bytes
        self.group = _open_group(
            init_info.master_address,
            init_info.master_port,
            rank,
            init_info.world_size,
            init_info.timeout_s,
        )

    def start_weight_update(self) -> None:
        """Nothing to prepare: the model is only touched once every byte has arrived."""

    def finish_weight_update(self) -> None:
        """Nothing to finish: `update_weights` loads and post-processes in one step."""

    def update_weights(self, update_info: dict) -> None:
        # The base class ends with an accelerator sync, which has nothing to wait for on the
        # CPU (and raises there); gloo receives are complete when `wait()` returns.
        self.receive_weights(self.parse_update_info(update_info))

    def receive_weights(self, update_info: GlooUpdateInfo) -> None:
        """Receive every chunk first, then load: a trainer that dies mid-transfer leaves the
        old weights serving instead of a half-reloaded model (vLLM's layerwise reload moves
        layers to the meta device until they are complete)."""
        from vllm.model_executor.model_loader.reload import (
            finalize_layerwise_reload,
            initialize_layerwise_reload,
        )

        if self.group is None:
            raise RuntimeError("gloo weight transfer is not initialised: call init first")
        received: list[tuple[str, torch.Tensor]] = []
        for chunk in plan_chunks(update_info.metas(), self.chunk_bytes):
            buffer = torch.empty(sum(map(_nbytes, chunk)), dtype=torch.uint8)
            _broadcast(self.group, buffer)
            received.extend(_unpack(buffer.to(self.device), chunk))
        initialize_layerwise_reload(self.model)
        self.model.load_weights(received)
        finalize_layerwise_reload(self.model, self.model_config)

    def shutdown(self) -> None:
        if self.group is not None:
            from vllm.distributed.utils import stateless_destroy_torch_distributed_process_group

            try:
                stateless_destroy_torch_distributed_process_group(self.group)
            except Exception as e:  # a dead peer can make teardown fail; the group is gone anyway
                log.warning("closing the previous gloo group failed: %s", e)
            self.group = None


class GlooTrainerWeightTransferEngine(TrainerWeightTransferEngine[GlooTrainerInitInfo]):
    """Trainer side: rank 0 packs and broadcasts; the server's workers receive."""

    init_info_cls = GlooTrainerInitInfo

    def __init__(self, *, client, source, is_sender: bool = True, chunk_bytes: int) -> None:
        super().__init__(client=client, source=source, is_sender=is_sender)
        self.chunk_bytes = chunk_bytes
        self.group = None

    @classmethod
    def trainer_init(
        cls,
        init_info: GlooTrainerInitInfo,
        *,
        client: VLLMWeightSyncClient,
        source: WeightSource | None = None,
    ) -> Self:
        if source is None:
            raise ValueError("gloo weight transfer needs a WeightSource")
        engine = cls(
            client=client,
            source=source,
            is_sender=init_info.is_sender,
            chunk_bytes=init_info.chunk_bytes,
        )
        if not engine.is_sender:
            return engine
        worker_info = GlooWorkerInitInfo(
            master_address=init_info.master_address,
            master_port=init_info.master_port,
            rank_offset=1,
            world_size=init_info.world_size,
            chunk_bytes=init_info.chunk_bytes,
            timeout_s=init_info.timeout_s,
        )
        # The workers block in the rendezvous inside the HTTP call, so it runs beside ours.
        with ThreadPoolExecutor(max_workers=1) as pool:
            pending = pool.submit(client.init_weight_transfer_engine, asdict(worker_info))
            engine.group = _open_group(
                init_info.master_address,
                init_info.master_port,
                0,
                init_info.world_size,
                init_info.timeout_s,
            )
            pending.result()
        return engine

    def send_weights(self) -> None:
        assert self.source is not None
        metas = self.source.metadata()
        if not self.is_sender:
            for _ in self.source:  # stay in the trainer-side gather collectives
                pass
            return
        info = GlooUpdateInfo(
            names=[m.name for m in metas],
            dtype_names=[str(m.dtype).removeprefix("torch.") for m in metas],
            shapes=[list(m.shape) for m in metas],
        )
        self.client.start_weight_update()
        pool = ThreadPoolExecutor(max_workers=1)
        try:
            pending = pool.submit(self.client.update_weights, asdict(info))
            self._send_chunks(self._checked(self.source, metas), metas)
            pending.result()
        finally:
            # Never join a worker call that waits on a broadcast that will not come.
            pool.shutdown(wait=False)
        self.client.finish_weight_update()

    def _send_chunks(self, pairs: Iterable[tuple[str, torch.Tensor]], metas) -> None:
        it = iter(pairs)
        for chunk in plan_chunks(metas, self.chunk_bytes):
            parts = [next(it)[1].detach().to("cpu").contiguous().view(-1) for _ in chunk]
            buffer = torch.cat([p.view(torch.uint8) for p in parts])
            _broadcast(self.group, buffer)

    @staticmethod
    def _checked(
        source: WeightSource, metas: list[ParamMeta]
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """Fail loudly, naming the parameter, if iteration disagrees with the declared
        metadata: the worker cuts its buffers from the metadata and would load garbage."""
        count = 0
        for (name, tensor), meta in zip(source, metas, strict=True):
            if (name, tensor.dtype, tuple(tensor.shape)) != (meta.name, meta.dtype, meta.shape):
                raise ValueError(
                    f"weight source yielded {name} {tensor.dtype} {tuple(tensor.shape)} where "
                    f"metadata declared {meta.name} {meta.dtype} {meta.shape}"
                )
            count += 1
            yield name, tensor

    def shutdown(self) -> None:
        if self.group is not None:
            self.group.shutdown()
            self.group = None
