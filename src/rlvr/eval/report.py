"""Evaluation reports: one honest summary of `vf-eval -s` runs, side by side.

Researchers evaluate a base model and a trained checkpoint with `vf-eval ... -s -o DIR` and want to
know whether training helped and by how much. This reads those directories and reports, per run,
the mean reward with a confidence interval clustered by example, pass@k, every rubric metric,
the shares of errored and truncated rollouts and completion lengths; for every run after the
first, the paired per-example difference in mean reward against the first. It also exports the
rollouts above a reward bar as chat JSONL: rejection-sampled data for a supervised warm-up.

Errored rollouts stay in every number (vf-eval scores them, usually 0): dropping them would make
a model that crashes its tools look better than one that does not.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from statistics import fmean
from typing import Any

from rlvr.atomic import atomic_write_text
from rlvr.eval.stats import Estimate, clustered_mean, k_values, mean_with_ci, pass_at_k
from rlvr.eval.vf_eval import ResultsError, find_results, iter_results

# A weighted rubric sum meant to be exactly 1.0 can come out as 0.9999999999999999; rounding
# must not turn a success into a failure.
SUCCESS_TOLERANCE = 1e-9


def succeeded(reward: float, bar: float) -> bool:
    """reward >= bar, up to float rounding (SUCCESS_TOLERANCE)."""
    return reward >= bar - SUCCESS_TOLERANCE


def errored(row: dict[str, Any]) -> bool:
    """vf-eval saves `error` with every rollout: None when it ran cleanly, the error's type and
    chain when the model call, a tool or the environment raised."""
    return row.get("error") is not None


@dataclass(frozen=True)
class Rollout:
    """One saved rollout: where it was saved, the fields every number needs (checked), and the
    row as vf-eval saved it."""

    line: int
    example_id: int
    reward: float
    row: dict[str, Any]


@dataclass(frozen=True)
class Run:
    """The rollouts and metadata of one vf-eval run, under the name the report gives it."""

    name: str
    results: Path
    metadata: dict[str, Any]
    rollouts: list[Rollout]

    def by_example(self) -> dict[int, list[Rollout]]:
        """Rollouts grouped by example id, in the order of first appearance."""
        groups: dict[int, list[Rollout]] = defaultdict(list)
        for rollout in self.rollouts:
            groups[rollout.example_id].append(rollout)
        return dict(groups)


def load_run(run_dir: str | Path, name: str) -> Run:
    """Read the one vf-eval run saved below `run_dir` (its `-o` directory or any folder inside).

    Raises ResultsError when there is no run, more than one (which one was meant is not ours to
    guess), a malformed line, or a rollout without a numeric reward or integer example id.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ResultsError(f"{run_dir}: no such directory")
    found = find_results(run_dir)
    if not found:
        raise ResultsError(f"{run_dir}: no results.jsonl below it (vf-eval saves one with -s)")
    if len(found) > 1:
        listing = "".join(f"\n  {path.parent}" for path in found)
        raise ResultsError(f"{run_dir} holds {len(found)} vf-eval runs; pass one of:{listing}")
    results = found[0]
    rollouts = [_rollout(results, line, row) for line, row in iter_results(results)]
    if not rollouts:
        raise ResultsError(f"{results}: no rollouts")
    return Run(name, results, _metadata(results.parent / "metadata.json"), rollouts)


def _rollout(path: Path, line: int, row: dict[str, Any]) -> Rollout:
    if "reward" not in row:
        raise ResultsError(f"{path}:{line}: no 'reward' field")
    reward = row["reward"]
    if isinstance(reward, bool) or not isinstance(reward, int | float) or not math.isfinite(reward):
        raise ResultsError(f"{path}:{line}: reward {reward!r} is not a finite number")
    example_id = row.get("example_id")
    if isinstance(example_id, bool) or not isinstance(example_id, int):
        raise ResultsError(f"{path}:{line}: example_id {example_id!r} is not an integer")
    return Rollout(line, example_id, float(reward), row)


def _metadata(path: Path) -> dict[str, Any]:
    """vf-eval's metadata.json beside the results; {} when absent (the rows alone still report,
    without environment, model and sampling)."""
    if not path.is_file():
        return {}
    try:
        metadata = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ResultsError(f"{path}: not valid JSON ({e.msg})") from None
    if not isinstance(metadata, dict):
        raise ResultsError(f"{path}: metadata must be a JSON object")
    return metadata


# ---- per-run numbers --------------------------------------------------------------------------


@dataclass(frozen=True)
class RunSummary:
    """Everything the report says about one run (the JSON report holds these fields).

    `rollouts_per_example` is None when examples have different counts (an interrupted run);
    `errored`, `truncated` and `completion_tokens` are None when vf-eval saved no such field.
    """

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
        metrics=_metric_means(rows),
        errored=_share(rows, "error", errored),
        truncated=_share(rows, "is_truncated", lambda row: bool(row["is_truncated"])),
        completion_chars=fmean(_written_chars(row.get("completion")) for row in rows),
        completion_tokens=_mean_output_tokens(rows),
        paired=paired_correct(rows),
    )


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
    fewest = min(n for n, _ in tallies)
    return {str(k): fmean(pass_at_k(n, c, k) for n, c in tallies) for k in k_values(fewest)}


def _metric_means(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Mean of every numeric rubric metric vf-eval saved (a row's `metrics`), over the rollouts
    that have it, in the rubric's order."""
    values: dict[str, list[float]] = defaultdict(list)
    for row in rows:
        metrics = row.get("metrics")
        for name, value in metrics.items() if isinstance(metrics, dict) else ():
            if isinstance(value, int | float) and not isinstance(value, bool):
                values[name].append(value)
    return {name: fmean(v) for name, v in values.items()}


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
    """A run against the baseline (the first run), paired by example id.

    `difference` is the mean over the `paired_examples` present in both runs of (this run's mean
    reward on the example - the baseline's), with a 95% t CI over examples. `prompts_differ`
    counts paired examples whose first rollouts' prompts differ: a sign that the runs did not
    evaluate the same examples (different env args or dataset).
    """

    name: str
    baseline: str
    paired_examples: int
    prompts_differ: int
    difference: Estimate


def compare(baseline: Run, run: Run) -> Comparison:
    """Pair `run` with `baseline` by example id; ResultsError when they share none."""
    base, other = baseline.by_example(), run.by_example()
    shared = [example for example in base if example in other]
    if not shared:
        raise ResultsError(f"runs {baseline.name} and {run.name} share no example ids")
    diffs = [
        fmean(r.reward for r in other[example]) - fmean(r.reward for r in base[example])
        for example in shared
    ]
    differ = sum(base[e][0].row.get("prompt") != other[e][0].row.get("prompt") for e in shared)
    return Comparison(run.name, baseline.name, len(shared), differ, mean_with_ci(diffs))


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
        ("examples × rollouts", [_shape(run) for run in runs]),
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


def _shape(run: RunSummary) -> str:
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


# ---- rejection-sampled chat data ------------------------------------------------------------


def export_chat_jsonl(runs: Sequence[Run], path: str | Path, min_reward: float) -> tuple[int, int]:
    """Write every rollout of `runs` with reward >= `min_reward` that did not error as one chat
    example per line, atomically, and return (kept, total rollouts).

    A line is `{"messages": prompt + completion}` with the messages exactly as vf-eval saved them
    (tool calls, which it saves as JSON strings, and tool messages included), plus `"tools"`, the
    environment's tool definitions as saved, when the rollout had tools: a chat template needs
    them to render tool calls.
    """
    lines = [
        json.dumps(_chat_example(run, rollout))
        for run in runs
        for rollout in run.rollouts
        if not errored(rollout.row) and succeeded(rollout.reward, min_reward)
    ]
    atomic_write_text(path, "".join(line + "\n" for line in lines))
    return len(lines), sum(len(run.rollouts) for run in runs)


def _chat_example(run: Run, rollout: Rollout) -> dict[str, Any]:
    prompt, completion = rollout.row.get("prompt"), rollout.row.get("completion")
    if not isinstance(prompt, list) or not isinstance(completion, list):
        raise ResultsError(
            f"{run.results}:{rollout.line}: prompt and completion are not chat messages "
            "(a text-completion environment); chat export needs messages"
        )
    example: dict[str, Any] = {"messages": prompt + completion}
    if rollout.row.get("tool_defs"):
        example["tools"] = rollout.row["tool_defs"]
    return example
