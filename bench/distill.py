"""Does on-policy distillation bring the base model toward a trained teacher, and how does it
compare with GRPO on the same prompts and steps? One run, on the embedded model.

1. The teacher: SmolLM2-135M-Instruct after `make demo`'s warm start and GRPO (its final adapter,
   `--teacher`, default outputs/demo/train/final; made with `rlvr-demo --eval-examples 0` when
   it is missing), served by a vf-vllm of its own.
2. The student's vf-vllm serves the base model, evaluated on the demo's held-out arithmetic
   (vf-eval, `--eval-examples` x 4 rollouts).
3. `--steps` steps of pure distillation (`distill.rewards=false`) from the base model, with the
   demo's GRPO recipe otherwise, then the student's last push evaluated alike.
4. `--steps` steps of GRPO from the base model on the same prompts (the trainer's first push
   puts the base weights back), evaluated alike.
5. The report: held-out reward per policy with 95% CIs clustered by problem, the paired
   differences distilled - base and distilled - GRPO, the reverse KL to the teacher per step,
   and a PNG of both runs' curves (reward, reverse KL, step time).

Everything lands in --out (default outputs/bench-distill); the summary also goes to
bench/results/distill.json. Trailing dotted overrides go to both training runs.

Run:  .venv/bin/python bench/distill.py [--steps 10] [--eval-examples 40] [optim.lr=1e-3]
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ROOT, SERVER_FLAGS, estimate_json, evaluate_stage, run_script, save  # noqa: E402

from rlvr.demo import EVAL_ROLLOUTS, GRPO_OVERRIDES, MODEL, RECIPE  # noqa: E402

RUNS = {"base": "base", "distilled": "distilled", "grpo": "GRPO"}  # eval dir: label
CURVES = ("reward/mean", "distill/reverse_kl", "distill/wait_share", "time/step")


def teacher_dir(path: Path) -> Path:
    """The teacher's adapter (or model) directory: `path`, made by `make demo`'s stages
    (without its evaluations) when it is missing."""
    if not path.exists():
        print(f"no teacher at {path}: running rlvr-demo --eval-examples 0 to make one", flush=True)
        demo_out = path.parents[1]
        cmd = [sys.executable, "-m", "rlvr.demo", "--eval-examples", "0", "--output-dir"]
        subprocess.run([*cmd, str(demo_out)], check=True)
    return path


def train(kind: str, base_url: str, data: Path, out: Path, extra: list[str]) -> float:
    """`--steps` steps of `kind` (distilled or grpo) from the base model; its wall time."""
    return run_script(
        "train.py",
        RECIPE,
        out / "train" / kind,
        [
            f"server.base_url={base_url}",
            f"env.args.data_files={data}",
            *GRPO_OVERRIDES,
            "wandb.mode=disabled",
            *extra,
        ],
    )


def summarise(out: Path, seconds: dict[str, float], args: argparse.Namespace) -> dict:
    """The report, the PNG and the headline numbers."""
    from rlvr.atomic import atomic_write_text
    from rlvr.eval.plots import plot_runs_compared
    from rlvr.eval.report import build_report, compare, format_estimate, render_markdown
    from rlvr.eval.vf_eval import load_run

    runs = {name: load_run(out / "eval" / name, label) for name, label in RUNS.items()}
    report = build_report(list(runs.values()))
    atomic_write_text(out / "report.md", render_markdown(report))
    versus_base = compare(runs["base"], runs["distilled"])
    versus_grpo = compare(runs["grpo"], runs["distilled"])
    history = {
        RUNS[kind]: [
            json.loads(line)
            for line in (out / "train" / kind / "metrics.jsonl").read_text().splitlines()
            if "reward/mean" in line
        ]
        for kind in ("distilled", "grpo")
    }
    png = plot_runs_compared(
        history,
        out / "distill_vs_grpo.png",
        CURVES,
        title=f"{MODEL}: pure distillation from the demo's policy vs GRPO, from the base",
    )
    for summary in report.runs:
        print(f"held-out reward, {summary.name + ':':<10} {format_estimate(summary.reward)}")
    for comparison in (versus_base, versus_grpo):
        print(
            f"paired difference, {comparison.name} - {comparison.baseline}: "
            f"{format_estimate(comparison.difference, '+')}"
        )
    kl = [h["distill/reverse_kl"] for h in history["distilled"]]
    print(f"reverse KL to the teacher per step: {[round(k, 3) for k in kl]}\ncurves: {png}")
    return {
        "reward": {s.name: estimate_json(s.reward) for s in report.runs},
        "distilled_minus_base": estimate_json(versus_base.difference),
        "distilled_minus_grpo": estimate_json(versus_grpo.difference),
        "reverse_kl_per_step": kl,
        "train_reward_per_step": {k: [h["reward/mean"] for h in v] for k, v in history.items()},
        "wait_share_per_step": [h.get("distill/wait_share") for h in history["distilled"]],
        "train_wall_s": seconds,
        "steps": args.steps,
        "eval_examples": args.eval_examples,
        "eval_rollouts": EVAL_ROLLOUTS,
        "outputs": str(out),
    }


def run(args: argparse.Namespace) -> dict:
    from rlvr.config import load_config
    from rlvr.data.arithmetic import arithmetic_splits, write_jsonl
    from rlvr.server.process import VLLMServer
    from rlvr.server.serve_model import serve

    out = args.out.resolve()
    teacher = teacher_dir(args.teacher.resolve())
    recipe = load_config(RECIPE, [*GRPO_OVERRIDES, *args.overrides])
    train_rows, heldout_rows = arithmetic_splits(held_out=args.eval_examples)
    data = write_jsonl(out / "data" / "train.jsonl", train_rows)
    heldout = write_jsonl(out / "data" / "heldout.jsonl", heldout_rows)
    steps = [f"max_steps={args.steps}", *args.overrides]
    seconds: dict[str, float] = {}
    with (
        serve(str(teacher), name="teacher", server_args=SERVER_FLAGS) as taught,
        VLLMServer(MODEL, extra_args=SERVER_FLAGS) as student,
    ):
        print(f"teacher {teacher} at {taught.base_url}; student {MODEL} at {student.base_url}")

        def evaluate(name: str) -> None:
            env_args: dict[str, Any] = {"data_files": str(heldout)}
            evaluate_stage(
                recipe,
                student.base_url,
                out / "eval" / name,
                env_args=env_args,
                examples=args.eval_examples,
                rollouts=EVAL_ROLLOUTS,
            )

        evaluate("base")
        distill = [f"distill.base_url={taught.base_url}", f"distill.model={taught.model}"]
        distill.append("distill.rewards=false")
        seconds["distilled"] = train("distilled", student.base_url, data, out, [*distill, *steps])
        evaluate("distilled")
        seconds["grpo"] = train("grpo", student.base_url, data, out, steps)
        evaluate("grpo")
    return summarise(out, seconds, args)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "outputs" / "bench-distill")
    parser.add_argument(
        "--teacher", type=Path, default=ROOT / "outputs" / "demo" / "train" / "final"
    )
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--eval-examples", type=int, default=40)
    parser.add_argument("overrides", nargs="*", help="dotted trainer overrides for both runs")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    payload = run(args)
    save("distill", {"recipe": str(RECIPE.relative_to(ROOT)), **payload})


if __name__ == "__main__":
    main()
