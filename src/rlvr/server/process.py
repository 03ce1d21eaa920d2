"""Runs vf-vllm as a child process: start it, wait until it serves, stop its whole tree.

Used from Python by tests, benchmarks, the demo and the trainer's examples."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from rlvr.server.lifetime import dies_with
from rlvr.weight_sync.rendezvous import free_port

EXACT_FLAGS = [
    "--dtype",
    "float32",
    "--enforce-eager",
    "--max-model-len",
    "4096",
    "--enable-auto-tool-choice",
    "--tool-call-parser",
    "hermes",
]
"""vf-vllm flags for a small model served to be compared with transformers (`make demo`, the
tests): float32, so log-probabilities match exactly; eager, since compiling costs more start-up
than it saves on tiny workloads; hermes tool calls for the tool-using environments."""

PORT_ATTEMPTS = 3
PORT_TAKEN_MESSAGE = "already in use"
"""In the log of a launcher whose port was taken: its own check's words, or the OS error's
("Address already in use") when the port went between that check and vLLM's bind."""


class PortTaken(RuntimeError):
    """The launcher's port was taken by the time it started."""


class VLLMServer:
    """A vf-vllm child process (a context manager, or start()/stop()) serving `model` at
    `base_url` (".../v1"), its log in `log_path`; `prefix` runs the launcher under another
    command, e.g. `["ip", "netns", "exec", "ns1"]` for a server on "another host"."""

    def __init__(
        self,
        model: str,
        *,
        port: int | None = None,
        host: str = "127.0.0.1",
        prefix: list[str] | None = None,
        extra_args: list[str] | None = None,
        log_path: str | Path | None = None,
        ready_timeout: float = 900.0,
        env: dict[str, str] | None = None,
    ):
        self.model = model
        self.host = host
        self.prefix = prefix or []
        self.port = port or free_port()
        self._port_chosen_here = port is None
        self.extra_args = extra_args or []
        self.log_path = Path(log_path or f"/tmp/vf-vllm-{self.port}.log")
        self.ready_timeout = ready_timeout
        self.env = env
        self.proc: subprocess.Popen | None = None

    @property
    def root_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.root_url}/v1"

    def start(self) -> VLLMServer:
        """Start and wait until it serves. A port picked here can be taken by another process
        before the launcher binds it; then the launcher refuses it and a fresh port is tried.
        Start it from a thread that outlives it: the child is told to end when the thread that
        started it ends (`dies_with`, Linux's parent-death signal follows the thread)."""
        for _ in range(PORT_ATTEMPTS - 1 if self._port_chosen_here else 0):
            try:
                return self._start_once()
            except PortTaken:
                self.port = free_port()
        return self._start_once()

    def _start_once(self) -> VLLMServer:
        cmd = [*self.prefix, sys.executable, "-m", "rlvr.server.launcher", "--model", self.model]
        cmd += ["--host", self.host, "--port", str(self.port), *self.extra_args]
        env = {**os.environ, **(self.env or {})}
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                # a crashed test run must not leave servers behind: SIGTERM when we die
                preexec_fn=dies_with(os.getpid()),
            )
        self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + self.ready_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = self.log_tail()
                error = PortTaken if PORT_TAKEN_MESSAGE in tail else RuntimeError
                raise error(f"vf-vllm exited with {self.proc.returncode}; log tail:\n{tail}")
            try:
                if httpx.get(f"{self.base_url}/models", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1)
        self.stop()
        raise TimeoutError(f"vf-vllm not ready after {self.ready_timeout}s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 40) -> str:
        return log_tail(self.log_path, lines)

    def kill(self) -> None:
        """SIGKILL the whole tree at once, as a crash of its host would end it."""
        if self.proc is not None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            self.proc = None

    def restart(self) -> VLLMServer:
        """Start it again on the same port (a server that comes back after a crash)."""
        self._port_chosen_here = False
        return self._start_once()

    def stop(self) -> None:
        """SIGTERM the launcher (it tears down the engine tree), then make sure of it."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        self.proc = None

    def __enter__(self) -> VLLMServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def log_tail(path: Path, lines: int = 40) -> str:
    """The last `lines` lines of a server's log, or "(no log)" where it cannot be read."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
