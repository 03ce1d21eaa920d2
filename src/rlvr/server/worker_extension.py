"""Methods vf-vllm adds to every vLLM worker (`--worker-extension-cls`), reached through the
dev-mode `/collective_rpc` route: where the workers run, storing adapter files sent by a trainer
on another host, whether a weight update is open, and the fingerprints of the weights the
worker's layers compute with (the exact check of every push).
Design: docs/architecture.md#vf-vllms-worker-extension.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import socket
from pathlib import Path
from typing import Any

ADAPTER_ROOT = Path(os.environ.get("RLVR_ADAPTER_DIR", "/dev/shm/rlvr-adapters"))


class WorkerExtension:
    def rlvr_device_info(self) -> dict[str, Any]:
        """This worker's device, the physical GPU's UUID (None on the CPU) and its host."""
        import torch

        device = getattr(self, "device", None)
        uuid = None
        if isinstance(device, torch.device) and device.type == "cuda":
            uuid = str(torch.cuda.get_device_properties(device).uuid)
        return {"device": str(device), "gpu_uuid": uuid, "host": socket.gethostname()}

    def rlvr_weight_update_state(self) -> dict[str, bool]:
        """A mapping, not a bare bool: the RPC route turns other values into strings."""
        return {"active": bool(getattr(self, "_weight_update_active", False))}

    def rlvr_weight_fingerprints(self) -> dict[str, Any]:
        """Every parameter's dtype and fingerprint as this worker's layers compute with it
        (rlvr.server.held_weights)."""
        from vllm.distributed import get_tensor_model_parallel_world_size

        from rlvr.server.held_weights import held_fingerprints

        replica = getattr(self.parallel_config, "data_parallel_index", 0)
        model = self.model_runner.get_model()
        return held_fingerprints(model, get_tensor_model_parallel_world_size(), replica)

    def rlvr_adapter_fingerprints(self) -> dict[str, Any]:
        """The newest LoRA adapter this worker holds, as fingerprints (the exact check of an
        adapter push; rlvr.server.held_weights)."""
        from rlvr.server.held_weights import held_adapter_fingerprints

        replica = getattr(self.parallel_config, "data_parallel_index", 0)
        return held_adapter_fingerprints(self.model_runner, replica)

    def rlvr_store_adapter(self, payload: str) -> dict[str, str]:
        """Write one adapter version (`{"run", "version", "files": {name: base64}}`) to this
        host's adapter directory and return its path. Workers on one host write the same
        files: each into its own temporary directory, renamed into place by whichever
        finishes first."""
        data = json.loads(payload)
        run = ADAPTER_ROOT / Path(data["run"]).name
        final = run / Path(data["version"]).name
        if not final.is_dir():
            tmp = run / f".tmp-{final.name}-{os.getpid()}"
            tmp.mkdir(parents=True, exist_ok=True)
            for name, content in data["files"].items():
                (tmp / Path(name).name).write_bytes(base64.b64decode(content))
            try:
                tmp.rename(final)
            except OSError:  # another worker of this host got there first
                shutil.rmtree(tmp, ignore_errors=True)
        return {"path": str(final)}

    def rlvr_drop_adapters(self, payload: str) -> dict[str, int]:
        """Delete adapter versions (`{"run", "versions": [names]}`) the trainer has unloaded:
        only it knows which versions requests still use (the run's folder goes with its last
        version)."""
        data = json.loads(payload)
        run = ADAPTER_ROOT / Path(data["run"]).name
        for version in data["versions"]:
            shutil.rmtree(run / Path(version).name, ignore_errors=True)
        with contextlib.suppress(OSError):
            run.rmdir()  # only when empty
        return {"dropped": len(data["versions"])}
