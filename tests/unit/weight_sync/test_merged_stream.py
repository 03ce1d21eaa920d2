"""The merged-LoRA weight stream (what vf-vllm receives) and scripts/merge_adapter.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

from rlvr.config import LoraConfig
from rlvr.model.policy import apply_lora
from rlvr.weight_sync.merged_stream import MergedWeightSource, hf_name

ROOT = Path(__file__).resolve().parents[3]


def tiny_model(tie: bool = False) -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        tie_word_embeddings=tie,
    )
    return Qwen2ForCausalLM(config).float()


def trained_lora(model, targets=("q_proj", "v_proj", "down_proj", "lm_head")):
    peft = apply_lora(model, LoraConfig(rank=4, alpha=8, target_modules=list(targets)))
    with torch.no_grad():  # pretend training happened: B starts at zero
        for name, p in peft.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.1)
    return peft


@pytest.mark.parametrize("tie", [False, True])
def test_merged_stream_equals_peft_merge_under_base_names(tie):
    base_names = [n for n, _ in tiny_model(tie).named_parameters()]
    peft = trained_lora(tiny_model(tie), ("q_proj", "v_proj", "down_proj"))
    source = MergedWeightSource(peft)
    streamed = dict(iter(source))
    metas = source.metadata()
    assert [m.name for m in metas] == list(streamed) == base_names
    assert all(tuple(streamed[m.name].shape) == m.shape for m in metas)
    reference = dict(peft.merge_and_unload().named_parameters())
    for name, tensor in streamed.items():
        assert torch.allclose(tensor, reference[name], atol=1e-6), name
    assert not torch.allclose(
        streamed["model.layers.0.self_attn.q_proj.weight"],
        dict(tiny_model(tie).named_parameters())["model.layers.0.self_attn.q_proj.weight"],
    )


def test_merged_stream_merges_embedding_and_head_adapters_of_untied_models():
    peft = trained_lora(tiny_model(), ("embed_tokens", "lm_head", "q_proj"))
    with torch.no_grad():  # PEFT starts an embedding's A at zero, a linear's B
        for name, p in peft.named_parameters():
            if "lora_embedding" in name:
                p.normal_(std=0.1)
    streamed = dict(iter(MergedWeightSource(peft)))
    reference = dict(peft.merge_and_unload().named_parameters())
    original = dict(tiny_model().named_parameters())
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        assert torch.allclose(streamed[name], reference[name], atol=1e-6), name
        assert not torch.allclose(streamed[name], original[name]), name


def test_stream_reads_current_values_on_every_pass():
    peft = trained_lora(tiny_model())
    source = MergedWeightSource(peft)
    before = dict(iter(source))["lm_head.weight"].clone()
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if "lm_head.lora_B" in name:
                p.add_(1.0)
    assert not torch.allclose(dict(iter(source))["lm_head.weight"], before)


def test_plain_model_stream_is_its_parameters():
    model = tiny_model()
    streamed = list(MergedWeightSource(model))
    expected = list(model.named_parameters())
    assert [n for n, _ in streamed] == [n for n, _ in expected]
    assert all(
        t is p.detach() or torch.equal(t, p)
        for (_, t), (_, p) in zip(streamed, expected, strict=True)
    )


def test_hf_names():
    assert hf_name("model.layers.0.self_attn.q_proj.base_layer.weight") == (
        "model.layers.0.self_attn.q_proj.weight"
    )
    assert hf_name("model.layers.0.self_attn.q_proj.lora_A.default.weight") is None
    assert hf_name("lm_head.modules_to_save.default.weight") == "lm_head.weight"
    assert hf_name("lm_head.original_module.weight") is None


@pytest.mark.slow
def test_merge_adapter_script(tmp_path):
    base_dir = tmp_path / "base"
    model = tiny_model()
    model.save_pretrained(base_dir)
    from rlvr.model.tiny_model import _train_tokenizer

    _train_tokenizer(64 + 8).save_pretrained(base_dir)
    peft = trained_lora(AutoModelForCausalLM.from_pretrained(base_dir))
    peft.save_pretrained(tmp_path / "adapter")
    out = tmp_path / "merged"
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "merge_adapter.py"),
            str(tmp_path / "adapter"),
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    merged = AutoModelForCausalLM.from_pretrained(out)
    ids = torch.tensor([[1, 5, 9, 3]])
    with torch.no_grad():
        assert torch.allclose(merged(ids).logits, peft(input_ids=ids).logits, atol=1e-5)
    assert (out / "tokenizer.json").is_file()
    bad = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "merge_adapter.py"), str(tmp_path), str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert bad.returncode != 0 and "not a PEFT adapter" in bad.stderr


@pytest.mark.slow
def test_policy_and_merging_need_no_vllm():
    """SFT and adapter merging run on hosts without vLLM (training-only GPU boxes)."""
    code = (
        "import sys, rlvr.model.merge, rlvr.model.policy, rlvr.trainer.sft\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] == 'vllm')\n"
        "assert not loaded, loaded\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]


@pytest.mark.parametrize("target", ["lm_head", "embed_tokens"])
def test_lora_on_a_tied_head_or_embedding_is_refused_with_the_reason(target):
    from rlvr.config import ConfigError

    with pytest.raises(ConfigError, match="ties its input embedding and output head"):
        apply_lora(tiny_model(tie=True), LoraConfig(rank=4, target_modules=["q_proj", target]))
    apply_lora(tiny_model(tie=False), LoraConfig(rank=4, target_modules=["q_proj", target]))


def test_kl_reference_after_resume_is_the_resumed_adapter_not_the_base(tmp_path):
    """With lora.resume_from (e.g. an SFT adapter), the initial policy is base + that adapter:
    the KL reference must be it, frozen, while the trained copy moves."""
    from rlvr.model.policy import reference_mode

    sft = trained_lora(tiny_model())
    sft.save_pretrained(tmp_path / "sft")
    cfg = LoraConfig(rank=4, alpha=8, resume_from=str(tmp_path / "sft"))
    policy = apply_lora(tiny_model(), cfg, keep_reference=True)
    trainable = [n for n, p in policy.named_parameters() if p.requires_grad]
    assert trainable and all(".default." in n for n in trainable)
    ids = torch.tensor([[1, 5, 9, 13]])
    initial = sft(input_ids=ids).logits
    base = tiny_model()(input_ids=ids).logits
    with torch.no_grad():  # training moves the trainable copy
        for name, p in policy.named_parameters():
            if p.requires_grad and "lora_B" in name:
                p.add_(0.5)
    with reference_mode(policy), torch.no_grad():
        reference = policy(input_ids=ids).logits
    assert torch.allclose(reference, initial, atol=1e-5)
    assert not torch.allclose(reference, base, atol=1e-3)
    assert not torch.allclose(policy(input_ids=ids).logits, initial, atol=1e-3)
    # the merged stream and the final save carry the trained adapter only
    streamed = dict(iter(MergedWeightSource(policy)))
    assert not torch.allclose(streamed["lm_head.weight"], sft.merge_and_unload().lm_head.weight)
    assert policy.active_adapters == ["default"]


def test_without_resume_the_reference_is_the_base_with_the_adapter_off():
    from rlvr.model.policy import reference_mode

    policy = trained_lora(tiny_model())
    ids = torch.tensor([[1, 5, 9, 13]])
    with reference_mode(policy), torch.no_grad():
        reference = policy(input_ids=ids).logits
    assert torch.allclose(reference, tiny_model()(input_ids=ids).logits, atol=1e-6)
