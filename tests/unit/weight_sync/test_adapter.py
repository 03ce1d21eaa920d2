"""LoRA adapter sync: the trainer pushes only the adapter, vf-vllm serves it on its frozen base
under its own name, and the base name keeps serving the base (vf_planner's frozen worker)."""

from __future__ import annotations

from rlvr.config import LoraConfig


def test_adapter_sync_problems_are_named():
    from rlvr.weight_sync.adapter import adapter_sync_problem

    assert adapter_sync_problem(_lora_model(["q_proj"]), 16) is None
    assert "lm_head" in adapter_sync_problem(_lora_model(["q_proj", "lm_head"]), 16)
    assert "--max-lora-rank 8" in adapter_sync_problem(_lora_model(["q_proj"], rank=16), 8)
    assert adapter_sync_problem(_lora_model(["q_proj"], rank=16), 16) is None
    assert "--enable-lora" in adapter_sync_problem(_lora_model(["q_proj"]), None)


def _lora_model(targets, rank: int = 4):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rlvr.model.policy import apply_lora

    config = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=16)  # fmt: skip
    return apply_lora(Qwen2ForCausalLM(config), LoraConfig(rank=rank, target_modules=targets))


def test_vf_vllm_enable_lora_defaults():
    from rlvr.server.launcher import engine_env, lora_defaults, lora_flags

    assert lora_defaults(["--enable-lora"]) == ["--max-lora-rank", "64", "--max-loras", "2"]
    assert lora_defaults(["--enable-lora", "--max-lora-rank", "8"]) == ["--max-loras", "2"]
    assert lora_defaults([]) == []
    assert lora_flags(16) == ["--enable-lora", "--max-lora-rank", "16", "--max-loras", "2"]
    assert lora_flags(20)[2] == "32"  # the next rank vLLM accepts
    assert engine_env(False, "cpu", lora=True)["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "1"
