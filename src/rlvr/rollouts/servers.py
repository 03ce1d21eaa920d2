"""The run's servers and what the trainer knows of each (`ServerPool`): up or down, the first
weight version it holds, its load, and what it last answered.

The rollout worker's thread routes groups and marks servers down; the trainer's thread pushes
weights, marks down the servers a push or probe failed on, admits returning ones and follows the
fleet file (adds the servers it lists anew, drains those it no longer lists). A lock keeps the
two consistent."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import NamedTuple


class NoServerLeftError(RuntimeError):
    """Every server of the run is down: the run stops (its last checkpoint stays intact)."""


@dataclass
class Server:
    """One vf-vllm of the run, numbered as its metrics are (`servers/<index>/*`)."""

    index: int
    url: str
    up: bool = True
    since: int = 0
    """The first weight version it holds: a server admitted again holds none older."""
    last_answer: str = "answered every request"
    """What it last answered: its failure once it is down, for the error that ends a run."""
    in_flight: int = 0
    """Groups it is generating now."""
    requests: int = 0
    groups: int = 0
    tokens: int = 0
    """Completion tokens of the groups it generated."""
    down_events: int = 0
    strikes: int = 0
    """Failures that may be its own, in a row with no answered request between
    (`rlvr.rollouts.router.STRIKES`)."""
    hangs: int = 0
    """Times it was taken out for answering no health check (`rlvr.rollouts.health`)."""
    joins: int = 0
    """Times it was admitted into rotation after start (joining, or returning)."""
    listed: bool = True
    """In the fleet: False once the fleet file no longer lists it. Unlisted, it takes no new
    groups (it drains) and is let go once none is in flight."""

    def describe(self) -> str:
        return f"server {self.index} ({self.url})"


class Counts(NamedTuple):
    """A server's running totals (`ServerPool.counters`); metrics are their differences."""

    requests: int
    groups: int
    tokens: int
    hangs: int
    joins: int
    leaves: int


NO_COUNTS = Counts(0, 0, 0, 0, 0, 0)
"""The totals of a server before it was added."""


class ServerPool:
    """Every server of a run, with the routing choice and the up/down bookkeeping."""

    def __init__(self, urls: list[str]):
        self.servers = [Server(i, url) for i, url in enumerate(urls)]
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.servers)

    def live(self) -> list[Server]:
        with self._lock:
            return [s for s in self.servers if s.up]

    def down(self) -> list[Server]:
        with self._lock:
            return [s for s in self.servers if not s.up]

    def add(self, url: str) -> Server:
        """A server the fleet file lists anew: numbered after the others, down until it answers
        and is admitted like a returning one."""
        with self._lock:
            server = Server(len(self.servers), url, up=False)
            server.last_answer = "listed in the fleet file: joins once it answers"
            self.servers.append(server)
            return server

    def list_in_fleet(self, server: Server, listed: bool) -> None:
        """The fleet file lists `server` (again), or no longer does: it drains."""
        with self._lock:
            server.listed = listed
            server.last_answer = (
                "listed in the fleet file again"
                if listed
                else "no longer in the fleet file: drains (takes no new groups), let go once "
                "its groups finish"
            )

    def drained(self) -> list[Server]:
        """The servers up that the fleet file no longer lists and that have no group in
        flight: ready to let go."""
        with self._lock:
            return [s for s in self.servers if s.up and not s.listed and s.in_flight == 0]

    def pick(self, version: int, avoid: set[int] | frozenset[int] = frozenset()) -> Server:
        """The server a new group of weight `version` goes to (and is counted on): the live,
        listed one with the fewest groups in flight, among those not in `avoid` (indices a
        group already failed on) if any, then those holding `version` if any does (a server
        admitted again holds only newer ones), ties to the fewest groups so far, then the
        lowest index.
        NoServerLeftError when none is up."""
        with self._lock:
            live = [s for s in self.servers if s.up and s.listed]
            if not live:
                raise NoServerLeftError(self._obituary())
            live = [s for s in live if s.index not in avoid] or live
            holding = [s for s in live if s.since <= version] or live
            server = min(holding, key=lambda s: (s.in_flight, s.groups, s.index))
            server.in_flight += 1
            return server

    def finished(self, server: Server, tokens: int | None) -> None:
        """A group on `server` ended: generated (`tokens` completion tokens) or abandoned
        (None)."""
        with self._lock:
            server.in_flight -= 1
            if tokens is not None:
                server.groups += 1
                server.tokens += tokens

    def requested(self, server: Server) -> None:
        with self._lock:
            server.requests += 1

    def answered(self, server: Server) -> None:
        """`server` answered a request: its strikes start again from none."""
        with self._lock:
            server.strikes = 0

    def strike(self, server: Server) -> int:
        """Count a failure that may be `server`'s; return its strikes in a row."""
        with self._lock:
            server.strikes += 1
            return server.strikes

    def mark_down(self, server: Server, why: str, hung: bool = False) -> bool:
        """Take `server` out of rotation (`hung`: it answered no health check); False when it
        already was."""
        with self._lock:
            if not server.up:
                return False
            server.up = False
            server.last_answer = why
            server.down_events += 1
            server.hangs += hung
            return True

    def admit(self, server: Server, version: int) -> None:
        """Put `server` back in rotation, holding weight `version` and newer."""
        with self._lock:
            server.up = True
            server.joins += 1
            server.strikes = 0
            server.since = version
            server.last_answer = f"admitted again at weight version {version}"

    def _obituary(self) -> str:
        lines = [f"  {s.describe()}: {s.last_answer}" for s in self.servers]
        return "no inference server is left; each last answered:\n" + "\n".join(lines)

    def check_any_left(self) -> None:
        """Raise NoServerLeftError, naming each server's last answer, when none listed is up."""
        with self._lock:
            if not any(s.up and s.listed for s in self.servers):
                raise NoServerLeftError(self._obituary())

    def counters(self) -> dict[int, Counts]:
        """Every server's totals so far."""
        with self._lock:
            return {
                s.index: Counts(s.requests, s.groups, s.tokens, s.hangs, s.joins, s.down_events)
                for s in self.servers
            }

    def metrics(
        self, before: dict[int, Counts], now: dict[int, Counts], seconds: float
    ) -> dict[str, float]:
        """Per-server metrics between the `counters()` snapshots `before` and `now`, over
        `seconds` of generation: requests, groups, generated tokens/s, groups in flight, up;
        how many listed servers are up (`servers/up`, of `servers/total`), how many entered
        rotation (`fleet/joined`) and left it (`fleet/left`: failed, hung or let go), and how
        many of those were taken out for answering no health check (`fleet/hung`)."""
        out: dict[str, float] = {"fleet/hung": 0, "fleet/joined": 0, "fleet/left": 0}
        with self._lock:
            for s in (s for s in self.servers if s.index in now):
                was = before.get(s.index, NO_COUNTS)
                delta = Counts(*(a - b for a, b in zip(now[s.index], was, strict=True)))
                prefix = f"servers/{s.index}"
                out[f"{prefix}/requests"] = delta.requests
                out[f"{prefix}/groups"] = delta.groups
                out[f"{prefix}/tokens_per_s"] = delta.tokens / max(seconds, 1e-9)
                out[f"{prefix}/in_flight"] = s.in_flight
                out[f"{prefix}/up"] = float(s.up)
                out["fleet/hung"] += delta.hangs
                out["fleet/joined"] += delta.joins
                out["fleet/left"] += delta.leaves
            out["servers/up"] = sum(s.up and s.listed for s in self.servers)
            out["servers/total"] = sum(s.listed for s in self.servers)
        return out
