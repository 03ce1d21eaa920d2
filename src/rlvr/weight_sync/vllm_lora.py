"""What vLLM 0.32's LoRA support can serve: the ranks `--max-lora-rank` accepts, and which
adapters it can apply at all. Used when serving an adapter directory (rlvr.server.serve_model) and
when the trainer pushes its adapter (rlvr.weight_sync.adapter). Plain data: no vLLM import.

vLLM's LoRA layers cover the linear projections only. An adapter that trains `lm_head` or the
input embedding (as targets or as fully trained `modules_to_save`) is refused with "expected
target modules in {q_proj, ..., down_proj}", and a refused runtime load kills the engine; DoRA
is not served either. Nor are embedding and head rows trained as PEFT's trainable tokens (a
reasoning vocabulary's): vLLM has no LoRA form for them.
"""

from __future__ import annotations

from typing import Any

VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
UNSERVABLE_MODULES = ("lm_head", "embed_tokens")


def lora_rank_limit(rank: int) -> int:
    """The smallest `--max-lora-rank` vLLM accepts that fits an adapter of `rank`."""
    for limit in VLLM_LORA_RANKS:
        if limit >= rank:
            return limit
    raise ValueError(f"LoRA rank {rank} is above vLLM's largest --max-lora-rank {limit}")


def adapter_rank(config: dict[str, Any]) -> int:
    """An adapter's largest rank (its `r`, or a larger one in `rank_pattern`)."""
    pattern = (config.get("rank_pattern") or {}).values()
    return max([int(config.get("r", 8)), *map(int, pattern)])


def lora_serving_problem(config: dict[str, Any], max_lora_rank: int | None = None) -> str | None:
    """Why vLLM cannot serve an adapter described by `config` (its adapter_config.json, or a
    PEFT config's `to_dict()`), or None. `max_lora_rank`: the server's limit, when known."""
    targets = config.get("target_modules") or []
    targets = [targets] if isinstance(targets, str) else sorted(targets)
    unservable = [t for t in targets if any(bad in t for bad in UNSERVABLE_MODULES)]
    if unservable:
        return f"vLLM's LoRA layers do not cover {unservable} (lora.target_modules)"
    if config.get("modules_to_save"):
        return f"modules_to_save {config['modules_to_save']} are full weights, not LoRA"
    if config.get("trainable_token_indices"):
        return (
            "the adapter trains embedding/lm_head rows (a reasoning vocabulary's, PEFT "
            "trainable tokens): full weights, not LoRA"
        )
    if config.get("use_dora"):
        return "vLLM does not serve DoRA adapters"
    if max_lora_rank is not None and adapter_rank(config) > max_lora_rank:
        return (
            f"the adapter's rank {adapter_rank(config)} exceeds the server's "
            f"--max-lora-rank {max_lora_rank}"
        )
    return None
