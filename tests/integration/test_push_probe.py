"""The push probe: after every push, the server's log-probabilities of a fixed token sequence
must match the trainer's for the weights it just pushed, whatever the rollouts' policy lag."""

from __future__ import annotations

import pytest
from support import config, restore_base_weights
from toy_env import target_share_env

from rlvr.trainer.grpo import Trainer
from rlvr.weight_sync.merged_stream import MergedWeightSource
from rlvr.weight_sync.probe import (
    WeightsNotServedError,
)


def drop_tensor(monkeypatch, name: str) -> None:
    """Make every merged push silently leave out one tensor: the server keeps its old value."""
    plan = MergedWeightSource._plan

    def without(model):
        return [e for e in plan(model) if e.name != name]

    monkeypatch.setattr(MergedWeightSource, "_plan", staticmethod(without))


@pytest.mark.integration
def test_push_probe_catches_weights_that_did_not_arrive(tiny_server, tmp_path, monkeypatch):
    """async_level 1: every batch after the first lags a step, so mismatch-KL cannot tell a
    stale server from lag. The probe compares the pushed weights themselves: a merged push
    that skips lm_head fails at the first step, and a complete push passes it."""
    env = target_share_env(set(range(0, 512, 2)))  # half the ids: every group learns
    extra = ["max_steps=2", "batch.async_level=1", "batch.batch_size=16"]
    complete = Trainer(config(tiny_server, tmp_path / "complete", *extra), env=env)
    history = complete.run()
    assert [h["push/probe_kl"] for h in history] == pytest.approx([0, 0], abs=1e-9)

    restore_base_weights(tiny_server)  # the initial push then matches despite the gap
    drop_tensor(monkeypatch, "lm_head.weight")
    partial = Trainer(config(tiny_server, tmp_path / "partial", *extra), env=env)
    with pytest.raises(WeightsNotServedError, match="version 1") as caught:
        partial.run()
    assert partial.pushes == 2 and partial.history == []  # failed at step 1, before logging
    print(caught.value)
