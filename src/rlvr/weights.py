"""Trainer side of the weight push into a running vf-vllm.

One object, `WeightSync`, hides the transports behind `connect()` and `push()`:
- `nccl`: vLLM's engine, for a server on other GPUs;
- `ipc`: vLLM's engine, for a server sharing the trainer's GPU (one-GPU users);
- `shm` and `gloo`: our `cpu` engine (rlvr.server.cpu_engine) for a server on the CPU, through
  shared memory on the same host or a gloo group across hosts;
- `auto`: `nccl` when the trainer has CUDA, else `shm` for a local server, else `gloo`.

`push()` pauses generation (requests in flight are kept, not aborted), streams the weights,
resets the prefix cache (cached KV was computed with the old weights) and resumes. Every HTTP
call has a timeout and raises with the server's own error text; resume runs even when the
transfer fails, so a failed push never leaves the server paused.
"""

from __future__ import annotations

import logging
import socket
import time
from typing import Any

import httpx
import torch
from vllm.distributed.weight_transfer.base import (
    ModuleSource,
    TrainerWeightTransferEngine,
    WeightSource,
)

log = logging.getLogger(__name__)

BACKENDS = ("auto", "shm", "gloo", "nccl", "ipc")
LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1", "0.0.0.0")


class ServerError(RuntimeError):
    """The server answered a control call with an error (its text is in the message)."""


def server_root(base_url: str) -> str:
    """Accept the OpenAI base URL (".../v1") as well as the server root."""
    url = base_url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


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
        return response.json() if response.content else {}

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


def resolve_backend(backend: str, base_url: str) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"unknown weight-transfer backend {backend!r}; choose one of {BACKENDS}")
    if backend != "auto":
        return backend
    if torch.cuda.is_available():
        return "nccl"
    host = httpx.URL(server_root(base_url)).host
    return "shm" if host in LOCAL_HOSTS else "gloo"


def _trainer_init_info(backend: str, host: str, chunk_bytes: int, timeout_s: float, rank: int):
    if backend in ("shm", "gloo"):
        from rlvr.server.cpu_engine import CPUTrainerInitInfo

        return CPUTrainerInitInfo(
            transport=backend,
            master_address=host,
            master_port=free_port(host) if backend == "gloo" else 0,
            chunk_bytes=chunk_bytes,
            timeout_s=timeout_s,
            rank=rank,
        )
    if backend == "nccl":
        from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

        return NCCLTrainerInitInfo(
            master_address=host, master_port=free_port(host), world_size=2, rank=rank
        )
    from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerInitInfo

    return IPCTrainerInitInfo(rank=rank)


class WeightSync:
    """Connects a trainer's weights to one vf-vllm and pushes them on demand.

    `source` is anything vLLM's `WeightSource` describes (`ModuleSource(model)` for a plain
    model; the trainer passes a merged-LoRA source). It is re-iterated on every push, so the
    server always receives the current values.

    With several trainer ranks, every rank creates a WeightSync with its `rank` and calls
    `connect`/`push` together: rank 0 talks to the server and sends; the others only iterate
    the source, taking part in the gathers (ZeRO-3) that materialise each parameter.
    """

    def __init__(
        self,
        base_url: str,
        backend: str = "auto",
        api_key: str | None = None,
        timeout_s: float = 300.0,
        transfer_timeout_s: float = 120.0,
        master_address: str = "127.0.0.1",
        chunk_bytes: int = 256 * 1024 * 1024,
        rank: int = 0,
    ):
        self.backend = resolve_backend(backend, base_url)
        self.control = ServerControl(base_url, api_key=api_key, timeout_s=timeout_s)
        self.transfer_timeout_s = transfer_timeout_s
        self.master_address = master_address
        self.chunk_bytes = chunk_bytes
        self.rank = rank
        self.engine: TrainerWeightTransferEngine | None = None
        self.version = 0

    def connect(self, source: WeightSource | torch.nn.Module) -> None:
        """Handshake with the server. A server left paused by a trainer that died is resumed."""
        from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory

        from rlvr.server.plugin import register

        register()
        if isinstance(source, torch.nn.Module):
            source = ModuleSource(source)
        if self.rank == 0:
            self.control.resume()
            if self.backend in ("shm", "gloo"):
                self._end_abandoned_update()
        info = _trainer_init_info(
            self.backend, self.master_address, self.chunk_bytes, self.transfer_timeout_s, self.rank
        )
        self.engine = WeightTransferTrainerFactory.trainer_init(
            info, client=self.control, source=source
        )

    def _end_abandoned_update(self) -> None:
        """Close an update session a dead trainer opened but never finished: vLLM refuses to
        start a new one while the old is open. Safe with our cpu engine only, which touches
        the model in `update_weights` alone (vLLM's engines may have begun a layerwise reload
        at start, and finishing that would serve half-loaded weights)."""
        try:
            self.control.finish_weight_update()
        except ServerError as e:
            if "without a matching start_weight_update" not in str(e):
                raise
        else:
            log.warning("closed a weight update that an earlier trainer left open")

    def push(self) -> float:
        """Send the current weights; returns the seconds the server was paused."""
        if self.engine is None:
            raise RuntimeError("WeightSync.push() before connect()")
        start = time.perf_counter()
        if self.rank != 0:
            self.engine.send_weights()
            self.version += 1
            return time.perf_counter() - start
        self.control.pause()
        try:
            self.engine.send_weights()
            self.control.reset_prefix_cache()
        finally:
            self.control.resume()
        self.version += 1
        return time.perf_counter() - start

    def close(self) -> None:
        if self.engine is not None:
            self.engine.shutdown()
            self.engine = None
        self.control.close()

    def __enter__(self) -> WeightSync:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
