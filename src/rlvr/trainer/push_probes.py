"""Each server's model probe after a push (rlvr.weight_sync.probe): is its model the trainer's?

`PushProbes` probes a server at its first push (the run's start or resume, a returning server)
and at every push the exact check did not cover, on all ranks alike; it takes a server that
fails out of rotation (with one server its error stops the run) and admits a returning one that
passes. `Pushed` is what a step's push measured.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from rlvr.weight_sync.connect import Connection
from rlvr.weight_sync.control import ServerError
from rlvr.weight_sync.probe import WeightsNotServedError, served_logprobs, trainer_logprobs


@dataclass
class Pushed:
    """A step's weight push: the seconds it took and what it measured per server
    (`push/<i>/seconds`, `push/<i>/probe_kl`; `push/probe_kl` is the largest); empty when the
    step did not push."""

    seconds: float = 0.0
    probe: dict[str, float] = field(default_factory=dict)


def probe_metrics(checked: dict[int, float]) -> dict[str, float]:
    """Each probed server's `push/<i>/probe_kl`, and the largest as `push/probe_kl` (the
    worst, for one curve whatever the count)."""
    if not checked:
        return {}
    return {
        **{f"push/{i}/probe_kl": kl for i, kl in checked.items()},
        "push/probe_kl": max(checked.values()),
    }


class PushProbes:
    """The model probes of the servers of `connection`, on every rank."""

    def __init__(self, connection: Connection):
        self.connection = connection

    def targets(self, initial: bool) -> list[int]:
        """The servers the push just made needs probed: every one at the initial push, a
        returning one, and one whose push the exact check did not cover."""
        weights = self.connection.weights
        return [
            i
            for i in weights.pushed
            if initial or i in weights.returned or weights.verified.get(i) is None
        ]

    def check(
        self, model: torch.nn.Module, accelerator: Any, version: int, initial: bool = False
    ) -> dict[str, float]:
        """Probe the servers that need it after the push of `version` (see `probe`); admit
        each returning server that took the push and did not fail (its exact check passed
        in the push)."""
        probe, weights = self.connection.probe, self.connection.weights
        targets = self.targets(initial) if probe is not None else []
        checked = self.probe(model, accelerator, version, targets) if targets else {}
        for i in weights.returned:
            if i in checked or i not in targets:
                weights.admit(i, version)
        return probe_metrics(checked)

    def probe(
        self, model: torch.nn.Module, accelerator: Any, version: int, targets: list[int]
    ) -> dict[int, float]:
        """Each target server's `probe_kl` where it passed: every rank runs the forward, the
        main process asks the servers, and every rank checks the main process's scores, so
        all ranks agree. A server that fails is taken out of rotation (with one server, its
        error stops the run)."""
        probe, weights = self.connection.probe, self.connection.weights
        mine = trainer_logprobs(model, probe.ids, accelerator.device)
        scores = None
        if accelerator.is_main_process:
            scores = mine, {i: self._served_scores(i, version) for i in targets}
        trainer, served = weights.agree(scores)
        checked: dict[int, float] = {}
        for i, answer in served.items():
            try:
                if isinstance(answer, str):
                    raise WeightsNotServedError(answer)
                scored, name = answer
                checked[i] = probe.check(trainer, scored, version, name)["push/probe_kl"]
            except WeightsNotServedError as e:
                if len(self.connection.pool) == 1:
                    raise
                weights.take_out(i, f"failed the probe of weight version {version}: {e}")
        return checked

    def _served_scores(self, index: int, version: int) -> tuple[torch.Tensor, str] | str:
        """Server `index`'s probe scores of `version` and the name it served them under; or
        why it could not say."""
        push = self.connection.weights.pushes[index]
        name = push.served_name(version)
        try:
            return served_logprobs(push.control, name, self.connection.probe.ids), name
        except ServerError as e:
            return f"could not score the probe: {e}"
