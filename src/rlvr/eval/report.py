"""Evaluation reports: one summary of `vf-eval -s` runs, side by side: per run the mean reward
with a CI clustered by example, pass@k, every rubric metric, errored and truncated shares and
lengths; for each later run the paired per-example difference against the first. Errored
rollouts stay in every number (dropping them flatters a model that crashes its tools).
Design: docs/evaluation.md#evaluation-reports.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from statistics import fmean
from typing import Any

from rlvr.atomic import atomic_write_text
from rlvr.eval.export import export_chat_jsonl
from rlvr.eval.stats import Estimate, clustered_mean, mean_with_ci
from rlvr.eval.vf_eval import ResultsError, Rollout, Run, errored, load_run
from rlvr.finite import metric_means
from rlvr.pass_at_k import mean_pass_at_k, succeeded

# ---- per-run numbers --------------------------------------------------------------------------


@dataclass(frozen=True)
class RunSummary:
    """Everything the report says about one run (the JSON report's fields); None where the
    counts differ per example (`rollouts_per_example`) or vf-eval saved no such field."""

    name: str
    results: str
    env_id: str | None
    model: str | None
    env_args: dict[str, Any] | None
    sampling_args: dict[str, Any] | None
    num_examples: int
    num_rollouts: int
    rollouts_per_example: int | None
    reward: Estimate
    pass_at_k: dict[str, float]
    metrics: dict[str, float]
    errored: float | None
    truncated: float | None
    completion_chars: float
    completion_tokens: float | None
    paired: float | None = None


def summarize(run: Run, threshold: float) -> RunSummary:
    """The numbers of one run; pass@k counts a rollout as a success when reward >= threshold."""
    groups = run.by_example()
    counts = {len(group) for group in groups.values()}
    rows = [rollout.row for rollout in run.rollouts]
    return RunSummary(
        name=run.name,
        results=str(run.results),
        env_id=run.metadata.get("env_id"),
        model=run.metadata.get("model"),
        env_args=run.metadata.get("env_args"),
        sampling_args=run.metadata.get("sampling_args"),
        num_examples=len(groups),
        num_rollouts=len(rows),
        rollouts_per_example=counts.pop() if len(counts) == 1 else None,
        reward=clustered_mean([[r.reward for r in group] for group in groups.values()]),
        pass_at_k=_pass_at_k(groups.values(), threshold),
        metrics=metric_means(row.get("metrics") for row in rows),
        errored=_share(rows, "error", errored),
        truncated=_share(rows, "is_truncated", lambda row: bool(row["is_truncated"])),
        completion_chars=fmean(_written_chars(row.get("completion")) for row in rows),
        completion_tokens=_mean_output_tokens(rows),
        paired=paired_correct(rows),
    )


def metric_estimate(run: Run, key: str) -> Estimate:
    """The mean of the rubric metric `key` over the run's rollouts, with its 95% CI clustered by
    example (as the reward's); rollouts that did not log it are left out. ResultsError when
    none did."""
    clusters = [_metric_values(rollouts, key) for rollouts in run.by_example().values()]
    if not any(clusters):
        raise ResultsError(f"{run.results}: no rollout logged the metric {key!r}")
    return clustered_mean(clusters)


def _metric_values(rollouts: list[Rollout], key: str) -> list[float]:
    """The rubric metric `key` of each rollout that logged it."""
    return [float(r.row["metrics"][key]) for r in rollouts if key in (r.row.get("metrics") or {})]


def paired_correct(rows: list[dict[str, Any]]) -> float | None:
    """MuSiQue-Full's paired metric: the share of pairs (examples sharing `info.pair_id`, an
    answerable question and its unanswerable twin) in which every twin is right (its `correct`
    metric), each twin's share of right rollouts multiplied as the chance that independent
    rollouts of both are. The per-row mean pays "always unanswerable" about half the pairs'
    rows; this pays it nothing. None when no two examples share a pair id."""
    right: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for row in rows:
        info, metrics = row.get("info"), row.get("metrics")
        if isinstance(info, dict) and "pair_id" in info and isinstance(metrics, dict):
            if "correct" in metrics:
                right[str(info["pair_id"])][row["example_id"]].append(metrics["correct"])
    pairs = [twins.values() for twins in right.values() if len(twins) > 1]
    return fmean(math.prod(map(fmean, twins)) for twins in pairs) if pairs else None


def _pass_at_k(groups: Iterable[list[Rollout]], threshold: float) -> dict[str, float]:
    """Mean over examples of the unbiased pass@k, each example with its own rollout count; k
    goes up to the fewest rollouts any example has."""
    tallies = [(len(g), sum(succeeded(r.reward, threshold) for r in g)) for g in groups]
    return {str(k): value for k, value in mean_pass_at_k(tallies).items()}


def _share(
    rows: list[dict[str, Any]], field: str, flagged: Callable[[dict[str, Any]], bool]
) -> float | None:
    """Share of rollouts that are `flagged`; None when no rollout saved `field` at all."""
    if not any(field in row for row in rows):
        return None
    return fmean(field in row and flagged(row) for row in rows)


def _written_chars(completion: Any) -> int:
    """Characters the model wrote: the text of the assistant messages (tool results, opponents'
    moves and other environment messages excluded), or the whole completion of a
    text-completion environment. Tool-call arguments are not counted: their saved form is JSON
    re-serialised by verifiers, not the model's own text."""
    if isinstance(completion, str):
        return len(completion)
    total = 0
    for message in completion if isinstance(completion, list) else ():
        if not isinstance(message, dict) or message.get("role") != "assistant":
            continue
        content = message.get("content")
        if isinstance(content, list):  # content parts
            content = "".join(str(p.get("text") or "") for p in content if isinstance(p, dict))
        total += len(content) if isinstance(content, str) else 0
    return total


def _mean_output_tokens(rows: list[dict[str, Any]]) -> float | None:
    """Mean tokens generated per rollout (vf-eval's `token_usage.output_tokens`, summed over
    turns) over the rollouts that have it; None when the server reported no usage."""
    tokens = [
        row["token_usage"]["output_tokens"]
        for row in rows
        if isinstance(row.get("token_usage"), dict) and "output_tokens" in row["token_usage"]
    ]
    return fmean(tokens) if tokens else None


# ---- comparison ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Comparison:
    """A run against the baseline (the first run), paired by example id: `difference` is the
    mean per-example reward difference with a 95% t CI; `prompts_differ` counts paired examples
    whose prompts differ (the runs did not evaluate the same examples)."""

    name: str
    baseline: str
    paired_examples: int
    prompts_differ: int
    difference: Estimate


def _paired(baseline: Run, run: Run) -> list[tuple[list[Rollout], list[Rollout]]]:
    """The two runs' rollouts of each example id present in both; ResultsError when none is."""
    base, other = baseline.by_example(), run.by_example()
    shared = [(base[example], other[example]) for example in base if example in other]
    if not shared:
        raise ResultsError(f"runs {baseline.name} and {run.name} share no example ids")
    return shared


def compare(baseline: Run, run: Run) -> Comparison:
    """Pair `run` with `baseline` by example id; ResultsError when they share none."""
    shared = _paired(baseline, run)
    diffs = [
        fmean(r.reward for r in after) - fmean(r.reward for r in before) for before, after in shared
    ]
    differ = sum(
        before[0].row.get("prompt") != after[0].row.get("prompt") for before, after in shared
    )
    return Comparison(run.name, baseline.name, len(shared), differ, mean_with_ci(diffs))


def metric_difference(baseline: Run, run: Run, key: str) -> Estimate:
    """`run` minus `baseline` in the rubric metric `key`, paired by example as `compare` pairs the
    reward: which parts of a reward a training run moved. Examples where either run logged no
    `key` are left out; ResultsError when no example is left."""

    def mean(rollouts: list[Rollout]) -> float | None:
        values = _metric_values(rollouts, key)
        return fmean(values) if values else None

    diffs = [
        after - before
        for before, after in ((mean(a), mean(b)) for a, b in _paired(baseline, run))
        if after is not None and before is not None
    ]
    if not diffs:
        raise ResultsError(f"runs {baseline.name} and {run.name} share no example logging {key!r}")
    return mean_with_ci(diffs)


# ---- the report ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Report:
    """Per-run summaries and the comparisons of every later run with the first."""

    threshold: float
    runs: list[RunSummary]
    comparisons: list[Comparison]


def build_report(runs: Sequence[Run], threshold: float = 1.0) -> Report:
    """Summarise `runs` (the first is the baseline). ResultsError when their metadata names
    different environments: their rewards measure different things."""
    if not runs:
        raise ResultsError("no runs to report on")
    envs = {run.metadata.get("env_id") for run in runs} - {None}
    if len(envs) > 1:
        listing = ", ".join(f"{run.name}: {run.metadata.get('env_id')}" for run in runs)
        raise ResultsError(f"runs evaluate different environments ({listing})")
    return Report(
        threshold=threshold,
        runs=[summarize(run, threshold) for run in runs],
        comparisons=[compare(runs[0], run) for run in runs[1:]],
    )


def report_json(report: Report) -> str:
    """The report's numbers as JSON (the Markdown shows the same ones, rounded)."""
    return json.dumps(asdict(report), indent=2) + "\n"


def render_markdown(report: Report) -> str:
    """The report as Markdown: one column per run, then the paired differences."""
    runs = report.runs
    env = next((run.env_id for run in runs if run.env_id), "unknown environment")
    paired = [("paired correct (both twins)", [format_number(run.paired) for run in runs])]
    paired = paired if any(run.paired is not None for run in runs) else []
    rows: list[tuple[str, list[str]]] = [
        ("model", [run.model or "?" for run in runs]),
        ("results", [f"`{run.results}`" for run in runs]),
        ("env args", [json_cell(run.env_args) for run in runs]),
        ("sampling", [json_cell(run.sampling_args) for run in runs]),
        ("examples × rollouts", [shape(run) for run in runs]),
        ("**mean reward** [95% CI]", [format_estimate(run.reward) for run in runs]),
        *paired,
        *[
            (f"pass@{k}", [format_number(run.pass_at_k.get(k)) for run in runs])
            for k in ordered_keys(run.pass_at_k for run in runs)
        ],
        ("errored", [format_percent(run.errored) for run in runs]),
        ("truncated", [format_percent(run.truncated) for run in runs]),
        ("completion chars (mean)", [f"{run.completion_chars:.1f}" for run in runs]),
        ("completion tokens (mean)", [format_number(run.completion_tokens, 1) for run in runs]),
        *[
            (f"`{name}`", [format_number(run.metrics.get(name)) for run in runs])
            for name in ordered_keys(run.metrics for run in runs)
        ],
    ]
    lines = [
        f"# Evaluation report: {env}",
        "",
        table_row(["", *(run.name for run in runs)]),
        table_row(["---"] * (len(runs) + 1)),
        *(table_row([label, *cells]) for label, cells in rows),
        "",
        "Mean reward is over all rollouts (vf-eval's avg_reward); its 95% CI is clustered by "
        "example (the rollouts of one example are not independent), with Student t over "
        "examples; n/a with fewer than 2 examples. pass@k: unbiased estimator (Chen et al. "
        f"2021), success = reward ≥ {report.threshold:g}. Errored rollouts count with the "
        "reward vf-eval gave them. Rubric metrics are the rows in backticks.",
    ]
    if report.comparisons:
        lines += _comparison_section(report)
    return "\n".join(lines) + "\n"


def _comparison_section(report: Report) -> list[str]:
    by_name = {run.name: run for run in report.runs}
    baseline = report.comparisons[0].baseline
    lines = [
        "",
        f"## Paired difference in mean reward against {baseline}",
        "",
        "Per example id present in both runs: this run's mean reward minus the baseline's.",
        "",
        table_row(["run", "paired examples", "difference [95% CI]"]),
        table_row(["---"] * 3),
    ]
    for c in report.comparisons:
        of = f"of {by_name[c.name].num_examples} and {by_name[baseline].num_examples}"
        lines.append(
            table_row([c.name, f"{c.paired_examples} ({of})", format_estimate(c.difference, "+")])
        )
    for c in report.comparisons:
        if c.prompts_differ:
            lines += [
                "",
                f"**Warning:** {c.prompts_differ} of {c.paired_examples} paired examples of "
                f"{c.name} have a different prompt than in {baseline}: the runs may not have "
                "evaluated the same examples (different env args or data).",
            ]
    return lines


def table_row(cells: Sequence[str]) -> str:
    """One Markdown table row; pipes inside cells are escaped."""
    return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"


def ordered_keys(dicts: Iterable[dict[str, Any]]) -> list[str]:
    """Every key of `dicts`, in order of first appearance."""
    return list(dict.fromkeys(key for d in dicts for key in d))


def shape(run: RunSummary) -> str:
    """Examples × rollouts per example (the run and sweep tables' cell)."""
    if run.rollouts_per_example is None:
        return f"{run.num_examples} examples, {run.num_rollouts} rollouts (uneven)"
    return f"{run.num_examples} × {run.rollouts_per_example}"


def format_estimate(estimate: Estimate, sign: str = "") -> str:
    """`mean [low, high]`; `sign="+"` marks differences as such."""
    spec = f"{sign}.3f"
    if estimate.low is None or estimate.high is None:
        return f"{estimate.mean:{spec}} [n/a]"
    return f"{estimate.mean:{spec}} [{estimate.low:{spec}}, {estimate.high:{spec}}]"


def format_number(value: float | None, digits: int = 3) -> str:
    """A number rounded for a table; a dash when there is none."""
    return "–" if value is None else f"{value:.{digits}f}"


def format_percent(share: float | None) -> str:
    """A share as a percentage; "not saved" when vf-eval saved no such field."""
    return "not saved" if share is None else f"{100 * share:.1f}%"


def json_cell(value: dict[str, Any] | None) -> str:
    """Compact JSON in code style for a table cell; "?" when unknown."""
    return "?" if value is None else f"`{json.dumps(value, separators=(',', ':'))}`"


# ---- the command ---------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=main.__doc__.splitlines()[0])
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="vf-eval -o directories")
    parser.add_argument("--names", help="comma-separated run names (default: the RUN_DIRs)")
    parser.add_argument(
        "--threshold",
        type=float,
        default=1.0,
        help="a rollout succeeds for pass@k when reward >= this (default 1.0)",
    )
    parser.add_argument("--out", type=Path, help="also write the Markdown report here")
    parser.add_argument("--json", type=Path, help="write the report's numbers as JSON here")
    parser.add_argument(
        "--export-sft",
        type=Path,
        metavar="FILE",
        help="write rollouts with reward >= --min-reward (errored ones skipped) as chat JSONL",
    )
    parser.add_argument(
        "--min-reward", type=float, help="reward bar of --export-sft (default: --threshold)"
    )
    args = parser.parse_args()
    args.names = args.names.split(",") if args.names else args.run_dirs
    if len(args.names) != len(args.run_dirs):
        parser.error(f"--names has {len(args.names)} names for {len(args.run_dirs)} RUN_DIRs")
    if len(set(args.names)) != len(args.names):
        parser.error("run names must differ")
    if args.min_reward is not None and args.export_sft is None:
        parser.error("--min-reward goes with --export-sft")
    return args


def main() -> None:
    """Summarise vf-eval runs (say a base model and a trained checkpoint) in one report.

        python scripts/eval_report.py RUN_DIR [RUN_DIR ...] [--names base,trained] [--threshold 1.0]
            [--out report.md] [--json report.json] [--export-sft data.jsonl --min-reward 1.0]

    Installed as `rlvr-eval-report`; the first RUN_DIR is the baseline. Usage:
    docs/evaluation.md#evaluation-reports.
    """
    args = parse_args()
    try:
        runs = [
            load_run(run_dir, name) for run_dir, name in zip(args.run_dirs, args.names, strict=True)
        ]
        report = build_report(runs, args.threshold)
        markdown = render_markdown(report)
        if args.out:
            atomic_write_text(args.out, markdown)
        if args.json:
            atomic_write_text(args.json, report_json(report))
        if args.export_sft:
            bar = args.threshold if args.min_reward is None else args.min_reward
            kept, total = export_chat_jsonl(runs, args.export_sft, bar)
    except (ResultsError, OSError) as e:
        raise SystemExit(f"error: {e}") from None
    print(markdown, end="")
    if args.export_sft:
        print(
            f"kept {kept} of {total} rollouts (reward >= {bar:g}, errored ones skipped) "
            f"in {args.export_sft}",
            file=sys.stderr,
        )
