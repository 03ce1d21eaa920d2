"""Merged-weight pushes into a running vf-vllm (`MergedPush`) over `nccl`, `ipc`, `shm` or
`gloo` (`auto` picks). `push()` pauses generation (requests kept), streams the weights, resets
the prefix cache and resumes; resume runs even when the transfer fails, and every HTTP call has
a timeout. Design: docs/weight-transfer.md#routes-and-backends.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import torch
from vllm.distributed.weight_transfer.base import (
    ModuleSource,
    ParamMeta,
    TrainerWeightTransferEngine,
    WeightSource,
)

from rlvr.weight_sync.base import WeightPush
from rlvr.weight_sync.control import ServerControl, server_host
from rlvr.weight_sync.exact_check import ExactCheck
from rlvr.weight_sync.fingerprint import Verified, aliases
from rlvr.weight_sync.rendezvous import LOOPBACK, Meeting, plan_meeting, with_deadline

log = logging.getLogger(__name__)

BACKENDS = ("auto", "shm", "gloo", "nccl", "ipc")


def check_backend(backend: str) -> None:
    """Raise ValueError for a transfer that is not one of `BACKENDS`."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown weight-transfer backend {backend!r}; choose one of {BACKENDS}")


def resolve_backend(backend: str, base_url: str, server_gpus: list[str] | None = None) -> str:
    """The transfer for `backend=auto`: on a CUDA trainer, `ipc` when the server's workers run
    on this very GPU (CUDA IPC handles only open on the GPU that made them; NCCL between two
    processes on one GPU fails), else `nccl`; on the CPU, `shm` for a server on this host,
    else `gloo`. `server_gpus` are the GPU UUIDs the server's workers report (None: unknown)."""
    check_backend(backend)
    if backend != "auto":
        return backend
    if torch.cuda.is_available():
        mine = str(torch.cuda.get_device_properties(torch.cuda.current_device()).uuid)
        return "ipc" if server_gpus and mine in server_gpus else "nccl"
    return "shm" if server_host(base_url) in LOOPBACK else "gloo"


# CUDA IPC in bounded buckets: vLLM's unpacked mode keeps every parameter's shared copy alive
# until the whole update ends (a second copy of the model on the GPU).
IPC_BUCKET_BYTES = 512 * 1024 * 1024


def _trainer_init_info(backend: str, meeting: Meeting | None, chunk_bytes: int, rank: int):
    """vLLM's trainer-side init info for `backend`; `meeting` is None on non-sending ranks
    (they only take part in the trainer-side gathers) and for the same-host transfers."""
    if backend in ("shm", "gloo"):
        from rlvr.server.cpu_engine import CPUTrainerInitInfo

        where = {}
        if meeting is not None:
            where = dict(
                master_address=meeting.master_address,
                master_port=meeting.master_port,
                world_size=meeting.world_size,
                timeout_s=meeting.timeout_s,
                server=meeting.server,
            )
        return CPUTrainerInitInfo(transport=backend, chunk_bytes=chunk_bytes, rank=rank, **where)
    if backend == "nccl":
        from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

        if meeting is None:  # a non-sending rank: never opens the group
            return NCCLTrainerInitInfo(master_address="", master_port=0, world_size=0, rank=rank)
        return NCCLTrainerInitInfo(
            master_address=meeting.master_address,
            master_port=meeting.master_port,
            world_size=meeting.world_size,
            rank=rank,
        )
    from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerInitInfo

    return IPCTrainerInitInfo(rank=rank, packed=True, packed_buffer_size_bytes=IPC_BUCKET_BYTES)


class _Adapted(WeightSource):
    """vLLM's `WeightSource` over one of ours (`metadata()` of name/dtype/shape records and
    iteration; e.g. `rlvr.weight_sync.merged_stream.MergedWeightSource`, which does not import
    vLLM)."""

    def __init__(self, inner: Any):
        self.inner = inner

    def metadata(self) -> list[ParamMeta]:
        return [ParamMeta(m.name, m.dtype, tuple(m.shape)) for m in self.inner.metadata()]

    def __iter__(self):
        return iter(self.inner)


def tied_names(source: Any) -> dict[str, str]:
    """A source's tied parameters: other name -> the name it streams under."""
    if isinstance(source, torch.nn.Module):
        return aliases(source)
    return dict(getattr(source, "tied", {}))


def as_weight_source(source: Any) -> WeightSource:
    """What vLLM's trainer engines take: a module's parameters, or any of our sources."""
    if isinstance(source, WeightSource):
        return source
    if isinstance(source, torch.nn.Module):
        return ModuleSource(source)
    return _Adapted(source)


class MergedPush(WeightPush):
    """Pushes a trainer's whole weights into one vf-vllm, which serves every version under
    `served_model`. The source is re-iterated on every push. Every rank calls `connect`/`push`
    together: rank 0 talks to the server and sends, the others only join the ZeRO-3 gathers;
    rank 0 picks the transfer (`resolve()`) and hands it to them (`connect(backend=...)`)."""

    def __init__(
        self,
        base_url: str,
        served_model: str,
        backend: str = "auto",
        api_key: str | None = None,
        timeout_s: float = 300.0,
        transfer_timeout_s: float = 120.0,
        transfer_host: str | None = None,
        transfer_port: int = 0,
        chunk_bytes: int = 256 * 1024 * 1024,
        rank: int = 0,
        exact_check: bool = True,
    ):
        check_backend(backend)
        self.control = ServerControl(base_url, api_key=api_key, timeout_s=timeout_s)
        self.base_url = base_url
        self.served_model = served_model
        self.requested_backend = backend
        self.backend: str | None = None
        """The transfer in use, once connected (`resolve()` on rank 0)."""
        self.transfer_timeout_s = transfer_timeout_s
        self.transfer_host = transfer_host
        self.transfer_port = transfer_port
        self.chunk_bytes = chunk_bytes
        self.rank = rank
        self.engine: TrainerWeightTransferEngine | None = None
        self.meeting: Meeting | None = None
        """Where the gloo/nccl rendezvous took place (rank 0; None for shm/ipc)."""
        self.exact_check = exact_check
        self.check: ExactCheck | None = None
        """The exact check of every push (rank 0; None where it is off or impossible)."""
        self.verified: Verified | None = None
        """The last push's exact check (rank 0)."""

    def resolve(self) -> str:
        """The transfer this trainer uses (asked of the server when `auto` on a CUDA trainer
        must choose between ipc and nccl)."""
        gpus = None
        if self.requested_backend == "auto" and torch.cuda.is_available():
            gpus = self.control.gpu_uuids()
        return resolve_backend(self.requested_backend, self.base_url, gpus)

    def connect(self, source: Any, backend: str | None = None) -> None:
        """Handshake with the server (one left paused by a dead trainer is resumed). `source`:
        a module, a vLLM `WeightSource` or a `MergedWeightSource`; `backend`: the transfer rank
        0 resolved (required on the other ranks)."""
        from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory

        from rlvr.server.plugin import register

        register()
        tied = tied_names(source)
        source = as_weight_source(source)
        if self.rank != 0:
            if backend is None:
                raise ValueError("ranks other than 0 need rank 0's resolved backend")
            self.backend = backend
            info = _trainer_init_info(backend, None, self.chunk_bytes, self.rank)
            self.engine = WeightTransferTrainerFactory.trainer_init(
                info, client=self.control, source=source
            )
            return
        self.backend = backend or self.resolve()
        self.control.resume()
        if self.exact_check:
            names = [m.name for m in source.metadata()]
            self.check = ExactCheck.start(self.control, names, tied)
        if self.check is not None:
            source = self.check.tap(source)
        if self.backend in ("shm", "gloo"):
            self._end_abandoned_update()
        meeting = None
        if self.backend in ("gloo", "nccl"):
            meeting = self.meeting = plan_meeting(
                server_host(self.base_url),
                self.control.world_size(),
                self.transfer_timeout_s,
                self.transfer_host,
                self.transfer_port,
            )
            log.info("weight transfer (%s): %s", self.backend, meeting.describe())
        info = _trainer_init_info(self.backend, meeting, self.chunk_bytes, self.rank)

        def handshake() -> TrainerWeightTransferEngine:
            return WeightTransferTrainerFactory.trainer_init(
                info, client=self.control, source=source
            )

        if self.backend == "nccl":  # vLLM's engine has no deadline of its own; ours does
            (self.engine,) = with_deadline(
                meeting, "the NCCL weight-transfer rendezvous", [handshake]
            )
        else:
            self.engine = handshake()

    def _end_abandoned_update(self) -> None:
        """Close an update session a dead trainer opened but never finished: vLLM refuses to
        start a new one while the old is open. Safe with our cpu engine only, which touches
        the model in `update_weights` alone (vLLM's engines may have begun a layerwise reload
        at start, and finishing that would serve half-loaded weights)."""
        states = self.control.worker_rpc("rlvr_weight_update_state")
        if any(isinstance(s, dict) and s.get("active") for s in states):
            self.control.finish_weight_update()
            log.warning("closed a weight update that an earlier trainer left open")

    def push(self, version: int) -> float:
        """Send the current weights as weight `version` (served under `served_model`, like
        every version) and, on rank 0, check exactly what the server holds (`verified`: the
        caller decides what a mismatch costs); returns the seconds of the push and check."""
        if self.engine is None:
            raise RuntimeError("MergedPush.push() before connect()")
        start = time.perf_counter()
        self.verified = None
        if self.rank == 0:
            self.control.pause()
            try:
                self.engine.send_weights()
                self.control.reset_prefix_cache()
            finally:
                self.control.resume()
            if self.check is not None:
                self.verified = self.check.verify(version)
        else:
            self.engine.send_weights()
        return time.perf_counter() - start

    def served_name(self, version: int) -> str:
        """`served_model`, whatever the version: the server holds only the newest weights."""
        return self.served_model

    def disconnect(self) -> None:
        """Shut the transfer engine down; the server's `control` stays open (an adapter push
        goes on using it after a QLoRA run's one base push)."""
        if self.engine is not None:
            self.engine.shutdown()
            self.engine = None

    def close(self) -> None:
        """Shut the transfer engine down and close the connection."""
        self.disconnect()
        self.control.close()


def push_merged_adapter(base_url: str, model: str, adapter: str | Path) -> float:
    """Push `model` + the saved LoRA `adapter`, merged, into the vf-vllm at `base_url` (what a
    LoRA GRPO run resuming from `adapter` sends first; a QLoRA adapter goes onto its
    dequantized base, as it trained); returns the push's seconds."""
    from rlvr.config import LoraConfig
    from rlvr.model.merge import adapter_base_quantization, load_trained_base
    from rlvr.model.names import resolve_model
    from rlvr.model.policy import apply_lora
    from rlvr.weight_sync.merged_stream import MergedWeightSource

    path = resolve_model(model)
    base = load_trained_base(path, adapter_base_quantization(adapter), torch.float32)
    policy = apply_lora(base, LoraConfig(resume_from=str(adapter)))
    with MergedPush(base_url, model) as weights:
        weights.connect(MergedWeightSource(policy))
        return weights.push(0)
