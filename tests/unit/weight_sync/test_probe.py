"""The push probe: after every push, the server's log-probabilities of a fixed token sequence
must match the trainer's for the weights it just pushed, whatever the rollouts' policy lag."""

from __future__ import annotations

import pytest
import torch

from rlvr.reasoning_vocab.mapping import ReasoningVocab
from rlvr.trainer.grpo import Trainer
from rlvr.weight_sync.probe import (
    PROBE_KL_FLOOR,
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


def test_probe_limit_is_calibrated_by_the_first_push_within_bounds():
    probe = PushProbe([1, 2, 3])
    probe.check(3e-14, version=0, model="m")  # float32 on both sides: the floor applies
    assert probe.kl_max == PROBE_KL_FLOOR
    with pytest.raises(WeightsNotServedError, match=r"version 1.*'m'.*calibrated limit 1e-06"):
        probe.check(2e-6, version=1, model="m")
    bf16 = PushProbe([1, 2, 3])
    bf16.check(8e-4, version=0, model="m")  # a bf16 server: ten times its rounding
    assert bf16.kl_max == pytest.approx(8e-3)
    with pytest.raises(WeightsNotServedError, match="version 0"):
        PushProbe([1, 2, 3]).check(0.05, version=0, model="m")  # even the first must pass
    fixed = PushProbe([1, 2, 3], kl_max=0.1)
    fixed.check(0.05, version=0, model="m")
    with pytest.raises(WeightsNotServedError, match="server.probe_kl_max 0.1"):
        fixed.check(0.2, version=1, model="m")


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
    trainer.cfg = load_config(overrides=[f"output_dir={tmp_path}", "wandb.mode=disabled",
                                         "logging.progress_bar=false"])  # fmt: skip
    trainer.logger = RunLogger(trainer.cfg, True, 0)
    with caplog.at_level(logging.WARNING, logger="rlvr.trainer.metrics"):
        trainer._report(2, {"mismatch_kl": 0.1, "rollouts/policy_lag": 1}, [])
        assert not caplog.records
        trainer._report(3, {"mismatch_kl": 0.1, "rollouts/policy_lag": 0}, [])
    (record,) = caplog.records
    assert "step 3: mismatch-KL 0.1" in record.getMessage()
    trainer.logger.close()
