"""`cpu`: a weight-transfer backend for vLLM on machines without CUDA, over `shm` (one
shared-memory file, same host) or `gloo` (packed chunks over a gloo group with timeouts, any
host). The worker loads only once every byte is local, so a failed push leaves the old weights
serving. Design: docs/weight-transfer.md#weight-transfer-engine.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import ClassVar, Self

import torch
from vllm.distributed.weight_transfer.base import (
    TrainerInitInfo,
    TrainerWeightTransferEngine,
    VLLMWeightSyncClient,
    WeightSource,
    WeightTransferEngine,
    WeightTransferInitInfo,
)

from rlvr.server.packing import (
    PackedUpdateInfo,
    checked,
    load_atomically,
    nbytes,
    pack_into,
    plan_chunks,
    unpack,
)
from rlvr.weight_sync.rendezvous import GlooGroup, Meeting, with_deadline

# Under vLLM's logger, so the lines show in the server log.
log = logging.getLogger("vllm.rlvr_cpu_engine")

BACKEND = "cpu"
TRANSPORTS = ("shm", "gloo")
DEFAULT_CHUNK_BYTES = 256 * 1024 * 1024
DEFAULT_TIMEOUT_S = 120.0
DEFAULT_SHM_DIR = "/dev/shm"


@dataclass
class CPUWorkerInitInfo(WeightTransferInitInfo):
    """Handshake sent to the workers over HTTP (JSON)."""

    transport: str
    directory: str | None = None  # shm: the only folder the worker reads weight files from
    master_address: str | None = None  # gloo rendezvous (hosted by the trainer, rank 0)
    master_port: int | None = None
    rank_offset: int = 1
    world_size: int = 2
    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    timeout_s: float = DEFAULT_TIMEOUT_S

    def __post_init__(self) -> None:
        if self.transport not in TRANSPORTS:
            raise ValueError(f"transport must be one of {TRANSPORTS}, got {self.transport!r}")
        if self.transport == "shm" and not self.directory:
            raise ValueError("the shm transport needs a directory")
        if self.transport == "gloo" and (self.master_address is None or self.master_port is None):
            raise ValueError("the gloo transport needs master_address and master_port")


@dataclass
class CPUTrainerInitInfo(TrainerInitInfo):
    backend: ClassVar[str] = BACKEND
    transport: str = "shm"
    directory: str = DEFAULT_SHM_DIR
    master_address: str = "127.0.0.1"
    master_port: int = 0
    world_size: int = 2
    """1 (this trainer) + the server's TP x PP x DP workers."""
    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    timeout_s: float = DEFAULT_TIMEOUT_S
    server: str = "127.0.0.1"
    """The server's address as the trainer sees it (named in rendezvous errors)."""


@dataclass
class CPUUpdateInfo(PackedUpdateInfo):
    path: str | None = None  # shm: the file holding this push's bytes


class CPUWeightTransferEngine(WeightTransferEngine[CPUWorkerInitInfo, CPUUpdateInfo]):
    """Worker side."""

    init_info_cls = CPUWorkerInitInfo
    update_info_cls = CPUUpdateInfo

    def __init__(self, config, vllm_config, device, model) -> None:
        super().__init__(config, vllm_config, device, model)
        self.info: CPUWorkerInitInfo | None = None
        self.group = None

    def init_transfer_engine(self, init_info: CPUWorkerInitInfo) -> None:
        # A new trainer replaces whatever a previous (possibly dead) trainer left.
        self.shutdown()
        if init_info.transport == "gloo":
            pc = self.parallel_config
            rank = init_info.rank_offset + pc.data_parallel_index * pc.world_size + pc.rank
            self.group = GlooGroup(
                init_info.master_address,
                init_info.master_port,
                rank,
                init_info.world_size,
                init_info.timeout_s,
            )
        elif not Path(init_info.directory).is_dir():
            raise ValueError(f"shm directory {init_info.directory} does not exist on the server")
        self.info = init_info

    def start_weight_update(self) -> None:
        """Nothing to prepare: the model is only touched once every byte is local."""

    def finish_weight_update(self) -> None:
        """Nothing to finish: `update_weights` loads and post-processes in one step."""

    def update_weights(self, update_info: dict) -> None:
        # The base class ends with an accelerator sync, which has nothing to wait for on the
        # CPU (and raises there).
        self.receive_weights(self.parse_update_info(update_info))

    def receive_weights(self, update_info: CPUUpdateInfo) -> None:
        if self.info is None:
            raise RuntimeError("cpu weight transfer is not initialised: call init first")
        start = time.perf_counter()
        metas = update_info.metas()
        if self.info.transport == "shm":
            weights = list(unpack(self._map_file(update_info, metas), metas))
        else:
            weights = self._receive_chunks(metas)
        arrived = time.perf_counter()
        load_atomically(self.model, self.model_config, weights)
        log.info(
            "weight update (%s): %d tensors arrived in %.2fs, loaded in %.2fs",
            self.info.transport,
            len(weights),
            arrived - start,
            time.perf_counter() - arrived,
        )

    def _map_file(self, update_info: CPUUpdateInfo, metas) -> torch.Tensor:
        assert self.info is not None and self.info.directory is not None
        if update_info.path is None:
            raise ValueError("shm update without a file path")
        path = Path(update_info.path).resolve()
        if path.parent != Path(self.info.directory).resolve():
            raise ValueError(f"{path} is outside the agreed directory {self.info.directory}")
        total = sum(map(nbytes, metas))
        if not path.is_file() or path.stat().st_size < total:
            raise ValueError(f"{path} is missing or smaller than the {total} bytes declared")
        return torch.from_file(str(path), shared=False, size=total, dtype=torch.uint8)

    def _receive_chunks(self, metas) -> list[tuple[str, torch.Tensor]]:
        assert self.info is not None
        weights: list[tuple[str, torch.Tensor]] = []
        for chunk in plan_chunks(metas, self.info.chunk_bytes):
            buffer = torch.empty(sum(map(nbytes, chunk)), dtype=torch.uint8)
            self.group.broadcast(buffer)
            weights.extend(unpack(buffer, chunk))
        return weights

    def shutdown(self) -> None:
        if self.group is not None:
            self.group.close()
            self.group = None
        self.info = None


class CPUTrainerWeightTransferEngine(TrainerWeightTransferEngine[CPUTrainerInitInfo]):
    """Trainer side: rank 0 packs the source's tensors and drives the worker's update."""

    init_info_cls = CPUTrainerInitInfo

    def __init__(self, *, client, source, is_sender: bool, info: CPUTrainerInitInfo) -> None:
        super().__init__(client=client, source=source, is_sender=is_sender)
        self.info = info
        self.group = None
        self.path: Path | None = None
        self.buffer: torch.Tensor | None = None

    @classmethod
    def trainer_init(
        cls,
        init_info: CPUTrainerInitInfo,
        *,
        client: VLLMWeightSyncClient,
        source: WeightSource | None = None,
    ) -> Self:
        if source is None:
            raise ValueError("cpu weight transfer needs a WeightSource")
        engine = cls(client=client, source=source, is_sender=init_info.is_sender, info=init_info)
        if not engine.is_sender:
            return engine
        shm = init_info.transport == "shm"
        worker_info = CPUWorkerInitInfo(
            transport=init_info.transport,
            directory=init_info.directory if shm else None,
            master_address=None if shm else init_info.master_address,
            master_port=None if shm else init_info.master_port,
            chunk_bytes=init_info.chunk_bytes,
            timeout_s=init_info.timeout_s,
            world_size=init_info.world_size,
        )
        if shm:
            name = f"rlvr-weights-{os.getpid()}-{uuid.uuid4().hex}"
            engine.path = Path(init_info.directory) / name
            client.init_weight_transfer_engine(asdict(worker_info))
            return engine
        # The workers block in the rendezvous inside the HTTP call, so both sides run at once.
        meeting = Meeting(
            init_info.master_address,
            init_info.master_port,
            init_info.world_size,
            init_info.server,
            init_info.timeout_s,
        )
        _, engine.group = with_deadline(
            meeting,
            "the gloo weight-transfer rendezvous",
            [
                lambda: client.init_weight_transfer_engine(asdict(worker_info)),
                lambda: GlooGroup(
                    init_info.master_address,
                    init_info.master_port,
                    0,
                    init_info.world_size,
                    init_info.timeout_s,
                    local_address=init_info.master_address,
                ),
            ],
        )
        return engine

    def send_weights(self) -> None:
        assert self.source is not None
        metas = self.source.metadata()
        if not self.is_sender:
            for _ in self.source:  # stay in the trainer-side gather collectives
                pass
            return
        tensors = checked(self.source, metas)
        self.client.start_weight_update()
        if self.info.transport == "shm":
            self._write_file(tensors, sum(map(nbytes, metas)))
            info = CPUUpdateInfo.from_metas(metas, path=str(self.path))
            self.client.update_weights(asdict(info))
        else:
            self._broadcast_chunks(tensors, metas)
        self.client.finish_weight_update()

    def _write_file(self, tensors, total: int) -> None:
        """Pack straight into a shared-memory file, reused across pushes."""
        if self.buffer is None or self.buffer.numel() != total:
            assert self.path is not None
            self.path.unlink(missing_ok=True)
            self.buffer = torch.from_file(
                str(self.path), shared=True, size=total, dtype=torch.uint8
            )
        pack_into(self.buffer, tensors)

    def _broadcast_chunks(self, tensors, metas) -> None:
        pool = ThreadPoolExecutor(max_workers=1)
        info = CPUUpdateInfo.from_metas(metas)
        try:
            pending = pool.submit(self.client.update_weights, asdict(info))
            for chunk in plan_chunks(metas, self.info.chunk_bytes):
                buffer = torch.empty(sum(map(nbytes, chunk)), dtype=torch.uint8)
                pack_into(buffer, (next(tensors) for _ in chunk))
                self.group.broadcast(buffer)
            pending.result()
        finally:
            # Never join a worker call that waits on a broadcast that will not come.
            pool.shutdown(wait=False)

    def shutdown(self) -> None:
        if self.group is not None:
            self.group.close()
            self.group = None
        self.buffer = None
        if self.path is not None:
            self.path.unlink(missing_ok=True)
