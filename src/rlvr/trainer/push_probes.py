"""Each server's push probe, run after every weight push: does the server serve the weights?

`PushProbes` holds the run's probes (`rlvr.weight_sync.probe`, one per server), checks every
push on all ranks alike, takes a server that fails out of rotation (with one server its error
stops the run), admits a returning one that passes, and saves and restores the probes'
calibration with the checkpoint. `Pushed` is what a step's push measured.
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
    (`push/<i>/seconds`, `push/<i>/probe_*`; `push/probe_*` is the server with the largest
    probe_kl); empty when the step did not push or nothing was probed."""

    seconds: float = 0.0
    probe: dict[str, float] = field(default_factory=dict)


def probe_metrics(checked: dict[int, dict[str, float]]) -> dict[str, float]:
    """Each server's probe metrics under `push/<i>/`, and those of the server with the
    largest `push/probe_kl` unprefixed (the worst, for one curve whatever the count)."""
    out = {
        key.replace("push/", f"push/{i}/", 1): value
        for i, metrics in checked.items()
        for key, value in metrics.items()
    }
    if checked:
        worst = max(checked.values(), key=lambda m: m.get("push/probe_kl", 0.0))
        out.update(worst)
    return out


class PushProbes:
    """The probes of the servers of `connection` (`urls[i]` is server i), on every rank."""

    def __init__(self, connection: Connection, urls: list[str]):
        self.connection = connection
        self.urls = urls

    def restore(self, saved: dict[str, dict]) -> None:
        """Each server's probe as the checkpoint left it (by URL), so that a resume's first
        push is judged like any later one; a server the checkpoint does not know calibrates
        afresh."""
        for url, probe in zip(self.urls, self.connection.probes, strict=False):
            if url in saved:
                probe.load_state(saved[url])

    def state(self) -> dict[str, dict]:
        """Each server's probe state by URL, for the checkpoint."""
        return {url: p.state() for url, p in zip(self.urls, self.connection.probes, strict=False)}

    def check(
        self, model: torch.nn.Module, accelerator: Any, version: int, initial: bool = False
    ) -> dict[str, float]:
        """The probe of the push of `version` on every server that took it and needs it (see
        rlvr.weight_sync.probe): every rank runs the forward, the main process asks each
        server (twice at a server's first push, for its noise), and every rank checks the
        main process's scores, so all ranks agree. A server that fails is taken out of
        rotation (with one server, its error stops the run); a returning server that passes
        is admitted. Where the exact check covers a server's pushes, its probe checks the
        model only: afresh at the initial push (start or resume) and when it returns."""
        probes, weights = self.connection.probes, self.connection.weights
        if not probes:
            return {}
        exact = {i for i, v in weights.verified.items() if v is not None}
        for i in weights.returned + sorted(exact if initial else ()):  # calibrated afresh
            probes[i] = self.connection.new_probe()
        targets = [i for i in weights.pushed if not probes[i].calibrated or i not in exact]
        if not targets:
            return {}
        ids = probes[0].ids
        mine = trainer_logprobs(model, ids, accelerator.device)
        scores = None
        if accelerator.is_main_process:
            scores = mine, {i: self._served_scores(i, version) for i in targets}
        trainer, served = weights.agree(scores)
        checked: dict[int, dict[str, float]] = {}
        for i, answer in served.items():
            try:
                if isinstance(answer, str):
                    raise WeightsNotServedError(answer)
                scored, name, again = answer
                checked[i] = probes[i].check(trainer, scored, version, name, repeat=again)
            except WeightsNotServedError as e:
                if len(self.connection.pool) == 1:
                    raise
                weights.take_out(i, f"failed the probe of weight version {version}: {e}")
            else:
                if i in weights.returned:
                    weights.admit(i, version)
        return probe_metrics(checked)

    def _served_scores(self, index: int, version: int) -> tuple | str:
        """Server `index`'s probe scores of `version` (a second scoring at its first push) and
        the name it served them under; or why it could not say."""
        push, probe = self.connection.weights.pushes[index], self.connection.probes[index]
        name = push.served_name(version)
        try:
            served = served_logprobs(push.control, name, probe.ids)
            again = None if probe.calibrated else served_logprobs(push.control, name, probe.ids)
        except ServerError as e:
            return f"could not score the probe: {e}"
        return served, name, again
