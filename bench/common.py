"""Shared bits of the benchmarks: summary statistics (percentiles from rlvr.eval.stats), saving
results as JSON beside the printout (every benchmark writes the same envelope: benchmark, date,
machine), and the stages of the "does it learn?" benchmarks (bench/learning*.py): a vf-eval run
of a served policy, a training script run as a user runs it, the whole demonstrations -> SFT ->
GRPO pipeline with an evaluation of every stage, and its report."""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlvr.atomic import atomic_write_text
from rlvr.eval.stats import Estimate, percentile

ROOT = Path(__file__).resolve().parents[1]
SERVER_FLAGS = ["--dtype", "float32", "--enforce-eager", "--max-model-len", "2048"]
"""vf-vllm flags of the benchmarks that serve SmolLM2 on the CPU: float32 (the trainer's dtype, so
log-probabilities compare), eager (compiling costs more start-up than it saves), 2,048 tokens."""
RESULTS = Path(__file__).resolve().parent / "results"
STEP_PARTS = ("time/wait_rollouts", "time/forward_backward", "time/optimizer", "time/weight_push")
"""The trainer's metrics that split a step's time (they add up to it at async_level 0)."""


def summary(values: Sequence[float], *, ms: bool = False) -> dict[str, float]:
    """n, mean, p50, p99, min and max of `values` (NaN when there are none). With `ms`, the
    values are seconds and the statistics come out in milliseconds, keys ending in `_ms`."""
    scaled = [v * 1e3 for v in values] if ms else list(values)
    nan = float("nan")
    stats = {
        "mean": statistics.fmean(scaled) if scaled else nan,
        "p50": percentile(scaled, 50),
        "p99": percentile(scaled, 99),
        "min": min(scaled, default=nan),
        "max": max(scaled, default=nan),
    }
    suffix = "_ms" if ms else ""
    return {"n": len(scaled), **{key + suffix: value for key, value in stats.items()}}


def result_path(name: str) -> Path:
    """Where `save(name, ...)` writes by default: bench/results/<name>.json."""
    return RESULTS / f"{name}.json"


def machine() -> dict:
    return {
        "cpu_count": os.cpu_count(),
        "load_average_1m": os.getloadavg()[0],
        "platform": platform.platform(),
        "python": platform.python_version(),
    }


def save(name: str, payload: dict, path: str | Path | None = None) -> Path:
    """Write `payload` with the benchmark's name, the date and the machine it ran on to `path`
    (default bench/results/<name>.json), atomically: a reader never sees half a file."""
    path = Path(path) if path is not None else result_path(name)
    envelope = {
        "benchmark": name,
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": machine(),
    }
    clash = envelope.keys() & payload.keys()
    if clash:
        raise ValueError(f"payload keys {sorted(clash)} would overwrite the envelope's")
    atomic_write_text(path, json.dumps({**envelope, **payload}, indent=2) + "\n")
    print(f"saved {path}")
    return path


# ---- stages of the learning benchmarks ------------------------------------------------------


def evaluate_stage(
    cfg: Any, base_url: str, out: Path, *, env_args: dict[str, Any], examples: int, rollouts: int
) -> list[dict[str, Any]]:
    """`rlvr.eval.vf_eval.evaluate_policy` (the run config's served policy, environment and
    sampling, into a fresh `out`), timed; prints and returns the rollouts."""
    from rlvr.eval.vf_eval import evaluate_policy

    began = time.perf_counter()
    rows = evaluate_policy(
        cfg, base_url, out, env_args=env_args, examples=examples, rollouts=rollouts
    )
    reward = sum(r["reward"] for r in rows) / len(rows)
    print(
        f"  {out.name}: {len(rows)} rollouts, mean reward {reward:.3f} "
        f"({time.perf_counter() - began:.0f} s)",
        flush=True,
    )
    return rows


def run_script(script: str, config: Path, out: Path, overrides: Sequence[str]) -> float:
    """`python scripts/<script> --config <config> output_dir=<out> <overrides>` into a fresh
    `out` (never a resumed run), as a user runs it; returns the wall time."""
    shutil.rmtree(out, ignore_errors=True)
    began = time.perf_counter()
    cmd = [
        sys.executable,
        str(ROOT / "scripts" / script),
        "--config",
        str(config),
        f"output_dir={out}",
        *overrides,
    ]
    subprocess.run(cmd, check=True)
    return time.perf_counter() - began


def estimate_json(estimate: Estimate) -> dict[str, Any]:
    return {"mean": estimate.mean, "low": estimate.low, "high": estimate.high, "n": estimate.n}


# ---- the base -> SFT -> GRPO pipeline of the learning benchmarks ------------------------------

STAGES = ("base", "sft", "grpo")
STAGE_LABELS = {"base": "base", "sft": "SFT", "grpo": "SFT + GRPO"}


def timed(times: dict[str, float], name: str, step: Callable[..., Any], *args: Any) -> Any:
    """`step(*args)`, its wall time recorded in `times[name]` (seconds) and printed."""
    began = time.perf_counter()
    result = step(*args)
    times[name] = round(time.perf_counter() - began, 1)
    print(f"{name}: {times[name]:.0f} s", flush=True)
    return result


@dataclass(frozen=True)
class Pipeline:
    """What a learning benchmark runs: its two recipes, the served base model and its server
    flags, where its stages land (`out`), and its own demonstrations and evaluation.

    `demonstrations()` writes the SFT rows and returns their files; `evaluate(base_url, dir)`
    evaluates the policy the server holds into `dir` = `out`/eval/<stage> (held-out rows,
    through vf-eval), and into `out`/<folder>/eval/<stage> for each further evaluation set
    named in `eval_folders`."""

    sft_recipe: Path
    grpo_recipe: Path
    out: Path
    demonstrations: Callable[[], list[Path]]
    evaluate: Callable[[str, Path], Any]
    server_flags: Sequence[str]
    model: str = "smollm2-135m"
    eval_folders: Sequence[str] = ("",)
    """Folders under `out` holding an eval/<stage> per evaluation set ("" is `out` itself)."""

    @property
    def adapter(self) -> Path:
        return self.out / "sft" / "final"


def run_pipeline(
    pipeline: Pipeline,
    sft_overrides: Sequence[str],
    grpo_overrides: Sequence[str],
    reuse_sft: bool = False,
) -> dict[str, float]:
    """Demonstrations, SFT on them, then with one vf-vllm: evaluate the base, push base + SFT
    adapter (merged, as GRPO's first push does) and evaluate it, GRPO from the adapter pushing
    into the same server, evaluate its last push. `reuse_sft` keeps `out`'s demonstrations,
    adapter and base/SFT evaluations and reruns GRPO and its evaluation. Returns the wall time
    of every stage and the total (seconds)."""
    from rlvr.server.process import VLLMServer
    from rlvr.weight_sync.merged import push_merged_adapter

    out, evaluate = pipeline.out, pipeline.evaluate
    evaluations = [out / f / "eval" / stage for f in pipeline.eval_folders for stage in STAGES[:2]]
    kept = [*evaluations, pipeline.adapter]
    if reuse_sft and (missing := [str(p) for p in kept if not p.exists()]):
        raise SystemExit(f"--reuse sft: {', '.join(missing)} missing; run without it first")
    times: dict[str, float] = {}
    began = time.perf_counter()
    if reuse_sft:
        print(f"1-4. reusing the demonstrations, SFT adapter and evaluations in {out}", flush=True)
    else:
        print("1. demonstrations", flush=True)
        files = timed(times, "demonstrations", pipeline.demonstrations)
        print("2. SFT", flush=True)
        train_files = f"data.train_files=[{', '.join(str(f) for f in files)}]"
        sft = [train_files, *sft_overrides]
        timed(times, "sft", run_script, "sft.py", pipeline.sft_recipe, out / "sft", sft)
    with VLLMServer(pipeline.model, extra_args=list(pipeline.server_flags)) as server:
        url = server.base_url
        if not reuse_sft:
            print("3. evaluating the base model", flush=True)
            timed(times, "eval_base", evaluate, url, out / "eval" / "base")
            print("4. evaluating the SFT policy (base + adapter pushed)", flush=True)
            push = (url, pipeline.model, pipeline.adapter)
            timed(times, "push_sft", push_merged_adapter, *push)
            timed(times, "eval_sft", evaluate, url, out / "eval" / "sft")
        print("5. GRPO from the SFT adapter", flush=True)
        grpo = [f"server.base_url={url}", f"lora.resume_from={pipeline.adapter}", *grpo_overrides]
        timed(times, "grpo", run_script, "train.py", pipeline.grpo_recipe, out / "train", grpo)
        print("   evaluating the GRPO policy (the server holds its last push)", flush=True)
        timed(times, "eval_grpo", evaluate, url, out / "eval" / "grpo")
    times["total"] = round(time.perf_counter() - began, 1)
    return times


@dataclass(frozen=True)
class StageReport:
    """The evaluation report of the three stages: per stage, each bar's estimate (the reward
    and rubric metrics), the paired differences (vs base, and GRPO - SFT) and GRPO - SFT in
    each rubric metric (which parts of the reward GRPO moved)."""

    stages: dict[str, dict[str, Estimate]]
    differences: dict[str, Estimate]
    grpo_minus_sft: Estimate
    grpo_minus_sft_parts: dict[str, Estimate]
    markdown: str

    def json(self) -> dict[str, Any]:
        return {
            "stages": {
                stage: {bar: estimate_json(e) for bar, e in bars.items()}
                for stage, bars in self.stages.items()
            },
            "paired_differences": {name: estimate_json(e) for name, e in self.differences.items()},
            "grpo_minus_sft_parts": {
                key: estimate_json(e) for key, e in self.grpo_minus_sft_parts.items()
            },
            "grpo_beats_sft_ci_excludes_zero": (self.grpo_minus_sft.low or 0.0) > 0,
        }


def stage_report(
    out: Path, bars: dict[str, str | None], unit: str, parts: Sequence[str] = ()
) -> StageReport:
    """rlvr.eval.report over `out`/eval/{base,sft,grpo} (each stage's mean reward with its CI
    clustered by example, paired differences against the base) plus GRPO - SFT paired per
    `unit` (e.g. "question"), in the reward and in each rubric metric of `bars` and `parts`,
    written to report.md and report.json and printed. `bars` maps a label to a rubric metric,
    or to None for the reward."""
    from rlvr.eval.report import (
        build_report,
        compare,
        format_estimate,
        metric_difference,
        metric_estimate,
        render_markdown,
        report_json,
    )
    from rlvr.eval.vf_eval import load_run

    runs = {stage: load_run(out / "eval" / stage, STAGE_LABELS[stage]) for stage in STAGES}
    report = build_report(list(runs.values()))
    grpo_vs_sft = compare(runs["sft"], runs["grpo"])
    grpo_name = f"{grpo_vs_sft.name} - {grpo_vs_sft.baseline}"
    keys = [key for key in bars.values() if key is not None] + list(parts)
    part_differences = {key: metric_difference(runs["sft"], runs["grpo"], key) for key in keys}
    markdown = render_markdown(report) + "".join(
        [
            f"\n{grpo_name} (paired per {unit}, {grpo_vs_sft.paired_examples} {unit}s): "
            f"{format_estimate(grpo_vs_sft.difference, '+')}\n\n",
            f"{grpo_name} in each rubric metric (paired per {unit}):\n\n",
            "| metric | difference [95% CI] |\n| --- | --- |\n",
            *(f"| `{key}` | {format_estimate(e, '+')} |\n" for key, e in part_differences.items()),
        ]
    )
    atomic_write_text(out / "report.md", markdown)
    atomic_write_text(out / "report.json", report_json(report))
    print(markdown)
    stages = {
        STAGE_LABELS[stage]: {
            label: summary.reward if key is None else metric_estimate(runs[stage], key)
            for label, key in bars.items()
        }
        for stage, summary in zip(STAGES, report.runs, strict=True)
    }
    differences = {f"{c.name} - {c.baseline}": c.difference for c in report.comparisons}
    differences[grpo_name] = grpo_vs_sft.difference
    return StageReport(stages, differences, grpo_vs_sft.difference, part_differences, markdown)


def plot_stages(report: StageReport, out: Path, ylabel: str, title: str) -> Path:
    """Grouped bars: one group per bar of the report, one bar per stage, with 95% CIs."""
    from rlvr.eval.plots import plot_estimate_bars

    labels = list(next(iter(report.stages.values())))
    series = {stage: list(bars.values()) for stage, bars in report.stages.items()}
    return plot_estimate_bars(labels, series, out, ylabel=ylabel, title=title)


def pipeline_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the options every base -> SFT -> GRPO benchmark takes: `--reuse sft` (`run_pipeline`'s
    `reuse_sft`), `--sft KEY=VALUE` (repeatable) for SFT and trailing dotted GRPO overrides; add
    them last (the overrides are positional)."""
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


def save_pipeline(
    name: str, args: argparse.Namespace, recipes: Sequence[Path], payload: dict
) -> Path:
    """`save(name, ...)` of a pipeline benchmark's `payload`, headed by its recipes (relative to
    the repository) and the `pipeline_arguments` the run was given."""
    return save(
        name,
        {
            "recipes": [str(recipe.relative_to(ROOT)) for recipe in recipes],
            "reuse": args.reuse,
            "sft_overrides": args.sft,
            "overrides": args.overrides,
            **payload,
        },
    )
