"""The `rlvr-merge-adapter` command: a LoRA adapter merged into its base model, optionally pushed.

Merging is `rlvr.model.policy.merge_adapter`; publishing with a generated model card is
`rlvr.model.publish`."""

from __future__ import annotations

import argparse
from pathlib import Path

from rlvr.model.policy import MERGE_INTO, merge_adapter, merge_statement
from rlvr.model.publish import (
    PublishError,
    check_hub_access,
    check_repo_id,
    list_files,
    push_folder,
    read_run,
    write_card,
)

# ---- the command ---------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    """Return the command line of `rlvr-merge-adapter`, hub-only flags checked."""
    parser = argparse.ArgumentParser(description=main.__doc__.splitlines()[0])
    parser.add_argument("adapter", help="adapter directory (adapter_config.json inside)")
    parser.add_argument("out", help="directory for the merged model")
    parser.add_argument("--base", default=None, help="base model (default: the adapter's own)")
    parser.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "float32", "bfloat16", "float16"],
        help="dtype of the merged weights (auto: float32)",
    )
    parser.add_argument(
        "--into",
        default="trained",
        choices=MERGE_INTO,
        help="for an adapter trained on a quantized base (QLoRA): merge into that base "
        "dequantized, the policy the run trained (trained, default), or into the unquantized "
        "original, which differs from it by the quantization error (original)",
    )
    parser.add_argument("--push-to-hub", metavar="REPO", help="Hub model id, e.g. you/model")
    parser.add_argument("--private", action="store_true", help="create the Hub repo private")
    parser.add_argument("--eval-report", type=Path, help="Markdown report for the model card")
    parser.add_argument(
        "--dry-run", action="store_true", help="write card and files into OUT, do not push"
    )
    args = parser.parse_args()
    if not args.push_to_hub:
        for flag, given in (
            ("--private", args.private),
            ("--eval-report", args.eval_report),
            ("--dry-run", args.dry_run),
        ):
            if given:
                parser.error(f"{flag} goes with --push-to-hub")
    return args


def main() -> None:
    """Merge a trained LoRA adapter into its base model and save a plain Hugging Face model;
    optionally publish it to the Hugging Face Hub with a generated model card.

        python scripts/merge_adapter.py outputs/run/final merged/ [--base NAME] [--dtype bfloat16]
            [--into trained|original]
        python scripts/merge_adapter.py outputs/run/final merged/ --push-to-hub you/model \
            [--private] [--eval-report report.md] [--dry-run]

    The result loads anywhere a model does (`vf-vllm --model merged/`, transformers, vf-eval).
    With --push-to-hub, merged/ also gets README.md, a model card written from the run directory
    (config.yaml, metrics.jsonl, checkpoints: base model, environment, steps, training curves) and
    the --eval-report, and is uploaded as one commit. The token and the network are checked before
    merging starts. --dry-run writes everything into merged/ and lists what would be pushed.

    Installed as `rlvr-merge-adapter`; `python scripts/merge_adapter.py` runs the same.
    """
    args = parse_args()
    repo = args.push_to_hub
    try:
        if repo:  # everything that can fail without merging fails first
            check_repo_id(repo)
            if args.eval_report and not args.eval_report.is_file():
                raise PublishError(f"--eval-report {args.eval_report}: no such file")
            run = read_run(args.adapter)
            token = None if args.dry_run else check_hub_access()
        out = merge_adapter(
            args.adapter, args.out, base=args.base, dtype=args.dtype, into=args.into
        )
        print(f"merged model written to {out}: {merge_statement(args.adapter, args.into)}")
        if not repo:
            return
        card = write_card(out, run, repo, args.eval_report)
        print(f"model card written to {card}")
        files = list_files(out)
        visibility = "private" if args.private else "public"
        if args.dry_run:
            mib = sum(size for _, size in files) / 2**20
            print(
                f"dry run: would push {len(files)} files ({mib:.1f} MiB) to {repo} ({visibility}):"
            )
            for name, size in files:
                print(f"  {name}  {size:,} bytes")
            return
        url = push_folder(out, repo, private=args.private, token=token)
        print(f"pushed {len(files)} files to {repo} ({visibility}): {url}")
    except (FileNotFoundError, PublishError, ValueError) as e:
        raise SystemExit(f"error: {e}") from None
