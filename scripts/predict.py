"""Answer rows of an environment's dataset (scored by its rubric) or a JSONL file of prompts.

    python scripts/predict.py --model outputs/run/final --env vf-deepscaler \
        --env-args '{"data_files": "data.jsonl"}' -n 16 --batch-size 8 --out predictions.jsonl
    python scripts/predict.py --model smollm2-135m --prompts prompts.jsonl --out answers.jsonl

The model (embedded short name, directory, hub id or adapter directory) is served by a vf-vllm
this script starts and stops, or by the server at --base-url. Each output line holds the
example id, prompt, completion (messages), `text` (the last assistant message), the error if
any, and for environment rows the answer, reward and rubric metrics; prompt-file lines echo
their input line as `input`.
"""

import argparse
import logging
import shlex
import sys
from pathlib import Path

from rlvr.config.cli import json_object, positive_int
from rlvr.eval.predict import (
    PredictError,
    environment_rows,
    predict,
    prompt_environment,
    read_prompts,
    write_predictions,
)
from rlvr.rollouts.client import make_client
from rlvr.server.serve_model import serve


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
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
        "-S", "--sampling-args", type=json_object, default={},
        help='more sampling fields, e.g. \'{"extra_body": {"top_k": 20}}\'',
    )  # fmt: skip
    parser.add_argument("--base-url", help="use this running server (serving --model)")
    parser.add_argument("--server-args", default="", help="extra vf-vllm flags")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per request")
    args = parser.parse_args()
    if args.env_args and not args.env:
        parser.error("--env-args goes with --env")
    return args


def sampling_args(args: argparse.Namespace) -> dict:
    flags = {
        "temperature": args.temperature,
        "top_p": args.top_p,
        "max_tokens": args.max_tokens,
        "seed": args.seed,
    }
    return {**{k: v for k, v in flags.items() if v is not None}, **args.sampling_args}


def main() -> None:
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
            args.model, base_url=args.base_url, server_args=shlex.split(args.server_args),
            log_path=log,
        ) as endpoint:  # fmt: skip
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


if __name__ == "__main__":
    main()
