"""After every merged push, ask the server what its layers compute with and compare it, exactly,
with what was sent (rlvr.weight_sync.fingerprint); `ExactCheck.start` says why a server cannot
be checked this way (a quantized model, a server without vf-vllm's worker extension, names it
does not hold), and the push probe then stays the check. Design:
docs/weight-transfer.md#the-exact-check.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import torch
from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource

from rlvr.weight_sync.control import ServerControl, ServerError
from rlvr.weight_sync.fingerprint import Expected, ServedWeights, Verified, mismatches
from rlvr.weight_sync.probe import WeightsNotServedError

log = logging.getLogger(__name__)

SHOWN_MISMATCHES = 5
"""How many mismatched parameters an error names in full (it counts the rest)."""


def served_weights(control: ServerControl) -> list[ServedWeights]:
    """Each data-parallel replica's weights as its workers report them."""
    answers = control.worker_rpc("rlvr_weight_fingerprints")
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
            return cls._unavailable(control, why)
        try:
            layout = served_weights(control)[0]
        except ServerError as e:
            return cls._unavailable(control, f"it does not report its weights ({e})")
        check = cls(control, layout, tied)
        unknown = check.expected.unknown(names)
        if unknown:
            return cls._unavailable(control, f"it holds no parameter for {unknown[:5]}")
        return check

    @staticmethod
    def _unavailable(control: ServerControl, why: str) -> None:
        log.warning(
            "no exact check of pushes into %s: %s; the push probe checks them instead",
            control.root,
            why,
        )
        return None

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

    def error(self, version: int, verified: Verified) -> WeightsNotServedError:
        """The error naming the server and what it does not hold as sent."""
        shown = "; ".join(m.describe() for m in verified.failed[:SHOWN_MISMATCHES])
        more = len(verified.failed) - SHOWN_MISMATCHES
        return WeightsNotServedError(
            f"{self.control.root} does not hold weight version {version} as pushed: "
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
