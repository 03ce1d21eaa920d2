"""What vLLM 0.32's LoRA support can serve: the ranks `--max-lora-rank` accepts, and which
adapters it can apply at all (linear projections only: no `lm_head`/embedding targets,
`modules_to_save`, DoRA or trainable tokens; a refused runtime load kills the engine).
Plain data: no vLLM import. Design: docs/weight-transfer.md#lora-adapter-sync.
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
