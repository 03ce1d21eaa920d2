"""A second "host" on this machine: a network namespace joined to ours by a veth pair.

A process started with `ip netns exec NAME` sees only the namespace's own interfaces: its
loopback is not ours, and it reaches this host only at `host_address` over the veth link, as a
server on another machine would. docs/scaling.md shows the same commands.
"""

from __future__ import annotations

import os
import subprocess
import uuid


class NamespaceError(RuntimeError):
    """The kernel or the user refused to create the namespace (not root, no netns support)."""


def _ip(*args: str) -> None:
    result = subprocess.run(["ip", *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise NamespaceError(f"ip {' '.join(args)}: {result.stderr.strip()}")


class NetworkNamespace:
    """`with NetworkNamespace() as ns:` creates the namespace and a /30 link between it
    (`ns.address`) and this host (`ns.host_address`); leaving the block deletes both."""

    def __init__(self, subnet: int | None = None):
        tag = uuid.uuid4().hex[:6]
        self.name = f"rlvr-{tag}"
        self.host_link, self.ns_link = f"rv{tag}h", f"rv{tag}n"
        octet = subnet if subnet is not None else 4 * (os.getpid() % 60)
        self.host_address = f"10.231.{octet}.1"
        self.address = f"10.231.{octet}.2"

    @property
    def prefix(self) -> list[str]:
        """The command prefix that runs a program inside the namespace."""
        return ["ip", "netns", "exec", self.name]

    def __enter__(self) -> NetworkNamespace:
        _ip("netns", "add", self.name)
        try:
            _ip("link", "add", self.host_link, "type", "veth", "peer", "name", self.ns_link)
            _ip("link", "set", self.ns_link, "netns", self.name)
            _ip("addr", "add", f"{self.host_address}/30", "dev", self.host_link)
            _ip("link", "set", self.host_link, "up")
            inside = ["netns", "exec", self.name, "ip"]
            _ip(*inside, "addr", "add", f"{self.address}/30", "dev", self.ns_link)
            _ip(*inside, "link", "set", self.ns_link, "up")
            _ip(*inside, "link", "set", "lo", "up")
        except NamespaceError:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        subprocess.run(["ip", "link", "del", self.host_link], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True)
