"""Where the trainer and vf-vllm meet for a weight transfer, and a deadline on the meeting.

The group is the trainer's rank 0 plus every vLLM worker (its world asked of the server); the
trainer hosts it at an address the server can reach (`server.transfer_host` overrides). A
wrong or unreachable address fails naming both addresses and the port instead of hanging.
Design: docs/weight-transfer.md#the-rendezvous.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

T = TypeVar("T")

LOOPBACK = ("127.0.0.1", "localhost", "::1", "0.0.0.0", "")


class RendezvousError(RuntimeError):
    """The trainer and the server did not meet; the message says where each was told to go."""


def route_address(peer_host: str) -> str:
    """This machine's own address on its route to `peer_host` (no packet is sent: a UDP
    socket's `connect` only chooses the route). Loopback for a local peer."""
    if peer_host in LOOPBACK:
        return "127.0.0.1"
    family, _, _, _, sockaddr = socket.getaddrinfo(peer_host, 9, proto=socket.IPPROTO_UDP)[0]
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.connect(sockaddr)
        return s.getsockname()[0]


def free_port(host: str = "127.0.0.1") -> int:
    """A port that is free on `host` now (the caller binds it soon after)."""
    with socket.socket() as s:
        try:
            s.bind((host, 0))
        except OSError as e:
            raise RendezvousError(
                f"cannot listen on {host}: it is not an address of this machine ({e}); "
                "set server.transfer_host to an address of the trainer's first node"
            ) from e
        return s.getsockname()[1]


@dataclass(frozen=True)
class Meeting:
    """Where the group meets: the trainer hosts it on `master_address:master_port`."""

    master_address: str
    master_port: int
    world_size: int
    """1 (the trainer's sender) + the server's workers."""
    server: str
    """The server's address as the trainer reaches it (for error messages)."""
    timeout_s: float

    def describe(self) -> str:
        return (
            f"trainer rendezvous at {self.master_address}:{self.master_port} "
            f"(world {self.world_size}: 1 trainer + {self.world_size - 1} vLLM workers), "
            f"server at {self.server}"
        )


def plan_meeting(
    server_host: str,
    server_world: int,
    timeout_s: float,
    transfer_host: str | None = None,
    transfer_port: int = 0,
) -> Meeting:
    """The rendezvous for a server at `server_host` running `server_world` workers."""
    if server_world < 1:
        raise RendezvousError(f"the server reports {server_world} workers; expected at least 1")
    host = transfer_host or route_address(server_host)
    port = transfer_port or free_port(host)
    return Meeting(host, port, 1 + server_world, server_host, timeout_s)


def with_deadline(meeting: Meeting, what: str, calls: list[Callable[[], Any]]) -> list[Any]:
    """Run `calls` at once (each side of a rendezvous blocks until the other arrives) and
    return their results; raise RendezvousError when any fails or all have not returned
    within the meeting's timeout. Threads that are still blocked are left behind as daemons:
    their own socket timeouts end them, and the error has already reached the user."""
    results: list[Any] = [None] * len(calls)
    errors: list[BaseException] = []

    def run(i: int, call: Callable[[], Any]) -> None:
        try:
            results[i] = call()
        except BaseException as e:  # handed to the caller below
            errors.append(e)

    threads = [
        threading.Thread(target=run, args=(i, c), daemon=True, name=f"rendezvous-{i}")
        for i, c in enumerate(calls)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(meeting.timeout_s)
    hint = (
        "check that the server can reach the trainer at that address and port (firewall, "
        "server.transfer_host, server.transfer_port) and that every vLLM worker joined"
    )
    if errors:
        raise RendezvousError(f"{what} failed: {meeting.describe()}: {errors[0]}; {hint}") from (
            errors[0]
        )
    if any(t.is_alive() for t in threads):
        raise RendezvousError(
            f"{what} did not complete within {meeting.timeout_s:.0f}s: {meeting.describe()}; {hint}"
        )
    return results


class GlooGroup:
    """A gloo process group outside torch's global state (neither side's own torch.distributed
    set-up is touched), with its data connections on a chosen interface. Rank 0 hosts the
    store; broadcasts go from group rank 0, whatever the processes' global ranks."""

    def __init__(
        self,
        master_address: str,
        master_port: int,
        rank: int,
        world_size: int,
        timeout_s: float,
        local_address: str | None = None,
    ):
        import torch
        from torch.distributed import PrefixStore, ProcessGroup, ProcessGroupGloo, TCPStore

        timeout = timedelta(seconds=timeout_s)
        # The store must live as long as the group's connections.
        self.store = TCPStore(
            master_address,
            master_port,
            world_size,
            is_master=rank == 0,
            timeout=timeout,
            wait_for_workers=False,
        )
        prefix = PrefixStore(f"rlvr-weights/{master_address}:{master_port}", self.store)
        options = ProcessGroupGloo._Options()
        options._timeout = timeout
        address = local_address or route_address(master_address)
        options._devices = [ProcessGroupGloo.create_device(hostname=address)]
        backend = ProcessGroupGloo(prefix, rank, world_size, options)
        self.group = ProcessGroup(prefix, rank, world_size)
        self.group._set_default_backend(ProcessGroup.BackendType.GLOO)
        backend._set_sequence_number_for_group()
        self.group._register_backend(torch.device("cpu"), ProcessGroup.BackendType.GLOO, backend)

    def broadcast(self, tensor) -> None:
        self.group.broadcast(tensor, 0).wait()

    def close(self) -> None:
        """Release the connections (the peer may already be gone)."""
        try:
            self.group.shutdown()
        except Exception:  # a dead peer can make teardown fail; the sockets close regardless
            pass
