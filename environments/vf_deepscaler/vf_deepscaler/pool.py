"""A pool of killable verification processes, awaited without blocking the event loop.

Why not ``concurrent.futures.ProcessPoolExecutor``: it cannot stop one stuck task; killing a
worker breaks the whole pool and fails every task in flight. Here each worker is a plain
subprocess speaking JSON lines (``python -P verifier.py``). A check that outlives the
hard limit kills its worker and a fresh one takes its slot, while the other workers keep
scoring. Plain subprocesses (not multiprocessing's spawn or forkserver) never re-run the
caller's ``__main__`` script. The event loop waits on the worker's stdout with ``add_reader``,
never in a blocking call or a thread, so any event loop can use the pool (one at a time: it is
not thread-safe).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import time
import weakref
from collections import deque
from pathlib import Path
from typing import Any, NamedTuple

logger = logging.getLogger(__name__)

WORKER_SCRIPT = str(Path(__file__).with_name("verifier.py"))
"""Run as a script (``-P``: without its folder on sys.path), so workers skip the package import."""
STARTUP_TIMEOUT_S = 120.0
"""Importing sympy and math-verify takes about a second; far longer means the worker is broken."""
SOFT_DEADLINE_FRACTION = 0.8
"""The worker stops itself at this share of the limit, before the parent has to kill it."""


class Verdict(NamedTuple):
    """Outcome of one check: ``status`` is ok, timeout (worker stopped itself), killed (hard
    limit), crashed (worker died) or error (exception while verifying)."""

    correct: bool
    status: str
    seconds: float


class WorkerStartupError(RuntimeError):
    """A worker process could not start (for example math-verify is not importable)."""


def _set_once(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class _Worker:
    """One worker process (it starts importing at once) and its line-buffered stdout."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-P", WORKER_SCRIPT],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self._stdin, self._stdout = self.proc.stdin, self.proc.stdout
        self._fd = self._stdout.fileno()
        os.set_blocking(self._fd, False)
        self._buffer = b""
        self.ready = False

    async def start(self) -> None:
        """Wait (once) until the worker has imported everything and said it is ready."""
        if self.ready:
            return
        message = await self._receive(STARTUP_TIMEOUT_S)
        if not message.get("ready"):
            detail = message.get("fatal") or message.get("status")
            raise WorkerStartupError(f"vf_deepscaler verification worker did not start: {detail}")
        self.ready = True

    async def ask(self, request: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """Send one request and wait for its reply at most ``timeout_s`` seconds."""
        try:
            self._stdin.write((json.dumps(request) + "\n").encode())
            self._stdin.flush()
        except OSError:
            return {"correct": False, "status": "crashed"}
        return await self._receive(timeout_s)

    async def _receive(self, timeout_s: float) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while b"\n" not in self._buffer:
            readable: asyncio.Future[None] = loop.create_future()
            loop.add_reader(self._fd, _set_once, readable)
            try:
                await asyncio.wait_for(readable, max(0.0, deadline - loop.time()))
            except TimeoutError:
                return {"correct": False, "status": "killed"}
            finally:
                loop.remove_reader(self._fd)
            try:
                chunk = os.read(self._fd, 1 << 16)
            except BlockingIOError:
                continue
            if not chunk:
                return {"correct": False, "status": "crashed"}
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        try:
            return json.loads(line)
        except json.JSONDecodeError:
            return {"correct": False, "status": "crashed"}

    def kill(self) -> None:
        """Stop the process now and reap it."""
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            logger.warning("verification worker %d survived SIGKILL", self.proc.pid)
        self._stdin.close()
        self._stdout.close()


def _kill_all(workers: set[_Worker]) -> None:
    for worker in list(workers):
        worker.kill()
    workers.clear()


class VerifierPool:
    """Up to ``size`` worker processes, started on first use; ``check`` never takes much longer
    than ``timeout_s`` once a worker is free."""

    def __init__(self, size: int, timeout_s: float):
        if size < 1:
            raise ValueError(f"verify_workers must be >= 1, got {size}")
        if not timeout_s > 0:
            raise ValueError(f"verify_timeout_s must be > 0, got {timeout_s}")
        self.size = size
        self.timeout_s = float(timeout_s)
        self._live: set[_Worker] = set()
        self._idle: list[_Worker] = []
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._finalizer = weakref.finalize(self, _kill_all, self._live)

    async def check(self, gold: str, prediction: str, percent: bool = False) -> Verdict:
        """Is ``prediction`` equal to ``gold``? False when the limit runs out or anything fails.
        ``percent``: the problem asks for a percent, so a bare number may be one (forms.py)."""
        worker = await self._acquire()
        try:
            await worker.start()
            started = time.perf_counter()
            request = {
                "gold": gold,
                "prediction": prediction,
                "soft_s": self.timeout_s * SOFT_DEADLINE_FRACTION,
                "percent": percent,
            }
            reply = await worker.ask(request, self.timeout_s)
        except BaseException:
            self._replace(worker)
            raise
        seconds = time.perf_counter() - started
        status = str(reply.get("status", "crashed"))
        if status in ("killed", "crashed"):
            self._replace(worker)
        else:
            self._release(worker)
        if status != "ok":
            logger.warning(
                "math verification %s after %.2fs (limit %.2fs), scored 0: "
                "prediction=%r gold=%r %s",
                status,
                seconds,
                self.timeout_s,
                prediction[:120],
                gold[:120],
                reply.get("detail", ""),
            )
        return Verdict(bool(reply.get("correct")) and status == "ok", status, seconds)

    def close(self) -> None:
        """Kill every worker (they also die with this process)."""
        _kill_all(self._live)
        self._idle.clear()

    async def _acquire(self) -> _Worker:
        loop = asyncio.get_running_loop()
        while not self._idle and len(self._live) >= self.size:
            waiter: asyncio.Future[None] = loop.create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self._wake_one()  # pass on the wake-up this task can no longer use
                raise
        if self._idle:
            return self._idle.pop()
        worker = _Worker()
        self._live.add(worker)
        return worker

    def _release(self, worker: _Worker) -> None:
        """Make a worker available. ``_acquire`` pops from the end: ready workers go there, a
        successor still importing goes to the front, taken only when no ready worker is idle."""
        if worker.ready:
            self._idle.append(worker)
        else:
            self._idle.insert(0, worker)
        self._wake_one()

    def _replace(self, worker: _Worker) -> None:
        """Kill a worker that is stuck, dead or mid-request; a fresh one takes its slot."""
        worker.kill()
        self._live.discard(worker)
        successor = _Worker()  # imports in the background while the others keep scoring
        self._live.add(successor)
        self._release(successor)

    def _wake_one(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done() and not waiter.get_loop().is_closed():
                waiter.set_result(None)
                return
