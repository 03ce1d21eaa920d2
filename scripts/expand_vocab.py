"""Write a model with a reasoning vocabulary: N extra token ids, each a copy of an ordinary
token (embedding and lm_head rows copied), usable only inside think spans. vf-vllm serves the
result with its think gate and folding tokenizer; train it with `model.name` set to it.

    python scripts/expand_vocab.py smollm2-135m outputs/models/smollm2-135m-rv4096 --size 4096
    python scripts/expand_vocab.py Qwen/Qwen3-1.7B outputs/models/qwen3-1.7b-rv --size -1 \
        --dtype bfloat16

--size -1 copies every non-special token; --start/--end set the think delimiters.
"""

import argparse

import torch

from rlvr.config import ConfigError, ModelConfig
from rlvr.reasoning_vocab.mapping import ReasoningVocab, ReasoningVocabError, expand_checkpoint


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="short name, directory or hub id")
    parser.add_argument("out", help="directory for the expanded model")
    parser.add_argument("--size", type=int, required=True, help="copies (-1: every token)")
    parser.add_argument("--start", default="<think>", help="opens a think span")
    parser.add_argument("--end", default="</think>", help="closes a think span")
    parser.add_argument(
        "--dtype", default=None, choices=["float32", "bfloat16", "float16"],
        help="dtype of the written weights (default: the checkpoint's)",
    )  # fmt: skip
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


if __name__ == "__main__":
    main()
