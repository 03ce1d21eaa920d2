"""Methods vf-vllm adds to every vLLM worker (`--worker-extension-cls`), reached through the
dev-mode `/collective_rpc` route: questions vLLM's own routes do not answer.

- Where the workers run: CUDA IPC handles open only on the GPU that made them, and NCCL
  refuses two ranks on one GPU, so a trainer sharing the server's GPU must use `ipc` and one on
  other GPUs `nccl`. vLLM reports its world size but not its devices.
- Whether a weight update is open: a trainer that died between `start_weight_update` and
  `update_weights` leaves one open, and vLLM refuses every later start. Asking beats provoking
  the "without a matching start" error: with several workers, a call that fails on some of
  them leaves the others' replies queued, and the next call reads those.
"""

from __future__ import annotations

import socket
from typing import Any


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
