"""The main job on the embedded default model (`make demo`), end to end on this machine, and
proof that it learns, in a few minutes on 2 cores:

serve SmolLM2-135M-Instruct with vf-vllm, push weights and restore them, evaluate the base model
on held-out arithmetic (vf-eval), warm-start it (`rlvr-demos`, `rlvr-sft`), train GRPO through the
same server, evaluate again (before/after with 95% CIs, training curves) and shut down. A run
replaces the last one's outputs under --output-dir. The settings and what they measured:
docs/benchmarks.md#make-demo-a-warm-start-then-grpo-in-5-minutes."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import torch

from rlvr.config.cli import positive_int
from rlvr.eval.vf_eval import evaluate_policy
from rlvr.model.names import ensure_embedded_model
from rlvr.server.process import EXACT_FLAGS, VLLMServer
from rlvr.weight_sync.merged import MergedPush, push_merged_adapter

MODEL = "smollm2-135m"
QUESTIONS = ["What is the capital of France?", "Name a primary colour.", "What is 7 + 5?"]
BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "configs" / "examples" / "learn_deepscaler_smollm2_cpu.yaml"
WARM_START = ROOT / "configs" / "examples" / "sft_arithmetic_warm_start_smollm2_cpu.yaml"
EVAL_ROLLOUTS = 4
STAGES = {"base": "base", "warm_start": "warm start", "trained": "GRPO"}  # eval dir: label
OUTPUTS = ("data", "warm_start", "train", "eval")
# The recipe from a warm start, at demo size: 8 problems x 8 rollouts a step; synchronous, so a
# step's reward is the current policy's; lr 5e-4 (docs/benchmarks.md, `make demo`); a line a step
# instead of a bar; no W&B.
GRPO_OVERRIDES = [
    "batch.rollouts_per_example=8",
    "batch.async_level=0",
    "optim.lr=5e-4",
    "checkpoint.every=0",
    "logging.progress_bar=false",
    "wandb.mode=disabled",
]


def banner(text: str, start: float) -> None:
    print(f"\n=== {text} [{time.time() - start:.0f}s] ===", flush=True)


def chat(server: VLLMServer, question: str) -> str:
    body = {
        "model": server.model,
        "messages": [{"role": "user", "content": question}],
        "max_tokens": 24,
        "temperature": 0,
    }
    response = httpx.post(f"{server.base_url}/chat/completions", json=body, timeout=300)
    response.raise_for_status()
    return response.json()["choices"][0]["message"]["content"].strip().replace("\n", " ")


def ask_all(server: VLLMServer) -> list[str]:
    answers = [chat(server, q) for q in QUESTIONS]
    for question, answer in zip(QUESTIONS, answers, strict=True):
        print(f"  Q: {question}\n  A: {answer[:100]}")
    return answers


def weight_push_demo(server: VLLMServer, start: float) -> None:
    from transformers import AutoModelForCausalLM

    banner("chat with the served model", start)
    original = ask_all(server)
    model = AutoModelForCausalLM.from_pretrained(ensure_embedded_model(), dtype=torch.float32)
    saved = {name: p.detach().clone() for name, p in model.named_parameters()}
    with MergedPush(server.base_url, server.model) as weights:
        weights.connect(model)
        banner(f"push perturbed weights ({weights.backend} transfer)", start)
        torch.manual_seed(0)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.02 * p.std() * torch.randn_like(p))
        print(f"  pushed in {weights.push(0):.2f}s")
        changed = ask_all(server)
        banner("push the original weights back", start)
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.copy_(saved[name])
        print(f"  pushed in {weights.push(1):.2f}s")
        restored = ask_all(server)
    differ = sum(a != b for a, b in zip(original, changed, strict=True))
    print(
        f"\n  answers changed after the push: {differ}/{len(QUESTIONS)}; "
        f"restored exactly: {restored == original}"
    )
    if differ == 0 or restored != original:
        raise SystemExit("demo failed: the served outputs did not follow the pushed weights")


def evaluate(server: VLLMServer, recipe: Any, data: Path, out: Path, examples: int) -> None:
    """vf-eval of whatever the server now serves on `examples` held-out problems x 4 rollouts,
    with the GRPO recipe's environment and sampling."""
    try:
        rows = evaluate_policy(
            recipe,
            server.base_url,
            out,
            env_args={"data_files": str(data)},
            examples=examples,
            rollouts=EVAL_ROLLOUTS,
        )
    except RuntimeError as error:
        raise SystemExit(str(error)) from error
    rewards = [row["reward"] for row in rows]
    print(f"  {len(rewards)} rollouts, mean reward {sum(rewards) / max(len(rewards), 1):.3f}")


def run(cmd: list[str]) -> None:
    """A project command, as a user runs it; its output goes straight to the console."""
    subprocess.run([str(BIN / "python"), *cmd], check=True)


def warm_start(recipe: Any, train_data: Path, out: Path, steps: int) -> Path:
    """Scripted demonstrations of the training problems in the GRPO recipe's environment (its
    system prompt), then `steps` SFT steps (LoRA) on them; returns the adapter."""
    demos = out / "data" / "demos.jsonl"
    env_args = {**recipe.env.args, "data_files": str(train_data)}
    run(
        [
            str(ROOT / "scripts" / "demonstrations.py"),
            "--env",
            recipe.env.id,
            "--env-args",
            json.dumps(env_args),
            "--policy",
            "rlvr.data.arithmetic:solver",
            "--min-reward",
            "1",
            "--out",
            str(demos),
        ]
    )
    run(
        [
            str(ROOT / "scripts" / "sft.py"),
            "--config",
            str(WARM_START),
            f"data.train_files=[{demos}]",
            f"train.max_steps={steps}",
            f"output_dir={out / 'warm_start'}",
        ]
    )
    return out / "warm_start" / "final"


def train(
    server: VLLMServer, train_data: Path, adapter: Path, out: Path, steps: int, overrides: list[str]
) -> None:
    """GRPO with the arithmetic recipe from the warm-start adapter, pushing into `server`."""
    run(
        [
            str(ROOT / "scripts" / "train.py"),
            "--config",
            str(RECIPE),
            f"server.base_url={server.base_url}",
            f"env.args.data_files={train_data}",
            f"lora.resume_from={adapter}",
            f"max_steps={steps}",
            *GRPO_OVERRIDES,
            *overrides,
            f"output_dir={out / 'train'}",
        ]
    )


def before_after(out: Path) -> None:
    """Held-out reward per stage (95% CIs clustered by problem) and the paired differences
    that say what each training stage added."""
    from rlvr.eval.report import build_report, compare, format_estimate
    from rlvr.eval.vf_eval import load_run

    runs = [load_run(out / "eval" / stage, label) for stage, label in STAGES.items()]
    report = build_report(runs)
    for summary in report.runs:
        print(f"  held-out reward, {summary.name + ':':<12} {format_estimate(summary.reward)}")
    for comparison in (report.comparisons[-1], compare(runs[1], runs[2])):
        print(
            f"  paired difference, {comparison.name} - {comparison.baseline}: "
            f"{format_estimate(comparison.difference, '+')}"
        )


def plot_training(out: Path) -> None:
    from rlvr.eval.plots import plot_run_curves

    png = plot_run_curves(
        out / "train" / "metrics.jsonl",
        out / "training_curves.png",
        ("reward/mean", "env/has_boxed", "mismatch_kl", "time/step"),
        title="make demo: GRPO on arithmetic from the warm start",
    )
    print(f"  training curves: {png}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="rlvr-demo", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--eval-examples",
        type=int,
        default=40,
        help="held-out problems, 4 rollouts each (0: no evaluation)",
    )
    parser.add_argument("--warm-start-steps", type=positive_int, default=1, help="SFT steps")
    parser.add_argument("--train-steps", type=int, default=10, help="GRPO steps (0: none)")
    parser.add_argument("--output-dir", type=Path, default=Path("outputs/demo"))
    parser.add_argument("overrides", nargs="*", help="dotted GRPO overrides, e.g. optim.lr=1e-3")
    args = parser.parse_args(argv)

    from rlvr.config import load_config
    from rlvr.data.arithmetic import arithmetic_splits, write_jsonl

    start = time.time()
    out = args.output_dir.resolve()
    for part in OUTPUTS:  # this demo's earlier outputs; nothing else in the directory
        shutil.rmtree(out / part, ignore_errors=True)
    recipe = load_config(RECIPE, [*GRPO_OVERRIDES, *args.overrides])  # evaluations sample alike
    train_rows, heldout_rows = arithmetic_splits(held_out=max(args.eval_examples, 1))
    train_data = write_jsonl(out / "data" / "train.jsonl", train_rows)
    heldout = write_jsonl(out / "data" / "heldout.jsonl", heldout_rows)
    banner(f"preparing the embedded model ({MODEL})", start)
    print(f"  {ensure_embedded_model()}")
    banner("starting vf-vllm (first start compiles kernels: 1-3 minutes on 2 cores)", start)
    with VLLMServer(MODEL, extra_args=EXACT_FLAGS) as server:
        print(f"  serving {MODEL} at {server.base_url} (log: {server.log_path})")
        weight_push_demo(server, start)
        if args.eval_examples > 0:
            banner(
                f"vf-eval vf-deepscaler, base model: {args.eval_examples} held-out "
                f"arithmetic problems x {EVAL_ROLLOUTS} rollouts",
                start,
            )
            evaluate(server, recipe, heldout, out / "eval" / "base", args.eval_examples)
        if args.train_steps > 0:
            steps = f"{args.warm_start_steps} SFT step" + "s" * (args.warm_start_steps != 1)
            banner(f"warm start: demonstrations, {steps} (LoRA)", start)
            adapter = warm_start(recipe, train_data, out, args.warm_start_steps)
            if args.eval_examples > 0:
                banner("vf-eval, warm start (base + SFT adapter, pushed)", start)
                push_merged_adapter(server.base_url, MODEL, adapter)
                evaluate(server, recipe, heldout, out / "eval" / "warm_start", args.eval_examples)
            banner(f"{args.train_steps} GRPO steps from the warm start ({MODEL}, CPU, LoRA)", start)
            train(server, train_data, adapter, out, args.train_steps, args.overrides)
            if args.eval_examples > 0:
                banner("vf-eval, GRPO-trained policy (its last push)", start)
                evaluate(server, recipe, heldout, out / "eval" / "trained", args.eval_examples)
                before_after(out)
            plot_training(out)
        banner("shutting down vf-vllm", start)
    print(f"  done in {time.time() - start:.0f}s; outputs in {out}")


if __name__ == "__main__":
    main()
