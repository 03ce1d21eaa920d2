"""An adapter merged into its base model: one plain Hugging Face model for serving.

`merge_adapter` rebuilds the base the adapter was trained on (quantized again for QLoRA, expanded
by its reasoning vocabulary) and writes base + adapter atomically; `rlvr-merge-adapter`
(`rlvr.eval.publish`) is its command. Design: docs/training.md#quantized-bases-qlora.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from rlvr.atomic import atomic_directory
from rlvr.config import ModelConfig
from rlvr.model.policy import BASE_QUANTIZATION_FILE, load_model
from rlvr.reasoning_vocab.mapping import ReasoningVocab, expand_model, load_tokenizer


@dataclass(frozen=True)
class BaseQuantization:
    """How the base an adapter was trained on was stored: `quantization` (`none`, `nf4`,
    `int8`) and the dtype its weights loaded in before they were quantized (the codes depend
    on it: a bfloat16 run quantizes bfloat16-rounded weights)."""

    quantization: str = "none"
    dtype: torch.dtype = torch.float32


def adapter_base_quantization(adapter_dir: str | Path) -> BaseQuantization:
    """The storage of the base an adapter was trained on (`none` when not recorded; float32
    for a file written before it recorded the dtype)."""
    path = Path(adapter_dir) / BASE_QUANTIZATION_FILE
    if not path.is_file():
        return BaseQuantization()
    recorded = json.loads(path.read_text())
    dtype = getattr(torch, recorded.get("dtype", "float32"))
    return BaseQuantization(recorded["quantization"], dtype)


def load_trained_base(path: str, base: BaseQuantization, dtype: torch.dtype) -> torch.nn.Module:
    """The model at `path` as a run with base storage `base` trained on it: quantized again
    from the dtype that run loaded it in (quantizing is deterministic, so the same codes, and
    the other weights in that dtype too), or unquantized in `dtype`."""
    if base.quantization == "none":
        return load_model(path, ModelConfig(name=path), dtype=dtype)
    quantized = ModelConfig(name=path, quantization=base.quantization)
    return load_model(path, quantized, dtype=base.dtype)


MERGE_INTO = ("trained", "original")


def merge_adapter(
    adapter_dir: str | Path,
    out_dir: str | Path,
    base: str | None = None,
    dtype: str = "auto",
    into: str = "trained",
) -> Path:
    """Write base model + adapter as one plain Hugging Face model (safetensors + tokenizer,
    and the reasoning vocabulary's mapping) to `out_dir`, complete or absent. `base` defaults
    to the adapter's recorded base; `into="trained"` merges a QLoRA adapter into its base
    dequantized (the trained policy), `"original"` into the unquantized base (`merge_statement`).
    """
    from peft import PeftModel

    from rlvr.model.names import resolve_model
    from rlvr.model.quantization import dequantize_model

    if into not in MERGE_INTO:
        raise ValueError(f"merge into {into!r}: choose one of {MERGE_INTO}")
    adapter_dir = Path(adapter_dir)
    config_file = adapter_dir / "adapter_config.json"
    if not config_file.is_file():
        raise FileNotFoundError(f"{adapter_dir} is not a PEFT adapter (no adapter_config.json)")
    base = base or json.loads(config_file.read_text())["base_model_name_or_path"]
    base_path = resolve_model(base)
    stored = adapter_base_quantization(adapter_dir) if into == "trained" else BaseQuantization()
    torch_dtype = torch.float32 if dtype == "auto" else getattr(torch, dtype)
    model = load_trained_base(base_path, stored, torch_dtype)
    if stored.quantization != "none":  # the trained base dequantized, then cast
        model = dequantize_model(model).to(torch_dtype)
    base_vocab = ReasoningVocab.load(base_path)
    reasoning_vocab = ReasoningVocab.load(adapter_dir) or base_vocab
    if reasoning_vocab is not None and base_vocab is None:
        expand_model(model, reasoning_vocab)
    merged = PeftModel.from_pretrained(model, str(adapter_dir)).merge_and_unload()
    has_tokenizer = (adapter_dir / "tokenizer_config.json").is_file()
    tokenizer = load_tokenizer(adapter_dir if has_tokenizer else base_path)
    out = Path(out_dir)
    with atomic_directory(out, replace=True) as tmp:
        merged.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        if reasoning_vocab is not None:
            reasoning_vocab.save(tmp)
    return out


def merge_statement(adapter_dir: str | Path, into: str) -> str:
    """What `merge_adapter(adapter_dir, ..., into=into)` merges the adapter into, in words."""
    stored = adapter_base_quantization(adapter_dir)
    quantization = stored.quantization
    if quantization == "none":
        return "merged into the base model (the adapter was trained on it unquantized)"
    if into == "trained":
        source = str(stored.dtype).removeprefix("torch.")
        return (
            f"merged into the {quantization}-dequantized base the adapter was trained on "
            f"(quantized from {source}, as the run loaded it): the policy the run trained and "
            "served (--into original merges into the unquantized base instead)"
        )
    return (
        f"merged into the ORIGINAL unquantized base, although the adapter was trained on its "
        f"{quantization} quantization: this model differs from the trained policy by the "
        "base's quantization error (--into trained gives the trained policy)"
    )
