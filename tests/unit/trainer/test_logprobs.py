"""Chunked log-probabilities (rlvr.trainer.logprobs) against the full-vocabulary computation they
replace: the same values and gradients (float32, 1e-5) for plain, tied, untied and LoRA-on-lm_head
models, the head run only on loss positions, per-position logit masks, and refusal of models
whose forward transforms the head's logits."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import Gemma2Config, Gemma2ForCausalLM

from rlvr.batch import MicroBatch, Sample
from rlvr.layout.micro_batches import collate
from rlvr.trainer import logprobs
from rlvr.trainer.logprobs import head_logprobs, output_head, sequence_scores

from .tiny_models import VOCAB, tiny_qwen2


def tiny_model(tied: bool, lora_head: bool = False) -> torch.nn.Module:
    model = tiny_qwen2(layers=2, tied=tied)
    if lora_head:
        from peft import LoraConfig, get_peft_model

        targets = ["q_proj", "v_proj", "lm_head"]
        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=targets))
        for name, p in model.named_parameters():  # LoRA B starts at 0: make the adapter count
            if "lora_B" in name:
                torch.nn.init.normal_(p, std=0.1)
    return model


def micro_batch() -> MicroBatch:
    g = torch.Generator().manual_seed(1)
    samples = []
    for i in range(5):
        prompt, completion = 3 + i % 3, 2 + (3 * i) % 7
        ids = torch.randint(1, VOCAB, (prompt + completion,), generator=g).tolist()
        logprobs_ = [0.0] * prompt + [-1.0] * completion
        samples.append(Sample(ids, [0] * prompt + [1] * completion, logprobs_, float(i % 3) - 1))
    return collate([[s] for s in samples], 0)


def full_vocabulary(model, mb: MicroBatch, temperature: float, mask_logits=None):
    """The computation the chunked path replaces: every position's logits, in float32, with
    the padding masked (the chunked path leaves the mask out: see rlvr.layout.micro_batches)."""
    logits = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask).logits
    logits = logits[:, :-1].float() / temperature
    if mask_logits is not None:
        flat = logits.flatten(0, 1)
        logits = mask_logits(flat, torch.arange(flat.shape[0])).view_as(logits)
    logp = torch.log_softmax(logits, -1)
    picked = logp.gather(-1, mb.input_ids[:, 1:, None])[..., 0].masked_fill(mb.loss_mask == 0, 0)
    entropy = (torch.special.entr(logp.exp()).sum(-1) * mb.loss_mask).sum()
    return picked, entropy


def gradients(model) -> list[torch.Tensor]:
    grads = [p.grad.clone() for p in model.parameters() if p.requires_grad]
    model.zero_grad()
    return grads


@pytest.mark.parametrize(
    "tied, lora_head, chunk_tokens, recompute, temperature",
    [
        (False, False, 3, True, 0.7),
        (True, False, 3, False, 0.7),
        (True, True, 3, True, 1.0),
        (False, True, 1, False, 0.7),
        (True, False, 1000, False, 1.0),
    ],
)
def test_chunked_logprobs_and_gradients_equal_the_full_vocabulary(
    monkeypatch, tied, lora_head, chunk_tokens, recompute, temperature
):
    """Several chunks, kept for backward or checkpointed and recomputed in it, and a single
    chunk alike."""
    model = tiny_model(tied, lora_head)
    mb = micro_batch()
    expected, expected_entropy = full_vocabulary(model, mb, temperature)
    (expected * mb.advantages).sum().backward()
    expected_grads = gradients(model)

    monkeypatch.setattr(logprobs, "MAX_CHUNK_ELEMENTS", VOCAB * chunk_tokens)
    if recompute:
        monkeypatch.setattr(logprobs, "MAX_SAVED_ELEMENTS", VOCAB * chunk_tokens)
    recomputed = []
    monkeypatch.setattr(
        logprobs,
        "checkpoint",
        lambda *a, **k: recomputed.append(1) or torch.utils.checkpoint.checkpoint(*a, **k),
    )
    scores = sequence_scores(model, mb, temperature, with_entropy=True)
    assert bool(recomputed) == recompute
    (scores.logprobs * mb.advantages).sum().backward()
    assert torch.allclose(scores.logprobs, expected, atol=1e-5)
    assert scores.logprobs[mb.loss_mask == 0].abs().max() == 0
    assert scores.entropy_sum.item() == pytest.approx(expected_entropy.item(), rel=1e-5)
    assert not scores.entropy_sum.requires_grad
    for got, want in zip(gradients(model), expected_grads, strict=True):
        assert want.abs().sum() > 0
        assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()


def test_the_head_runs_only_on_loss_positions():
    model = tiny_model(tied=True)
    mb = micro_batch()
    rows = []
    head = output_head(model)
    handle = head.register_forward_hook(lambda _m, args, _out: rows.append(args[0].shape[-2]))
    sequence_scores(model, mb)
    handle.remove()
    assert rows[0] == 0  # inside the model's forward: an empty slice
    assert sum(rows[1:]) == mb.num_loss_tokens < mb.input_ids.numel() // 2


def test_a_per_position_logit_mask_shapes_logprobs_and_entropy():
    """`mask_logits` sees flat positions of the [B, T-1] grid: forbid the upper half of the
    vocabulary wherever the sampled token is in the lower half, as a reasoning-vocabulary gate
    would outside the think span."""
    model = tiny_model(tied=False)
    mb = micro_batch()
    gated = mb.input_ids[:, 1:].flatten() < VOCAB // 2
    assert 0 < gated.sum() < gated.numel()
    seen = []

    def forbid(logits: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        seen.append(positions)
        upper = torch.arange(logits.shape[-1]) >= VOCAB // 2
        return logits.masked_fill(gated[positions][:, None] & upper, -math.inf)

    expected, expected_entropy = full_vocabulary(model, mb, 1.0, forbid)
    seen.clear()
    scores = sequence_scores(model, mb, with_entropy=True, mask_logits=forbid)
    assert torch.equal(torch.cat(seen), (mb.loss_mask.flatten() > 0).nonzero()[:, 0])
    assert torch.allclose(scores.logprobs, expected, atol=1e-5)
    assert scores.entropy_sum.item() == pytest.approx(expected_entropy.item(), rel=1e-5)
    unmasked = sequence_scores(model, mb, with_entropy=True)
    assert scores.entropy_sum < unmasked.entropy_sum  # fewer choices where gated
    assert (scores.logprobs > unmasked.logprobs).any()  # the mass moves to the allowed half


def test_head_logprobs_without_tokens():
    head = torch.nn.Linear(8, VOCAB)
    picked, entropy = head_logprobs(
        head, torch.zeros(0, 8), torch.zeros(0, dtype=torch.long), torch.zeros(0), with_entropy=True
    )
    assert picked.shape == (0,) and entropy.item() == 0


def test_models_that_transform_their_logits_are_refused():
    config = Gemma2Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=16,
        final_logit_softcapping=30.0,
    )
    with pytest.raises(NotImplementedError, match="final_logit_softcapping=30.0"):
        sequence_scores(Gemma2ForCausalLM(config), micro_batch())


def test_a_micro_batch_without_loss_tokens_still_reaches_every_parameter():
    """Padding micro-batches (see rlvr.layout.micro_batches.padding_micro_batch) must run a
    backward that touches every parameter, or DDP and ZeRO-3 ranks fall out of step."""
    model = tiny_model(tied=False, lora_head=True)
    mb = collate([[Sample([0, 0], [0, 0], [0.0, 0.0])]], 0)
    scores = sequence_scores(model, mb, with_entropy=True)
    scores.logprobs.sum().backward()
    assert scores.entropy_sum.item() == 0
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_scores_without_gradients_equal_those_with():
    """The reference model's pass (no gradient, no entropy) skips the softmax it would only
    keep for backward; the log-probabilities stay the same."""
    model = tiny_model(tied=False)
    mb = micro_batch()
    expected = sequence_scores(model, mb, 0.7, with_entropy=True)
    with torch.no_grad():
        plain = sequence_scores(model, mb, 0.7)
        with_entropy = sequence_scores(model, mb, 0.7, with_entropy=True)
    assert plain.entropy_sum is None
    assert torch.equal(plain.logprobs, expected.logprobs.detach())
    assert with_entropy.entropy_sum.item() == pytest.approx(expected.entropy_sum.item())
