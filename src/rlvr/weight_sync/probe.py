"""Did the weights arrive? After every push, one short probe checks that the server serves
what the trainer just pushed, on a bfloat16 server as on a float32 one.

Both sides score a fixed token sequence (`probe_ids`); the server's change since a reference
push must be the trainer's change, within the server's noise (`Noise`), measured over the
first pushes. `PushProbe.check` raises `WeightsNotServedError` otherwise; NaN never passes.
Design and measurements: docs/weight-transfer.md#did-the-weights-arrive.
"""

from __future__ import annotations

import logging
import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import torch

from rlvr.reasoning_vocab.mapping import ReasoningVocab

if TYPE_CHECKING:
    from rlvr.weight_sync.control import ServerControl

log = logging.getLogger(__name__)

PROBE_TEXT = (
    "Question: A farmer has 17 sheep and buys 23 more. How many sheep does he have now?\n"
    "Answer: He starts with 17 and adds 23, so 17 + 23 = 40. The answer is 40.\n"
    "def add(a, b):\n    return a + b\n"
)
REASONING_PROBE_IDS = 16
"""How many of a reasoning vocabulary's added ids the probe's think span holds."""
PROBE_KL_CAP = 1e-2
"""The most `push/probe_kl` a fresh run's initial push may show (a bf16 server against a
float32 trainer stays well below it; another model does not)."""
PROBE_NOISE_FLOOR = 3e-6
"""The least noise assumed (RMS log-probability per token): float32 on both sides measures
~1e-7, which the offset's growth over a run may exceed; one layer's share of an optimizer
step at lr 1e-5 (~3e-5) is ten times this floor."""
CALIBRATION_PUSHES = 3
"""How many pushes after the initial one at least measure the noise of changes (pushes
whose move is below the noise floor do not count)..."""
RESOLVED_TOKENS = 10
"""...and until the trainer's summed move would have changed this many probe tokens' rounding
on the server (its rounding step taken as sqrt(12) x the initial offset, what uniform
rounding errors give): a correct server that rounds coarsely may show no change at all over
smaller moves (probability ~exp(-10) here), which would measure as a stale server's."""
DECISIVE_SNR = 2.0
"""A check judges whether the server realised the trainer's move once rms(dT) is this many
times the noise: the realised fraction's standard error is about noise / (rms(dT) sqrt(n))
for n probe tokens, ~0.06 here with ~64 tokens, so `REALISED_TOLERANCE` is ~8 of them."""
REALISED_TOLERANCE = 0.5
"""How far from 1 the realised fraction of a decisive move may be."""
RESIDUAL_NOISE = 3.0
"""rms(dS - dT) may reach RESIDUAL_NOISE times the noise of the move..."""
RESIDUAL_FRACTION = 0.05
"""...plus, since the initial push only, this fraction of the move: the offset of a
lower-precision server grows as training sharpens the logits."""
STEP_RESIDUAL_FRACTION = 1e-3
"""...and, since the last decisive push, this fraction of the move: a complete float32 server
rounds a large move (2.19 RMS per token at lr 2e-2) to a residual of ~1e-5 of it, while one
layer of 30 left out is ~3% of it."""


class WeightsNotServedError(RuntimeError):
    """The server does not serve the weights that were just pushed."""


NOT_SERVED = (
    "The server does not serve what was pushed: a push that did not arrive, a stale or partly "
    "updated server (a skipped layer or lm_head), or another process pushing into it."
)
CANNOT_SEE = (
    "The probe sees only what moves its ~70 tokens' log-probabilities beyond the server's "
    "noise: on a lower-precision (bf16) server a part of the model that carries less of the "
    "move than that noise (one layer of many), or that was missing from the first pushes on "
    "(measured as noise), can pass until the move since the initial push clears the initial "
    "offset."
)
TURN_OFF = "server.push_probe=false turns the check off."
BROKEN_POLICY = (
    "The policy's weights are broken (a non-finite update?): resume from the last checkpoint."
)
BROKEN_SERVER = f"The server computes non-finite values for the pushed weights. {NOT_SERVED}"


def probe_ids(tokenizer: Any, vocab: ReasoningVocab | None = None) -> list[int]:
    """The probe's token ids: `PROBE_TEXT`, and with a reasoning vocabulary a think span of
    its first added ids."""
    ids = tokenizer.encode(PROBE_TEXT, add_special_tokens=False)
    if vocab is None:
        return ids
    first = vocab.base_vocab_size
    added = range(first, first + min(vocab.size, REASONING_PROBE_IDS))
    start = tokenizer.encode(vocab.think_start, add_special_tokens=False)
    end = tokenizer.encode(vocab.think_end, add_special_tokens=False)
    return [*start, *added, *end, *ids]


@torch.no_grad()
def trainer_logprobs(model: torch.nn.Module, ids: list[int], device: Any) -> torch.Tensor:
    """The log-probability of each probe token after the first, at temperature 1 (in eval
    mode: no dropout). Every rank calls it together under ZeRO-3."""
    was_training = model.training
    model.eval()
    try:
        inputs = torch.tensor([ids], device=device)
        logits = model(input_ids=inputs, use_cache=False).logits[0, :-1].float()
    finally:
        model.train(was_training)
    targets = inputs[0, 1:, None]
    return logits.log_softmax(-1).gather(-1, targets)[:, 0].cpu()


def served_logprobs(control: ServerControl, model: str, ids: list[int]) -> torch.Tensor:
    """The server's log-probability of each probe token after the first, from `model`."""
    body = {"model": model, "prompt": ids, "max_tokens": 1, "prompt_logprobs": 0}
    entries = control.post("/v1/completions", json=body)["choices"][0]["prompt_logprobs"][1:]
    return torch.tensor(
        [entry[str(token)]["logprob"] for entry, token in zip(entries, ids[1:], strict=True)]
    )


def probe_kl(trainer: torch.Tensor, served: torch.Tensor) -> float:
    """Mean of exp(d) - 1 - d over the tokens, d = trainer - served log-probability."""
    d = (trainer - served).double()
    return float((torch.expm1(d) - d).mean())


def rms(x: torch.Tensor) -> float:
    """Root mean square over the probe's tokens (float64)."""
    return float(x.double().pow(2).mean().sqrt())


@dataclass(frozen=True)
class Scores:
    """One push's probe: the trainer's and the server's log-probability of each token."""

    version: int
    trainer: torch.Tensor
    served: torch.Tensor

    def state(self) -> dict[str, Any]:
        """JSON-able: the version and both sides' log-probabilities."""
        return {
            "version": self.version,
            "trainer": self.trainer.tolist(),
            "served": self.served.tolist(),
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Scores:
        """The scores `state()` wrote."""
        trainer, served = (
            torch.tensor(state[k], dtype=torch.float64) for k in ("trainer", "served")
        )
        return cls(state["version"], trainer, served)


@dataclass(frozen=True)
class Move:
    """How the server's probe log-probabilities (dS) followed the trainer's (dT) since `since`:
    `moved` = rms(dT), `realised` = <dS,dT>/<dT,dT>, `residual` = rms(dS - dT), `noise` over
    such a move, `fraction` of the move the residual may add besides the noise."""

    since: int
    moved: float
    realised: float
    residual: float
    noise: float
    fraction: float = 0.0

    @property
    def snr(self) -> float:
        """The move over the noise."""
        return self.moved / self.noise

    @property
    def decisive(self) -> bool:
        """The move is large enough against the noise to judge the realised fraction."""
        return self.snr >= DECISIVE_SNR

    @property
    def allowed_residual(self) -> float:
        """The residual a complete push may show: the noise, and part of the move."""
        return RESIDUAL_NOISE * self.noise + self.fraction * self.moved

    def metrics(self, suffix: str) -> dict[str, float]:
        """`push/probe_snr`, the noise, the residual as a fraction of what is allowed (above
        1 fails), and the realised fraction where the move is decisive."""
        metrics = {
            f"push/probe_snr{suffix}": self.snr,
            f"push/probe_noise{suffix}": self.noise,
            f"push/probe_residual{suffix}": self.residual / self.allowed_residual,
        }
        if self.decisive:
            metrics[f"push/probe_realised{suffix}"] = self.realised
        return metrics

    def problem(self) -> str | None:
        """What is wrong with this move (None: it is what a complete push does). NaN fails:
        every comparison is written so that only a finite, in-range value passes."""
        if not all(math.isfinite(v) for v in (self.moved, self.realised, self.snr)):
            return f"a non-finite statistic ({self})"
        allowed = self.allowed_residual
        if not (self.residual <= allowed):
            return f"residual {self.residual:.3g} > allowed {allowed:.3g}"
        if self.decisive and not (abs(self.realised - 1) <= REALISED_TOLERANCE):
            low, high = 1 - REALISED_TOLERANCE, 1 + REALISED_TOLERANCE
            return f"realised {self.realised:.3g}, outside [{low:g}, {high:g}]"
        return None


def changes(reference: Scores, now: Scores) -> tuple[torch.Tensor, torch.Tensor]:
    """dT, dS: the trainer's and the server's change of each token's log-probability."""
    return (now.trainer - reference.trainer).double(), (now.served - reference.served).double()


def realised_fraction(d_trainer: torch.Tensor, d_served: torch.Tensor) -> float:
    """<dS,dT>/<dT,dT>: how much of the trainer's move the server made (0 without a move)."""
    square = float(d_trainer.pow(2).sum())
    return float((d_served * d_trainer).sum()) / square if square > 0 else 0.0


def non_finite(what: str, values: torch.Tensor) -> str | None:
    """A message naming `what`'s non-finite entries (None: all finite)."""
    bad = (~torch.isfinite(values)).nonzero()[:, 0].tolist()
    if not bad:
        return None
    shown = ", ".join(f"token {i}: {values[i].item()}" for i in bad[:5])
    return f"{len(bad)} of {len(values)} of {what} log-probabilities are not finite ({shown})"


@dataclass
class Noise:
    """The server's noise of *changes* in probe log-probabilities (RMS per token) over a move
    of the trainer's, measured over the first pushes and kept between `low` (its
    repeatability) and `cap` (the whole initial offset redrawn). A stale server measures none."""

    cap: float
    low: float
    resolved_move: float
    """The summed rms(dT) over which the measured pushes resolve the server's rounding."""
    pushes: int = 0
    sum_change: float = 0.0
    """Sum over the measured pushes of the squared RMS change."""
    sum_moved: float = 0.0
    """Sum over the measured pushes of rms(dT)."""

    @classmethod
    def at_initial_push(cls, now: Scores, repeat: torch.Tensor | None) -> Noise:
        """At the initial push both sides hold the same weights: their offset (kernels,
        dtypes) and the server's repeatability bound the noise."""
        jitter = 0.0 if repeat is None else rms(repeat.double() - now.served)
        offset = rms(now.served - now.trainer)
        cap = max(math.sqrt(2 * (offset**2 + jitter**2)), PROBE_NOISE_FLOOR)
        low = max(math.sqrt(2) * jitter, PROBE_NOISE_FLOOR)
        resolved_move = RESOLVED_TOKENS * math.sqrt(12) * offset / len(now.trainer)
        return cls(cap=cap, low=low, resolved_move=resolved_move)

    @property
    def measured(self) -> bool:
        """The noise of changes is known (the first pushes were measured, over a move that
        resolves the server's rounding)."""
        return self.pushes >= CALIBRATION_PUSHES and self.sum_moved >= self.resolved_move

    def measure(self, previous: Scores, now: Scores) -> None:
        """Count the change from `previous` to `now` while the first pushes are measured."""
        d_trainer, d_served = changes(previous, now)
        moved = rms(d_trainer)
        if self.measured or not moved >= PROBE_NOISE_FLOOR:
            return
        unexplained = d_served - realised_fraction(d_trainer, d_served) * d_trainer
        self.pushes += 1
        self.sum_change += rms(unexplained) ** 2
        self.sum_moved += moved

    def over(self, moved: float) -> float:
        """The noise a complete push shows over a move of rms `moved`."""
        if not self.measured:
            return self.cap
        ratio = moved * self.pushes / self.sum_moved
        change = math.sqrt(self.sum_change / self.pushes) * max(math.sqrt(ratio), ratio)
        return min(max(change, self.low), self.cap)

    def state(self) -> dict[str, float]:
        """JSON-able."""
        return asdict(self)


class PushProbe:
    """The probe of one server: token ids, absolute limit (`kl_max`: every push; default: a
    fresh run's initial push only), noise, and the scores later pushes are compared with.
    Every rank checks the same (broadcast) scores, so all ranks pass or raise together."""

    def __init__(self, ids: list[int], kl_max: float | None = None, noise: float | None = None):
        self.ids = ids
        self.kl_max = kl_max if kl_max is not None else PROBE_KL_CAP
        self.configured = kl_max is not None
        self.fixed_noise = noise
        self.noise: Noise | None = None
        self.initial: Scores | None = None
        """The initial push's scores: the cumulative check's reference."""
        self.reference: Scores | None = None
        """The last decisive push's scores (the initial one before any)."""
        self.previous: Scores | None = None
        """The last push's scores (the noise of changes is measured from push to push)."""

    @property
    def calibrated(self) -> bool:
        """The initial push was checked (its scores and the noise's bounds are known)."""
        return self.initial is not None

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps of the probe (JSON-able; empty before the initial push)."""
        if self.initial is None:
            return {}
        return {
            "ids": self.ids,
            "noise": self.noise.state(),
            **{key: getattr(self, key).state() for key in ("initial", "reference", "previous")},
        }

    def load_state(self, state: dict[str, Any]) -> None:
        """Continue from `state()` of the run being resumed. A state for other probe ids
        (another tokenizer or reasoning vocabulary) is left out: the probe calibrates again."""
        if state.get("ids") != self.ids:
            if state:
                log.warning("the checkpoint's push probe used other token ids: calibrating again")
            return
        self.noise = Noise(**state["noise"])
        self.initial, self.reference, self.previous = (
            Scores.from_state(state[key]) for key in ("initial", "reference", "previous")
        )

    def check(
        self,
        trainer: torch.Tensor,
        served: torch.Tensor,
        version: int,
        model: str,
        repeat: torch.Tensor | None = None,
    ) -> dict[str, float]:
        """Raise `WeightsNotServedError` unless the server serves weight `version`; return
        what was measured (`push/probe_*` metrics). `repeat`: the server's second scoring of
        the initial push, which measures its run-to-run noise."""
        where = f"after the push of weight version {version}, {model!r} on the server"
        self._check_finite(where, trainer, served, repeat)
        now = Scores(version, trainer.double(), served.double())
        kl = probe_kl(now.trainer, now.served)
        if (self.configured or not self.calibrated) and not (kl <= self.kl_max):
            how = "server.probe_kl_max" if self.configured else "the initial push's limit"
            raise WeightsNotServedError(
                f"{where} scores a fixed token sequence differently from the trainer's weights: "
                f"push/probe_kl {kl:.3g} > {how} {self.kl_max:.3g}. {NOT_SERVED} If the server "
                "computes in lower precision than this allows, set server.probe_kl_max. "
                f"{TURN_OFF}"
            )
        if self.initial is None:
            self.noise = Noise.at_initial_push(now, repeat)
            self.initial = self.reference = self.previous = now
            return {"push/probe_kl": kl}
        self.noise.measure(self.previous, now)
        self.previous = now
        step = self._compare(self.reference, now, fraction=STEP_RESIDUAL_FRACTION)
        total = self._compare(self.initial, now, fraction=RESIDUAL_FRACTION)
        for move in (step, total):
            problem = move.problem()
            if problem is not None:
                raise WeightsNotServedError(f"{where} {self._describe(move, problem)}")
        if step.decisive:
            self.reference = now
        return {"push/probe_kl": kl, **step.metrics(""), **total.metrics("_total")}

    def _compare(self, reference: Scores, now: Scores, fraction: float) -> Move:
        """The server's move against the trainer's from `reference` to `now`, its residual
        allowed `fraction` of the move besides the noise."""
        d_trainer, d_served = changes(reference, now)
        moved = rms(d_trainer)
        noise = self.fixed_noise or self.noise.over(moved)
        realised = realised_fraction(d_trainer, d_served)
        return Move(reference.version, moved, realised, rms(d_served - d_trainer), noise, fraction)

    def _check_finite(
        self, where: str, trainer: torch.Tensor, served: torch.Tensor, repeat: torch.Tensor | None
    ) -> None:
        """Raise, naming the side and the tokens, when any log-probability is not finite."""
        sides = [("the trainer's", trainer, BROKEN_POLICY), ("the server's", served, BROKEN_SERVER)]
        if repeat is not None:
            sides.append(("the server's repeated", repeat, BROKEN_SERVER))
        for what, values, advice in sides:
            problem = non_finite(what, values)
            if problem is not None:
                raise WeightsNotServedError(f"{where}: {problem}. {advice}")

    def _describe(self, move: Move, problem: str) -> str:
        """What the check measured and what to do, for the error."""
        return (
            f"did not follow the trainer's weights since version {move.since}: the trainer's "
            f"probe log-probabilities moved by {move.moved:.3g} (RMS per token; "
            f"{move.snr:.3g}x the server's noise {move.noise:.3g} over that move), and the "
            f"server realised {move.realised:.3g} of that move (1: every weight arrived, 0: "
            f"none did; checked when the move is at least {DECISIVE_SNR:g}x the noise), "
            f"residual {move.residual:.3g}: {problem}. {NOT_SERVED} {CANNOT_SEE} If the "
            "server's log-probabilities are noisier than the first pushes measured "
            f"(nondeterministic kernels), set server.probe_noise above {move.noise:.3g}. "
            f"{TURN_OFF}"
        )
