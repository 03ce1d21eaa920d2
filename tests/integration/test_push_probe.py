"""The model probe where the exact check cannot reach (`server.exact_check=false` here, as for
a quantized server): every push is held to the probe's absolute limit, against a real vf-vllm.
What the limit cannot see (a stale or partly updated server whose scores stay under it) is the
exact check's work: tests/integration/test_exact_check.py."""

from __future__ import annotations

import pytest
from support import config, restore_base_weights
from toy_env import target_share_env

from rlvr.trainer.grpo import Trainer
from rlvr.weight_sync.merged import MergedPush
from rlvr.weight_sync.merged_stream import MergedWeightSource
from rlvr.weight_sync.probe import WeightsNotServedError

HALF_THE_IDS = set(range(0, 512, 2))  # the toy reward: every group learns
PROBED = "server.exact_check=false"


def garble_from(monkeypatch, version: int, prefix: str) -> None:
    """Make the merged pushes from weight `version` on send the tensors whose names start with
    `prefix` (`lm_head.`) with their rows reversed: the server holds another output layer."""
    push, stream = MergedPush.push, MergedWeightSource.__iter__
    pushing = [0]

    def tracked(self, pushed_version):
        pushing[0] = pushed_version
        return push(self, pushed_version)

    def garbled(self):
        garble = pushing[0] >= version
        for name, tensor in stream(self):
            yield name, tensor.flip(0) if garble and name.startswith(prefix) else tensor

    monkeypatch.setattr(MergedPush, "push", tracked)
    monkeypatch.setattr(MergedWeightSource, "__iter__", garbled)


@pytest.mark.integration
def test_push_probe_catches_weights_that_did_not_arrive(tiny_server, tmp_path, monkeypatch):
    """async_level 1: every batch after the first lags a step, so mismatch-KL cannot tell a
    stale server from lag. Without the exact check the probe checks every push, not only the
    initial one: complete pushes score as the trainer does, and a push of version 1 whose
    output layer arrives garbled fails its probe, so version 1 is never published."""
    env = target_share_env(HALF_THE_IDS)
    extra = ["max_steps=2", "batch.async_level=1", "batch.batch_size=16", PROBED]
    complete = Trainer(config(tiny_server, tmp_path / "complete", *extra), env=env)
    history = complete.run()
    assert [h["push/probe_kl"] for h in history] == pytest.approx([0, 0], abs=1e-9)
    assert all("push/verified_params" not in h for h in history), "the exact check was off"

    garble_from(monkeypatch, 1, "lm_head.")
    partial = Trainer(config(tiny_server, tmp_path / "partial", *extra), env=env)
    over = r"version 1.*push/probe_kl .* > the default"
    with pytest.raises(WeightsNotServedError, match=over) as e:
        partial.run()
    print(e.value)
    restore_base_weights(tiny_server)
    clock = partial.worker.clock  # version 1 was pushed and failed its probe: never published
    assert (clock.pushing, clock.current) == (1, 0) and partial.history == []
