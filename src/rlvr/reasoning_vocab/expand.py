"""Writing a model with a reasoning vocabulary (`expand_checkpoint`) and the `rlvr-expand-vocab`
command around it; the mapping, the model and tokenizer expansion are
`rlvr.reasoning_vocab.mapping`."""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from rlvr.atomic import atomic_directory
from rlvr.config import ConfigError, ModelConfig
from rlvr.reasoning_vocab.mapping import ReasoningVocab, ReasoningVocabError, attach, load_tokenizer


def expand_checkpoint(
    model_cfg: ModelConfig, out_dir: str | Path, dtype: torch.dtype | None = None
) -> Path:
    """Write `model_cfg.name` expanded by `model_cfg.reasoning_vocab_size` copies as a plain
    model directory (weights, expanded tokenizer, mapping) that vf-vllm serves; atomic."""
    from transformers import AutoModelForCausalLM

    from rlvr.model.names import resolve_model

    if model_cfg.reasoning_vocab_size == 0:
        raise ConfigError("model.reasoning_vocab_size=0: nothing to expand")
    path = resolve_model(model_cfg.name)
    if ReasoningVocab.load(path) is not None:
        raise ReasoningVocabError(f"{path} already carries a reasoning vocabulary")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype or "auto")
    tokenizer, vocab = attach(model, load_tokenizer(path), model_cfg, path)
    out = Path(out_dir)
    with atomic_directory(out, replace=True) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        vocab.save(tmp)
    return out


# ---- the command ---------------------------------------------------------------------------------


def main() -> None:
    """Write a model with a reasoning vocabulary: N extra token ids, each a copy of an ordinary
    token (embedding and lm_head rows copied), usable only inside think spans.

        python scripts/expand_vocab.py smollm2-135m outputs/models/smollm2-135m-rv4096 --size 4096

    Installed as `rlvr-expand-vocab`; serving and training it: docs/reasoning-vocabulary.md.
    """
    parser = argparse.ArgumentParser(description=main.__doc__.splitlines()[0])
    parser.add_argument("model", help="short name, directory or hub id")
    parser.add_argument("out", help="directory for the expanded model")
    parser.add_argument("--size", type=int, required=True, help="copies (-1: every token)")
    parser.add_argument("--start", default="<think>", help="opens a think span")
    parser.add_argument("--end", default="</think>", help="closes a think span")
    parser.add_argument(
        "--dtype",
        default=None,
        choices=["float32", "bfloat16", "float16"],
        help="dtype of the written weights (default: the checkpoint's)",
    )
    args = parser.parse_args()
    cfg = ModelConfig(
        name=args.model,
        reasoning_vocab_size=args.size,
        reasoning_start=args.start,
        reasoning_end=args.end,
    )
    try:
        cfg.validate()
        dtype = getattr(torch, args.dtype) if args.dtype else None
        out = expand_checkpoint(cfg, args.out, dtype)
    except (ConfigError, ReasoningVocabError, OSError) as e:
        raise SystemExit(f"error: {e}") from None
    vocab = ReasoningVocab.load(out)
    print(
        f"{out}: {vocab.size} reasoning ids ({vocab.base_vocab_size}.."
        f"{vocab.total_vocab_size - 1}) inside {vocab.think_start}...{vocab.think_end}"
    )
