"""The one interface the trainer pushes weights through (`WeightPush`); `connect` picks the
implementation: `rlvr.weight_sync.merged.MergedPush` or `rlvr.weight_sync.adapter.AdapterPush`."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import Any, Self

from rlvr.weight_sync.exact_check import not_served
from rlvr.weight_sync.probe import WeightsNotServedError


class WeightPush(ABC):
    """Sends the trainer's current weights into vf-vllm as numbered versions.

    Every trainer rank holds one and calls `push` together (ZeRO-3 gathers the shards on all
    of them); rank 0 alone talks to the server. A rollout asks for weight version v by the
    model name `served_name(v)`."""

    @abstractmethod
    def push(self, version: int) -> float:
        """Send the current weights as weight `version`; returns the seconds it took."""

    check: Any = None
    """The exact check of this server's pushes (`rlvr.weight_sync.exact_check`), where one runs."""

    verified: Any = None
    """The last push's exact check (`rlvr.weight_sync.fingerprint.Verified`) where one ran."""

    def failed_check(self, version: int) -> Exception | None:
        """Why the exact check of the last push, of `version`, failed (rank 0), or None: it
        passed, or this server has no exact check. A server with one whose last verification
        is not of `version` (a push that returned without sending) has failed it."""
        if self.check is None:
            return None
        verified = self.verified
        if verified is None or verified.version != version:
            return WeightsNotServedError(
                f"{self.check.control.root}: the push of weight version {version} ran no exact "
                "check (the push did not reach the server)"
            )
        return not_served(self.check.control, version, verified) if verified.failed else None

    @abstractmethod
    def served_name(self, version: int) -> str:
        """The model name a rollout requests to be served weight `version`."""

    def release(self, in_use: Iterable[int]) -> None:  # noqa: B027 (a default, not abstract)
        """Free the versions no rollout requests any more (`in_use`: those still requested);
        nothing to free where a push replaces the served weights."""

    @abstractmethod
    def close(self) -> None:
        """Let go of the server: what the push holds there, and the connection."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
