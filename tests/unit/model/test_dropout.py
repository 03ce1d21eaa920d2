"""The GRPO policy's loss and reference forwards run without dropout (rlvr.model.policy
`disable_dropout`): on identical weights the importance ratio is exactly 1, whatever dropout
the LoRA config or the model's own config asks for."""

from __future__ import annotations

import shutil

import pytest
import torch
from accelerate import Accelerator
from transformers import Qwen2ForCausalLM

from rlvr.batch import Sample
from rlvr.config import load_config
from rlvr.layout.micro_batches import collate
from rlvr.model.policy import load_policy, reference_mode
from rlvr.trainer.logprobs import sequence_scores
from rlvr.trainer.step import micro_batch_loss


@pytest.fixture(scope="module")
def dropout_model_dir(tiny_model_dir, tmp_path_factory):
    """The tiny model with attention dropout 0.3 in its config (read in train mode)."""
    out = tmp_path_factory.mktemp("models") / "tiny-attention-dropout"
    Qwen2ForCausalLM.from_pretrained(tiny_model_dir, attention_dropout=0.3).save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_model_dir / name, out / name)
    return out


def ratios(model_dir, lora_dropout: float, guarded: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The loss forward's ratio statistics (min, max) and the reference pass's two draws, on a
    micro-batch whose sampler log-probabilities are the policy's own (same weights)."""
    cfg = load_config(
        overrides=[
            f"model.name={model_dir}",
            "model.dtype=float32",
            f"lora.dropout={lora_dropout}",
            "lora.target_modules=[q_proj,v_proj,up_proj]",
            "loss.beta=0.1",
            "sampling.temperature=0.8",
        ]
    )
    sampled_len = cfg.batch.max_seq_len if guarded else None
    policy = load_policy(
        cfg.model, cfg.lora, Accelerator(cpu=True), keep_reference=True, sampled_len=sampled_len
    )
    model = policy.model
    torch.manual_seed(0)
    with torch.no_grad():  # a LoRA delta away from 0, so its dropout has something to drop
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p) * 0.05)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, model.config.vocab_size, (4, 40), generator=g).tolist()
    samples = [Sample(row, [0] * 16 + [1] * 24, [0.0] * 40, 1.0) for row in ids]
    mb = collate([[s] for s in samples], policy.pad_id)
    model.train()  # as forward_backward runs it
    with torch.no_grad():
        mb.sampler_logprobs = sequence_scores(model, mb, 0.8).logprobs

    def reference(batch):
        with torch.no_grad(), reference_mode(model):
            return sequence_scores(model, batch, 0.8).logprobs

    _, terms = micro_batch_loss(model, mb, cfg, mb.num_loss_tokens, 1, reference)
    extremes = torch.stack([terms.stats["ratio/min"], terms.stats["ratio/max"]])
    select = mb.loss_mask > 0
    return extremes, torch.stack([reference(mb)[select], reference(mb)[select]])


@pytest.mark.parametrize(
    ("lora_dropout", "model_dropout"), [(0.05, False), (0.0, True)], ids=["lora", "model"]
)
def test_loss_forward_has_no_dropout(
    tiny_model_dir, dropout_model_dir, lora_dropout, model_dropout
):
    model_dir = dropout_model_dir if model_dropout else tiny_model_dir
    extremes, references = ratios(model_dir, lora_dropout, guarded=True)
    assert extremes.tolist() == [1.0, 1.0]
    assert torch.equal(references[0], references[1])
    # the same forwards with the dropout left on: the ratio strays (what the guard prevents)
    extremes, references = ratios(model_dir, lora_dropout, guarded=False)
    assert extremes[1] - extremes[0] > 1e-2
    if model_dropout:  # the reference pass (adapter off) runs the model's own dropout
        assert not torch.equal(references[0], references[1])
