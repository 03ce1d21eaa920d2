"""Rotary embeddings whose frequencies depend on the sequence length: which the GRPO trainer
can reproduce, and the refusal of the others.

LongRoPE runs only where trainer and server both use the short factors for every token
(`batch.max_seq_len` and the server's `max_model_len` within the original context: checked at
load, `check_trainer_rope`, and once connected, `check_served_rope`); dynamic NTK is refused.
Why: docs/troubleshooting.md#models-and-sampling-settings-the-trainer-refuses-or-adapts-to.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from rlvr.config import ConfigError

LONGROPE = "longrope"
LONGROPE_ALIASES = ("su",)
"""Older spellings of LongRoPE (Phi-3's first configs) that transformers and vLLM read as it."""


@dataclass(frozen=True)
class LengthDependentRope:
    """A rotary embedding whose frequencies depend on the sequence length."""

    rope_type: str
    original_context: int
    """The context the short factors (LongRoPE) or the unstretched base (dynamic) cover."""


def _parameter_sets(config: Any) -> Iterator[dict[str, Any]]:
    """Each set of RoPE parameters of `config`: one, or one per layer type when nested
    (`rope_parameters` in transformers 5, `rope_scaling` in older or remote-code configs)."""
    for name in ("rope_parameters", "rope_scaling"):
        params = getattr(config, name, None)
        if not isinstance(params, dict) or not params:
            continue
        nested = [p for p in params.values() if isinstance(p, dict)]
        yield from nested if nested and len(nested) == len(params) else [params]


def length_dependent_rope(config: Any) -> LengthDependentRope | None:
    """The model's LongRoPE or dynamic-NTK rotary embedding, or None when its frequencies do
    not depend on the sequence length."""
    for params in _parameter_sets(config):
        rope_type = str(params.get("rope_type") or params.get("type") or "default")
        rope_type = LONGROPE if rope_type in LONGROPE_ALIASES else rope_type
        if rope_type != LONGROPE and "dynamic" not in rope_type:
            continue
        original = (
            params.get("original_max_position_embeddings")
            or getattr(config, "original_max_position_embeddings", None)
            or config.max_position_embeddings
        )
        return LengthDependentRope(rope_type, int(original))
    return None


def check_trainer_rope(config: Any, model_name: str, max_seq_len: int) -> None:
    """Raise ConfigError unless the trainer, scoring samples of up to `max_seq_len` tokens, can
    reproduce the sampler's rotary embedding of the model `model_name` with `config`."""
    rope = length_dependent_rope(config)
    if rope is None or (rope.rope_type == LONGROPE and max_seq_len <= rope.original_context):
        return
    if rope.rope_type == LONGROPE:
        raise ConfigError(
            f"model {model_name} uses LongRoPE (rope type 'longrope', original context "
            f"{rope.original_context} tokens) and batch.max_seq_len is {max_seq_len}: the "
            "trainer would pick the short or the long RoPE factors per micro-batch from its "
            "longest sample, while vLLM uses the long factors for every token once its "
            f"max_model_len exceeds {rope.original_context}, so the importance ratios would "
            f"be biased. Train within the original context (batch.max_seq_len <= "
            f"{rope.original_context} and vf-vllm started with --max-model-len "
            f"{rope.original_context} or less: both then use the short factors), or use a "
            "model without LongRoPE."
        )
    raise ConfigError(
        f"model {model_name} uses dynamic-NTK RoPE scaling (rope type {rope.rope_type!r}): the "
        "trainer would stretch the RoPE base per micro-batch from its longest sample, while "
        "vLLM fixes one base for every token, so the importance ratios would be biased. Use a "
        "model with a fixed RoPE (default, linear, yarn or llama3 scaling)."
    )


def check_served_rope(config: Any, model_name: str, control: Any, base_url: str) -> None:
    """Raise ConfigError when the server at `base_url` (its `control`, see
    `rlvr.weight_sync.control.ServerControl`) serves a LongRoPE model with the long factors (a
    `max_model_len` beyond the original context, or one it does not say: vLLM's default is the
    model's full context) while the trainer uses the short ones (`check_trainer_rope` let
    it through)."""
    rope = length_dependent_rope(config)
    if rope is None or rope.rope_type != LONGROPE:
        return
    model_config = control.vllm_config().get("model_config")
    served = model_config.get("max_model_len") if isinstance(model_config, dict) else None
    if served is not None and int(served) <= rope.original_context:
        return
    said = f"serves it with max_model_len {served}" if served else "does not say its max_model_len"
    raise ConfigError(
        f"model {model_name} uses LongRoPE (original context {rope.original_context} tokens) "
        f"and the server at {base_url} {said}: vLLM then uses the long RoPE factors for every "
        "token while the trainer, within the original context, uses the short ones, so the "
        f"importance ratios would be biased. Restart vf-vllm with --max-model-len "
        f"{rope.original_context} (or less)."
    )
