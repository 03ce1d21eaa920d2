"""Runs a verifiers 0.4 `EnvServer` from its side venv: start it on a free loopback port, wait
until it answers `health`, stop its whole process group.

Nothing here imports verifiers 0.4 (it cannot live in our venv): the side venv's python runs
`SERVE_CODE`, a few lines that hand the env config to 0.4's own `serve_env`."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zmq

from rlvr.envserver.wire import pack, unpack
from rlvr.server.lifetime import dies_with, stop_group
from rlvr.server.process import log_tail

SERVE_CODE = """
import functools, json, logging, os, sys
from verifiers.v1.serve import serve_env
from verifiers.v1.utils.loaders import resolve_env_config

spec = json.loads(sys.argv[1])

class ReportAddress:
    def put(self, address):
        tmp = spec["address_file"] + ".tmp"
        with open(tmp, "w") as f:
            f.write(address)
        os.replace(tmp, spec["address_file"])

serve_env(
    config=resolve_env_config(spec["env"]),
    address=spec["address"],
    address_queue=ReportAddress(),
    log_setup=functools.partial(
        logging.basicConfig, level=logging.INFO,
        format="%(asctime)s %(process)d %(name)s %(levelname)s %(message)s"),
    max_workers=spec["workers"],
    elastic=False,
    max_concurrent=spec["max_concurrent"],
)
"""
"""Run by the side venv's python with the JSON spec as argv[1]. `serve_env` reports the bound
address (the OS picks the port: `:0`) through any object with `put`; here, a file."""

HEALTH_DEADLINE_S = 10.0
"""How long a running server gets to answer a health request before it counts as wedged (0.4's
broker answers health beside the episodes, so a busy server still answers at once)."""
STOP_GRACE_S = 10.0
"""How long the group gets after SIGTERM by default (0.4 turns SIGTERM into a clean asyncio
teardown) before SIGKILL."""


KILL_WAIT_S = 5.0
"""How long SIGKILLed members get to be reaped before `stop` returns."""


class EnvServerStartError(RuntimeError):
    """The EnvServer exited, or did not answer health, within its start-up deadline."""


@dataclass(frozen=True)
class EnvServerSpec:
    """What to serve: taskset `taskset_id` with `env_overrides` deep-merged onto the offline
    defaults (harness `null`, runtime `subprocess`), `workers` processes (1 = one in-process
    server), each running at most `max_concurrent` episodes (None = unbounded)."""

    taskset_id: str
    env_overrides: dict[str, Any] = field(default_factory=dict)
    workers: int = 1
    max_concurrent: int | None = None

    def env_config(self) -> dict[str, Any]:
        """The `[env]` block 0.4's `resolve_env_config` takes."""
        base = {
            "taskset": {"id": self.taskset_id},
            "agent": {"harness": {"id": "null"}, "runtime": {"type": "subprocess"}},
        }
        return deep_merge(base, self.env_overrides)


def deep_merge(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """`base` with `overrides` applied; nested dicts merge key by key."""
    merged = dict(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def health(address: str, timeout_s: float = 2.0) -> bool:
    """Whether the EnvServer at `address` answers a `health` request within `timeout_s`."""
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(address)
        request_id = uuid.uuid4().hex.encode()
        sock.send_multipart([request_id, b"health", pack({})])
        if not sock.poll(int(timeout_s * 1000)):
            return False
        rid, kind, payload = sock.recv_multipart()
        reply = unpack(payload)
        return rid == request_id and kind == b"reply" and bool(reply.get("success"))
    finally:
        sock.close()


class EnvServerProcess:
    """A 0.4 EnvServer child (a context manager, or start()/stop()) in its own process group,
    bound to a free 127.0.0.1 port, its log in `log_path`."""

    def __init__(
        self,
        spec: EnvServerSpec,
        *,
        venv: str | Path,
        log_path: str | Path | None = None,
        startup_timeout_s: float = 120.0,
        stop_grace_s: float = STOP_GRACE_S,
        env: dict[str, str] | None = None,
    ):
        self.spec = spec
        self.venv = Path(venv)
        self.log_path = Path(log_path or tempfile.mktemp(prefix="envserver-", suffix=".log"))
        self.startup_timeout_s = startup_timeout_s
        self.stop_grace_s = stop_grace_s
        self.env = env or {}
        self.address: str | None = None
        self.proc: subprocess.Popen | None = None

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def pgid(self) -> int | None:
        """The server's process group (its pid: it leads a new session)."""
        return self.proc.pid if self.proc is not None else None

    def command(self, address_file: Path) -> list[str]:
        """The argv that starts the server (the side venv's python running `SERVE_CODE`)."""
        spec = {
            "env": self.spec.env_config(),
            "address": "tcp://127.0.0.1:0",
            "address_file": str(address_file),
            "workers": self.spec.workers,
            "max_concurrent": self.spec.max_concurrent,
        }
        return [str(self.python), "-c", SERVE_CODE, json.dumps(spec)]

    def start(self) -> EnvServerProcess:
        """Start it and wait until it answers health; on failure stop it and raise
        `EnvServerStartError` with the log's tail."""
        if not self.python.exists():
            raise EnvServerStartError(
                f"no side venv at {self.venv}: build it with "
                f"python -m rlvr.envserver.side_venv --venv {self.venv}"
            )
        address_file = self.log_path.with_suffix(".address")
        address_file.unlink(missing_ok=True)
        # The venv's bin first: 0.4's `null` harness finds the builder's offline `uv` there.
        path = f"{self.venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"
        env = {**os.environ, "PATH": path, "PYTHONUNBUFFERED": "1", **self.env}
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(
                self.command(address_file),
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                preexec_fn=dies_with(os.getpid()),
            )
        try:
            self.address = self._wait_ready(address_file)
        except EnvServerStartError:
            self.stop()
            raise
        return self

    def _wait_ready(self, address_file: Path) -> str:
        assert self.proc is not None
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise EnvServerStartError(
                    f"EnvServer for {self.spec.taskset_id!r} exited with {self.proc.returncode}"
                    f" during start-up; log {self.log_path}:\n{self.log_tail()}"
                )
            if address_file.exists() and health(address := address_file.read_text()):
                return address
            time.sleep(0.2)
        raise EnvServerStartError(
            f"EnvServer for {self.spec.taskset_id!r} did not answer health within "
            f"{self.startup_timeout_s}s; log {self.log_path}:\n{self.log_tail()}"
        )

    def trouble(self, deadline_s: float = HEALTH_DEADLINE_S) -> str | None:
        """Why the server is not serving, or None: it exited (its code and the log's tail), or
        it runs but answered no health request within `deadline_s` (wedged)."""
        if self.proc is None or self.address is None:
            return "it is not running"
        if self.proc.poll() is not None:
            return f"it exited with {self.proc.returncode}; log {self.log_path}:\n{self.log_tail()}"
        if not health(self.address, deadline_s):
            return f"it answered no health request within {deadline_s:g} s; log {self.log_path}"
        return None

    def restart(self) -> EnvServerProcess:
        """Stop whatever is left of it and start it afresh (on a new port: `address` changes)."""
        self.stop()
        return self.start()

    def log_tail(self, lines: int = 40) -> str:
        return log_tail(self.log_path, lines)

    def stop(self) -> None:
        """SIGTERM the whole group, SIGKILL it after `stop_grace_s`, and SIGKILL every process
        the server had started in sessions of their own; nothing of it is left."""
        if self.proc is None:
            return
        pgid = self.proc.pid
        episodes = descendants(pgid)  # 0.4 runs each episode's programs in a session of its own
        stop_group(pgid, self.stop_grace_s, reap=self.proc.poll, kill_wait_s=KILL_WAIT_S)
        for pid in episodes:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.proc.wait()
        self.proc = None
        self.address = None

    def __enter__(self) -> EnvServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def descendants(pid: int) -> list[int]:
    """Every live descendant of `pid` (read from /proc), children first."""
    found: list[int] = []
    queue = [pid]
    while queue:
        parent = queue.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except FileNotFoundError:
            continue
        for task in tasks:
            with contextlib.suppress(FileNotFoundError, ProcessLookupError):
                children = Path(f"/proc/{parent}/task/{task}/children").read_text().split()
                found += map(int, children)
                queue += map(int, children)
    return found
