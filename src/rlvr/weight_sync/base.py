"""The one interface the trainer pushes weights through (`WeightPush`); `connect` picks the
implementation: `rlvr.weight_sync.merged.MergedPush` or `rlvr.weight_sync.adapter.AdapterPush`."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import Any, Self


class WeightPush(ABC):
    """Sends the trainer's current weights into vf-vllm as numbered versions.

    Every trainer rank holds one and calls `push` together (ZeRO-3 gathers the shards on all
    of them); rank 0 alone talks to the server. A rollout asks for weight version v by the
    model name `served_name(v)`."""

    @abstractmethod
    def push(self, version: int) -> float:
        """Send the current weights as weight `version`; returns the seconds it took."""

    verified: Any = None
    """The last push's exact check (`rlvr.weight_sync.fingerprint.Verified`) where one ran."""

    def failed_check(self, version: int) -> Exception | None:
        """Why the last push's exact check failed, or None (also where none ran)."""
        return None

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
