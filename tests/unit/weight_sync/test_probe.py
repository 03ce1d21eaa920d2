"""The push probe: after every push, the server's log-probabilities of a fixed token sequence
must match the trainer's for the weights it just pushed, whatever the rollouts' policy lag."""

from __future__ import annotations

import math

import pytest
import torch

from rlvr.reasoning_vocab.mapping import ReasoningVocab
from rlvr.trainer.grpo import Trainer
from rlvr.weight_sync.probe import (
    DECISIVE_SNR,
    PROBE_NOISE_FLOOR,
    Move,
    PushProbe,
    WeightsNotServedError,
    probe_ids,
    probe_kl,
)


def test_probe_kl_is_zero_only_when_both_sides_agree():
    trainer = torch.tensor([-1.0, -2.0, -0.5])
    assert probe_kl(trainer, trainer.clone()) == 0.0
    off = probe_kl(trainer, trainer + torch.tensor([0.0, 0.1, 0.0]))
    assert off == pytest.approx((torch.expm1(torch.tensor(-0.1)) + 0.1).item() / 3, rel=1e-6)
    assert probe_kl(trainer, trainer - 0.1) > 0  # either direction counts


def offset(trainer: torch.Tensor, kl: float) -> torch.Tensor:
    """Server log-probabilities at a uniform offset d from `trainer` with exp(d) - 1 - d = kl."""
    d = math.sqrt(2 * kl)
    for _ in range(50):  # Newton on exp(d) - 1 - d - kl
        d -= (math.expm1(d) - d - kl) / math.expm1(d)
    return trainer - d


def test_probe_absolute_limit_holds_the_initial_push_and_a_configured_one_every_push():
    trainer = torch.tensor([-1.0, -2.0, -0.5], dtype=torch.float64)
    probe = PushProbe([1, 2, 3])
    probe.check(trainer, offset(trainer, 3e-14), version=0, model="m")  # float32 both sides
    with pytest.raises(WeightsNotServedError, match=r"version 1.*'m'.*residual"):
        probe.check(trainer, offset(trainer, 2e-6), version=1, model="m")  # the server moved
    bf16 = PushProbe([1, 2, 3])
    bf16.check(trainer, offset(trainer, 8e-4), version=0, model="m")  # a bf16 server's rounding
    bf16.check(trainer, offset(trainer, 8e-4), version=1, model="m")  # the same offset passes
    with pytest.raises(WeightsNotServedError, match="version 0.*initial push's limit 0.01"):
        PushProbe([1, 2, 3]).check(trainer, offset(trainer, 0.05), version=0, model="m")
    fixed = PushProbe([1, 2, 3], kl_max=0.1)
    fixed.check(trainer, offset(trainer, 0.05), version=0, model="m")
    with pytest.raises(WeightsNotServedError, match="server.probe_kl_max 0.1"):
        fixed.check(trainer, offset(trainer, 0.2), version=1, model="m")


def test_probe_noise_is_bounded_by_the_initial_offset_and_repeatability():
    """Above: sqrt(2) x the rms of both (the offset is redrawn as weights move); below:
    sqrt(2) x the repeatability; never below the floor; a configured noise is kept."""
    trainer = torch.full((4,), -3.0, dtype=torch.float64)
    served = trainer + torch.tensor([0.03, -0.03, 0.03, -0.03], dtype=torch.float64)
    repeat = served + torch.tensor([0.04, -0.04, 0.04, -0.04], dtype=torch.float64)
    probe = PushProbe([0] * 5)
    assert probe.check(trainer, served, 0, "m", repeat=repeat) == {
        "push/probe_kl": pytest.approx(probe_kl(trainer, served))
    }
    assert probe.noise.cap == pytest.approx(math.sqrt(2) * 0.05)
    assert probe.noise.low == pytest.approx(math.sqrt(2) * 0.04)
    assert probe.noise.over(1.0) == probe.noise.cap  # before the first pushes are measured
    exact = PushProbe([0] * 5)
    exact.check(trainer, trainer.clone(), 0, "m", repeat=trainer.clone())
    assert exact.noise.cap == exact.noise.low == PROBE_NOISE_FLOOR
    fixed = PushProbe([0] * 5, noise=0.5)
    fixed.check(trainer, served, 0, "m", repeat=repeat)
    moved = fixed.check(trainer + 0.01, served, 1, "m")
    assert moved["push/probe_noise"] == moved["push/probe_noise_total"] == 0.5


def bf16(values: torch.Tensor) -> torch.Tensor:
    """What a bfloat16 server returns for these log-probabilities: rounded to 8 bits."""
    return values.to(torch.bfloat16).double()


def drive(probe: PushProbe, served_for, pushes: int, step: float, seed: int = 0) -> int | None:
    """Push `pushes` versions whose trainer probe log-probabilities drift by ~`step` (RMS per
    token, mostly in one direction, as training does); the server answers `served_for(version,
    trainer)`. Returns the version the probe raised at (None: it never did)."""
    g = torch.Generator().manual_seed(seed)
    trainer = -6 + torch.randn(64, generator=g, dtype=torch.float64)
    direction = torch.randn(64, generator=g, dtype=torch.float64)
    for version in range(pushes):
        if version:
            noise = torch.randn(64, generator=g, dtype=torch.float64)
            trainer = trainer + step * (direction + noise) / math.sqrt(2)
        repeat = served_for(version, trainer) if version == 0 else None
        try:
            probe.check(trainer, served_for(version, trainer), version, "m", repeat=repeat)
        except WeightsNotServedError:
            return version
    return None


class PartServer:
    """A bf16 server that makes `fraction` of the trainer's move since the initial push
    (0.3: a push that leaves out most of the model), or none from version `stale_from` on."""

    def __init__(self, fraction: float = 1.0, stale_from: int | None = None):
        self.fraction, self.stale_from = fraction, stale_from
        self.initial = self.held = None

    def __call__(self, version: int, trainer: torch.Tensor) -> torch.Tensor:
        if self.initial is None:
            self.initial = trainer
        if self.stale_from is None or version < self.stale_from:
            self.held = bf16(self.initial + self.fraction * (trainer - self.initial))
        return self.held


@pytest.mark.parametrize("step", [2e-3, 2e-2])
def test_probe_sees_a_stale_bf16_server_once_the_move_clears_its_noise(step):
    """On a bf16 server one step can move the probe far less than the server's rounding: the
    reference then stays put and the trainer's move accumulates until it is measurable.
    Complete pushes never raise over 300 pushes, at either step size and whatever the noise's
    draw."""
    for seed in range(3):
        assert drive(PushProbe([0] * 65), lambda v, t: bf16(t), 300, step, seed) is None
    noise = math.sqrt(2) * 0.0089  # ~ bf16's rounding of log-probabilities near -6, twice
    needed = DECISIVE_SNR * noise / step  # pushes before the move clears the noise
    caught = drive(PushProbe([0] * 65), PartServer(stale_from=5), 300, step)
    assert caught is not None and 5 <= caught <= 5 + 2 * needed
    partial = drive(PushProbe([0] * 65), PartServer(fraction=0.3), 300, step)
    assert partial is not None and partial <= 2 * needed


def test_probe_error_says_what_was_seen_and_what_to_do():
    trainer = torch.linspace(-8, -1, 64, dtype=torch.float64)
    probe = PushProbe([0] * 65)
    probe.check(trainer, bf16(trainer), 0, "m", repeat=bf16(trainer))
    moved = trainer + 0.2 * torch.linspace(-1, 1, 64, dtype=torch.float64)
    with pytest.raises(WeightsNotServedError) as caught:
        probe.check(moved, bf16(trainer), 1, "m")  # the server kept version 0
    message = str(caught.value)
    for words in (
        "version 1, 'm'",
        "since version 0",
        "realised 0 of that move",
        "RMS per token",
        "server.probe_noise",
        "server.push_probe=false",
    ):
        assert words in message, message


def test_probe_is_nan_safe():
    """A non-finite log-probability on either side, at the initial push or later, raises and
    says which side; no statistic computed from it can pass a limit (NaN compares False)."""
    trainer = torch.linspace(-8, -1, 16, dtype=torch.float64)
    for bad in (math.nan, math.inf, -math.inf):
        for side in ("trainer", "served", "repeat"):
            for later in (False, True):
                probe = PushProbe([0] * 17)
                if later:
                    probe.check(trainer, trainer + 1e-3, 0, "m", repeat=trainer + 1e-3)
                scores = {"trainer": trainer.clone(), "served": trainer + 1e-3}
                scores["repeat"] = trainer + 1e-3 if not later else None
                if scores.get(side) is None:
                    continue  # the server scores twice only at the initial push
                scores[side][3] = bad
                with pytest.raises(
                    WeightsNotServedError, match="token 3.*not finite|not finite.*token 3"
                ):
                    probe.check(
                        scores["trainer"],
                        scores["served"],
                        int(later),
                        "m",
                        repeat=scores["repeat"],
                    )
    nan_move = Move(since=0, moved=math.nan, realised=1.0, residual=0.0, noise=1e-3)
    assert "non-finite" in nan_move.problem()
    assert Move(0, 1.0, math.nan, 0.0, 0.1).problem() is not None
    assert Move(0, 1.0, 1.0, math.nan, 0.1).problem() is not None
    assert Move(0, 1.0, 1.0, 0.0, math.nan).problem() is not None


def test_probe_ids_hold_a_think_span_of_reasoning_ids(tiny_model_dir):
    """A reasoning vocabulary's added rows train too, so the probe reads some of them."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    plain = probe_ids(tokenizer)
    assert len(plain) > 40 and max(plain) < len(tokenizer)
    vocab = ReasoningVocab(base_vocab_size=len(tokenizer), original_ids=tuple(range(3, 103)))
    with_vocab = probe_ids(tokenizer, vocab)
    added = [i for i in with_vocab if i >= len(tokenizer)]
    assert added == list(range(len(tokenizer), len(tokenizer) + 16))
    assert with_vocab[-len(plain) :] == plain


def test_mismatch_kl_warns_only_on_batches_sampled_by_the_weights_they_train(tmp_path, caplog):
    """With policy lag, mismatch-KL also measures how far the policy moved since sampling: no
    warning there (the probe checks the pushes); without lag it is the sampler's fault."""
    import logging

    from rlvr.config import load_config
    from rlvr.trainer.metrics import RunLogger

    trainer = Trainer.__new__(Trainer)  # only what reporting reads
    trainer.cfg = load_config(
        overrides=[f"output_dir={tmp_path}", "wandb.mode=disabled", "logging.progress_bar=false"]
    )
    trainer.logger = RunLogger(trainer.cfg, True, 0)
    with caplog.at_level(logging.WARNING, logger="rlvr.trainer.metrics"):
        trainer._report(2, {"mismatch_kl": 0.1, "rollouts/policy_lag": 1}, [])
        assert not caplog.records
        trainer._report(3, {"mismatch_kl": 0.1, "rollouts/policy_lag": 0}, [])
    (record,) = caplog.records
    assert "step 3: mismatch-KL 0.1" in record.getMessage()
    trainer.logger.close()


def test_probe_resume_keeps_its_calibration():
    """A correct bf16 server whose offset grows as training sharpens the logits passes the
    1e-2 cap of a fresh run's initial push; a resumed run's first push, with the probe's
    state from the checkpoint (through JSON), is judged like any later push and passes, and
    the resumed probe goes on judging (and still sees a server that stops updating)."""
    import json

    g = torch.Generator().manual_seed(0)
    start = -6 + torch.randn(64, generator=g, dtype=torch.float64)
    direction = torch.randn(64, generator=g, dtype=torch.float64)
    offset = 0.06 * torch.randn(64, generator=g, dtype=torch.float64)

    def scores(version: int, stale_from: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The trainer's probe after `version` steps of ~0.02, and a correct server's (its
        offset grows by 3.5% a step), or a stale one's from `stale_from` on."""
        trainer = start + 0.02 * version * direction
        held = version if stale_from is None else min(version, stale_from)
        return trainer, start + 0.02 * held * direction + (1 + 0.035 * held) * offset

    probe = PushProbe([0] * 65)
    for version in range(45):
        trainer, served = scores(version)
        probe.check(trainer, served, version, "m", repeat=served if version == 0 else None)
    assert probe_kl(*scores(44)) > 1e-2  # above the initial push's limit by now
    saved = json.loads(json.dumps(probe.state()))
    with pytest.raises(WeightsNotServedError, match="initial push's limit"):
        PushProbe([0] * 65).check(*scores(44), 44, "m")  # the resume without the state
    resumed = PushProbe([0] * 65)
    resumed.load_state(saved)
    assert resumed.calibrated and resumed.state() == saved
    metrics = resumed.check(*scores(44), 44, "m")  # the resumed run's initial push
    assert metrics["push/probe_kl"] > 1e-2
    for version in range(45, 50):
        resumed.check(*scores(version), version, "m")
    with pytest.raises(WeightsNotServedError, match="did not follow"):
        for version in range(50, 55):
            resumed.check(*scores(version, stale_from=49), version, "m")
    other = PushProbe([1] * 65)  # another tokenizer: the saved scores do not apply
    other.load_state(saved)
    assert not other.calibrated


def adapter_bf16(fraction: float = 1.0, stale: bool = False):
    """A bf16 server under adapter sync: its base fixed and rounded, the adapter's change of
    the log-probabilities on top (`fraction` of it: 0.3 for a server that never gets the MLP
    adapters), or the initial adapter for good (`stale`)."""
    held = {}

    def served(version: int, trainer: torch.Tensor) -> torch.Tensor:
        base = held.setdefault("base", trainer)
        return bf16(base) + (0.0 if stale else fraction * (trainer - base))

    return served


DEFAULT_LR_STEP = 1e-3
"""How far one optimizer step at lr 1e-5 moves the probe (RMS per token, on SmolLM2)."""


def test_probe_catches_stale_bf16_server_at_default_lr():
    """At lr 1e-5 a step moves the probe ~0.001, far below a bf16 server's offset (~0.01
    here): a noise bounded by that offset needs ~35 pushes before a check is decisive. The
    noise of *changes*, measured over the first pushes, is that of the server's change beside
    the trainer's: nothing for a server that never changes (stale) or that makes a share of
    each move (adapter sync: its base is fixed) -- caught once the first pushes are measured,
    which takes as many as make a correct server's rounding change (~5 here). Complete
    servers pass 300 pushes, merged (every push rounded again) or adapter-synced, also with
    steps far below their rounding, where a correct server shows no change for many pushes."""
    for seed in range(3):
        for complete in (lambda v, t: bf16(t), adapter_bf16()):
            for step in (DEFAULT_LR_STEP, 1e-5):
                assert drive(PushProbe([0] * 65), complete, 300, step, seed) is None
    stale_servers = {
        "merged, stale": lambda: PartServer(stale_from=1),
        "adapter sync, stale": lambda: adapter_bf16(stale=True),
        "adapter sync, no MLP adapters": lambda: adapter_bf16(fraction=0.3),
    }
    for what, server in stale_servers.items():
        for seed in range(3):
            caught = drive(PushProbe([0] * 65), server(), 300, DEFAULT_LR_STEP, seed)
            assert caught is not None and caught <= 6, (what, seed, caught)


def test_probe_catches_a_missing_layer():
    """30 layers move the probe together, each ~1/30 of a step at lr 1e-5; a float32 server
    that never applies one layer's updates realises ~0.97 of every move. Its residual (~3% of
    the move) is far above what a float32 offset can redraw: caught at the first push after
    the initial one. A complete float32 server (its offset redrawn at ~1e-7 every push)
    passes 300 pushes."""
    g = torch.Generator().manual_seed(0)
    shared = torch.randn(64, generator=g, dtype=torch.float64)

    def run(missing: int | None, pushes: int) -> int | None:
        probe = PushProbe([0] * 65)
        trainer = -6 + torch.randn(64, generator=g, dtype=torch.float64)
        served = trainer.clone()
        for version in range(pushes):
            if version:
                own = torch.randn(30, 64, generator=g, dtype=torch.float64)
                layers = DEFAULT_LR_STEP * (shared + 0.3 * own) / 30
                trainer = trainer + layers.sum(0)
                served = served + layers.sum(0) - (layers[missing] if missing is not None else 0)
            redraw = 1e-7 * torch.randn(64, generator=g, dtype=torch.float64)
            try:
                probe.check(trainer, served + redraw, version, "m", repeat=served + redraw)
            except WeightsNotServedError as e:
                assert "residual" in str(e) and "one layer of many" in str(e)
                return version
        return None

    assert run(missing=None, pushes=300) is None
    assert run(missing=7, pushes=40) == 1


def test_probe_passes_a_large_move_rounded_by_a_float32_server():
    """At lr 2e-2 a step can move the probe by ~2 RMS per token after steps that moved it
    not at all (no signal, noise measured at the floor); a complete float32 server rounds such
    a move to a residual of ~1e-5 of it (measured: 2.19e-5 on 2.19), which is not a missing
    layer (~3% of the move) and must pass."""
    g = torch.Generator().manual_seed(1)
    probe = PushProbe([0] * 65)
    trainer = -6 + torch.randn(64, generator=g, dtype=torch.float64)
    served = trainer.clone()
    for version in range(10):
        if version >= 6:
            move = 2.0 * torch.randn(64, generator=g, dtype=torch.float64)
            trainer = trainer + move
            served = served + move * (1 + 1e-5 * torch.randn(64, generator=g, dtype=torch.float64))
        probe.check(trainer, served.clone(), version, "m", repeat=served.clone())
