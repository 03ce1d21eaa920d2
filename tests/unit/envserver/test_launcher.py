"""The EnvServer launcher: a clear error on a failed start (naming the log), and a stop that leaves
no process of the server's group. The real-server tests run verifiers 0.4 from the side venv the
`side_venv` fixture builds (tests/conftest.py)."""

from __future__ import annotations

import os
import signal
import stat
import time
from pathlib import Path

import pytest

from rlvr.envserver.launcher import (
    EnvServerProcess,
    EnvServerSpec,
    EnvServerStartError,
    health,
)


def fake_venv(root: Path, script: str) -> Path:
    """A venv whose `bin/python` is the shell `script` (it ignores the server's arguments)."""
    python = root / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(f"#!/bin/sh\n{script}\n")
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    return root


def assert_group_gone(pgid: int) -> None:
    with pytest.raises(ProcessLookupError):
        os.killpg(pgid, 0)


def test_env_overrides_merge_onto_the_offline_defaults() -> None:
    spec = EnvServerSpec("t", env_overrides={"agent": {"max_turns": 2}, "taskset": {"seed": 3}})
    assert spec.env_config() == {
        "taskset": {"id": "t", "seed": 3},
        "agent": {"harness": {"id": "null"}, "runtime": {"type": "subprocess"}, "max_turns": 2},
    }


def test_a_missed_startup_deadline_names_the_log_and_leaves_nothing(tmp_path) -> None:
    venv = fake_venv(tmp_path / "venv", "echo never healthy; exec sleep 60")
    server = EnvServerProcess(
        EnvServerSpec("t"), venv=venv, log_path=tmp_path / "server.log", startup_timeout_s=1.0
    )
    with pytest.raises(EnvServerStartError) as error:
        server.start()
    message = str(error.value)
    assert "did not answer health within 1.0s" in message
    assert str(tmp_path / "server.log") in message and "never healthy" in message
    assert server.proc is None


@pytest.mark.slow
def test_stop_kills_a_group_that_ignores_sigterm(tmp_path) -> None:
    # The leader and its child both ignore SIGTERM, so only the SIGKILL after the grace ends them.
    pidfile = tmp_path / "pid"
    venv = fake_venv(tmp_path / "venv", f"trap '' TERM; echo $$ > {pidfile}; sleep 60 & wait")
    server = EnvServerProcess(
        EnvServerSpec("t"),
        venv=venv,
        log_path=tmp_path / "server.log",
        startup_timeout_s=1.0,
        stop_grace_s=0.5,
    )
    with pytest.raises(EnvServerStartError):
        server.start()
    assert_group_gone(int(pidfile.read_text()))


def test_a_missing_venv_is_a_clear_error(tmp_path) -> None:
    with pytest.raises(EnvServerStartError, match="rlvr.envserver.side_venv"):
        EnvServerProcess(EnvServerSpec("t"), venv=tmp_path / "nowhere").start()


@pytest.mark.slow
def test_stop_leaves_no_process_of_the_group(side_venv, tmp_path) -> None:
    spec = EnvServerSpec("vf04-reverse-text", workers=2, max_concurrent=4)
    with EnvServerProcess(spec, venv=side_venv, log_path=tmp_path / "server.log") as server:
        assert server.address is not None and health(server.address)
        pgid = server.pgid
        assert pgid is not None
        wait_for_pool_workers(pgid, 2)
    assert_group_gone(pgid)
    assert server.proc is None


@pytest.mark.slow
def test_a_dead_or_wedged_server_is_seen_and_restarted(side_venv, tmp_path) -> None:
    """`trouble` names a server that was SIGKILLed (its exit code and log) or SIGSTOPped (no
    health answer within the deadline), and `restart` starts it afresh on a new address."""
    spec = EnvServerSpec("vf04-reverse-text")
    server = EnvServerProcess(spec, venv=side_venv, log_path=tmp_path / "server.log")
    server.stop_grace_s = 1.0
    with server:
        assert server.trouble() is None
        os.killpg(server.pgid, signal.SIGKILL)
        server.proc.wait(30)
        assert "it exited with -9; log" in server.trouble()
        first = server.address
        server.restart()
        assert server.trouble() is None and server.address != first
        os.killpg(server.pgid, signal.SIGSTOP)
        assert "answered no health request within 1 s" in server.trouble(deadline_s=1.0)
        server.restart()
        assert server.trouble() is None


def wait_for_pool_workers(pgid: int, workers: int, timeout_s: float = 60.0) -> None:
    """Until the group holds the broker and `workers` spawned workers (so stop has a tree)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        members = [p for p in os.listdir("/proc") if p.isdigit() and pgid_of(int(p)) == pgid]
        if len(members) > workers:
            return
        time.sleep(0.2)
    raise AssertionError(f"group {pgid} never held {workers} workers")


def pgid_of(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


@pytest.mark.slow
def test_a_bad_taskset_id_is_a_clear_error(side_venv, tmp_path) -> None:
    server = EnvServerProcess(
        EnvServerSpec("no-such-taskset"), venv=side_venv, log_path=tmp_path / "server.log"
    )
    with pytest.raises(EnvServerStartError) as error:
        server.start()
    message = str(error.value)
    assert "exited with" in message and str(tmp_path / "server.log") in message
    assert "taskset 'no-such-taskset' not found" in message
