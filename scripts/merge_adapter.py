"""Merge a trained LoRA adapter into its base model and save a plain Hugging Face model.

    python scripts/merge_adapter.py outputs/run/final merged/ [--base NAME] [--dtype bfloat16]

The result loads anywhere a model does (`vf-vllm --model merged/`, transformers, vf-eval).
"""

import argparse

from rlvr.policy import merge_adapter


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("adapter", help="adapter directory (adapter_config.json inside)")
    parser.add_argument("out", help="directory for the merged model")
    parser.add_argument("--base", default=None, help="base model (default: the adapter's own)")
    parser.add_argument(
        "--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
        help="dtype of the merged weights (auto: float32)",
    )  # fmt: skip
    args = parser.parse_args()
    try:
        out = merge_adapter(args.adapter, args.out, base=args.base, dtype=args.dtype)
    except FileNotFoundError as e:
        raise SystemExit(f"error: {e}") from None
    print(f"merged model written to {out}")


if __name__ == "__main__":
    main()
