"""A sweep's report: tables per metric, paired comparisons, plots and the same numbers as JSON.

Each table is models x settings, seeds pooled by prompt."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from rlvr.atomic import atomic_write_text
from rlvr.eval.report import (
    Comparison,
    RunSummary,
    compare,
    format_estimate,
    format_number,
    format_percent,
    json_cell,
    ordered_keys,
    shape,
    summarize,
    table_row,
)
from rlvr.eval.sweep.inputs import (
    ALL_SEEDS,
    CELLS,
    Cell,
    ModelEntry,
    Setting,
    Shared,
    Sweep,
    is_done,
)
from rlvr.eval.vf_eval import ResultsError, Rollout, Run, load_run


@dataclass(frozen=True)
class Row:
    """One row of the report's tables: a model at one seed, or pooled over its seeds
    (`seed` = "all"); `summaries[i]` belongs to the sweep's i-th setting (None: not run)."""

    model: str
    seed: int | str | None
    summaries: list[RunSummary | None]


@dataclass(frozen=True)
class SweepReport:
    shared: Shared
    settings: list[Setting]
    threshold: float
    rows: list[Row]
    pooled: dict[str, list[RunSummary | None]]
    """Per model, one summary per setting over all its seeds (the cell's own with one seed)."""
    comparisons: list[tuple[str, Comparison]]
    """(setting, comparison of a model with the first model), pooled over seeds."""
    missing: list[str]


def pool(runs: Sequence[Run], name: str, index: dict[str, int]) -> Run:
    """The rollouts of `runs` (one setting, several seeds) as one run whose example ids are
    the index of each rollout's prompt in `index` (shared across the runs compared with each
    other, so the same prompt pairs up): rollouts of the same prompt form one cluster."""
    rollouts = []
    for run in runs:
        for rollout in run.rollouts:
            key = json.dumps(rollout.row.get("prompt"), sort_keys=True)
            example = index.setdefault(key, len(index))
            rollouts.append(Rollout(rollout.line, example, rollout.reward, rollout.row))
    return replace(runs[0], name=name, rollouts=rollouts)


def build_sweep_report(sweep: Sweep, out: Path, threshold: float = 1.0) -> SweepReport:
    """Summaries of every finished cell, pooled over seeds, and each model's paired difference
    from the first model per setting. ResultsError when no cell has finished."""
    runs: dict[Cell, Run] = {}
    missing = []
    for cell in sweep.cells:
        if is_done(cell.directory(out)):
            runs[cell] = load_run(cell.directory(out), cell.label)
        else:
            missing.append(cell.label)
    if not runs:
        raise ResultsError(f"no finished cells under {out / CELLS}")
    rows: list[Row] = []
    pooled_runs: dict[str, list[Run | None]] = {}
    indexes = [dict() for _ in sweep.settings]  # prompt -> pooled example id, per setting
    for model in sweep.models:
        per_setting: list[Run | None] = []
        for i, setting in enumerate(sweep.settings):
            done = [runs[c] for c in _cells_of(sweep, model, setting) if c in runs]
            if len(sweep.seeds) == 1:
                per_setting.append(replace(done[0], name=model.label) if done else None)
            else:
                per_setting.append(pool(done, model.label, indexes[i]) if done else None)
        pooled_runs[model.label] = per_setting
        for seed in sweep.seeds:
            cells = [Cell(model, s, seed) for s in sweep.settings]
            summaries = [summarize(runs[c], threshold) if c in runs else None for c in cells]
            rows.append(Row(model.label, seed, summaries))
        if len(sweep.seeds) > 1:
            summaries = [summarize(r, threshold) if r else None for r in per_setting]
            rows.append(Row(model.label, ALL_SEEDS, summaries))
    pooled = {
        label: [summarize(r, threshold) if r else None for r in per_setting]
        for label, per_setting in pooled_runs.items()
    }
    comparisons = []
    baseline = sweep.models[0].label
    for i, setting in enumerate(sweep.settings):
        base = pooled_runs[baseline][i]
        for model in sweep.models[1:]:
            other = pooled_runs[model.label][i]
            if base is not None and other is not None:
                try:
                    comparisons.append((setting.label, compare(base, other)))
                except ResultsError:
                    pass  # no shared examples: nothing to pair (the tables still show both)
    return SweepReport(sweep.shared, sweep.settings, threshold, rows, pooled, comparisons, missing)


def _cells_of(sweep: Sweep, model: ModelEntry, setting: Setting) -> list[Cell]:
    return [Cell(model, setting, seed) for seed in sweep.seeds]


def sweep_json(report: SweepReport) -> str:
    """The report's numbers as JSON (every cell's full summary, pooled summaries, comparisons)."""
    payload = {
        "shared": asdict(report.shared),
        "threshold": report.threshold,
        "settings": [asdict(s) for s in report.settings],
        "rows": [asdict(row) for row in report.rows],
        "pooled": {k: [asdict(s) if s else None for s in v] for k, v in report.pooled.items()},
        "comparisons": [{"setting": setting, **asdict(c)} for setting, c in report.comparisons],
        "missing": report.missing,
    }
    return json.dumps(payload, indent=2) + "\n"


# What each per-metric table shows: (heading, cell text of a summary).
def _metric_tables(report: SweepReport) -> list[tuple[str, Callable[[RunSummary], str]]]:
    summaries = [s for row in report.rows for s in row.summaries if s is not None]
    ks = ordered_keys(s.pass_at_k for s in summaries)
    metrics = ordered_keys(s.metrics for s in summaries)
    return [
        ("mean reward [95% CI]", lambda s: format_estimate(s.reward)),
        *[(f"pass@{k}", lambda s, k=k: format_number(s.pass_at_k.get(k))) for k in ks],
        *[(f"`{m}`", lambda s, m=m: format_number(s.metrics.get(m))) for m in metrics],
        ("errored rollouts", lambda s: format_percent(s.errored)),
        ("truncated rollouts", lambda s: format_percent(s.truncated)),
        ("completion tokens (mean)", lambda s: format_number(s.completion_tokens, 1)),
        ("examples × rollouts per example", shape),
    ]


def render_sweep_markdown(report: SweepReport, plots: Iterable[tuple[str, str]] = ()) -> str:
    """The report as Markdown: settings, one table per metric (rows: model and seed, columns:
    settings), paired differences, then the `plots` as (caption, relative path) images."""
    shared = report.shared
    settings = report.settings
    lines = [
        f"# Evaluation sweep: {shared.env_id}",
        "",
        f"Every cell: {shared.num_examples} examples × {shared.rollouts_per_example} rollouts, "
        f"max tokens {shared.max_tokens or 'env default'}, sampling "
        f"{json_cell(shared.sampling_args)}, base env args {json_cell(shared.base_env_args)}. "
        f"Seeds set the env arg `{shared.seed_arg}`. pass@k counts reward ≥ "
        f"{report.threshold:g} as success. Mean reward CIs are clustered by example; rows "
        f"'{ALL_SEEDS}' pool a model's seeds, clustering rollouts by prompt.",
        "",
        table_row(["setting", "env args"]),
        table_row(["---"] * 2),
        *(table_row([s.label, json_cell(s.args)]) for s in settings),
    ]
    for heading, cell_text in _metric_tables(report):
        lines += [
            "",
            f"## {heading}",
            "",
            table_row(["model", "seed", *(s.label for s in settings)]),
        ]
        lines.append(table_row(["---"] * (len(settings) + 2)))
        for row in report.rows:
            seed = "default" if row.seed is None else str(row.seed)
            cells = [cell_text(s) if s is not None else "not run" for s in row.summaries]
            lines.append(table_row([row.model, seed, *cells]))
    if report.comparisons:
        baseline = report.comparisons[0][1].baseline
        lines += [
            "",
            f"## Paired difference in mean reward against {baseline}",
            "",
            "Per prompt evaluated by both (all seeds): this model's mean reward minus the "
            "baseline's, with a 95% t CI over prompts.",
            "",
            table_row(["setting", "model", "paired examples", "difference [95% CI]"]),
            table_row(["---"] * 4),
            *(
                table_row(
                    [setting, c.name, str(c.paired_examples), format_estimate(c.difference, "+")]
                )
                for setting, c in report.comparisons
            ),
        ]
    if report.missing:
        lines += ["", f"**Not run yet ({len(report.missing)}):** " + "; ".join(report.missing)]
    for caption, path in plots:
        lines += ["", f"## {caption}", "", f"![{caption}]({path})"]
    return "\n".join(lines) + "\n"


def plot_sweep(report: SweepReport, plot_dir: Path) -> list[tuple[str, Path]]:
    """The sweep's figures: mean reward with 95% CI per setting and model (pooled over seeds),
    and pass@k curves per model and setting. Returns (caption, path) pairs."""
    from rlvr.eval.plots import plot_estimate_bars, plot_pass_at_k

    groups = [s.label for s in report.settings]
    series = {m: [s.reward if s else None for s in v] for m, v in report.pooled.items()}
    pooled = ", seeds pooled" if any(row.seed == ALL_SEEDS for row in report.rows) else ""
    env = report.shared.env_id
    reward = plot_estimate_bars(
        groups,
        series,
        plot_dir / "reward.png",
        xlabel="environment setting",
        ylabel="mean reward per rollout",
        title=f"{env}: mean reward{pooled}",
        ci_label="95% CI (clustered by example)",
    )
    curves = {
        f"{model} · {setting}" if len(groups) > 1 else model: summary.pass_at_k
        for model, summaries in report.pooled.items()
        for setting, summary in zip(groups, summaries, strict=True)
        if summary is not None
    }
    figures = [("Mean reward", reward)]
    if any(len(curve) > 1 for curve in curves.values()):
        title = f"{env}: pass@k (success = reward ≥ {report.threshold:g})"
        figures.append(("pass@k", plot_pass_at_k(curves, plot_dir / "pass_at_k.png", title=title)))
    return figures


def write_report(sweep: Sweep, out: Path, threshold: float = 1.0) -> Path:
    """Build the report over the finished cells and write OUT/report.md, OUT/report.json and
    OUT/plots/*.png; returns the Markdown's path."""
    report = build_sweep_report(sweep, out, threshold)
    figures = plot_sweep(report, out / "plots")
    relative = [(caption, str(path.relative_to(out))) for caption, path in figures]
    atomic_write_text(out / "report.json", sweep_json(report))
    atomic_write_text(out / "report.md", render_sweep_markdown(report, relative))
    return out / "report.md"
