"""Trainer side of the weight push into a running vf-vllm.

One object, `WeightSync`, hides the transports behind `connect()` and `push()`:
- `nccl`: vLLM's engine, for a server on other GPUs;
- `ipc`: vLLM's engine, for a server sharing the trainer's GPU (one-GPU users);
- `shm` and `gloo`: our `cpu` engine (rlvr.server.cpu_engine) for a server on the CPU, through
  shared memory on the same host or a gloo group across hosts;
- `auto`: on a CUDA trainer `ipc` when the server runs on the same GPU, else `nccl`; on the
  CPU `shm` for a local server, else `gloo`.

`push()` pauses generation (requests in flight are kept, not aborted), streams the weights,
resets the prefix cache (cached KV was computed with the old weights) and resumes. Every HTTP
call has a timeout and raises with the server's own error text; resume runs even when the
transfer fails, so a failed push never leaves the server paused.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import httpx
import torch
from vllm.distributed.weight_transfer.base import (
    ModuleSource,
    ParamMeta,
    TrainerWeightTransferEngine,
    WeightSource,
)

from rlvr.weight_sync.rendezvous import LOOPBACK, Meeting, plan_meeting, with_deadline

log = logging.getLogger(__name__)

BACKENDS = ("auto", "shm", "gloo", "nccl", "ipc")


class ServerError(RuntimeError):
    """The server answered a control call with an error (its text is in the message)."""


def server_root(base_url: str) -> str:
    """Accept the OpenAI base URL (".../v1") as well as the server root."""
    url = base_url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


class ServerControl:
    """The control-plane routes of vf-vllm (vLLM's RL routes), with timeouts and clear errors.

    Also satisfies vLLM's `VLLMWeightSyncClient` protocol, so vLLM's own trainer engines drive
    their handshakes through it.
    """

    def __init__(self, base_url: str, api_key: str | None = None, timeout_s: float = 300.0):
        self.root = server_root(base_url)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # No keep-alive: a connection idle for uvicorn's 5 s keep-alive timeout may be closed
        # by the server just as the next call reuses it ("Server disconnected without sending
        # a response"). Control calls are a handful per step; a fresh connection costs ~1 ms.
        self.http = httpx.Client(
            base_url=self.root,
            headers=headers,
            timeout=timeout_s,
            limits=httpx.Limits(max_keepalive_connections=0),
        )

    def post(self, path: str, json: Any = None, params: dict | None = None) -> dict:
        try:
            response = self.http.post(path, json=json, params=params)
        except httpx.HTTPError as e:
            raise ServerError(f"POST {self.root}{path} failed: {e!r}") from e
        if response.status_code >= 400:
            raise ServerError(
                f"POST {self.root}{path} -> {response.status_code}: {response.text[:2000]}"
            )
        if "json" not in response.headers.get("content-type", ""):
            return {"text": response.text}  # e.g. /v1/load_lora_adapter answers in plain text
        return response.json()

    def get(self, path: str, params: dict | None = None) -> dict:
        try:
            response = self.http.get(path, params=params)
        except httpx.HTTPError as e:
            raise ServerError(f"GET {self.root}{path} failed: {e!r}") from e
        if response.status_code >= 400:
            raise ServerError(
                f"GET {self.root}{path} -> {response.status_code}: {response.text[:2000]}"
            )
        return response.json()

    def worker_rpc(self, method: str, kwargs: dict[str, str] | None = None) -> list[Any]:
        """Every worker's answer to vf-vllm's worker-extension `method`
        (rlvr.server.worker_extension); vLLM passes only string arguments."""
        body = {"method": method, "kwargs": kwargs or {}}
        return self.post("/collective_rpc", json=body)["results"]

    def vllm_config(self) -> dict[str, Any]:
        """The server's vLLM config as JSON ({} when it does not describe it)."""
        try:
            config = self.get("/server_info", params={"config_format": "json"})["vllm_config"]
        except (ServerError, KeyError, TypeError) as e:
            log.info("the server does not describe its configuration (%s)", e)
            return {}
        return config if isinstance(config, dict) else {}

    def tokenizer_mode(self) -> str | None:
        """The server's `--tokenizer-mode` (None when it does not say)."""
        model = self.vllm_config().get("model_config")
        return model.get("tokenizer_mode") if isinstance(model, dict) else None

    def logprobs_mode(self) -> str | None:
        """The server's `--logprobs-mode` (None when it does not say)."""
        model = self.vllm_config().get("model_config")
        return model.get("logprobs_mode") if isinstance(model, dict) else None

    def max_lora_rank(self) -> int | None:
        """The largest adapter rank the server can load at run time, or None when it cannot
        load adapters (started without --enable-lora, or without runtime loading)."""
        lora = self.vllm_config().get("lora_config")
        if not lora or not self.get("/openapi.json").get("paths", {}).get("/v1/load_lora_adapter"):
            return None
        return int(lora["max_lora_rank"])

    def gpu_uuids(self) -> list[str] | None:
        """UUIDs of the GPUs the server's workers run on (None when the server cannot say,
        e.g. a plain vLLM without vf-vllm's worker extension)."""
        try:
            results = self.worker_rpc("rlvr_device_info")
        except (ServerError, KeyError, TypeError) as e:
            log.info("the server does not report its GPUs (%s); assuming other GPUs", e)
            return None
        return [r["gpu_uuid"] for r in results if isinstance(r, dict) and r.get("gpu_uuid")]

    def world_size(self) -> int:
        """The server's workers across tensor, pipeline and data parallelism: each joins the
        weight-transfer group."""
        return int(self.get("/get_world_size", params={"include_dp": "true"})["world_size"])

    def health(self) -> bool:
        try:
            return self.http.get("/health", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    def pause(self) -> None:
        self.post("/pause", params={"mode": "keep"})

    def resume(self) -> None:
        self.post("/resume")

    def reset_prefix_cache(self) -> None:
        self.post("/reset_prefix_cache", params={"reset_running_requests": "true"})

    # vLLM's VLLMWeightSyncClient protocol
    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        self.post("/init_weight_transfer_engine", json={"init_info": init_info})

    def start_weight_update(self) -> None:
        self.post("/start_weight_update")

    def update_weights(self, update_info) -> None:
        from vllm.distributed.weight_transfer.clients import _json_safe_update_payload

        self.post("/update_weights", json={"update_info": _json_safe_update_payload(update_info)})

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        body = {"weight_version": weight_version} if weight_version is not None else None
        self.post("/finish_weight_update", json=body)

    def close(self) -> None:
        self.http.close()


def resolve_backend(backend: str, base_url: str, server_gpus: list[str] | None = None) -> str:
    """The transfer for `backend=auto`: on a CUDA trainer, `ipc` when the server's workers run
    on this very GPU (CUDA IPC handles only open on the GPU that made them; NCCL between two
    processes on one GPU fails), else `nccl`; on the CPU, `shm` for a server on this host,
    else `gloo`. `server_gpus` are the GPU UUIDs the server's workers report (None: unknown)."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown weight-transfer backend {backend!r}; choose one of {BACKENDS}")
    if backend != "auto":
        return backend
    if torch.cuda.is_available():
        mine = str(torch.cuda.get_device_properties(torch.cuda.current_device()).uuid)
        return "ipc" if server_gpus and mine in server_gpus else "nccl"
    host = httpx.URL(server_root(base_url)).host
    return "shm" if host in LOOPBACK else "gloo"


def server_host(base_url: str) -> str:
    return httpx.URL(server_root(base_url)).host


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


def as_weight_source(source: Any) -> WeightSource:
    """What vLLM's trainer engines take: a module's parameters, or any of our sources."""
    if isinstance(source, WeightSource):
        return source
    if isinstance(source, torch.nn.Module):
        return ModuleSource(source)
    return _Adapted(source)


class WeightSync:
    """Connects a trainer's weights to one vf-vllm and pushes them on demand.

    `source` is anything vLLM's `WeightSource` describes (`ModuleSource(model)` for a plain
    model; the trainer passes a merged-LoRA source). It is re-iterated on every push, so the
    server always receives the current values.

    With several trainer ranks, every rank creates a WeightSync with its `rank` and calls
    `connect`/`push` together: rank 0 talks to the server and sends; the others only iterate
    the source, taking part in the gathers (ZeRO-3) that materialise each parameter. Rank 0
    picks the transfer (`resolve()`) and hands it to the others (`connect(backend=...)`).

    For the network transfers (gloo, nccl) rank 0 hosts the rendezvous on `transfer_host`
    (default: its own address on the route to the server) and sizes the group from the
    server's reported workers; see `rlvr.weight_sync.rendezvous`.
    """

    def __init__(
        self,
        base_url: str,
        backend: str = "auto",
        api_key: str | None = None,
        timeout_s: float = 300.0,
        transfer_timeout_s: float = 120.0,
        transfer_host: str | None = None,
        transfer_port: int = 0,
        chunk_bytes: int = 256 * 1024 * 1024,
        rank: int = 0,
    ):
        if backend not in BACKENDS:
            raise ValueError(
                f"unknown weight-transfer backend {backend!r}; choose one of {BACKENDS}"
            )
        self.control = ServerControl(base_url, api_key=api_key, timeout_s=timeout_s)
        self.base_url = base_url
        self.requested_backend = backend
        self.backend: str | None = None
        self.transfer_timeout_s = transfer_timeout_s
        self.transfer_host = transfer_host
        self.transfer_port = transfer_port
        self.chunk_bytes = chunk_bytes
        self.rank = rank
        self.engine: TrainerWeightTransferEngine | None = None
        self.meeting: Meeting | None = None
        """Where the gloo/nccl rendezvous took place (rank 0; None for shm/ipc)."""
        self.version = -1
        """The weight version of the last push (-1: none yet)."""

    def resolve(self) -> str:
        """The transfer this trainer uses (asked of the server when `auto` on a CUDA trainer
        must choose between ipc and nccl)."""
        gpus = None
        if self.requested_backend == "auto" and torch.cuda.is_available():
            gpus = self.control.gpu_uuids()
        return resolve_backend(self.requested_backend, self.base_url, gpus)

    def connect(self, source: Any, backend: str | None = None) -> None:
        """Handshake with the server. A server left paused by a trainer that died is resumed.

        `source`: a module (its parameters are sent), a vLLM `WeightSource`, or any object
        with `metadata()` and iteration such as `rlvr.weight_sync.merged_stream.MergedWeightSource`.
        `backend`: the transfer rank 0 resolved (required on the other ranks, which never talk to
        the server)."""
        from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory

        from rlvr.server.plugin import register

        register()
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
            (self.engine,) = with_deadline(meeting, "the NCCL weight-transfer rendezvous",
                                           [handshake])  # fmt: skip
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

    def push(self, version: int | None = None) -> float:
        """Send the current weights as weight `version` (default: one more than the last
        push); returns the seconds the server was paused."""
        if self.engine is None:
            raise RuntimeError("WeightSync.push() before connect()")
        start = time.perf_counter()
        if self.rank == 0:
            self.control.pause()
            try:
                self.engine.send_weights()
                self.control.reset_prefix_cache()
            finally:
                self.control.resume()
        else:
            self.engine.send_weights()
        self.version = self.version + 1 if version is None else version
        return time.perf_counter() - start

    def release(self, in_use: Iterable[int]) -> None:
        """Nothing to release: a merged push replaces the served weights (the adapter sync's
        counterpart unloads old versions)."""

    def close(self) -> None:
        if self.engine is not None:
            self.engine.shutdown()
            self.engine = None
        self.control.close()

    def __enter__(self) -> WeightSync:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def push_adapter(base_url: str, model: str, adapter: str | Path) -> float:
    """Push `model` (a name `rlvr.model.names.resolve_model` knows) + the saved LoRA `adapter`,
    merged, into the vf-vllm at `base_url`; returns the push's seconds.

    This is what a LoRA GRPO run resuming from `adapter` sends on its first push, so a warm
    start (an SFT adapter) is evaluated exactly as GRPO will start from it."""
    from transformers import AutoModelForCausalLM

    from rlvr.config import LoraConfig
    from rlvr.model.names import resolve_model
    from rlvr.model.policy import apply_lora
    from rlvr.weight_sync.merged_stream import MergedWeightSource

    base = AutoModelForCausalLM.from_pretrained(resolve_model(model), dtype=torch.float32)
    policy = apply_lora(base, LoraConfig(resume_from=str(adapter)))
    with WeightSync(base_url) as sync:
        sync.connect(MergedWeightSource(policy))
        return sync.push()
