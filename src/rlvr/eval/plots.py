"""Figures of training runs and evaluations, as PNG files, drawn alike: axes with units, a
legend for several series, 95% CIs as error bars. matplotlib's object API only (no pyplot: no
display, no caller's backend touched); each PNG is written atomically and its path returned.
The functions take plain data (metric records, `Estimate`s, pass@k dicts), not report objects.
"""

from __future__ import annotations

import argparse
import io
import math
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from rlvr.atomic import atomic_write_bytes
from rlvr.eval.stats import LEVEL, Estimate
from rlvr.finite import finite_number
from rlvr.jsonl import iter_jsonl

# What a training run's curves show by default: how the reward moves, how far the policy has
# drifted from the reference, whether sampler and trainer agree, and what a step costs.
RUN_CURVE_KEYS: tuple[str, ...] = ("reward/mean", "loss/kl_ref", "mismatch_kl", "time/step")

# Axis labels (with units) of metrics the trainers log; other keys are labelled by name.
METRIC_LABELS: dict[str, str] = {
    "reward/mean": "reward (mean over rollouts)",
    "eval/reward": "eval reward (mean)",
    "loss/kl_ref": "KL to reference (nats/token)",
    "mismatch_kl": "sampler-trainer KL (nats/token)",
    "entropy": "entropy (nats/token)",
    "grad_norm": "gradient norm",
    "lr": "learning rate",
    "train/loss": "training loss (nats/token)",
    "val/loss": "validation loss (nats/token)",
    "throughput/tokens_per_s": "completion tokens/s",
    "rollouts/completion_len": "completion length (tokens)",
    "reasoning/think_tokens": "thinking share of sampled tokens",
    "reasoning/reasoning_id_share": "reasoning-id share of thinking tokens",
    "reasoning/embedding_cosine": "cosine(reasoning row, original)",
}

# Companion series drawn on a metric's panel: (key, legend label, style).
# A mean's spread: (std, min, max) keys; the ±1 std band is clipped to the logged range.
_SPREAD = {"reward/mean": ("reward/std", "reward/min", "reward/max")}
_OVERLAY = {"reward/mean": ("eval/reward", "eval reward"), "train/loss": ("val/loss", "val loss")}

DPI = 120
# Positive series spanning this factor or more (KL divergences often do) get a log axis.
LOG_SCALE_RANGE = 1e3


def metric_label(key: str) -> str:
    """The axis label of a logged metric: its unit where known; `time/...` keys are seconds."""
    if key in METRIC_LABELS:
        return METRIC_LABELS[key]
    if key.startswith("time/"):
        return f"{key.removeprefix('time/').replace('_', ' ')} time (s)"
    return key


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The records of a run's `metrics.jsonl`; a last line without a newline (a run still
    writing) is left out, any other malformed line raises ValueError naming file and line."""
    records = []
    for number, record in iter_jsonl(path, ValueError, unfinished_last_line=True):
        if not isinstance(record, dict) or not isinstance(record.get("step"), int):
            raise ValueError(f"{path}:{number}: expected a JSON object with an integer 'step'")
        records.append(record)
    return records


def metric_series(records: Sequence[Mapping[str, Any]], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of the records that logged `key` as a finite number, in file order."""
    steps, values = [], []
    for record in records:
        value = finite_number(record.get(key))
        if value is not None:
            steps.append(int(record["step"]))
            values.append(value)
    return steps, values


def run_curve_keys(
    records: Sequence[Mapping[str, Any]], keys: Sequence[str], skip_all_zero: bool = True
) -> list[str]:
    """The `keys` that get a panel: those logged as numbers, without the ones that are 0 at
    every step when `skip_all_zero`. ValueError, listing what the run did log, when none is."""
    shown = []
    for key in keys:
        _, values = metric_series(records, key)
        if values and not (skip_all_zero and all(v == 0 for v in values)):
            shown.append(key)
    if not shown:
        present = sorted({k for r in records for k in r} - {"step"})
        raise ValueError(f"none of {list(keys)} was logged; the run has: {', '.join(present)}")
    return shown


def style_step_panel(ax: Any, key: str) -> None:
    """Axes, title, grid and legend of one metric-against-step panel."""
    ax.set_xlabel("optimizer step")
    ax.set_ylabel(metric_label(key))
    ax.set_title(key)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")


def finish_panels(fig: Figure, unused: Sequence[Any], title: str | None, out: str | Path) -> Path:
    """Hide the grid's unused axes, add the figure title and save."""
    for ax in unused:
        ax.set_visible(False)
    if title:
        fig.suptitle(title)
    return save_figure(fig, out)


def spread_band(
    records: Sequence[Mapping[str, Any]], key: str, steps: Sequence[int], values: Sequence[float]
) -> tuple[list[int], list[float], list[float]]:
    """(steps, low, high) of the ±1 std band around `key`'s series, at the steps that logged a
    std. Clipped to the logged min and max where known, since rewards in [0, 1] with a large
    std would otherwise shade impossible values."""
    std, low, high = (dict(zip(*metric_series(records, k), strict=True)) for k in _SPREAD[key])
    band = [
        (s, max(m - std[s], low.get(s, -math.inf)), min(m + std[s], high.get(s, math.inf)))
        for s, m in zip(steps, values, strict=True)
        if s in std
    ]
    if not band:
        return [], [], []
    xs, lows, highs = zip(*band, strict=True)
    return list(xs), list(lows), list(highs)


def plot_run_curves(
    metrics: str | Path | Sequence[Mapping[str, Any]],
    out: str | Path,
    keys: Sequence[str] = RUN_CURVE_KEYS,
    *,
    title: str | None = None,
    skip_all_zero: bool = True,
) -> Path:
    """One panel per metric of a training run (a `metrics.jsonl` path or its records) against
    the step; keys not logged (with `skip_all_zero`, all-zero ones such as `loss/kl_ref`
    without a reference model) are skipped. Raises ValueError when none of `keys` has data."""
    records = read_metrics(metrics) if isinstance(metrics, str | Path) else list(metrics)
    panels = [
        (key, *metric_series(records, key)) for key in run_curve_keys(records, keys, skip_all_zero)
    ]
    ncols = min(2, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    fig = Figure(figsize=(6.0 * ncols, 3.6 * nrows), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    for ax, (key, steps, values) in zip(axes, panels, strict=False):
        ax.plot(steps, values, marker="o" if len(steps) <= 30 else None, ms=3, label=key)
        if key in _SPREAD and (band := spread_band(records, key, steps, values))[0]:
            ax.fill_between(*band, alpha=0.2, label="±1 std across rollouts")
        if key in _OVERLAY:
            other, label = _OVERLAY[key]
            other_steps, other_values = metric_series(records, other)
            if other_steps:
                ax.plot(other_steps, other_values, "s--", ms=5, label=label)
        if min(values) > 0 and max(values) / min(values) >= LOG_SCALE_RANGE:
            ax.set_yscale("log")
        style_step_panel(ax, key)
    return finish_panels(fig, axes[len(panels) :], title, out)


def plot_runs_compared(
    runs: Mapping[str, Sequence[Mapping[str, Any]]],
    out: str | Path,
    keys: Sequence[str],
    *,
    title: str | None = None,
) -> Path:
    """One panel per metric, one line per run (name -> its metric records) against the
    optimizer step: runs of one comparison (a baseline and a variant) on shared axes. A run
    that did not log a key has no line on that panel; keys no run logged get no panel."""
    panels = [k for k in keys if any(metric_series(r, k)[1] for r in runs.values())]
    if not panels:
        raise ValueError(f"no run logged any of {list(keys)}")
    ncols = min(2, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    fig = Figure(figsize=(6.0 * ncols, 3.6 * nrows), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    for ax, key in zip(axes, panels, strict=False):
        for i, (name, records) in enumerate(runs.items()):  # one colour per run throughout
            steps, values = metric_series(records, key)
            if values:
                marker = "o" if len(steps) <= 30 else None
                ax.plot(steps, values, marker=marker, ms=3, color=f"C{i}", label=name)
        style_step_panel(ax, key)
    return finish_panels(fig, axes[len(panels) :], title, out)


def plot_estimate_bars(
    groups: Sequence[str],
    series: Mapping[str, Sequence[Estimate | None]],
    out: str | Path,
    *,
    ylabel: str = "mean reward",
    xlabel: str | None = None,
    title: str | None = None,
    ci_label: str = f"{LEVEL:.0%} CI",
) -> Path:
    """Grouped bars of means with 95% CI error bars: a group per `groups[i]`, a bar per series
    (`series[name][i]`; None: not run). `ci_label` names the error bars in the legend."""
    for name, estimates in series.items():
        if len(estimates) != len(groups):
            raise ValueError(
                f"series {name!r} has {len(estimates)} values for {len(groups)} groups"
            )
    width = 0.8 / max(len(series), 1)
    fig = Figure(
        figsize=(max(5.0, 1.2 + len(groups) * len(series) * 0.75), 4.2), layout="constrained"
    )
    ax = fig.subplots()
    values: list[float] = [0.0]
    for index, estimates in enumerate(series.values()):
        offset = (index - (len(series) - 1) / 2) * width
        for g, estimate in enumerate(estimates):
            if estimate is None:
                continue
            x = g + offset
            ax.bar(x, estimate.mean, width * 0.9, color=f"C{index}")
            top = estimate.mean
            if estimate.low is not None and estimate.high is not None:
                ax.errorbar(
                    x,
                    estimate.mean,
                    yerr=[[estimate.mean - estimate.low], [estimate.high - estimate.mean]],
                    fmt="none",
                    ecolor="black",
                    capsize=5,
                    lw=1.4,
                )
                top = max(estimate.high, estimate.mean)
                values += [estimate.low, estimate.high]
            text = f"{estimate.mean:.3f}" + ("" if estimate.low is not None else "\nno CI")
            ax.annotate(
                text,
                (x, top),
                xytext=(0, 3),
                textcoords="offset points",
                ha="center",
                va="bottom",
                fontsize="x-small",
            )
            values.append(estimate.mean)
    handles = [Patch(color=f"C{i}", label=name) for i, name in enumerate(series)]
    low, high = min(values), max(values)
    span = (high - low) or 1.0
    ax.set_ylim(0.0 if low >= 0 else low - 0.05 * span, high + 0.15 * span)
    ax.axhline(0, color="black", lw=0.6)
    ax.set_xticks(range(len(groups)), list(groups))
    ax.set_ylabel(ylabel)
    if xlabel:
        ax.set_xlabel(xlabel)
    ax.grid(axis="y", alpha=0.3)
    ci = Line2D([], [], color="black", marker="_", ms=10, lw=1.4, label=ci_label)
    ax.legend(handles=[*handles, ci], fontsize="small")
    _title(ax, title)
    return save_figure(fig, out)


def plot_before_after(
    labels: Sequence[str],
    before: Sequence[Estimate | None],
    after: Sequence[Estimate | None],
    out: str | Path,
    *,
    names: tuple[str, str] = ("before", "after"),
    ylabel: str = "mean reward",
    title: str | None = None,
) -> Path:
    """Before/after bars per label (e.g. base model vs trained, per environment), each with its
    95% CI: `plot_estimate_bars` with the two series `names`."""
    return plot_estimate_bars(
        labels, {names[0]: before, names[1]: after}, out, ylabel=ylabel, title=title
    )


def plot_pass_at_k(
    curves: Mapping[str, Mapping[int | str, float]],
    out: str | Path,
    *,
    title: str | None = None,
) -> Path:
    """pass@k against k (log2 axis), one line per curve: `curves[name][k]` is the share of
    examples solved by at least one of k rollouts (keys may be ints or, as in the JSON reports,
    digit strings)."""
    fig = Figure(figsize=(6.0, 4.2), layout="constrained")
    ax = fig.subplots()
    ks: set[int] = set()
    for index, (name, curve) in enumerate(curves.items()):
        points = sorted((int(k), v) for k, v in curve.items())
        ks.update(k for k, _ in points)
        xs, ys = zip(*points, strict=True) if points else ((), ())
        ax.plot(xs, ys, marker="o", color=f"C{index}", label=name)
    ax.set_xscale("log", base=2)
    ticks = sorted(ks) or [1]
    ax.set_xticks(ticks, [str(k) for k in ticks])
    ax.minorticks_off()
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("k (rollouts per example)")
    ax.set_ylabel("pass@k (share of examples solved)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    _title(ax, title)
    return save_figure(fig, out)


def _title(ax: Any, title: str | None) -> None:
    """A title wrapped to the axes' width (long ones would be cut off at the figure's edge)."""
    if title:
        inches = ax.get_figure().get_size_inches()[0] * ax.get_position().width
        ax.set_title(textwrap.fill(title, width=max(20, int(inches * 11))))


def save_figure(fig: Figure, out: str | Path) -> Path:
    """Render `fig` as PNG and write it atomically to `out`."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI)
    atomic_write_bytes(out, buffer.getvalue())
    return Path(out)


# ---- the command ---------------------------------------------------------------------------------


def main() -> None:
    """Plot a training run's curves from its metrics.jsonl (works while the run is going).

        python scripts/plot_run.py outputs/run [--keys reward/mean,mismatch_kl] [--out curves.png]

    Installed as `rlvr-plot-run`; the PNG goes to RUN/curves.png unless --out says otherwise.
    """
    parser = argparse.ArgumentParser(description=main.__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="run directory or metrics.jsonl")
    parser.add_argument("--keys", default=",".join(RUN_CURVE_KEYS), help="comma-separated")
    parser.add_argument("--out", type=Path, help="PNG path (default RUN/curves.png)")
    parser.add_argument("--title", help="figure title (default: the run directory)")
    args = parser.parse_args()
    metrics = args.run / "metrics.jsonl" if args.run.is_dir() else args.run
    run_dir = metrics.parent
    keys = [key.strip() for key in args.keys.split(",") if key.strip()]
    try:
        out = plot_run_curves(
            metrics, args.out or run_dir / "curves.png", keys, title=args.title or str(run_dir)
        )
    except (OSError, ValueError) as e:
        raise SystemExit(f"error: {e}") from None
    print(f"wrote {out}")
