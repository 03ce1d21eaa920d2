"""Rotary embeddings the trainer cannot reproduce (rlvr.model.rope): LongRoPE beyond its original
context and dynamic NTK are refused at start with the reason; LongRoPE within the original
context on both sides (exactly reproducible) trains."""

from __future__ import annotations

import shutil
from types import SimpleNamespace

import pytest
import torch
from accelerate import Accelerator
from toy_env import target_share_env
from transformers import Phi3Config, Phi3ForCausalLM, Qwen2Config

from rlvr.config import ConfigError, load_config
from rlvr.model.policy import load_policy
from rlvr.model.rope import check_served_rope, check_trainer_rope, length_dependent_rope
from rlvr.trainer.grpo import Trainer

ORIGINAL = 256


@pytest.fixture(scope="module")
def phi3_dir(tiny_model_dir, tmp_path_factory):
    """A tiny random Phi-3 with LongRoPE (original context 256, extended to 1024), with the
    tiny model's tokenizer."""
    out = tmp_path_factory.mktemp("models") / "tiny-phi3-longrope"
    config = Phi3Config(
        vocab_size=Qwen2Config.from_pretrained(tiny_model_dir).vocab_size,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=4 * ORIGINAL,
        original_max_position_embeddings=ORIGINAL,
        rope_scaling={"type": "longrope", "short_factor": [1.0] * 32, "long_factor": [4.0] * 32},
        pad_token_id=0,
        bos_token_id=None,
        eos_token_id=None,
        sliding_window=None,
    )
    torch.manual_seed(0)
    Phi3ForCausalLM(config).save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_model_dir / name, out / name)
    return out


def grpo_config(model_dir, tmp_path, max_seq_len: int):
    return load_config(
        overrides=[
            f"model.name={model_dir}",
            "model.dtype=float32",
            f"output_dir={tmp_path}",
            f"batch.max_seq_len={max_seq_len}",
            "batch.max_prompt_len=64",
            "lora.enabled=false",
        ]
    )


def test_longrope_model_is_refused(phi3_dir, tmp_path):
    """Through the trainer's own start-up (the environment loads, then the policy): refused
    before any weight loads, naming the model, the rope type and what to do."""
    trainer = Trainer(grpo_config(phi3_dir, tmp_path, 2 * ORIGINAL), env=target_share_env(5))
    with pytest.raises(ConfigError) as refused:
        trainer.setup()
    message = str(refused.value)
    assert str(phi3_dir) in message and "'longrope'" in message
    assert f"batch.max_seq_len <= {ORIGINAL}" in message and "--max-model-len" in message
    assert trainer.model is None  # refused before loading


def test_longrope_within_the_original_context_trains_only_against_such_a_server(phi3_dir):
    """Within the original context on both sides every token uses the short factors in
    transformers and in vLLM: the policy loads; a server serving beyond it (or not saying) is
    refused once connected."""
    cfg = load_config(
        overrides=[f"model.name={phi3_dir}", "model.dtype=float32", "lora.enabled=false"]
    )
    policy = load_policy(cfg.model, cfg.lora, Accelerator(cpu=True), sampled_len=ORIGINAL)
    config = policy.model.config

    def server(model_config):
        return SimpleNamespace(vllm_config=lambda: {"model_config": model_config})

    check_served_rope(config, "phi", server({"max_model_len": ORIGINAL}), "http://s")
    for said, expected in [
        ({"max_model_len": 4 * ORIGINAL}, "max_model_len 1024"),
        ({}, "does not say"),
    ]:
        with pytest.raises(ConfigError, match=f"{expected}.*--max-model-len {ORIGINAL}"):
            check_served_rope(config, "phi", server(said), "http://s")


@pytest.mark.parametrize(
    "rope",
    [{"type": "dynamic", "factor": 2.0}, {"rope_type": "dynamic", "factor": 2.0}],
    ids=["rope_scaling-type", "rope_type"],
)
def test_dynamic_ntk_is_refused(rope):
    config = Qwen2Config(rope_scaling=rope, max_position_embeddings=512)
    assert length_dependent_rope(config).rope_type == "dynamic"
    with pytest.raises(ConfigError, match="dynamic-NTK RoPE scaling .*'dynamic'"):
        check_trainer_rope(config, "m", 128)


def test_fixed_rope_scalings_are_accepted():
    for rope in (None, {"rope_type": "linear", "factor": 2.0}, {"rope_type": "default"}):
        config = Qwen2Config(rope_scaling=rope, max_position_embeddings=512)
        assert length_dependent_rope(config) is None
        check_trainer_rope(config, "m", 4096)


def test_longropes_older_spelling_counts_as_longrope():
    """A config as older Phi-3 checkpoints and remote code spell it: `rope_scaling` only,
    type "su"."""
    rope = {
        "type": "su",
        "short_factor": [1.0],
        "long_factor": [2.0],
        "original_max_position_embeddings": 256,
    }
    config = SimpleNamespace(rope_scaling=rope, max_position_embeddings=1024)
    assert length_dependent_rope(config).rope_type == "longrope"
    with pytest.raises(ConfigError, match="uses LongRoPE"):
        check_trainer_rope(config, "m", 512)
