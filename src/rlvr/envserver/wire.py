"""Our client of verifiers 0.4's `EnvServer`: ZMQ DEALER frames, msgpack payloads, and the
episode assembled from the trace deltas a run streams. Nothing of verifiers 0.4 is imported
(it cannot share our virtualenv); the protocol it speaks is written down in
docs/training.md#verifiers-04-environments.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from typing import Any

import msgpack
import numpy as np
import zmq
import zmq.asyncio

log = logging.getLogger(__name__)

TRACE_VERSIONS = {1}
"""Trace schema versions whose nodes this client reads (`Trace.version`)."""
VERIFIERS_SERIES = "0.4."
"""The verifiers releases whose serve protocol this client speaks (`Trace.verifiers.version`)."""
LIST_FIELDS = ("nodes", "calls", "errors", "extra_usage", "request_rewrites", "response_rewrites")
"""A trace's append-only lists: each delta carries the items past those already sent."""


class EnvServerError(RuntimeError):
    """The server answered a request with a failure (its reply's `error`)."""


class UnknownServerError(EnvServerError):
    """A server whose verifiers version or trace format this client does not read."""


class EpisodeDeadline(TimeoutError):
    """An episode ran past its deadline; it was cancelled on the server."""


def pack(payload: Any) -> bytes:
    return msgpack.packb(payload, use_bin_type=True)


def unpack(data: bytes) -> Any:
    """A frame's payload (node updates are keyed by int, hence `strict_map_key=False`)."""
    return msgpack.unpackb(data, raw=False, strict_map_key=False)


def check_trace_header(header: dict) -> None:
    """Raise UnknownServerError unless the trace's schema and verifiers series are known."""
    version = header.get("version")
    release = str((header.get("verifiers") or {}).get("version", ""))
    if version not in TRACE_VERSIONS or not release.startswith(VERIFIERS_SERIES):
        raise UnknownServerError(
            f"the environment server speaks trace format {version!r} of verifiers {release!r}; "
            f"this trainer reads format {sorted(TRACE_VERSIONS)} of verifiers {VERIFIERS_SERIES}x"
        )


def _replace_last_row(encoded: dict, row: dict) -> dict:
    """A routing array (`{"__nd__", dtype, shape, data}`) with its last row repaired."""

    def decode(d: dict) -> np.ndarray:
        return np.frombuffer(d["data"], dtype=np.dtype(d["dtype"])).reshape(d["shape"])

    array = np.ascontiguousarray(np.concatenate([decode(encoded)[:-1], decode(row)]))
    return {
        "__nd__": True,
        "dtype": str(array.dtype),
        "shape": list(array.shape),
        "data": array.tobytes(),
    }


class Assembly:
    """The episode a run's deltas describe: raw trace dicts in arrival order."""

    def __init__(self) -> None:
        self.traces: dict[str, dict] = {}

    def apply(self, delta: dict) -> None:
        trace_id = delta["trace"]
        if delta.get("discard"):  # a retried attempt abandons its traces
            self.traces.pop(trace_id, None)
            return
        trace = self.traces.get(trace_id)
        if trace is None:
            check_trace_header(delta["open"])
            trace = {**delta["open"], **{name: [] for name in LIST_FIELDS}, "pending": []}
            self.traces[trace_id] = trace
        for index, links in (delta.get("links") or {}).items():
            trace["nodes"][int(index)]["semantic_parents"].extend(links)
        for index, row in (delta.get("routing_repairs") or {}).items():
            node = trace["nodes"][int(index)]
            node["routed_experts"] = _replace_last_row(node["routed_experts"], row)
        trace["nodes"].extend(
            {**node, "semantic_parents": list(node.get("semantic_parents") or [])}
            for node in delta.get("nodes") or []
        )
        for name in LIST_FIELDS[1:]:
            trace[name].extend(delta.get(name) or [])
        trace.update(delta.get("set") or {})
        if "nodes" in delta:
            trace["pending"] = []
        if "pending" in delta:
            trace["pending"] = delta["pending"]

    def finish(self, head: dict, summaries: list[dict]) -> dict:
        """The episode: `head` joined with its traces in the server's order, each checked
        against the node and call counts the server reports (a lost delta fails loudly)."""
        traces = []
        for summary in summaries:
            trace = self.traces.get(summary["id"])
            if trace is None:
                raise EnvServerError(f"the episode is missing trace {summary['id']}")
            trace = {key: value for key, value in trace.items() if key != "pending"}
            got = (len(trace["nodes"]), len(trace["calls"]))
            if got != (summary["nodes"], summary["calls"]):
                raise EnvServerError(
                    f"trace {summary['id']} assembled {got[0]} nodes / {got[1]} calls, the "
                    f"server reports {summary['nodes']} / {summary['calls']}"
                )
            traces.append(trace)
        return {**head, "traces": traces}


class EnvServerClient:
    """One DEALER connection to an EnvServer: `health`, `run` (one episode), `cancel`.

    One receive loop routes every frame to its request by id; a run's `delta` frames go to
    its `Assembly`. Use inside one event loop; `close` ends the loop and the socket."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.ctx = zmq.asyncio.Context()
        self.socket = self.ctx.socket(zmq.DEALER)
        for option in (zmq.LINGER, zmq.SNDHWM, zmq.RCVHWM):
            self.socket.setsockopt(option, 0)
        self.socket.connect(address)
        self._replies: dict[str, asyncio.Future[bytes]] = {}
        self._assemblies: dict[str, Assembly] = {}
        self._receiver: asyncio.Task | None = None

    async def _receive(self) -> None:
        """Route every frame to its request, whatever the frames: one that cannot be read is
        dropped with a warning (its request, if any, fails or meets its deadline), and the
        loop goes on serving every other request."""
        while True:
            frames = await self.socket.recv_multipart()
            try:
                self._route(frames)
            except Exception as e:
                log.warning("dropped a frame from the environment server %s: %s", self.address, e)

    def _route(self, frames: list[bytes]) -> None:
        if len(frames) != 3:
            raise ValueError(f"{len(frames)} parts, not the protocol's 3")
        try:
            request_id = frames[0].decode()
        except UnicodeDecodeError:
            raise ValueError(f"request id {frames[0][:40]!r} is not UTF-8") from None
        kind, data = frames[1], frames[2]
        if kind == b"delta":
            assembly = self._assemblies.get(request_id)
            if assembly is not None:
                try:
                    assembly.apply(unpack(data))
                except Exception as e:  # the run fails with it, the loop goes on
                    self._fail(request_id, e)
            return
        future = self._replies.pop(request_id, None)
        if future is not None and not future.done():
            future.set_result(data)

    def _fail(self, request_id: str, error: Exception) -> None:
        self._assemblies.pop(request_id, None)
        future = self._replies.pop(request_id, None)
        if future is not None and not future.done():
            future.set_exception(error)

    async def _request(
        self, method: str, payload: dict, timeout: float | None, request_id: str | None = None
    ) -> dict:
        if self._receiver is None:
            self._receiver = asyncio.create_task(self._receive())
        request_id = request_id or uuid.uuid4().hex
        future = asyncio.get_running_loop().create_future()
        self._replies[request_id] = future
        await self.socket.send_multipart([request_id.encode(), method.encode(), pack(payload)])
        try:
            data = await asyncio.wait_for(future, timeout)
        finally:
            self._replies.pop(request_id, None)
        try:
            reply = unpack(data)
            if not isinstance(reply, dict):
                raise TypeError(f"a {type(reply).__name__}, not a map")
        except Exception as e:  # this request's reply only: the loop goes on
            raise EnvServerError(f"{method}: the server's reply cannot be read ({e})") from None
        if not reply.get("success", False):
            raise EnvServerError(reply.get("error") or f"{method} failed")
        return reply

    async def health(self, timeout: float = 2.0) -> bool:
        """True when the server answers a health request within `timeout` seconds."""
        try:
            await self._request("health", {}, timeout)
        except (TimeoutError, EnvServerError):
            return False
        return True

    async def cancel(self, run_id: str, timeout: float = 5.0) -> bool:
        """Abort run `run_id` on the server; True if it was still running there."""
        reply = await self._request("cancel", {"request_id": run_id}, timeout)
        return bool(reply.get("cancelled"))

    async def run(self, request: dict, deadline_s: float | None = None) -> dict:
        """One episode for `request` (task_data, client, model, sampling), assembled from
        its deltas. Past `deadline_s`, when the caller is cancelled or the stream is refused, the
        run is cancelled on the server before this returns (EpisodeDeadline for the deadline)."""
        run_id = uuid.uuid4().hex
        assembly = self._assemblies[run_id] = Assembly()
        try:
            reply = await self._request("run", request, deadline_s, request_id=run_id)
        except BaseException as stop:  # a cancel of a finished run is a no-op on the server
            with contextlib.suppress(Exception):
                await asyncio.shield(self.cancel(run_id))
            if isinstance(stop, TimeoutError):
                raise EpisodeDeadline(f"episode ran past its {deadline_s} s deadline") from None
            raise
        finally:
            self._assemblies.pop(run_id, None)
        return assembly.finish(reply.get("head") or {}, reply.get("traces") or [])

    def close(self) -> None:
        """End the receive loop and the socket (callable once the loop has stopped too)."""
        if self._receiver is not None and not self._receiver.get_loop().is_closed():
            self._receiver.get_loop().call_soon_threadsafe(self._receiver.cancel)
        self._receiver = None
        self.socket.close(linger=0)
        self.ctx.term()
