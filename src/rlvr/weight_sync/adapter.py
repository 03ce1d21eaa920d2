"""Adapter sync: after each step, push the trained LoRA adapter (megabytes) into vf-vllm, which
serves it on its own frozen base, instead of the whole merged model. Version v is loaded once
as `{server.adapter_name}-v{v}` (no pause, no prefix-cache reset), then checked exactly against
what the server stored (rlvr.weight_sync.exact_check.AdapterCheck); `release` unloads versions
no batch can still request. `adapter_sync_problem` says why an adapter cannot be served
(the trainer then falls back to merged pushes).
Design: docs/weight-transfer.md#lora-adapter-sync.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import re
import shutil
import threading
import time
import uuid
from collections.abc import Iterable
from pathlib import Path

import torch

from rlvr.atomic import atomic_directory
from rlvr.model.policy import save_adapter, trainable_state
from rlvr.weight_sync.base import WeightPush
from rlvr.weight_sync.control import ServerControl, ServerError, server_host
from rlvr.weight_sync.exact_check import AdapterCheck
from rlvr.weight_sync.rendezvous import LOOPBACK
from rlvr.weight_sync.vllm_lora import lora_serving_problem

log = logging.getLogger(__name__)

ADAPTER_ROOT = Path(os.environ.get("RLVR_ADAPTER_DIR", "/dev/shm/rlvr-adapters"))


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


class AdapterPush(WeightPush):
    """Pushes a PEFT model's trained adapter into one vf-vllm, one served name per weight
    version (`served_name`). Every rank calls `push` together (the adapter is gathered from
    ZeRO-3 shards on all of them); rank 0 writes and talks to the server."""

    def __init__(
        self,
        control: ServerControl,
        base_url: str,
        adapter_name: str,
        rank: int = 0,
        root: Path = ADAPTER_ROOT,
        exact_check: bool = True,
    ):
        self.control = control
        self.adapter_name = adapter_name
        self.rank = rank
        self.local = server_host(base_url) in LOOPBACK
        self.directory = root / f"{adapter_name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.model: torch.nn.Module | None = None
        self._loaded: dict[int, Path] = {}
        """Version -> its files on this host, for every version the server has loaded; read by
        the rollout worker's thread (`served_name`), hence the lock."""
        self._lock = threading.Lock()
        self.exact_check = exact_check
        self.check: AdapterCheck | None = None
        """The exact check of every push (rank 0; None where it is off or impossible)."""

    def name(self, version: int) -> str:
        """The name weight `version` is loaded under (when it was pushed)."""
        return f"{self.adapter_name}-v{version}"

    def served_name(self, version: int) -> str:
        """The model name that serves weight `version`: its own adapter, or the newest pushed
        before it (pushes skipped with `server.push_weights=false`)."""
        return self.name(self._serving(version))

    def _serving(self, version: int) -> int:
        with self._lock:
            pushed = [v for v in self._loaded if v <= version]
        if not pushed:
            raise KeyError(f"no adapter version <= {version} is loaded (pushed: {self._newest()})")
        return max(pushed)

    def _newest(self) -> int:
        """The newest version loaded (-1: none; always -1 on ranks other than 0)."""
        with self._lock:
            return max(self._loaded, default=-1)

    def connect(self, model: torch.nn.Module) -> None:
        """Remember the model; rank 0 un-pauses a server that a dead trainer left paused and
        unloads the versions it left (a resumed run loads the same names again)."""
        self.model = model
        if self.rank == 0:
            self.control.resume()
            self._unload_leftovers()
            if self.exact_check:
                self.check = AdapterCheck.start(self.control, model)

    def _unload_leftovers(self) -> None:
        pattern = re.compile(re.escape(self.adapter_name) + r"-v\d+")
        for card in self.control.get("/v1/models").get("data", []):
            if pattern.fullmatch(card.get("id", "")):
                self.control.post("/v1/unload_lora_adapter", json={"lora_name": card["id"]})
                log.warning(
                    "unloaded adapter %r, left on the server by an earlier trainer", card["id"]
                )

    def push(self, version: int) -> float:
        """Write the current adapter, load it as weight `version` (again, in place, when it is
        pushed a second time) and check exactly what the server stored (`verified`: the caller
        decides what a mismatch costs); returns the seconds of the push and check. Nothing is
        paused: requests of older versions go on with their own adapters."""
        if self.model is None:
            raise RuntimeError("AdapterPush.push() before connect()")
        start = time.perf_counter()
        self.verified = None
        state = trainable_state(self.model)
        if self.rank != 0:
            return time.perf_counter() - start
        with self._lock:
            earlier = self._loaded.get(version)
        local, path = self._write(state, version, again=earlier is not None)
        request = {"lora_name": self.name(version), "lora_path": path}
        self.control.post(
            "/v1/load_lora_adapter", json={**request, "load_inplace": earlier is not None}
        )
        with self._lock:
            self._loaded[version] = local
        if earlier is not None:
            self._drop_files([earlier])
        if self.check is not None:
            self.verified = self.check.verify(version, state)
        return time.perf_counter() - start

    def release(self, in_use: Iterable[int]) -> None:
        """Unload every version but the newest and those serving a version in `in_use` (what
        running batches and evaluations request), and delete their files."""
        self._unload(keep={self._newest()} | {self._serving(v) for v in in_use})

    def _unload(self, keep: set[int]) -> None:
        with self._lock:
            gone = [(v, p) for v, p in sorted(self._loaded.items()) if v not in keep]
            self._loaded = {v: p for v, p in self._loaded.items() if v in keep}
        for version, _ in gone:
            self.control.post("/v1/unload_lora_adapter", json={"lora_name": self.name(version)})
        self._drop_files([path for _, path in gone])

    def _write(
        self, state: dict[str, torch.Tensor], version: int, again: bool = False
    ) -> tuple[Path, str]:
        """The adapter of `version`, complete, in a directory the server reads: its path here
        and as the server sees it (`again`: a second push of the version, into a new
        directory, so that nothing of the first is read)."""
        local = self.directory / f"v{version:06d}{f'-{uuid.uuid4().hex[:6]}' if again else ''}"
        with atomic_directory(local) as tmp:
            save_adapter(self.model, state, tmp)
        if self.local:
            return local, str(local)
        files = {f.name: base64.b64encode(f.read_bytes()).decode() for f in local.iterdir()}
        payload = {"run": self.directory.name, "version": local.name, "files": files}
        results = self.control.worker_rpc("rlvr_store_adapter", {"payload": json.dumps(payload)})
        return local, next(r["path"] for r in results if isinstance(r, dict))

    def _drop_files(self, directories: list[Path]) -> None:
        """Delete versions' files here and, for a server on another host, its copies."""
        for directory in directories:
            shutil.rmtree(directory, ignore_errors=True)
        if directories and not self.local:
            payload = {"run": self.directory.name, "versions": [d.name for d in directories]}
            self.control.worker_rpc("rlvr_drop_adapters", {"payload": json.dumps(payload)})

    def close(self) -> None:
        """Unload every version (a name left behind would point at deleted files) and delete
        the files. A server that no longer answers is only logged: closing runs while a
        failure is on its way up, and must not replace it."""
        if self.rank == 0:
            try:
                self._unload(keep=set())
            except ServerError as e:
                log.warning("could not unload the adapters from %s: %s", self.control.root, e)
            finally:
                shutil.rmtree(self.directory, ignore_errors=True)
        self.control.close()
