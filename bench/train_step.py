"""GRPO step time and the pipeline's generation throughput, vs raw vLLM throughput, in one run.

SmolLM2-135M (LoRA) on vf-deepscaler, trainer and vf-vllm on the same CPU. For async_level 0
and 1 it reports the step-time breakdown (waiting for rollouts, forward/backward, optimizer,
weight push) and the generated tokens per second of wall time, then divides that by the raw
tokens/s of the same server at the same concurrency (bench/serve_throughput.py's measurement):

    pipeline efficiency = training-time generation tokens/s / raw tokens/s

Run:  .venv/bin/python bench/train_step.py [--steps 4] [--batch-size 16] [--max-tokens 128]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import save  # noqa: E402
from serve_throughput import SERVER_FLAGS, measure  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "deepscaler" / "preview_first803.jsonl"
BREAKDOWN = ("time/wait_rollouts", "time/forward_backward", "time/optimizer", "time/weight_push")


def train(base_url: str, args: argparse.Namespace, async_level: int, out: Path) -> dict:
    from rlvr.config import load_config
    from rlvr.trainer import Trainer

    cfg = load_config(
        overrides=[
            "env.id=vf-deepscaler",
            f"env.args={{data_files: '{DATA}', max_examples: 200}}",
            "model.name=smollm2-135m",
            f"server.base_url={base_url}",
            f"batch.batch_size={args.batch_size}",
            f"batch.rollouts_per_example={args.group}",
            f"batch.micro_batch_size={args.micro_batch_size}",
            f"batch.async_level={async_level}",
            "batch.max_seq_len=1024",
            "batch.max_prompt_len=512",
            f"sampling.max_tokens={args.max_tokens}",
            f"max_steps={args.steps + 1}",
            "optim.lr=5e-5",
            "wandb.mode=disabled",
            "logging.progress_bar=false",
            "checkpoint.every=0",
            f"output_dir={out}",
        ]
    )
    history = Trainer(cfg).run()
    steady = history[1:]  # the first step warms caches up and has nothing to overlap with
    tokens = sum(h["rollouts/completion_tokens"] for h in steady)
    wall = sum(h["time/step"] for h in steady)
    return {
        "async_level": async_level,
        "steps_measured": len(steady),
        "step_s": statistics.fmean(h["time/step"] for h in steady),
        **{key: statistics.fmean(h[key] for h in steady) for key in BREAKDOWN},
        "generate_s": statistics.fmean(h["time/generate"] for h in steady),
        "completion_tokens_per_step": tokens / len(steady),
        "pipeline_tokens_per_s": tokens / wall,
        "mismatch_kl_max": max(h["mismatch_kl"] for h in steady),
        "reward_per_step": [h["reward/mean"] for h in history],
    }


def prompts() -> list[str]:
    rows = [json.loads(line) for line in DATA.read_text().splitlines()[:64]]
    suffix = "\nPut the final answer in \\boxed{}."
    return [row["problem"] + suffix for row in rows]


def run(base_url: str, args: argparse.Namespace) -> dict:
    raw = asyncio.run(
        measure(base_url, "smollm2-135m", args.batch_size, args.batch_size * 2,
                args.max_tokens, prompts())
    )  # fmt: skip
    print(
        f"raw vLLM at concurrency {args.batch_size}: {raw['tokens_per_s']:.1f} tokens/s", flush=True
    )
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for level in args.async_levels:
            result = train(base_url, args, level, Path(tmp) / f"async{level}")
            result["pipeline_efficiency"] = result["pipeline_tokens_per_s"] / raw["tokens_per_s"]
            runs.append(result)
    print(f"\n{'async':>5} {'step s':>7} {'wait':>6} {'fwd/bwd':>7} {'optim':>6} {'push':>6}"
          f" {'gen tok/s':>9} {'efficiency':>10}")  # fmt: skip
    for r in runs:
        print(
            f"{r['async_level']:>5} {r['step_s']:7.2f} {r['time/wait_rollouts']:6.2f} "
            f"{r['time/forward_backward']:7.2f} {r['time/optimizer']:6.2f} "
            f"{r['time/weight_push']:6.2f} {r['pipeline_tokens_per_s']:9.1f} "
            f"{r['pipeline_efficiency']:10.2f}"
        )
    return {"raw": raw, "runs": runs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default=None, help="an existing vf-vllm on smollm2-135m")
    parser.add_argument("--steps", type=int, default=4, help="measured steps per async level")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--micro-batch-size", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--async-levels", type=int, nargs="+", default=[0, 1])
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    if args.base_url:
        payload = run(args.base_url, args)
    else:
        from rlvr.server.process import VLLMServer

        with VLLMServer("smollm2-135m", extra_args=SERVER_FLAGS) as server:
            payload = run(server.base_url, args)
    save("train_step", {"model": "smollm2-135m", "env": "vf-deepscaler", **vars(args), **payload})


if __name__ == "__main__":
    main()
