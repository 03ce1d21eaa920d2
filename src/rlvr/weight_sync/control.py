"""The trainer's HTTP client for vf-vllm's control plane (`ServerControl`): vLLM's RL routes
(pause, resume, weight updates), adapter loading and the worker extension's calls, each with a
timeout and an error that carries the server's own text (`ServerError`)."""

from __future__ import annotations

import logging
from typing import Any

import httpx

from rlvr.config.server import auth_header, server_root

log = logging.getLogger(__name__)


class ServerError(RuntimeError):
    """The server answered a control call with an error (its text is in the message)."""


class ServerControl:
    """The control-plane routes of vf-vllm (vLLM's RL routes), with timeouts and clear errors.

    Also satisfies vLLM's `VLLMWeightSyncClient` protocol, so vLLM's own trainer engines drive
    their handshakes through it.
    """

    def __init__(self, base_url: str, api_key: str | None = None, timeout_s: float = 300.0):
        self.root = server_root(base_url)
        headers = auth_header(api_key)
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
        """The answer to POST `path` (JSON, or plain text as {"text": ...}); ServerError on
        a failed call or an error status."""
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
        """The JSON answer to GET `path`; ServerError on a failed call or an error status."""
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
        """Whether the server answers its health check within 5 s."""
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


def server_host(base_url: str) -> str:
    """The host name or address of the server at `base_url`."""
    return httpx.URL(server_root(base_url)).host


def server_answers(base_url: str, api_key: str | None = None) -> bool:
    """Whether the server at `base_url` answers its health check (within 5 s)."""
    control = ServerControl(base_url, api_key=api_key, timeout_s=5.0)
    try:
        return control.health()
    finally:
        control.close()
