"""The `rlvr-merge-adapter` command: a LoRA adapter merged into its base model, optionally pushed
to the Hugging Face Hub with a generated model card (`rlvr.eval.model_card`).

A push needs the network and a token: both are checked before any merging starts, so a machine
without them fails in a second with the reason. Merging is `rlvr.model.merge`.
Design: docs/evaluation.md#publishing.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rlvr.eval.model_card import read_run, write_card
from rlvr.model.merge import MERGE_INTO, merge_adapter, merge_statement

HUB_PROBE_TIMEOUT_S = 5.0


class PublishError(RuntimeError):
    """Publishing cannot go ahead; the message says why and what to do."""


# ---- the Hub --------------------------------------------------------------------------------


def check_repo_id(repo: str) -> None:
    """PublishError unless `repo` is a valid Hub model id (`name` or `owner/name`)."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo)
    except HFValidationError as e:
        raise PublishError(f"--push-to-hub {repo!r}: {e}") from None


def check_hub_access(timeout: float = HUB_PROBE_TIMEOUT_S) -> str:
    """Make sure a push can work before any work is done: a token is configured and the Hub
    (HF_ENDPOINT, default huggingface.co) answers within `timeout` seconds. Returns the token;
    raises PublishError saying what is missing."""
    import httpx
    from huggingface_hub import constants, get_token

    token = get_token()
    if token is None:
        raise PublishError(
            "no Hugging Face token: run `hf auth login` or set HF_TOKEN "
            "(or use --dry-run to write the files without pushing)"
        )
    endpoint = constants.ENDPOINT
    try:
        httpx.head(endpoint, timeout=timeout)
    except httpx.HTTPError as e:
        raise PublishError(
            f"cannot reach the Hugging Face Hub at {endpoint} ({type(e).__name__}: {e}); "
            "pushing needs network access (use --dry-run to write the files without pushing)"
        ) from None
    return token


def push_folder(folder: str | Path, repo: str, *, private: bool, token: str) -> str:
    """Create the model repo if needed (private or public) and upload `folder` as one commit;
    returns the commit's URL."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    api = HfApi(token=token)
    try:
        api.create_repo(repo, private=private, exist_ok=True, repo_type="model")
        commit = api.upload_folder(
            repo_id=repo, folder_path=str(folder), commit_message="Upload model trained with rlvr"
        )
    except HfHubHTTPError as e:
        raise PublishError(f"pushing to {repo} failed: {e}") from None
    return commit.commit_url


def list_files(folder: str | Path) -> list[tuple[str, int]]:
    """(relative path, size in bytes) of every file below `folder`, sorted."""
    folder = Path(folder)
    return sorted(
        (str(path.relative_to(folder)), path.stat().st_size)
        for path in folder.rglob("*")
        if path.is_file()
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

    With --push-to-hub the token and the network are checked before merging starts; --dry-run
    writes the card and files into OUT and lists what would be pushed.
    See docs/evaluation.md#publishing.
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
