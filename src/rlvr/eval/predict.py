"""Predictions: a model answers rows of an environment's dataset (through its own rollout and
rubric, so each line carries the reward evaluation would give), or a file of prompts (plain
single-turn chats, no reward). Design: docs/evaluation.md#predictions.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from statistics import fmean
from typing import Any

from rlvr.atomic import atomic_write_text
from rlvr.config.cli import json_object, positive_int
from rlvr.jsonl import iter_jsonl
from rlvr.rollouts.client import make_client
from rlvr.server.serve_model import serve


class PredictError(ValueError):
    """Bad input for a prediction; the message names the file, line or argument."""


@dataclass(frozen=True)
class Predictions:
    """What a prediction run wrote: its output lines, and whether they carry rewards."""

    rows: list[dict[str, Any]]
    scored: bool

    @property
    def errored(self) -> int:
        return sum(row["error"] is not None for row in self.rows)

    def summary(self) -> str:
        text = f"{len(self.rows)} rows, {self.errored} errored"
        if self.scored and self.rows:
            text += f", mean reward {fmean(row['reward'] for row in self.rows):.4f}"
        return text


@dataclass(frozen=True)
class PromptFile:
    """A JSONL file of prompts: the rollout inputs, and each line as read (written back beside
    its prediction as `input`, so ids and other fields travel along)."""

    rows: list[dict[str, Any]]
    lines: list[dict[str, Any]]


def read_prompts(path: str | Path) -> PromptFile:
    """Read a JSONL file whose lines are objects with `prompt` (a string, which becomes a user
    message, or a list of chat messages) or `messages` (a list of chat messages)."""
    path = Path(path)
    rows, lines = [], []
    for number, item in iter_jsonl(path, PredictError):
        prompt = item.get("prompt", item.get("messages")) if isinstance(item, dict) else None
        if isinstance(prompt, str):
            prompt = [{"role": "user", "content": prompt}]
        if not _is_chat(prompt):
            raise PredictError(
                f"{path}:{number}: expected an object with 'prompt' (a string or chat "
                "messages) or 'messages' (a list of {role, content})"
            )
        rows.append({"prompt": prompt, "example_id": len(rows)})
        lines.append(item)
    if not rows:
        raise PredictError(f"{path}: no prompts")
    return PromptFile(rows, lines)


def _is_chat(messages: Any) -> bool:
    return (
        isinstance(messages, list)
        and bool(messages)
        and all(
            isinstance(m, dict)
            and isinstance(m.get("role"), str)
            and isinstance(m.get("content"), str)
            for m in messages
        )
    )


def prompt_environment(rows: Sequence[dict[str, Any]]) -> Any:
    """A single-turn environment over `read_prompts` rows that scores nothing."""
    import verifiers as vf
    from datasets import Dataset

    dataset = Dataset.from_list(list(rows))
    return vf.SingleTurnEnv(eval_dataset=dataset, rubric=vf.Rubric(), score_rollouts=False)


def environment_rows(env: Any, num_rows: int | None, split: str) -> list[dict[str, Any]]:
    """The first `num_rows` rows (None: all) of the environment's eval or train split."""
    n = -1 if num_rows is None else num_rows
    dataset = env.get_eval_dataset(n=n) if split == "eval" else env.get_dataset(n=n)
    return dataset.to_list()


def final_text(completion: Any) -> str:
    """The text of the last assistant message (the answer of a multi-turn rollout), or the
    completion itself for text-completion environments."""
    if isinstance(completion, str):
        return completion
    for message in reversed(completion or []):
        if isinstance(message, dict) and message.get("role") == "assistant":
            return message.get("content") or ""
    return ""


def saved_form(output: dict[str, Any]) -> dict[str, Any]:
    """A verifiers rollout output (whose messages are pydantic objects) as vf-eval saves it in
    results.jsonl: plain JSON values, tool calls as JSON strings."""
    from verifiers.utils.save_utils import make_serializable

    return json.loads(json.dumps(output, default=make_serializable))


def output_row(output: dict[str, Any], scored: bool) -> dict[str, Any]:
    """One line of the predictions file from a rollout in its saved form (`generate_saved`)."""
    row: dict[str, Any] = {
        "example_id": output["example_id"],
        "prompt": output.get("prompt"),
        "completion": output.get("completion"),
        "text": final_text(output.get("completion")),
        "error": output.get("error"),
        "truncated": bool(output.get("is_truncated")),
    }
    if scored:
        row.update(
            answer=output.get("answer"), reward=output["reward"], metrics=output.get("metrics")
        )
    return row


def generate_saved(
    env: Any,
    rows: list[dict[str, Any]],
    *,
    client: Any,
    model: str,
    sampling_args: dict[str, Any],
    max_concurrent: int = -1,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """The rollouts of `rows` through `env.generate` (at most `max_concurrent` in flight; with
    verifiers' progress bar if `progress`), in example order and in vf-eval's saved form."""
    results = asyncio.run(
        env.generate(
            rows,
            client,
            model,
            sampling_args=sampling_args,
            max_concurrent=max_concurrent,
            on_progress=None if progress else (lambda *_: None),
        )
    )
    outputs = sorted(results["outputs"], key=lambda o: o["example_id"])
    return [saved_form(output) for output in outputs]


def predict(
    env: Any,
    rows: list[dict[str, Any]],
    *,
    client: Any,
    model: str,
    sampling_args: dict[str, Any],
    batch_size: int,
    scored: bool,
    echo: Sequence[dict[str, Any]] | None = None,
) -> Predictions:
    """Run every row through `env` (at most `batch_size` rollouts in flight; verifiers shows a
    progress bar) and return the output lines in row order. A row whose rollout errored keeps
    its line, with the error. `echo[i]` is written as `input` on the line of example id i."""
    outputs = generate_saved(
        env,
        rows,
        client=client,
        model=model,
        sampling_args=sampling_args,
        max_concurrent=batch_size,
    )
    lines = []
    for output in outputs:
        line = output_row(output, scored)
        if echo is not None:
            line["input"] = echo[output["example_id"]]
        lines.append(line)
    return Predictions(lines, scored)


def write_predictions(predictions: Predictions, path: str | Path) -> None:
    """The lines as JSONL, written atomically."""
    text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in predictions.rows)
    atomic_write_text(path, text)


# ---- the command ---------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=main.__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m", help="default: the embedded model")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--env", help="environment id: answer rows of its dataset, scored")
    source.add_argument("--prompts", type=Path, help="JSONL file of prompts (not scored)")
    parser.add_argument("--env-args", type=json_object, default={}, help="load_environment args")
    parser.add_argument("--split", choices=["eval", "train"], default="eval")
    parser.add_argument("-n", "--num-rows", type=positive_int, help="first N rows (default: all)")
    parser.add_argument("--out", type=Path, required=True, help="predictions JSONL")
    parser.add_argument(
        "-b", "--batch-size", type=positive_int, default=8, help="requests in flight"
    )
    parser.add_argument("-T", "--temperature", type=float)
    parser.add_argument("--top-p", type=float)
    parser.add_argument("-t", "--max-tokens", type=positive_int)
    parser.add_argument("--seed", type=int, help="sampling seed of every request")
    parser.add_argument(
        "-S",
        "--sampling-args",
        type=json_object,
        default={},
        help='more sampling fields, e.g. \'{"extra_body": {"top_k": 20}}\'',
    )
    parser.add_argument("--base-url", help="use this running server (serving --model)")
    parser.add_argument("--server-args", default="", help="extra vf-vllm flags")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per request")
    args = parser.parse_args()
    if args.env_args and not args.env:
        parser.error("--env-args goes with --env")
    return args


def sampling_args(args: argparse.Namespace) -> dict:
    """Return the sampling arguments of the command line: -S, then the flags that were given."""
    flags = {
        "temperature": args.temperature,
        "top_p": args.top_p,
        "max_tokens": args.max_tokens,
        "seed": args.seed,
    }
    return {**{k: v for k, v in flags.items() if v is not None}, **args.sampling_args}


def main() -> None:
    """Answer rows of an environment's dataset (scored by its rubric) or a JSONL file of prompts.

        python scripts/predict.py --model outputs/run/final --env vf-deepscaler \
            --env-args '{"data_files": "data.jsonl"}' -n 16 --batch-size 8 --out predictions.jsonl
        python scripts/predict.py --model smollm2-135m --prompts prompts.jsonl --out answers.jsonl

    Installed as `rlvr-predict`; the output lines: docs/evaluation.md#predictions.
    """
    args = parse_args()
    logging.basicConfig(level=logging.WARNING)
    try:
        if args.prompts:
            prompts = read_prompts(args.prompts)
            rows = prompts.rows[: args.num_rows]
            env, echo = prompt_environment(rows), prompts.lines
        else:
            import verifiers as vf

            env, echo = vf.load_environment(args.env, **args.env_args), None
            rows = environment_rows(env, args.num_rows, args.split)
        log = args.out.with_name(args.out.name + ".vf-vllm.log")
        with serve(
            args.model,
            base_url=args.base_url,
            server_args=shlex.split(args.server_args),
            log_path=log,
        ) as endpoint:
            print(f"predicting {len(rows)} rows with {endpoint.model}", file=sys.stderr)
            client = make_client(
                endpoint.base_url, None, args.timeout, args.batch_size, training=False
            )
            predictions = predict(
                env,
                rows,
                client=client,
                model=endpoint.model,
                sampling_args=sampling_args(args),
                batch_size=args.batch_size,
                scored=args.env is not None,
                echo=echo,
            )
        write_predictions(predictions, args.out)
    except (PredictError, OSError, ValueError, RuntimeError, TimeoutError) as e:
        raise SystemExit(f"error: {e}") from None
    print(f"{predictions.summary()}; written to {args.out}", file=sys.stderr)
