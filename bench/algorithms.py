"""Do dynamic sampling and the curriculum help? Arms trained for the same wall-clock time, compared.

On the arithmetic recipe (configs/examples/learn_deepscaler_smollm2_cpu.yaml, data written as
bench/learning.py writes it), every arm trains from the base model with the same seed and the
same data order, against one vf-vllm (each trainer's initial push puts the base weights back):

- `baseline`: the defaults (`batch.dynamic_sampling=false`, `curriculum.enabled=false`);
- `dynamic_sampling`: groups without signal are replaced by fresh ones (`batch.dynamic_sampling`);
- `dynamic_sampling_curriculum`: that, and the pass-rate curriculum (`curriculum.enabled`).

Equal wall clock: the trainer has no time limit, so each arm runs the trainer in this process
with a cadence that ends the run at a step boundary: after each step it continues only while the
budget minus the time spent is more than half the arm's mean step time so far, i.e. it stops at
the boundary nearest the budget. That is honest where the alternatives are not: a
steps-per-second calibration would fix each arm's step count from a short run, but what dynamic
sampling costs depends on how many groups lack signal, which changes as the policy learns; and
killing a trainer mid-step could leave a weight push half done in the server. With the default
constant learning rate (the script refuses another schedule) a run stopped after n steps is the
run `max_steps=n` would be. The clock starts after set-up (model load, initial push), runs
until the last step's push has ended, and is reported per arm (`train_s`): arms differ by up to
half a step.

After each arm the server serves its last pushed weights; vf-eval evaluates them on the held-out
split (`--eval-examples` x `--eval-rollouts`), and the base model once before the arms. The
report (rlvr.eval.report) gives each arm's mean reward with a 95% CI clustered by problem and the
paired per-problem difference against the first arm (`baseline`). Per step, from each arm's
metrics.jsonl: the share of groups (a sample is one rollout here, so also of samples) with a
non-zero advantage, 1 - (zero-variance + errored groups) / groups, beside `batch/refill_groups`
and `batch/zero_signal_frac` (rlvr.trainer.train_batch).

Everything lands in --out (report.md, report.json, curves.png, train/<arm>, eval/<arm>,
eval/base); the summary also goes to bench/results/algorithms.json. Trailing dotted overrides go
to every arm's trainer.

Run:  .venv/bin/python bench/algorithms.py [--budget-min 6] [--eval-examples 100]
          [--eval-rollouts 2] [--arms baseline,dynamic_sampling] [optim.lr=1e-3]
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ROOT, SERVER_FLAGS, estimate_json, save  # noqa: E402
from learning import RECIPE, evaluate  # noqa: E402

from rlvr.data.arithmetic import arithmetic_splits, write_jsonl  # noqa: E402
from rlvr.trainer.cadence import Cadence, run_steps  # noqa: E402
from rlvr.trainer.grpo import Trainer  # noqa: E402

ARMS = {
    "baseline": ["batch.dynamic_sampling=false", "curriculum.enabled=false"],
    "dynamic_sampling": ["batch.dynamic_sampling=true", "curriculum.enabled=false"],
    "dynamic_sampling_curriculum": ["batch.dynamic_sampling=true", "curriculum.enabled=true"],
}
# every arm: steps until the budget ends the run, no checkpoints inside the budget
RUN = ["max_steps=100000", "checkpoint.every=0"]
NONZERO = "nonzero_adv_frac"
CURVES = ("reward/mean", NONZERO, "batch/refill_groups", "curriculum/set_aside")


@dataclasses.dataclass(frozen=True)
class BudgetCadence(Cadence):
    """A cadence that also stops at the step boundary nearest to `began + budget_s`."""

    began: float = 0.0
    budget_s: float = float("inf")

    def stop_here(self, done: int, stop_after: int | None) -> bool:
        spent = time.perf_counter() - self.began
        return super().stop_here(done, stop_after) or self.budget_s - spent < spent / done / 2


class BudgetTrainer(Trainer):
    """The GRPO trainer, noting when each step (its weight push included) ended."""

    ended = 0.0

    def train_step(self, step: int) -> dict[str, float]:
        metrics = super().train_step(step)
        self.ended = time.perf_counter()
        return metrics


def train_arm(cfg: Any, budget_s: float) -> float:
    """Train `cfg` until its budget (see the module docstring); returns the seconds trained."""
    trainer = BudgetTrainer(cfg)
    trainer.setup()
    began = time.perf_counter()
    cadence = BudgetCadence(
        total_steps=cfg.max_steps,
        eval_every=0,
        save_every=cfg.checkpoint.every,
        eval_at_start=False,
        eval_at_end=False,
        began=began,
        budget_s=budget_s,
    )
    try:
        run_steps(trainer, cadence, trainer.start_step)
    finally:
        trainer.close()
    return trainer.ended - began


def nonzero_advantage_frac(record: dict[str, Any], groups: int) -> float:
    """The share of a step's groups whose rollouts got a non-zero advantage."""
    flat = record["rollouts/zero_variance_groups"] + record["rollouts/dropped_errored_groups"]
    return 1 - flat / groups


def run_arm(name: str, base_url: str, data: dict[str, Path], args: argparse.Namespace) -> dict:
    """Train one arm for the budget, evaluate what the server then serves; its figures."""
    from rlvr.config import load_config
    from rlvr.eval.plots import read_metrics

    out = args.out.resolve()
    overrides = [
        f"server.base_url={base_url}",
        f"env.args.data_files={data['train']}",
        f"output_dir={out / 'train' / name}",
        *RUN,
        *args.overrides,
        *ARMS[name],
    ]
    cfg = load_config(RECIPE, overrides)
    if cfg.optim.scheduler != "constant":
        raise SystemExit("a time budget needs optim.scheduler=constant: others follow max_steps")
    print(f"arm {name}: training for {args.budget_min} min", flush=True)
    load_before = os.getloadavg()[0]
    train_s = train_arm(cfg, args.budget_min * 60)
    load_after = os.getloadavg()[0]
    evaluate(cfg, base_url, out / "eval" / name, data["heldout"], args)
    steps = [
        {**r, NONZERO: nonzero_advantage_frac(r, cfg.examples_per_step)}
        for r in read_metrics(out / "train" / name / "metrics.jsonl")
        if "reward/mean" in r
    ]
    return {
        "overrides": ARMS[name],
        "steps": len(steps),
        "train_s": train_s,
        "load_average_1m": [load_before, load_after],
        "records": steps,
    }


def per_step(records: list[dict[str, Any]], key: str) -> list[float]:
    return [r[key] for r in records if key in r]


def summarise(out: Path, arms: dict[str, dict], args: argparse.Namespace) -> dict:
    """The report, the curves, one printed line per arm, and the summary saved as JSON."""
    from rlvr.atomic import atomic_write_text
    from rlvr.eval.plots import plot_runs_compared
    from rlvr.eval.report import build_report, format_estimate, render_markdown, report_json
    from rlvr.eval.vf_eval import load_run

    runs = [load_run(out / "eval" / name, name) for name in arms]
    report = build_report([*runs, load_run(out / "eval" / "base", "base")])
    plot_runs_compared(
        {name: arm["records"] for name, arm in arms.items()},
        out / "curves.png",
        CURVES,
        title=f"arithmetic, SmolLM2-135M, {args.budget_min} min of training per arm",
    )
    paired = {c.name: c.difference for c in report.comparisons}
    summary: dict[str, dict] = {}
    lines = []
    for run, (name, arm) in zip(report.runs[: len(arms)], arms.items(), strict=True):
        nonzero = per_step(arm["records"], NONZERO)
        difference = paired.get(name)
        versus = "n/a" if difference is None else format_estimate(difference, "+")
        lines.append(
            f"arm={name} steps={arm['steps']} heldout_reward={format_estimate(run.reward)} "
            f"paired_vs_baseline={versus} nonzero_adv_frac={statistics.fmean(nonzero):.3f}"
        )
        summary[name] = {
            "overrides": arm["overrides"],
            "steps": arm["steps"],
            "train_s": arm["train_s"],
            "load_average_1m_before_after": arm["load_average_1m"],
            "heldout_reward": estimate_json(run.reward),
            "paired_vs_baseline": None if difference is None else estimate_json(difference),
            "nonzero_adv_frac_mean": statistics.fmean(nonzero),
            "per_step": {
                key: per_step(arm["records"], key)
                for key in ("reward/mean", NONZERO, "batch/refill_groups", "batch/zero_signal_frac")
                + ("time/step", "time/generate", "curriculum/set_aside")
            },
        }
    base = report.runs[-1].reward
    lines.append(f"base (untrained) heldout_reward={format_estimate(base)}")
    table = "\n".join(f"    {line}" for line in lines)
    atomic_write_text(
        out / "report.md",
        f"# Dynamic sampling and curriculum, {args.budget_min} min per arm\n\n{table}\n\n"
        + render_markdown(report),
    )
    atomic_write_text(out / "report.json", report_json(report))
    print("\n".join(lines))
    return {"arms": summary, "base_reward": estimate_json(base)}


def run(base_url: str, args: argparse.Namespace) -> dict:
    from rlvr.config import load_config

    out = args.out.resolve()
    train_rows, eval_rows = arithmetic_splits(args.eval_examples)
    data = {
        "train": write_jsonl(out / "data" / "train.jsonl", train_rows),
        "heldout": write_jsonl(out / "data" / "heldout.jsonl", eval_rows),
    }
    print(f"{len(train_rows)} training and {len(eval_rows)} held-out problems in {out / 'data'}")
    print("evaluating the base model", flush=True)
    evaluate(
        load_config(RECIPE, args.overrides), base_url, out / "eval" / "base", data["heldout"], args
    )
    began = time.perf_counter()
    arms = {name: run_arm(name, base_url, data, args) for name in args.arms}
    payload = summarise(out, arms, args)
    return {**payload, "arms_wall_s": time.perf_counter() - began}


def arm_list(text: str) -> list[str]:
    """`--arms`: comma-separated names of ARMS, `baseline` first (the others pair with it)."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in ARMS]
    if unknown or not names or names[0] != "baseline" or len(set(names)) < len(names):
        raise argparse.ArgumentTypeError(
            f"{text!r}: give distinct arms of {', '.join(ARMS)}, baseline first"
        )
    return names


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "outputs" / "algorithms")
    parser.add_argument("--budget-min", type=float, default=6.0, help="training minutes per arm")
    parser.add_argument("--eval-examples", type=int, default=100)
    parser.add_argument("--eval-rollouts", type=int, default=2)
    parser.add_argument("--arms", type=arm_list, default=list(ARMS), help=", ".join(ARMS))
    parser.add_argument("--base-url", help="a fresh vf-vllm serving the base smollm2-135m")
    parser.add_argument("overrides", nargs="*", help="dotted trainer overrides for every arm")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    began = time.perf_counter()
    if args.base_url:
        payload = run(args.base_url, args)
    else:
        from rlvr.server.process import VLLMServer

        with VLLMServer("smollm2-135m", extra_args=SERVER_FLAGS) as server:
            payload = run(server.base_url, args)
    save(
        "algorithms",
        {
            "recipe": str(RECIPE.relative_to(ROOT)),
            "overrides": args.overrides,
            "budget_min": args.budget_min,
            "eval_examples": args.eval_examples,
            "eval_rollouts": args.eval_rollouts,
            "wall_s": time.perf_counter() - began,
            "outputs": str(args.out.resolve()),
            **payload,
        },
    )


if __name__ == "__main__":
    main()
