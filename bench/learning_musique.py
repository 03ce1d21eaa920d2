"""Does a warm start + GRPO teach the embedded model MuSiQue tool use? Base, SFT, GRPO in one run.

The base SmolLM2-135M-Instruct never calls `retrieve_documents` and `submit_answer` correctly,
so GRPO alone has nothing to learn from; the recipe is the warm start of
bench/learning_openspiel.py:

1. Rows: MuSiQue has no training file here, so the dev sample (shared/data/musique/
   dev_sample.jsonl) is split: questions of at most --max-hops hops (a rollout of SmolLM2 on 2
   cores must fit its length budget), the first --train-rows for demonstrations and GRPO, the
   last --eval-rows held out, never trained on. Both go to --out/data.
2. Demonstrations: `rlvr-demos` plays the training rows with `vf_musique.scripted:hop_searcher`
   (a search per hop in its own words, reads the results, cites what it used, answers), once per
   seed in --demo-seeds (other phrasings), through the GRPO recipe's environment, and keeps the
   rollouts with reward >= --demo-min-reward and no tool error.
3. SFT on them (scripts/sft.py --config configs/examples/sft_musique_smollm2_cpu.yaml), LoRA: the
   loss covers the model's tool calls only, never the system prompt, question or tool results.
4. Serves the base model with vf-vllm (hermes tool calls) and evaluates it on the held-out rows
   through vf-eval with the recipe's environment and sampling; pushes base + SFT adapter (merged)
   and evaluates that; GRPO (scripts/train.py --config configs/examples/
   learn_musique_smollm2_cpu.yaml, `lora.resume_from` the adapter, the environment's reward),
   then evaluates its last push.
5. Writes the evaluation report (each stage's mean reward with a 95% CI clustered by question,
   paired differences against the base, and GRPO against SFT in the reward, each of its parts,
   tool errors and searches), the reward's parts per stage (exact match, F1, citation F1,
   retrieval recall, accepted submissions, tool errors), the training curves and a PNG of the
   reward and its parts per stage.

Everything lands in --out (default outputs/learn-musique); the summary also goes to
bench/results/learning_musique.json. Trailing dotted overrides go to the GRPO trainer,
`--sft KEY=VALUE` (repeatable) to SFT; `--reuse sft` reruns GRPO and after on --out's
stages 1-4. Smoke run:

    .venv/bin/python bench/learning_musique.py --train-rows 8 --eval-rows 8 --demo-seeds 1 \\
        --sft train.max_steps=2 max_steps=1
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
    Pipeline,
    evaluate_stage,
    pipeline_arguments,
    plot_stages,
    run_pipeline,
    save_pipeline,
    stage_report,
)

from rlvr.server.process import EXACT_FLAGS  # noqa: E402

SFT_RECIPE = ROOT / "configs" / "examples" / "sft_musique_smollm2_cpu.yaml"
GRPO_RECIPE = ROOT / "configs" / "examples" / "learn_musique_smollm2_cpu.yaml"
DEV_ROWS = ROOT.parent / "shared" / "data" / "musique" / "dev_sample.jsonl"
DEMO_POLICY = "vf_musique.scripted:hop_searcher"
# the reward and its parts (vf_musique's README), as the stage figure shows them
BARS = {
    "reward": None,
    "exact match": "exact_match",
    "F1": "f1",
    "citation F1": "citation_f1",
    "retrieval recall": "retrieval_recall",
    "submitted (format)": "format",
}
LOGGED = ("tool_errors", "searches", "docs_shown", "retrieval_score")
GRPO_CURVES = ("reward/mean", "env/exact_match", "env/format", "env/tool_errors", "time/step")


def split_rows(
    source: Path, out: Path, max_hops: int, train: int, held_out: int
) -> tuple[Path, Path]:
    """The questions of at most `max_hops` hops: the first `train` to train.jsonl, the last
    `held_out` to eval.jsonl (disjoint, or SystemExit)."""
    lines = [line for line in source.read_text().splitlines() if line.strip()]
    kept = [line for line in lines if len(json.loads(line)["question_decomposition"]) <= max_hops]
    if train + held_out > len(kept):
        raise SystemExit(
            f"{source}: {len(kept)} questions of at most {max_hops} hops, fewer than "
            f"--train-rows {train} + --eval-rows {held_out}"
        )
    data = out / "data"
    data.mkdir(parents=True, exist_ok=True)
    paths = data / "train.jsonl", data / "eval.jsonl"
    for path, rows in zip(paths, (kept[:train], kept[len(kept) - held_out :]), strict=True):
        path.write_text("".join(row + "\n" for row in rows))
    return paths


def make_demonstrations(cfg: Any, train: Path, args: argparse.Namespace) -> list[Path]:
    """`rlvr-demos` with the scripted hop searcher on the training rows, once per seed."""
    from rlvr.eval.demonstrations import main as demos

    files = []
    for seed in range(args.demo_seeds):
        path = train.parent / f"demos_seed{seed}.jsonl"
        demos(
            [
                *("--env", cfg.env.id, "--env-args", json.dumps(cfg.env.args)),
                *("--policy", DEMO_POLICY, "--seed", str(seed)),
                *("--policy-args", json.dumps({"data_files": str(train)})),
                *("--min-reward", str(args.demo_min_reward), "--require", "tool_errors==0"),
                *("--out", str(path)),
            ]
        )
        files.append(path)
    return files


def summarise(out: Path, times: dict[str, float], args: argparse.Namespace) -> dict:
    """The report, the figures and the headline numbers."""
    from rlvr.eval.plots import plot_run_curves, read_metrics
    from rlvr.eval.report import metric_estimate
    from rlvr.eval.vf_eval import load_run

    report = stage_report(out, BARS, "question", parts=("tool_errors", "searches"))
    plot_stages(
        report,
        out / "stages.png",
        ylabel="mean over held-out questions",
        title=f"MuSiQue tool use, {args.eval_rows} held-out dev questions, SmolLM2-135M",
    )
    plot_run_curves(out / "sft" / "metrics.jsonl", out / "sft_curves.png", ("train/loss",))
    plot_run_curves(
        out / "train" / "metrics.jsonl",
        out / "training_curves.png",
        GRPO_CURVES,
        title="GRPO on MuSiQue from the SFT adapter",
    )
    logged = {
        stage: {
            key: metric_estimate(load_run(out / "eval" / stage, stage), key).mean for key in LOGGED
        }
        for stage in ("base", "sft", "grpo")
    }
    steps = [h for h in read_metrics(out / "train" / "metrics.jsonl") if "reward/mean" in h]
    return {
        **report.json(),
        "logged_means": logged,
        "grpo_steps": len(steps),
        "grpo_train_reward_per_step": [h["reward/mean"] for h in steps],
        "wall_s": times,
        **{key: getattr(args, key) for key in ("max_hops", "train_rows", "eval_rows")},
        **{key: getattr(args, key) for key in ("eval_rollouts", "demo_seeds")},
        "outputs": str(out),
    }


def run(args: argparse.Namespace) -> dict:
    from rlvr.config import load_config

    out = args.out.resolve()
    train, held_out = split_rows(args.rows, out, args.max_hops, args.train_rows, args.eval_rows)
    rows = [f"env.args.data_files={train}"]
    cfg = load_config(GRPO_RECIPE, [*rows, *args.overrides])

    def evaluate(base_url: str, where: Path) -> None:
        env_args = {"data_files": str(train), "eval_data_files": str(held_out)}
        evaluate_stage(
            cfg,
            base_url,
            where,
            env_args=env_args,
            examples=args.eval_rows,
            rollouts=args.eval_rollouts,
        )

    pipeline = Pipeline(
        sft_recipe=SFT_RECIPE,
        grpo_recipe=GRPO_RECIPE,
        out=out,
        demonstrations=lambda: make_demonstrations(cfg, train, args),
        evaluate=evaluate,
        server_flags=EXACT_FLAGS,
    )
    times = run_pipeline(pipeline, args.sft, [*rows, *args.overrides], args.reuse == "sft")
    return summarise(out, times, args)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "outputs" / "learn-musique")
    parser.add_argument("--rows", type=Path, default=DEV_ROWS, help="MuSiQue jsonl to split")
    parser.add_argument("--max-hops", type=int, default=2, help="questions of at most N hops")
    parser.add_argument("--train-rows", type=int, default=95, help="first N: demos and GRPO")
    parser.add_argument("--eval-rows", type=int, default=30, help="last N: held out")
    parser.add_argument("--eval-rollouts", type=int, default=2, help="rollouts per question")
    parser.add_argument("--demo-seeds", type=int, default=4, help="demonstrator seeds")
    parser.add_argument("--demo-min-reward", type=float, default=0.9, help="demos kept at >=")
    pipeline_arguments(parser)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    save_pipeline("learning_musique", args, (SFT_RECIPE, GRPO_RECIPE), run(args))


if __name__ == "__main__":
    main()
