"""Adapter sync: after each step, push the trained LoRA adapter (megabytes) into vf-vllm, which
serves it on top of its own frozen base model, instead of streaming the whole merged model.

The base model's name keeps serving the frozen base and the adapter's name (`server.adapter_name`)
serves the policy, from one server: a frozen helper (vf_planner's worker) can share the policy's
server. A push writes the adapter in PEFT format to a new directory and asks vLLM to load it in
place under the same name (`/v1/load_lora_adapter`, `load_inplace`), with generation paused and
the prefix cache reset as for a merged push:

- same host: the directory is in shared memory (/dev/shm), so "writing" is a memory copy;
- another host: the adapter's bytes travel in the HTTP request to vf-vllm's worker extension
  (`rlvr_store_adapter`), which writes them to the server's own shared memory. No shared file
  system and no transfer group are needed: an adapter is a few megabytes.

A trainer that dies mid-push leaves the previous adapter serving: vLLM reads a directory only
when asked to load it, and it is only asked once the directory is complete.

Not every adapter can be served this way (see rlvr.vllm_lora: vLLM's LoRA layers cover the
linear projections only, and its engine dies on a refused load), so `adapter_sync_problem`
says why and the trainer falls back to merged pushes (or refuses, when
`server.lora_sync=adapter` was asked for explicitly).
"""

from __future__ import annotations

import base64
import json
import logging
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

import torch

from rlvr.atomic import atomic_directory
from rlvr.policy import save_adapter, trainable_state
from rlvr.rendezvous import LOOPBACK
from rlvr.vllm_lora import lora_serving_problem
from rlvr.weights import ServerControl, server_host

log = logging.getLogger(__name__)

ADAPTER_ROOT = Path(os.environ.get("RLVR_ADAPTER_DIR", "/dev/shm/rlvr-adapters"))
KEEP_VERSIONS = 2


def adapter_sync_problem(model: torch.nn.Module, max_lora_rank: int | None) -> str | None:
    """Why this PEFT model's adapter cannot be pushed for vLLM to serve (None: it can).
    `max_lora_rank` is the server's (None: the server cannot load adapters at run time)."""
    if max_lora_rank is None:
        return (
            "the server was not started with LoRA support "
            "(vf-vllm --enable-lora, with runtime adapter loading)"
        )
    config = getattr(model, "peft_config", {}).get("default")
    if config is None:
        return "the model has no LoRA adapter"
    return lora_serving_problem(config.to_dict(), max_lora_rank)


class AdapterSync:
    """Pushes a PEFT model's trained adapter into one vf-vllm under `adapter_name`. The same
    interface as `WeightSync` (connect, push, close): every rank calls `push` together (the
    adapter is gathered from ZeRO-3 shards on all of them); rank 0 writes and talks to the
    server."""

    def __init__(
        self,
        control: ServerControl,
        base_url: str,
        adapter_name: str,
        rank: int = 0,
        root: Path = ADAPTER_ROOT,
    ):
        self.control = control
        self.adapter_name = adapter_name
        self.rank = rank
        self.local = server_host(base_url) in LOOPBACK
        self.directory = root / f"{adapter_name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.model: torch.nn.Module | None = None
        self.version = 0
        self.backend = "adapter"
        self.meeting = None
        self._written: list[Path] = []

    def resolve(self) -> str:
        return self.backend

    def connect(self, model: torch.nn.Module, backend: str | None = None) -> None:
        """Remember the model; rank 0 un-pauses a server that a dead trainer left paused."""
        self.model = model
        if self.rank == 0:
            self.control.resume()

    def push(self) -> float:
        """Write and load the current adapter; returns the seconds the push took."""
        if self.model is None:
            raise RuntimeError("AdapterSync.push() before connect()")
        start = time.perf_counter()
        state = trainable_state(self.model)
        self.version += 1
        if self.rank != 0:
            return time.perf_counter() - start
        path = self._write(state)
        self.control.pause()
        try:
            self.control.post(
                "/v1/load_lora_adapter",
                json={"lora_name": self.adapter_name, "lora_path": path, "load_inplace": True},
            )
            self.control.reset_prefix_cache()
        finally:
            self.control.resume()
        self._forget_old()
        return time.perf_counter() - start

    def _write(self, state: dict[str, torch.Tensor]) -> str:
        """The adapter of this version, complete, in a directory the server reads; its path
        as the server sees it."""
        local = self.directory / f"v{self.version:06d}"
        with atomic_directory(local) as tmp:
            save_adapter(self.model, state, tmp)
        self._written.append(local)
        if self.local:
            return str(local)
        files = {f.name: base64.b64encode(f.read_bytes()).decode() for f in local.iterdir()}
        payload = {"run": self.directory.name, "version": local.name, "files": files}
        results = self.control.worker_rpc("rlvr_store_adapter", {"payload": json.dumps(payload)})
        return next(r["path"] for r in results if isinstance(r, dict))

    def _forget_old(self) -> None:
        """Delete all but the newest versions (vLLM may re-read the loaded one)."""
        while len(self._written) > KEEP_VERSIONS:
            shutil.rmtree(self._written.pop(0), ignore_errors=True)

    def close(self) -> None:
        if self.rank == 0:
            shutil.rmtree(self.directory, ignore_errors=True)
        self.control.close()

    def __enter__(self) -> AdapterSync:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
