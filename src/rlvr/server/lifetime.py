"""No process of vf-vllm outlives its launcher, however the launcher stops: the API server
gets a parent-death signal, and a watchdog (`python -m rlvr.server.lifetime PGID`) takes vLLM's
process group down when the launcher's pipe closes. Standard library only.
Design: docs/architecture.md#vf-vllms-process-lifetime.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable

GRACE_S = 5.0
"""How long vLLM gets to shut down on SIGTERM before the watchdog SIGKILLs its group."""
PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int, signum: int = signal.SIGTERM) -> None:
    """In a child about to exec (a Popen `preexec_fn`, via `dies_with`): ask Linux to send
    `signum` when its parent dies, and send it at once if the parent, pid `parent`, already
    died between fork and this call. Elsewhere this is a no-op."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signum)
    if os.getppid() != parent:
        os.kill(os.getpid(), signum)


def dies_with(parent: int, signum: int = signal.SIGTERM) -> Callable[[], None]:
    """A Popen `preexec_fn` that ties the child's life to process `parent` (the caller's pid)."""
    return functools.partial(die_with_parent, parent, signum)


def group_alive(pgid: int) -> bool:
    """Whether any process (a zombie included) is still in process group `pgid`."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop_group(
    pgid: int,
    grace_s: float = GRACE_S,
    reap: Callable[[], object] | None = None,
    kill_wait_s: float = 0.0,
) -> None:
    """SIGTERM process group `pgid`, then SIGKILL it if anything is left after `grace_s`, then
    wait up to `kill_wait_s` for the killed to go. A caller that is the leader's parent passes
    `reap` (its Popen's `poll`), so the leader's zombie does not keep the group alive."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    if group_gone_within(pgid, grace_s, reap):
        return
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        return
    group_gone_within(pgid, kill_wait_s, reap)


def group_gone_within(pgid: int, seconds: float, reap: Callable[[], object] | None) -> bool:
    """Whether process group `pgid` empties within `seconds`, calling `reap` at each look."""
    deadline = time.monotonic() + seconds
    while True:
        if reap is not None:
            reap()
        if not group_alive(pgid):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)


def start_watchdog(pgid: int) -> subprocess.Popen:
    """Start the watchdog of process group `pgid`; it acts when the returned Popen's stdin
    (held by this process alone) closes, i.e. when this process ends or closes it."""
    return subprocess.Popen(
        [sys.executable, "-m", "rlvr.server.lifetime", str(pgid)],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )


def watch(pgid: int) -> None:
    """Wait for the launcher's end (EOF on stdin), then stop its engine's process group."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # only the pipe decides when to act
    while sys.stdin.buffer.read(4096):
        pass
    if group_alive(pgid):
        print(f"vf-vllm: the launcher is gone; stopping vLLM (group {pgid})", file=sys.stderr)
        stop_group(pgid)


if __name__ == "__main__":
    watch(int(sys.argv[1]))
