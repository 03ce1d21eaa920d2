"""Shared-prefix training (rlvr.trainer.prefix_tree): folding a step's samples into prefix trees
changes no log-probability, loss term or gradient, keeps every continuation blind to the others, and
keeps groups whole across ranks."""

from __future__ import annotations

import pytest
import torch
from unit.trainer.test_prefix_tree import ATOL


@pytest.mark.integration
@pytest.mark.slow
def test_prefix_sharing_zero3_two_ranks_pushes_the_unshared_runs_weights(tiny_server, tmp_path):
    """`accelerate launch` with ZeRO-3 on 2 CPU processes, prefix sharing on and off from the
    same initial weights and seeded rollouts: after 2 steps the adapter the trainer pushed
    (its final adapter) is the same, while the shared run forwarded far fewer tokens. "The
    same": Adam's first updates are about lr * sign(gradient), so where a gradient is near 0
    float32's rounding of differently ordered sums moves a handful of elements by up to
    ~1e-4 (of updates of ~0.03); all others agree to 1e-5."""
    from safetensors.torch import load_file
    from support import launch, zero3_launch

    accelerate = zero3_launch()
    adapters, saved = [], []
    for sharing in (True, False):
        out = tmp_path / f"sharing-{sharing}"
        extra = ["max_steps=2", "batch.micro_batch_size=4", f"batch.prefix_sharing={sharing}"]
        ranks = launch(tiny_server, out, accelerate, extra, {"DS_ACCELERATOR": "cpu"})
        assert [r["world"] for r in ranks] == [2, 2]
        saved.append([h["throughput/prefix_saved_frac"] for h in ranks[0]["history"]])
        adapters.append(load_file(out / "run" / "final" / "adapter_model.safetensors"))
    assert min(saved[0]) > 0.3 and max(saved[1]) == 0
    shared, unshared = adapters
    assert shared.keys() == unshared.keys()
    differ = 0
    for name, weight in unshared.items():
        assert torch.allclose(shared[name], weight, atol=1e-4), name
        differ += int(((shared[name] - weight).abs() > ATOL).sum())
    assert differ <= 1e-3 * sum(w.numel() for w in unshared.values())
    assert any(w.abs().max() > 0 for name, w in unshared.items() if "lora_B" in name)
