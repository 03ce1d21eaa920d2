"""Does GRPO make the embedded model better at a real task? Base vs trained policy, in one run.

1. Writes the task's data: small-number addition and subtraction problems for vf-deepscaler
   (`\\boxed{}` answers checked by math-verify), a training split and a held-out split that
   share no problem.
2. Serves SmolLM2-135M-Instruct with vf-vllm and evaluates it on the held-out split through
   vf-eval (`--eval-examples` x `--eval-rollouts`, the recipe's sampling).
3. Trains with the recipe (scripts/train.py --config configs/examples/learn_deepscaler_
   smollm2_cpu.yaml), pushing weights into the same server after every step, so that the server
   ends up serving the final policy.
4. Evaluates the served final policy exactly as the base model.
5. Writes the evaluation report (rlvr.eval.report: each run's mean reward with a 95% CI clustered by
   example, and the paired per-example difference with its 95% CI), a PNG of the training curves
   (reward, mismatch-KL, step time) and a PNG of the before/after bars.

Everything lands in --out (default outputs/learn-deepscaler); the summary also goes to
bench/results/learning.json. Trailing dotted overrides go to the trainer (e.g. `max_steps=3`
for a smoke run). The full run takes about an hour on two otherwise idle cores.

Run:  .venv/bin/python bench/learning.py [--eval-examples 100] [--eval-rollouts 4] [max_steps=3]
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    ROOT,
    SERVER_FLAGS,
    estimate_json,
    evaluate_stage,
    run_script,
    save,
)

from rlvr.data.arithmetic import arithmetic_splits, write_jsonl  # noqa: E402

RECIPE = ROOT / "configs" / "examples" / "learn_deepscaler_smollm2_cpu.yaml"
CURVES = ("reward/mean", "mismatch_kl", "time/step")


def evaluate(cfg: Any, base_url: str, out: Path, data: Path, args: argparse.Namespace) -> Path:
    """vf-eval on the held-out split with the recipe's environment and sampling."""
    evaluate_stage(
        cfg,
        base_url,
        out,
        env_args={"data_files": str(data)},
        examples=args.eval_examples,
        rollouts=args.eval_rollouts,
    )
    return out


def summarise(out: Path, train_s: float, args: argparse.Namespace) -> dict:
    """The report, both figures and the headline numbers."""
    from rlvr.atomic import atomic_write_text
    from rlvr.eval.plots import plot_before_after, plot_run_curves
    from rlvr.eval.report import build_report, render_markdown, report_json
    from rlvr.eval.vf_eval import load_run

    report = build_report(
        [load_run(out / "eval" / "base", "base"), load_run(out / "eval" / "trained", "trained")]
    )
    atomic_write_text(out / "report.md", render_markdown(report))
    atomic_write_text(out / "report.json", report_json(report))
    base, trained = (run.reward for run in report.runs)
    difference = report.comparisons[0].difference
    history = [
        json.loads(line) for line in (out / "train" / "metrics.jsonl").read_text().splitlines()
    ]
    steps = [h for h in history if "reward/mean" in h]
    plot_run_curves(
        out / "train" / "metrics.jsonl",
        out / "training_curves.png",
        CURVES,
        title="GRPO on small-number arithmetic, SmolLM2-135M-Instruct",
    )
    plot_before_after(
        ["held-out reward"],
        [base],
        [trained],
        out / "before_after.png",
        names=("base", "trained"),
        title="held-out problems",
    )
    print(render_markdown(report))

    return {
        "base_reward": estimate_json(base),
        "trained_reward": estimate_json(trained),
        "paired_difference": estimate_json(difference),
        "ci_excludes_zero_in_favour": difference.low is not None and difference.low > 0,
        "steps": len(steps),
        "train_wall_s": train_s,
        "train_reward_per_step": [h["reward/mean"] for h in steps],
        "eval_examples": args.eval_examples,
        "eval_rollouts": args.eval_rollouts,
        "outputs": str(out),
    }


def run(base_url: str, args: argparse.Namespace, overrides: list[str]) -> dict:
    from rlvr.config import load_config

    cfg = load_config(RECIPE, overrides)
    out = args.out.resolve()
    train_rows, eval_rows = arithmetic_splits(args.eval_examples)
    train_data = write_jsonl(out / "data" / "train.jsonl", train_rows)
    eval_data = write_jsonl(out / "data" / "heldout.jsonl", eval_rows)
    print(f"{len(train_rows)} training and {len(eval_rows)} held-out problems in {out / 'data'}")
    print("evaluating the base model", flush=True)
    evaluate(cfg, base_url, out / "eval" / "base", eval_data, args)
    print("training", flush=True)
    train_s = run_script(
        "train.py",
        RECIPE,
        out / "train",
        [f"server.base_url={base_url}", f"env.args.data_files={train_data}", *overrides],
    )
    print("evaluating the trained policy (served with the last pushed weights)", flush=True)
    evaluate(cfg, base_url, out / "eval" / "trained", eval_data, args)
    return summarise(out, train_s, args)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "outputs" / "learn-deepscaler")
    parser.add_argument("--eval-examples", type=int, default=100)
    parser.add_argument("--eval-rollouts", type=int, default=4)
    parser.add_argument("--base-url", help="a fresh vf-vllm serving the base smollm2-135m")
    parser.add_argument("overrides", nargs="*", help="dotted trainer overrides, e.g. max_steps=3")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if args.base_url:
        payload = run(args.base_url, args, args.overrides)
    else:
        from rlvr.server.process import VLLMServer

        with VLLMServer("smollm2-135m", extra_args=SERVER_FLAGS) as server:
            payload = run(server.base_url, args, args.overrides)
    save(
        "learning",
        {"recipe": str(RECIPE.relative_to(ROOT)), "overrides": args.overrides, **payload},
    )


if __name__ == "__main__":
    main()
