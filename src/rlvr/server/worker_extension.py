"""Methods vf-vllm adds to every vLLM worker (`--worker-extension-cls`), reached through the
dev-mode `/collective_rpc` route.

The trainer needs to know *where* the server's workers run to choose a weight transfer: CUDA
IPC handles open only on the GPU that made them, and NCCL refuses two ranks on one GPU, so a
trainer sharing the server's GPU must use `ipc` and one on other GPUs `nccl`. vLLM reports its
world size but not its devices.
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
