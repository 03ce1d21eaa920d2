"""The model probe: the server's log-probabilities of a fixed token sequence must be the
trainer's within an absolute limit, and anything non-finite fails."""

from __future__ import annotations

import math

import pytest
import torch

from rlvr.reasoning_vocab.mapping import ReasoningVocab
from rlvr.trainer.grpo import Trainer
from rlvr.weight_sync.probe import ModelProbe, WeightsNotServedError, probe_ids, probe_kl


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


def test_probe_holds_every_check_to_its_absolute_limit():
    """The default limit passes a float32 server and a bf16 server's rounding, at any version
    (a resume onto other kernels included), and fails another model; a configured limit
    replaces it."""
    trainer = torch.tensor([-1.0, -2.0, -0.5], dtype=torch.float64)
    probe = ModelProbe([1, 2, 3])
    for version, kl in enumerate([3e-14, 8e-4, 9e-3]):  # float32, bf16, other kernels
        assert probe.check(trainer, offset(trainer, kl), version, "m")["push/probe_kl"] == (
            pytest.approx(kl, rel=1e-6)
        )
    with pytest.raises(WeightsNotServedError, match="version 3.*'m'.*default limit 0.01"):
        probe.check(trainer, offset(trainer, 0.011), version=3, model="m")
    fixed = ModelProbe([1, 2, 3], kl_max=0.1)
    fixed.check(trainer, offset(trainer, 0.05), version=0, model="m")
    with pytest.raises(WeightsNotServedError, match="server.probe_kl_max 0.1"):
        fixed.check(trainer, offset(trainer, 0.2), version=1, model="m")


def test_probe_error_says_what_was_seen_and_what_to_do():
    trainer = torch.linspace(-8, -1, 64, dtype=torch.float64)
    with pytest.raises(WeightsNotServedError) as caught:
        ModelProbe([0] * 65).check(trainer, trainer - 0.5, 1, "m")
    message = str(caught.value)
    for words in (
        "version 1, 'm'",
        "push/probe_kl 0.149 > the default limit 0.01",
        "another model or tokenizer",
        "server.probe_kl_max",
        "server.push_probe=false",
    ):
        assert words in message, message


def test_probe_is_nan_safe():
    """A non-finite log-probability on either side raises and says which side (NaN compares
    False, so no limit lets it through)."""
    trainer = torch.linspace(-8, -1, 16, dtype=torch.float64)
    for bad in (math.nan, math.inf, -math.inf):
        for side in ("trainer", "served"):
            scores = {"trainer": trainer.clone(), "served": trainer + 1e-3}
            scores[side][3] = bad
            who = "server" if side == "served" else "trainer"
            message = f"of the {who}'s .* not finite .token 3"
            with pytest.raises(WeightsNotServedError, match=message):
                ModelProbe([0] * 17).check(scores["trainer"], scores["served"], 0, "m")
    assert not (probe_kl(trainer, trainer + math.nan) <= 1.0)


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
