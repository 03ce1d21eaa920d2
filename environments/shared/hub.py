"""Whether the Hugging Face Hub can be asked for a dataset, decided in seconds.

`datasets.load_dataset` retries for about 25 s before failing on a machine without network; the
environments ask here first, so that an offline machine fails (or falls back to local data) at
once. Shared by the environments under environments/ through symlinks to this file (a wheel or
sdist build replaces each link by its content), so each environment still installs on its own.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from urllib.parse import urlparse

logger = logging.getLogger(__name__)

HUB_PROBE_TIMEOUT_S = 3.0
_OFFLINE_FLAGS = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")


def offline_requested() -> bool:
    """HF_HUB_OFFLINE / HF_DATASETS_OFFLINE ask for the local cache only (read at call time, so
    a flag set after `datasets` was imported counts too)."""
    flags = (os.environ.get(name, "").strip().lower() for name in _OFFLINE_FLAGS)
    return any(flag in ("1", "true", "yes", "on") for flag in flags)


def hub_reachable(timeout_s: float = HUB_PROBE_TIMEOUT_S) -> bool:
    """Can a TCP connection to the hub endpoint (`HF_ENDPOINT`, default huggingface.co) open
    within `timeout_s`? Name resolution can hang past any socket timeout, so the probe runs in a
    daemon thread that is abandoned when it is late. A failure is logged with its reason."""
    endpoint = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    host = endpoint.hostname or "huggingface.co"
    port = endpoint.port or (80 if endpoint.scheme == "http" else 443)
    outcome: list[OSError | None] = []

    def connect() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout_s).close()
            outcome.append(None)
        except OSError as exc:
            outcome.append(exc)

    probe = threading.Thread(target=connect, daemon=True)
    probe.start()
    probe.join(timeout_s)
    if outcome == [None]:
        return True
    reason = repr(outcome[0]) if outcome else f"no answer in {timeout_s:.0f}s"
    logger.warning("Hugging Face Hub %s:%d unreachable (%s)", host, port, reason)
    return False
