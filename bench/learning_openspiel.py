"""Does a warm start + GRPO make the embedded model play tic-tac-toe? Base, SFT, GRPO in one run.

The base SmolLM2-135M-Instruct never writes a well-formed `<move>` (reward 0 on every game), so
GRPO alone has nothing to learn from; the recipe is the field's warm start:

1. Demonstrations: `rlvr-demos` plays the recipe's training games (its environment, task seed
   0, openings of up to `SFT_RANDOM_STEPS` random moves) with
   `vf_openspiel.scripted:quiet_mover` (a random legal move, answered as `<move>ID</move>`)
   against the random opponent and keeps the won games (`--min-reward 1`).
2. SFT on them (scripts/sft.py --config configs/examples/sft_openspiel_smollm2_cpu.yaml), LoRA:
   the loss covers the player's replies only, never the positions or the opponent's moves.
3. Serves the base model with vf-vllm and evaluates it through vf-eval on two sets of games
   never trained on (task seed `--eval-seed`): `held_out`, games drawn as every earlier run of
   this bench drew them (openings of up to 4 random moves), and `opening`, games from the
   empty board (the model's seat alternates, so half start after one random opponent move).
4. Pushes base + SFT adapter (merged) into the server, as the GRPO trainer's first push does,
   and evaluates that policy the same way.
5. GRPO (scripts/train.py --config configs/examples/learn_openspiel_smollm2_cpu.yaml,
   `lora.resume_from` the SFT adapter; one move per rollout from its own, deeper openings,
   scored by random playouts), pushing weights into the same server after every step; then
   evaluates the served final policy on whole games, as the earlier stages.
6. Writes, per evaluation set, the evaluation report (rlvr.eval.report: each stage's mean
   outcome reward with a 95% CI clustered by game; paired per-game differences SFT - base and
   GRPO - SFT, the latter also in legal-move rate, win, draw and loss) and a PNG of the
   outcome reward, legal-move rate and win/draw/loss per stage; and the training curves (SFT
   loss; GRPO reward, win and legal-move rates, step time).

Everything lands in --out (default outputs/learn-openspiel): the held-out set's evaluations in
eval/<stage>/ and its report in report.md, as before, the opening set's under opening/; the
summary also goes to bench/results/learning_openspiel.json. Trailing dotted overrides go to
the GRPO trainer, `--sft KEY=VALUE` (repeatable) to SFT. `--reuse sft` keeps --out's stages
1-4 (demonstrations, SFT adapter, base and SFT evaluations) and reruns GRPO, its evaluations
and the report, replacing --out's train/ and both sets' grpo evaluations (copy them first to
keep them). Smoke run:

    .venv/bin/python bench/learning_openspiel.py --demo-games 40 --eval-games 8 \\
        --opening-games 4 --sft train.max_steps=2 max_steps=2
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    ROOT,
    SERVER_FLAGS,
    Pipeline,
    evaluate_stage,
    pipeline_arguments,
    plot_stages,
    run_pipeline,
    save_pipeline,
    stage_report,
    timed,
)

SFT_RECIPE = ROOT / "configs" / "examples" / "sft_openspiel_smollm2_cpu.yaml"
GRPO_RECIPE = ROOT / "configs" / "examples" / "learn_openspiel_smollm2_cpu.yaml"
DEMO_POLICY = "vf_openspiel.scripted:quiet_mover"
# vf_openspiel's default opening depth, which every earlier run of this bench demonstrated and
# evaluated with: the demonstrations (so the SFT stage is the one measured before) and the
# held-out games keep it whatever depth GRPO trains at, so their numbers compare with those runs.
SFT_RANDOM_STEPS = 4
# What the demonstrations and every evaluation play, whatever GRPO trains on (the recipe trains
# single moves, scored by playouts, and forfeits at the first illegal reply): whole games with
# the environment's defaults, as every earlier run of this bench played them.
WHOLE_GAMES = {"mode": "game", "playouts": 1, "max_illegal_moves": 2, "reward_mode": "outcome"}
# what a stage figure shows: the reward, then rubric metrics (vf_openspiel's README)
BARS = {
    "outcome reward": None,
    "legal-move rate": "legal_rate",
    "win": "win",
    "draw": "draw",
    "loss": "loss",
}
GRPO_CURVES = ("reward/mean", "env/win", "env/legal_rate", "entropy", "mismatch_kl", "time/step")


@dataclass(frozen=True)
class EvalSet:
    """Games every stage is evaluated on: `games` tasks of seed --eval-seed whose openings play
    up to `random_steps` random moves (vf_openspiel's `max_random_steps`); their evaluations
    and report live under --out/`folder`."""

    name: str
    random_steps: int
    games: int
    folder: str
    title: str

    def env_args(self, seed: int) -> dict[str, Any]:
        """vf_openspiel arguments over the recipe's: these games, drawn with task seed `seed`."""
        return {
            **WHOLE_GAMES,
            "seed": seed,
            "num_tasks_per_case": self.games,
            "max_random_steps": self.random_steps,
        }


def eval_sets(args: argparse.Namespace) -> tuple[EvalSet, ...]:
    """The held-out games (drawn, and stored, as every earlier run did) and the opening games."""
    return (
        EvalSet("held_out", SFT_RANDOM_STEPS, args.eval_games, "", "held-out games"),
        EvalSet("opening", 0, args.opening_games, "opening", "games from the opening position"),
    )


def make_demonstrations(cfg: Any, out: Path, games: int) -> list[Path]:
    """`rlvr-demos` on the first `games` training games (openings of up to `SFT_RANDOM_STEPS`
    random moves); the won ones, as SFT rows."""
    from rlvr.eval.demonstrations import main as demos

    path = out / "data" / "demos.jsonl"
    env_args = {
        **cfg.env.args,
        **WHOLE_GAMES,
        "num_tasks_per_case": games,
        "max_random_steps": SFT_RANDOM_STEPS,
    }
    demos(
        [
            *("--env", cfg.env.id, "--env-args", json.dumps(env_args)),
            *("--policy", DEMO_POLICY, "--min-reward", "1", "--out", str(path)),
        ]
    )
    return [path]


def summarise(out: Path, times: dict[str, float], args: argparse.Namespace) -> dict:
    """Per evaluation set its report and stage figure; the training curves; the headline
    numbers."""
    from rlvr.eval.plots import plot_run_curves, read_metrics

    sets = {}
    for games in eval_sets(args):
        report = stage_report(out / games.folder, BARS, "game")
        plot_stages(
            report,
            out / f"stages_{games.name}.png",
            ylabel="mean over games (95% CI clustered by game)",
            title=f"tic-tac-toe vs random, {games.games} {games.title}, SmolLM2-135M",
        )
        sets[games.name] = {
            "games": games.games,
            "max_random_steps": games.random_steps,
            **report.json(),
        }
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
    rewards = [h["reward/mean"] for h in steps]
    sft_legal = sets["held_out"]["stages"]["SFT"]["legal-move rate"]["mean"]
    return {
        "eval_sets": sets,
        "grpo_beats_sft_ci_excludes_zero": sets["held_out"]["grpo_beats_sft_ci_excludes_zero"],
        "sft_legal_rate_at_least_0.95": sft_legal >= 0.95,
        "grpo_steps": len(steps),
        "grpo_train_reward_per_step": rewards,
        # least-squares slope of the training reward against the step: > 0 when it rose
        "grpo_train_reward_slope": (
            statistics.linear_regression(range(len(rewards)), rewards).slope
            if len(rewards) > 1
            else None
        ),
        "grpo_zero_variance_groups_per_step": [
            h.get("rollouts/zero_variance_groups") for h in steps
        ],
        "wall_s": times,
        "eval_rollouts": args.eval_rollouts,
        "eval_seed": args.eval_seed,
        "demo_games": args.demo_games,
        "outputs": str(out),
    }


def run(args: argparse.Namespace) -> dict:
    from rlvr.config import load_config

    cfg = load_config(GRPO_RECIPE, args.overrides)
    if args.eval_seed == cfg.env.args.get("seed", 0):
        raise SystemExit(f"--eval-seed {args.eval_seed} is the training games' seed")
    out = args.out.resolve()
    sets = eval_sets(args)
    set_times: dict[str, float] = {}

    def evaluate(base_url: str, where: Path) -> None:
        """The served policy on every evaluation set, into <set folder>/eval/<stage>."""
        for games in sets:
            stage_eval = functools.partial(
                evaluate_stage,
                cfg,
                base_url,
                out / games.folder / "eval" / where.name,
                env_args=games.env_args(args.eval_seed),
                examples=games.games,
                rollouts=args.eval_rollouts,
            )
            timed(set_times, f"eval_{where.name}_{games.name}", stage_eval)

    pipeline = Pipeline(
        sft_recipe=SFT_RECIPE,
        grpo_recipe=GRPO_RECIPE,
        out=out,
        demonstrations=lambda: make_demonstrations(cfg, out, args.demo_games),
        evaluate=evaluate,
        server_flags=SERVER_FLAGS,
        eval_folders=[games.folder for games in sets],
    )
    times = run_pipeline(pipeline, args.sft, args.overrides, args.reuse == "sft")
    return summarise(out, {**times, **set_times}, args)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "outputs" / "learn-openspiel")
    parser.add_argument("--demo-games", type=int, default=800, help="games played for demos")
    parser.add_argument("--eval-games", type=int, default=200, help="held-out games per stage")
    parser.add_argument(
        "--opening-games", type=int, default=100, help="games from the empty board per stage"
    )
    parser.add_argument("--eval-rollouts", type=int, default=1, help="rollouts per game")
    parser.add_argument("--eval-seed", type=int, default=1, help="task seed of evaluation games")
    pipeline_arguments(parser)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    payload = run(args)
    save_pipeline("learning_openspiel", args, (SFT_RECIPE, GRPO_RECIPE), payload)


if __name__ == "__main__":
    main()
