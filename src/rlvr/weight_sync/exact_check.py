"""After every push, ask the server what it holds and compare it, exactly, with what was sent
(rlvr.weight_sync.fingerprint): the weights its layers compute with after a merged push
(`ExactCheck`), the adapter it stored after an adapter push (`AdapterCheck`). `start` says why
a server cannot be checked this way (a quantized model under a merged push, a server without
vf-vllm's worker extension, names it does not hold), and the model probe then checks every push
(its limits: docs/weight-transfer.md#the-model-probe).
Design: docs/weight-transfer.md#the-exact-check.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import torch
from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource

from rlvr.weight_sync.control import ServerControl, ServerError
from rlvr.weight_sync.fingerprint import (
    Expected,
    ServedWeights,
    Verified,
    adapter_expected,
    lora_scalings,
    mismatches,
)
from rlvr.weight_sync.probe import WeightsNotServedError

log = logging.getLogger(__name__)

SHOWN_MISMATCHES = 5
"""How many mismatched parameters an error names in full (it counts the rest)."""


def served_weights(
    control: ServerControl, report: str = "rlvr_weight_fingerprints"
) -> list[ServedWeights]:
    """Each data-parallel replica's weights as its workers `report` them."""
    answers = control.worker_rpc(report)
    if not answers or not all(isinstance(a, dict) and "params" in a for a in answers):
        raise ServerError(f"the server's workers did not report fingerprints: {answers!r:.300}")
    replicas = sorted({a.get("replica", 0) for a in answers})
    return [
        ServedWeights.from_answers([a for a in answers if a.get("replica", 0) == r])
        for r in replicas
    ]


class ExactCheck:
    """The exact check of one server: `tap` the source the transfer streams, then `verify`."""

    def __init__(self, control: ServerControl, layout: ServedWeights, tied: dict[str, str]):
        self.control = control
        self.expected = Expected(layout, tied)

    @classmethod
    def start(
        cls, control: ServerControl, names: list[str], tied: dict[str, str]
    ) -> ExactCheck | None:
        """The check of the server `control` reaches for a push of the parameters `names`
        (Hugging Face names; `tied`: other names of tied ones), or None, logged with the
        reason, where it cannot be made."""
        model = control.vllm_config().get("model_config") or {}
        if isinstance(model, dict) and model.get("quantization"):
            why = f"it serves a {model['quantization']}-quantized model (weights transformed)"
            return unavailable(control, why)
        try:
            layout = served_weights(control)[0]
        except ServerError as e:
            return unavailable(control, f"it does not report its weights ({e})")
        check = cls(control, layout, tied)
        unknown = check.expected.unknown(names)
        if unknown:
            return unavailable(control, f"it holds no parameter for {unknown[:5]}")
        return check

    def tap(self, source: WeightSource) -> WeightSource:
        """`source`, fingerprinting each tensor as the transfer reads it."""
        return _Tapped(source, self.expected)

    def verify(self, version: int) -> Verified:
        """Compare every replica of the server with the push of `version` that just ran
        (raises nothing: `failed` lists the mismatches)."""
        start = time.perf_counter()
        failed = []
        for replica in served_weights(self.control):
            failed += mismatches(self.expected.prints, replica)
        seconds = time.perf_counter() - start
        return Verified(version, seconds, len(self.expected.prints), failed)


class AdapterCheck:
    """The exact check of adapter pushes into one server: after each load, the newest adapter
    its workers hold against the trained matrices (`verify`)."""

    def __init__(self, control: ServerControl, scalings: dict[str, float]):
        self.control = control
        self.scalings = scalings

    @classmethod
    def start(cls, control: ServerControl, model: torch.nn.Module) -> AdapterCheck | None:
        """The check of adapter pushes of the PEFT `model` into the server `control` reaches,
        or None, logged with the reason, where the server does not report its adapters."""
        try:
            served_weights(control, "rlvr_adapter_fingerprints")
        except ServerError as e:
            return unavailable(control, f"it does not report its adapters ({e})")
        return cls(control, lora_scalings(model))

    def verify(self, version: int, state: dict[str, torch.Tensor]) -> Verified:
        """Compare every replica's newest adapter with `state`, the trained tensors the push
        of `version` just loaded (raises nothing: `failed` lists the mismatches)."""
        start = time.perf_counter()
        failed, params = [], 0
        for replica in served_weights(self.control, "rlvr_adapter_fingerprints"):
            expected = adapter_expected(state, self.scalings, replica)
            failed += mismatches(expected, replica)
            params = len(expected)
        return Verified(version, time.perf_counter() - start, params, failed)


def unavailable(control: ServerControl, why: str) -> None:
    """No exact check of `control`'s server, logged with `why`."""
    log.warning(
        "no exact check of pushes into %s: %s; the model probe checks them instead",
        control.root,
        why,
    )
    return None


def not_served(control: ServerControl, version: int, verified: Verified) -> WeightsNotServedError:
    """The error naming the server and the parameters it does not hold as pushed."""
    shown = "; ".join(m.describe() for m in verified.failed[:SHOWN_MISMATCHES])
    more = len(verified.failed) - SHOWN_MISMATCHES
    return WeightsNotServedError(
        f"{control.root} does not hold weight version {version} as pushed: "
        f"{len(verified.failed)} of {verified.params} parameters differ. {shown}"
        + (f"; and {more} more" if more > 0 else "")
    )


class _Tapped(WeightSource):
    """A weight source whose tensors are fingerprinted as they stream."""

    def __init__(self, inner: WeightSource, expected: Expected):
        self.inner = inner
        self.expected = expected

    def metadata(self) -> list[ParamMeta]:
        return self.inner.metadata()

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        return self.expected.tap(iter(self.inner))
