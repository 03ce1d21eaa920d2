"""Shared-prefix training (rlvr.layout): folding a step's samples into prefix trees
changes no log-probability, loss term or gradient, keeps every continuation blind to the others, and
keeps groups whole across ranks."""

from __future__ import annotations

import pytest
import torch
from unit.layout.test_prefix_tree import ATOL, policy, step_samples


@pytest.mark.slow
def test_prefix_tree_flex_attention_forward_matches_unshared_on_cpu(tiny_model_dir):
    """The GPU path's forward on the CPU (compiled flex attention runs forward there, not
    backward: `test_prefix_tree_flex_attention_matches_unshared_on_gpu`): the tree's block
    mask gives every sample's log-probabilities as its own forward does. Slow: compiling flex
    attention and the block mask takes minutes on two cores."""
    from rlvr.layout.attention import tree_attention
    from rlvr.layout.folded import collate_folded
    from rlvr.layout.micro_batches import collate
    from rlvr.layout.prefix_tree import fold_rows
    from rlvr.reasoning_vocab.mapping import load_tokenizer
    from rlvr.trainer.logprobs import sequence_scores

    tokenizer = load_tokenizer(tiny_model_dir)
    samples = step_samples(lambda t: tokenizer.encode(t, add_special_tokens=False))
    model, _, _, gate, pad_id = policy(tiny_model_dir, True, False, "flex_attention")
    assert tree_attention(model) == "flex_attention"
    rows = fold_rows(samples, 10_000)
    ordered = [s for row in rows for s in row]
    folded = collate_folded(rows, pad_id, "flex_attention")
    unshared = collate([[s] for s in ordered], pad_id)
    model.eval()
    with torch.no_grad():
        got = sequence_scores(model, folded, 0.8, mask_logits=gate.logit_mask(folded)).logprobs
        want = sequence_scores(model, unshared, 0.8, mask_logits=gate.logit_mask(unshared))
    assert got.shape == want.logprobs.shape and bool(want.logprobs.ne(0).any())
    assert torch.allclose(got, want.logprobs, atol=ATOL)


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
        trained = [h for h in ranks[0]["history"] if h["grad_norm"] > 0]  # a step with signal
        assert trained, "no step had signal: nothing was forwarded to compare"
        saved.append([h["throughput/prefix_saved_frac"] for h in trained])
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
