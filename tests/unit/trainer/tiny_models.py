"""Randomly initialised Qwen2 models small enough for exact loss and gradient checks."""

from __future__ import annotations

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

VOCAB = 64


def tiny_qwen2(layers: int, tied: bool = False) -> Qwen2ForCausalLM:
    """A float32 Qwen2 of `layers` layers over a `VOCAB`-token vocabulary, seeded (the same
    weights on every call)."""
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=16,
        tie_word_embeddings=tied,
    )
    return Qwen2ForCausalLM(config).float()
