"""Every weight version to every server (`FleetPush`): one `WeightPush` per server, pushed one
after the other. A server whose push fails leaves rotation; a returning one is connected afresh
and admitted once its exact check (and model probe) pass. With `server.fleet_file`, each push
first reads the file: a server listed anew joins like a returning one, a server no longer listed
drains and is let go once its groups finish. Rank 0 decides the servers and `agree` shares the
decision.
Design: docs/weight-transfer.md#several-servers, docs/scaling.md#the-fleet-file.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from rlvr.config import ConfigError
from rlvr.config.server import read_fleet_file, server_root
from rlvr.rollouts.servers import Server, ServerPool
from rlvr.weight_sync.base import WeightPush
from rlvr.weight_sync.control import ServerError, server_answers
from rlvr.weight_sync.probe import WeightsNotServedError

log = logging.getLogger(__name__)


@dataclass
class PushPlan:
    """Which servers a push goes to: those up, and the returning ones to connect first; the
    servers the fleet file lists anew (numbered after the others, among `returning` where they
    answer) and the drained ones to let go first."""

    live: list[int]
    returning: list[int] = field(default_factory=list)
    added: list[str] = field(default_factory=list)
    let_go: list[int] = field(default_factory=list)

    @property
    def targets(self) -> list[int]:
        return sorted({*self.live, *self.returning})


class FleetPush(WeightPush):
    """Pushes each weight version to every live server of `pool` (`pushes[i]` reaches server
    i); `connect_one(server)` connects a server afresh (a returning or joining one), `agree(x)`
    returns rank 0's `x` on every rank; `fleet_file` is read at every push. After `push`,
    `pushed` lists the servers that took the version (the model probe checks those that need
    it) and `seconds` each one's push time."""

    def __init__(
        self,
        pool: ServerPool,
        pushes: list[WeightPush],
        connect_one: Callable[[Server], WeightPush],
        agree: Callable[[Any], Any],
        rank: int,
        api_key: str | None = None,
        fleet_file: str | None = None,
    ):
        self.pool = pool
        self.pushes = pushes
        self.connect_one = connect_one
        self.agree = agree
        self.rank = rank
        self.api_key = api_key
        self.fleet_file = fleet_file
        self.pushed: list[int] = []
        self.returned: list[int] = []
        """Servers connected afresh by the last push: admitted once their checks pass."""
        self.seconds: dict[int, float] = {}
        self.verified: dict[int, Any] = {}
        """Each server's exact check of the last push (`Verified`), where one ran."""

    def push(self, version: int) -> float:
        """Push `version` to every live server and every returning one; returns the seconds
        it took in all. A server whose push fails is marked down (on rank 0); one whose exact
        check fails is pushed again once, then taken out (with one server, the error stops
        the run)."""
        plan = self.agree(self._plan() if self.rank == 0 else None)
        for url in plan.added:
            self.pool.add(url)
            self.pushes.append(NotConnected())
        for i in plan.let_go:
            self._let_go(i)
        returned = [i for i in plan.returning if self._reconnect(i)]
        returned = self.agree(returned if self.rank == 0 else None)
        self.seconds = {}
        for i in sorted({*plan.live, *returned}):
            server = self.pool.servers[i]
            try:
                self.seconds[i] = self.pushes[i].push(version)
            except Exception as e:  # a server gone mid-push: the others go on
                self._take_out(server, f"the push of weight version {version} failed: {e}")
        self._repair(version)
        self.pushed = self.agree(sorted(self.seconds) if self.rank == 0 else None)
        self.returned = [i for i in returned if i in self.pushed]
        if self.rank == 0 and not self.pushed:
            self.pool.check_any_left()
        return sum(self.seconds.values())

    def _repair(self, version: int) -> None:
        """Push once more to every server whose exact check failed (all ranks together); one
        that still fails leaves rotation, named with what it does not hold."""
        failing = [i for i in self.seconds if self.pushes[i].failed_check(version)]
        for i in self.agree(failing if self.rank == 0 else None):
            log.warning(
                "%s failed the exact check of weight version %d: pushing it again (%s)",
                self.pool.servers[i].describe(),
                version,
                self.pushes[i].failed_check(version),
            )
            try:
                self.seconds[i] += self.pushes[i].push(version)
            except Exception as e:  # gone mid-push: out, as in `push`
                self.seconds.pop(i, None)
                self._take_out(self.pool.servers[i], f"the second push failed: {e}")
        errors = {}
        for i in failing:
            if i in self.seconds and (error := self.pushes[i].failed_check(version)):
                errors[i] = str(error)
        for i, error in self.agree(errors if self.rank == 0 else None).items():
            if len(self.pool.servers) == 1:
                raise WeightsNotServedError(f"{error} (after a second push too)")
            self.seconds.pop(i, None)
            self._take_out(self.pool.servers[i], f"failed the exact check twice: {error}")
        verified = {}
        for i in self.seconds:  # a push that did not run its check is not checked
            v = self.pushes[i].verified
            verified[i] = v if v is not None and v.version == version else None
        self.verified = self.agree(verified if self.rank == 0 else None)

    def _plan(self) -> PushPlan:
        """Rank 0's targets: the servers up, and the down ones (or ones listed anew) that
        answer; the drained ones to let go."""
        added = self._follow_fleet_file()
        let_go = [s.index for s in self.pool.drained()]
        live = [s.index for s in self.pool.live() if s.index not in let_go]
        returning = [s.index for s in self.pool.down() if s.listed and self._answers(s)]
        new = [Server(len(self.pool) + k, url, up=False) for k, url in enumerate(added)]
        returning += [s.index for s in new if self._answers(s)]
        for i in returning:
            url = (self.pool.servers + new)[i].url
            log.warning("server %d (%s) answers: connecting it", i, url)
        return PushPlan(live, returning, added, let_go)

    def _follow_fleet_file(self) -> list[str]:
        """Rank 0: read the fleet file (if any), drain the servers it no longer lists (they
        take no new groups), list again those it lists anew; the URLs it lists for the first
        time. An unreadable file changes nothing (a warning says why)."""
        if self.fleet_file is None:
            return []
        try:
            urls = read_fleet_file(self.fleet_file)
        except ConfigError as e:
            log.warning("%s: the fleet stays as it is", e)
            return []
        keys = {server_root(url) for url in urls}
        known = {server_root(s.url): s for s in self.pool.servers}
        for key, server in known.items():
            if (key in keys) != server.listed:
                self.pool.list_in_fleet(server, key in keys)
                log.warning("%s: %s", server.describe(), server.last_answer)
        return [url for url in urls if server_root(url) not in known]

    def _let_go(self, index: int) -> None:
        """Close the connection to server `index`, drained after the fleet file dropped it
        (every rank), and take it out of rotation."""
        self._take_out(self.pool.servers[index], "no longer in the fleet file: let go, drained")
        try:
            self.pushes[index].close()
        except Exception as e:
            log.info("closing the connection to %s: %s", self.pool.servers[index].describe(), e)
        self.pushes[index] = NotConnected()

    def _answers(self, server: Server) -> bool:
        return server_answers(server.url, self.api_key)

    def _reconnect(self, index: int) -> bool:
        """Connect server `index` afresh (its old connection is closed quietly); False, with
        the reason recorded, when it cannot be connected."""
        server = self.pool.servers[index]
        try:
            self.pushes[index].close()
        except Exception as e:
            log.info("closing the old connection to %s: %s", server.describe(), e)
        try:
            self.pushes[index] = self.connect_one(server)
        except Exception as e:
            server.last_answer = f"could not be connected again: {e}"
            log.warning("%s %s", server.describe(), server.last_answer)
            return False
        return True

    def _take_out(self, server: Server, why: str) -> None:
        if self.rank == 0 and self.pool.mark_down(server, why):
            log.warning("%s is out of rotation: %s", server.describe(), why)

    def take_out(self, index: int, why: str) -> None:
        """Take server `index` out of rotation (its model probe failed); NoServerLeftError when it
        was the last."""
        self._take_out(self.pool.servers[index], why)
        if self.rank == 0:
            self.pool.check_any_left()

    def admit(self, index: int, version: int) -> None:
        """Server `index` serves `version` and passed its checks: it takes requests again."""
        if self.rank == 0:
            self.pool.admit(self.pool.servers[index], version)
            log.warning("%s is back in rotation", self.pool.servers[index].describe())

    def served_name(self, version: int) -> str:
        """The model name that serves `version`, as a live server holding it names it (every
        server loads each version under the same name)."""
        live = self.pool.live() or self.pool.servers
        holding = [s for s in live if s.since <= version] or live
        return self.pushes[holding[0].index].served_name(version)

    def release(self, in_use: Iterable[int]) -> None:
        """Free, on every live server, the versions no rollout requests any more (a server
        admitted again is asked about its own versions only)."""
        in_use = list(in_use)
        for server in self.pool.live():
            try:
                self.pushes[server.index].release({max(v, server.since) for v in in_use})
            except Exception as e:
                self._take_out(server, f"releasing old weight versions failed: {e}")

    def close(self) -> None:
        for i, push in enumerate(self.pushes):
            try:
                push.close()
            except Exception as e:  # closing runs while a failure may be on its way up
                log.warning("closing the connection to server %d: %s", i, e)


class NotConnected(WeightPush):
    """The push of a server not connected: down at start or listed anew (nothing to push to or
    close until it answers and `connect_one` connects it), or let go."""

    def push(self, version: int) -> float:
        raise ServerError("not connected: the server has not answered yet")

    def served_name(self, version: int) -> str:
        raise ServerError("not connected: the server has not answered yet")

    def close(self) -> None:
        pass
