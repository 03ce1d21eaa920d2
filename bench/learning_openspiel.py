"""Does a warm start + GRPO make the embedded model play tic-tac-toe? Base, SFT, GRPO in one run.

The base SmolLM2-135M-Instruct never writes a well-formed `<move>` (reward 0 on every game), so
GRPO alone has nothing to learn from; the recipe is the field's warm start:

1. Demonstrations: `rlvr-demos` plays the GRPO recipe's training games (its environment, task
   seed 0) with `vf_openspiel.scripted:quiet_mover` (a random legal move, answered as
   `<move>ID</move>`) against the random opponent and keeps the won games (`--min-reward 1`).
2. SFT on them (scripts/sft.py --config configs/examples/sft_openspiel_smollm2_cpu.yaml), LoRA:
   the loss covers the player's replies only, never the positions or the opponent's moves.
3. Serves the base model with vf-vllm and evaluates it on held-out games: the recipe's
   environment with another task seed (`--eval-seed`), never trained on, through vf-eval.
4. Pushes base + SFT adapter (merged) into the server, as the GRPO trainer's first push does,
   and evaluates that policy the same way.
5. GRPO (scripts/train.py --config configs/examples/learn_openspiel_smollm2_cpu.yaml,
   `lora.resume_from` the SFT adapter, outcome reward), pushing weights into the same server
   after every step; then evaluates the served final policy.
6. Writes the evaluation report (rlvr.eval.report: each stage's mean outcome reward with a 95% CI
   clustered by game, paired per-game differences against the base and GRPO against SFT), the
   training curves (SFT loss; GRPO reward, mismatch-KL, step time) and a PNG of the outcome
   reward, legal-move rate and win/draw/loss per stage.

Everything lands in --out (default outputs/learn-openspiel); the summary also goes to
bench/results/learning_openspiel.json. Trailing dotted overrides go to the GRPO trainer,
`--sft KEY=VALUE` (repeatable) to SFT. `--reuse sft` keeps --out's stages 1-4 (demonstrations,
SFT adapter, base and SFT evaluations) and reruns GRPO, its evaluation and the report, replacing
--out's train/ and eval/grpo/ (copy them first to keep them). Smoke run:

    .venv/bin/python bench/learning_openspiel.py --demo-games 40 --eval-games 8 \\
        --sft train.max_steps=2 max_steps=2
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ROOT, estimate_json, evaluate_stage, run_script, save  # noqa: E402

SFT_RECIPE = ROOT / "configs" / "examples" / "sft_openspiel_smollm2_cpu.yaml"
GRPO_RECIPE = ROOT / "configs" / "examples" / "learn_openspiel_smollm2_cpu.yaml"
DEMO_POLICY = "vf_openspiel.scripted:quiet_mover"
SERVER_FLAGS = ["--dtype", "float32", "--enforce-eager", "--max-model-len", "2048"]
STAGES = ("base", "sft", "grpo")
LABELS = {"base": "base", "sft": "SFT", "grpo": "SFT + GRPO"}
# what the stage figure shows: the reward, then rubric metrics (vf_openspiel's README)
BARS = {
    "outcome reward": None,
    "legal-move rate": "legal_rate",
    "win": "win",
    "draw": "draw",
    "loss": "loss",
}
GRPO_CURVES = ("reward/mean", "mismatch_kl", "time/step")


def make_demonstrations(cfg: Any, out: Path, games: int) -> Path:
    """`rlvr-demos` on the recipe's first `games` training games; the won ones, as SFT rows."""
    from rlvr.data.demonstrations import main as demos

    path = out / "data" / "demos.jsonl"
    env_args = {**cfg.env.args, "num_tasks_per_case": games}
    demos(
        [
            "--env",
            cfg.env.id,
            "--env-args",
            json.dumps(env_args),
            "--policy",
            DEMO_POLICY,
            "--min-reward",
            "1",
            "--out",
            str(path),
        ]
    )
    return path


def evaluate(cfg: Any, base_url: str, out: Path, args: argparse.Namespace) -> None:
    """Held-out games: the recipe's environment and sampling with task seed --eval-seed."""
    env_args = {"seed": args.eval_seed, "num_tasks_per_case": args.eval_games}
    evaluate_stage(
        cfg, base_url, out, env_args=env_args, examples=args.eval_games, rollouts=args.eval_rollouts
    )


def summarise(out: Path, times: dict[str, float], args: argparse.Namespace) -> dict:
    """The report, the figures and the headline numbers."""
    from rlvr.atomic import atomic_write_text
    from rlvr.eval.plots import plot_estimate_bars, plot_run_curves, read_metrics
    from rlvr.eval.report import (
        build_report,
        compare,
        format_estimate,
        metric_estimate,
        render_markdown,
        report_json,
    )
    from rlvr.eval.vf_eval import load_run

    runs = {stage: load_run(out / "eval" / stage, LABELS[stage]) for stage in STAGES}
    report = build_report(list(runs.values()))
    grpo_vs_sft = compare(runs["sft"], runs["grpo"])
    markdown = render_markdown(report) + (
        f"\n{grpo_vs_sft.name} - {grpo_vs_sft.baseline} (paired per game, "
        f"{grpo_vs_sft.paired_examples} games): {format_estimate(grpo_vs_sft.difference, '+')}\n"
    )
    atomic_write_text(out / "report.md", markdown)
    atomic_write_text(out / "report.json", report_json(report))
    print(markdown)
    stages = {
        stage: {
            label: summary.reward if key is None else metric_estimate(runs[stage], key)
            for label, key in BARS.items()
        }
        for stage, summary in zip(STAGES, report.runs, strict=True)
    }
    plot_estimate_bars(
        list(BARS),
        {LABELS[s]: list(stages[s].values()) for s in STAGES},
        out / "stages.png",
        ylabel="mean over held-out games",
        title=f"tic-tac-toe vs random, {args.eval_games} held-out games, SmolLM2-135M",
    )
    plot_run_curves(
        out / "sft" / "metrics.jsonl",
        out / "sft_curves.png",
        ("train/loss",),
        title="SFT on won demonstration games",
    )
    plot_run_curves(
        out / "train" / "metrics.jsonl",
        out / "training_curves.png",
        GRPO_CURVES,
        title="GRPO on tic-tac-toe from the SFT adapter",
    )
    steps = [h for h in read_metrics(out / "train" / "metrics.jsonl") if "reward/mean" in h]
    differences = {f"{c.name} - {c.baseline}": c.difference for c in report.comparisons}
    differences[f"{grpo_vs_sft.name} - {grpo_vs_sft.baseline}"] = grpo_vs_sft.difference
    return {
        "stages": {
            LABELS[s]: {label: estimate_json(e) for label, e in stages[s].items()} for s in STAGES
        },
        "paired_differences": {name: estimate_json(e) for name, e in differences.items()},
        "sft_legal_rate_at_least_0.95": stages["sft"]["legal-move rate"].mean >= 0.95,
        "grpo_beats_sft_ci_excludes_zero": (grpo_vs_sft.difference.low or 0.0) > 0,
        "grpo_steps": len(steps),
        "grpo_train_reward_per_step": [h["reward/mean"] for h in steps],
        "wall_s": times,
        "eval_games": args.eval_games,
        "eval_rollouts": args.eval_rollouts,
        "eval_seed": args.eval_seed,
        "demo_games": args.demo_games,
        "outputs": str(out),
    }


def timed(times: dict[str, float], name: str, step: Any, *a: Any) -> Any:
    began = time.perf_counter()
    result = step(*a)
    times[name] = round(time.perf_counter() - began, 1)
    print(f"{name}: {times[name]:.0f} s", flush=True)
    return result


def run(args: argparse.Namespace) -> dict:
    from rlvr.config import load_config
    from rlvr.server.process import VLLMServer
    from rlvr.weight_sync.merged import push_merged_adapter

    cfg = load_config(GRPO_RECIPE, args.overrides)
    if args.eval_seed == cfg.env.args.get("seed", 0):
        raise SystemExit(f"--eval-seed {args.eval_seed} is the training games' seed")
    out = args.out.resolve()
    adapter = out / "sft" / "final"
    kept = [out / "eval" / "base", out / "eval" / "sft", adapter]
    if args.reuse == "sft" and (missing := [str(p) for p in kept if not p.exists()]):
        raise SystemExit(f"--reuse sft: {', '.join(missing)} missing; run without it first")
    times: dict[str, float] = {}
    began = time.perf_counter()
    if args.reuse == "sft":
        print(f"1-4. reusing the demonstrations, SFT adapter and evaluations in {out}", flush=True)
    else:
        print(f"1. demonstrations: {args.demo_games} games by {DEMO_POLICY}, won", flush=True)
        demos = timed(times, "demonstrations", make_demonstrations, cfg, out, args.demo_games)
        print("2. SFT", flush=True)
        sft_overrides = [f"data.train_files=[{demos}]", *args.sft]
        timed(times, "sft", run_script, "sft.py", SFT_RECIPE, out / "sft", sft_overrides)
    with VLLMServer("smollm2-135m", extra_args=SERVER_FLAGS) as server:
        url = server.base_url
        if args.reuse != "sft":
            print("3. evaluating the base model", flush=True)
            timed(times, "eval_base", evaluate, cfg, url, out / "eval" / "base", args)
            print("4. evaluating the SFT policy (base + adapter pushed)", flush=True)
            timed(times, "push_sft", push_merged_adapter, url, "smollm2-135m", adapter)
            timed(times, "eval_sft", evaluate, cfg, url, out / "eval" / "sft", args)
        print("5. GRPO from the SFT adapter", flush=True)
        grpo = [f"server.base_url={url}", f"lora.resume_from={adapter}", *args.overrides]
        timed(times, "grpo", run_script, "train.py", GRPO_RECIPE, out / "train", grpo)
        print("   evaluating the GRPO policy (the server holds its last push)", flush=True)
        timed(times, "eval_grpo", evaluate, cfg, url, out / "eval" / "grpo", args)
    times["total"] = round(time.perf_counter() - began, 1)
    return summarise(out, times, args)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "outputs" / "learn-openspiel")
    parser.add_argument("--demo-games", type=int, default=800, help="games played for demos")
    parser.add_argument("--eval-games", type=int, default=200, help="held-out games per stage")
    parser.add_argument("--eval-rollouts", type=int, default=1, help="rollouts per game")
    parser.add_argument("--eval-seed", type=int, default=1, help="task seed of held-out games")
    parser.add_argument(
        "--reuse", choices=["sft"], help="keep --out's stages 1-4; rerun GRPO and after"
    )
    parser.add_argument(
        "--sft",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="SFT override (repeatable), e.g. train.max_steps=2",
    )
    parser.add_argument("overrides", nargs="*", help="dotted GRPO overrides, e.g. max_steps=2")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    payload = run(args)
    save(
        "learning_openspiel",
        {
            "recipes": [str(SFT_RECIPE.relative_to(ROOT)), str(GRPO_RECIPE.relative_to(ROOT))],
            "reuse": args.reuse,
            "sft_overrides": args.sft,
            "overrides": args.overrides,
            **payload,
        },
    )


if __name__ == "__main__":
    main()
