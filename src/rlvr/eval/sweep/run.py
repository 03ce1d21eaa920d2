"""Evaluation sweeps: models x environment settings x seeds, each cell one vf-eval run, then one
report with a table per metric and plots.

Comparing several checkpoints under several settings (say MuSiQue's retrievers) is many vf-eval
runs that must share everything else (examples, rollouts, token budget, sampling) to be
comparable. A sweep keeps those shared settings in `OUT/sweep.json` and refuses to add cells
made with different ones; each cell is saved under `OUT/cells/<model>/<setting>/<seed>/`,
renamed into place only once vf-eval has finished, so an interrupted sweep resumes by running
the cells that are missing and nothing else.

Seeds set the environment's own `seed` argument (every environment here takes one: which
problems are generated, which distractors are drawn, which start positions are played); the
sampling is not seeded, so seeds are also independent replicates of the sampling. Where a
setting has several seeds the report also pools them, clustering rollouts by prompt: the
example (what the model saw), not the seed, is the unit of independence.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import re
import shutil
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from rlvr.atomic import atomic_directory, atomic_write_text
from rlvr.eval.report import (
    Comparison,
    Rollout,
    Run,
    RunSummary,
    compare,
    format_estimate,
    format_number,
    format_percent,
    json_cell,
    load_run,
    ordered_keys,
    summarize,
    table_row,
)
from rlvr.eval.vf_eval import ResultsError, run_vf_eval
from rlvr.server.serve_model import serve

SPEC_FILE = "sweep.json"
CELLS = "cells"
ALL_SEEDS = "all"


class SweepError(ValueError):
    """A sweep that cannot run or report as asked; the message says which input is wrong."""


@dataclass(frozen=True)
class ModelEntry:
    """A model of the sweep: `label` names it in the report and on disk; `model` is what is
    served (a name, directory, hub id or adapter directory; with a given server, the name it
    serves)."""

    label: str
    model: str


@dataclass(frozen=True)
class Setting:
    """A set of environment arguments, named for the report and the directory it runs in."""

    label: str
    args: dict[str, Any] = field(hash=False)


@dataclass(frozen=True)
class Shared:
    """What every cell of a sweep shares, so that its cells can be compared."""

    env_id: str
    num_examples: int
    rollouts_per_example: int
    max_tokens: int | None = None
    sampling_args: dict[str, Any] = field(default_factory=dict)
    base_env_args: dict[str, Any] = field(default_factory=dict)
    seed_arg: str = "seed"


@dataclass(frozen=True)
class Cell:
    model: ModelEntry
    setting: Setting
    seed: int | None

    @property
    def label(self) -> str:
        seed = "" if self.seed is None else f", seed {self.seed}"
        return f"{self.model.label} / {self.setting.label}{seed}"

    def directory(self, out: Path) -> Path:
        seed = "default-seed" if self.seed is None else f"seed-{self.seed}"
        return out / CELLS / _safe(self.model.label) / _safe(self.setting.label) / seed


@dataclass(frozen=True)
class Sweep:
    """A planned sweep; `cells` in run order (all cells of a model together, so each model's
    server starts once)."""

    shared: Shared
    models: list[ModelEntry]
    settings: list[Setting]
    seeds: list[int | None]

    @property
    def cells(self) -> list[Cell]:
        return [
            Cell(m, s, seed)
            for m, s, seed in itertools.product(self.models, self.settings, self.seeds)
        ]

    def env_args(self, cell: Cell) -> dict[str, Any]:
        args = {**self.shared.base_env_args, **cell.setting.args}
        if cell.seed is not None:
            args[self.shared.seed_arg] = cell.seed
        return args


# ---- the command line's inputs ------------------------------------------------------------


def _safe(label: str) -> str:
    """A directory name for a label: characters other than letters, digits and `._=-` become
    `_` (labels that collide this way are refused when the sweep is planned)."""
    return re.sub(r"[^A-Za-z0-9._=-]", "_", label).strip(".") or "_"


def parse_models(text: str) -> list[ModelEntry]:
    """`a,b` or `label=model,...`: a model without a label is labelled by itself."""
    entries = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        label, eq, model = item.partition("=")
        entries.append(ModelEntry(label, model) if eq else ModelEntry(item, item))
    if not entries:
        raise SweepError("--models names no model")
    return entries


def parse_grid(axes: Sequence[str]) -> list[Setting]:
    """The settings of `--grid KEY=V1,V2` axes (several axes: every combination). Values are
    YAML (`3`, `true`, `null`, `bm25`); a value that is itself a YAML list gives the axis's
    values as a list (for values with commas). No axes: one setting, `default`."""
    parsed: list[tuple[str, list[Any]]] = []
    for axis in axes:
        key, eq, raw = axis.partition("=")
        if not eq or not key.strip() or not raw.strip():
            raise SweepError(f"--grid {axis!r}: expected KEY=VALUE[,VALUE...]")
        loaded = yaml.safe_load(raw) if raw.lstrip().startswith("[") else None
        values = loaded if isinstance(loaded, list) else [_yaml(v) for v in raw.split(",")]
        if not values:
            raise SweepError(f"--grid {axis!r}: no values")
        parsed.append((key.strip(), values))
    if not parsed:
        return [Setting("default", {})]
    settings = []
    for combo in itertools.product(*(values for _, values in parsed)):
        args = {key: value for (key, _), value in zip(parsed, combo, strict=True)}
        label = ",".join(f"{k}={_compact(v)}" for k, v in args.items())
        settings.append(Setting(label, args))
    return settings


def _yaml(raw: str) -> Any:
    return yaml.safe_load(raw) if raw.strip() else ""


def _compact(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def parse_seeds(text: str | None) -> list[int | None]:
    """`0,1,2` or `0-4`; None: one cell per model and setting with the environment's default."""
    if text is None:
        return [None]
    seeds: list[int | None] = []
    try:
        for part in filter(None, (p.strip() for p in text.split(","))):
            first, dash, last = part.partition("-")
            seeds += range(int(first), int(last) + 1) if dash and first else [int(part)]
    except ValueError:
        raise SweepError(f"--seeds {text!r}: expected integers like 0,1,2 or 0-4") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise SweepError(f"--seeds {text!r}: name each seed once")
    return seeds


def plan(
    shared: Shared, models: list[ModelEntry], settings: list[Setting], seeds: list[int | None]
) -> Sweep:
    """Check the sweep's inputs and return it; SweepError names what is wrong."""
    if shared.num_examples < 1 or shared.rollouts_per_example < 1:
        raise SweepError("-n and -r must be at least 1")
    labelled = {"model": [m.label for m in models], "setting": [s.label for s in settings]}
    for kind, labels in labelled.items():
        safe = [_safe(label) for label in labels]
        if len(set(safe)) != len(safe):
            raise SweepError(f"{kind} labels {labels} collide as directory names {safe}")
    if seeds != [None]:
        clash = [s.label for s in settings if shared.seed_arg in s.args]
        if shared.seed_arg in shared.base_env_args or clash:
            where = "--env-args" if not clash else f"setting {clash[0]}"
            raise SweepError(f"--seeds sets {shared.seed_arg!r}, which {where} sets too")
    return Sweep(shared, models, settings, seeds)


# ---- running ------------------------------------------------------------------------------


def is_done(cell_dir: Path) -> bool:
    """A cell is finished when its directory exists (with its cell.json): the directory only
    appears, complete, once vf-eval has saved its results (see `_run_cell`)."""
    return (cell_dir / "cell.json").is_file()


def record_sweep(out: Path, sweep: Sweep) -> Sweep:
    """Record the sweep in OUT/sweep.json and return everything recorded there so far.

    The first run fixes the shared settings; later runs must share them, and may add models,
    settings or seeds (the record keeps the union, so a report covers every cell run into
    OUT). A label that comes back naming another model or other arguments is refused.
    """
    path = out / SPEC_FILE
    if path.is_file():
        recorded = load_sweep(out)
        old, new = asdict(recorded.shared), asdict(sweep.shared)
        changed = [k for k in new if old.get(k) != new[k]]
        if changed:
            details = "; ".join(f"{k}: was {old.get(k)!r}, now {new[k]!r}" for k in changed)
            raise SweepError(
                f"{out} holds a sweep run with other shared settings ({details}); "
                "use another --out or the same settings"
            )
        sweep = Sweep(
            sweep.shared,
            _union("model", recorded.models, sweep.models),
            _union("setting", recorded.settings, sweep.settings),
            list(dict.fromkeys([*recorded.seeds, *sweep.seeds])),
        )
    spec = {
        "shared": asdict(sweep.shared),
        "models": [asdict(m) for m in sweep.models],
        "settings": [asdict(s) for s in sweep.settings],
        "seeds": sweep.seeds,
    }
    atomic_write_text(path, json.dumps(spec, indent=2) + "\n")
    return sweep


def _union(kind: str, old: list[Any], new: list[Any]) -> list[Any]:
    """`old` then the entries of `new` it lacks, matched by label."""
    merged = {entry.label: entry for entry in old}
    for entry in new:
        if merged.setdefault(entry.label, entry) != entry:
            raise SweepError(
                f"{kind} label {entry.label!r} was {merged[entry.label]}, now {entry}; "
                "give it another label"
            )
    return list(merged.values())


def load_sweep(out: Path) -> Sweep:
    """The sweep recorded in `out` (every model, setting and seed run into it)."""
    path = out / SPEC_FILE
    if not path.is_file():
        raise SweepError(f"{out} holds no sweep ({SPEC_FILE} not found)")
    spec = json.loads(path.read_text())
    return Sweep(
        Shared(**spec["shared"]),
        [ModelEntry(**m) for m in spec["models"]],
        [Setting(**s) for s in spec["settings"]],
        spec["seeds"],
    )


@dataclass
class SweepRun:
    """What running a sweep did: cells run now, cells finished before, cells that failed."""

    ran: list[Cell] = field(default_factory=list)
    skipped: list[Cell] = field(default_factory=list)
    failed: list[tuple[Cell, str]] = field(default_factory=list)


def run_sweep(
    sweep: Sweep,
    out: Path,
    *,
    base_url: str | None = None,
    server_args: Sequence[str] = (),
    cell_timeout: float | None = None,
    progress: bool = True,
) -> SweepRun:
    """Run every unfinished cell, one model (and server) at a time.

    Without `base_url` each model with unfinished cells gets its own vf-vllm (started with
    `server_args`, stopped after its cells). A failing cell is recorded and the sweep goes on;
    so does a model whose server does not start (its cells fail).
    """
    from tqdm.auto import tqdm

    out.mkdir(parents=True, exist_ok=True)
    record_sweep(out, sweep)
    for stale in (out / CELLS).rglob(".tmp-*") if (out / CELLS).is_dir() else ():
        shutil.rmtree(stale, ignore_errors=True)  # an interrupted cell's partial output
    result = SweepRun()
    cells = sweep.cells
    result.skipped = [c for c in cells if is_done(c.directory(out))]
    bar = tqdm(
        total=len(cells), initial=len(result.skipped), desc="sweep", unit="cell",
        disable=not progress,
    )  # fmt: skip
    for model in sweep.models:
        pending = [c for c in cells if c.model == model and c not in result.skipped]
        if not pending:
            continue
        log = out / CELLS / _safe(model.label) / "vf-vllm.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.ExitStack() as stack:
            try:
                endpoint = stack.enter_context(
                    serve(
                        model.model, name=model.label if base_url is None else None,
                        base_url=base_url, server_args=server_args, log_path=log,
                    )
                )  # fmt: skip
            except (RuntimeError, TimeoutError, OSError, ValueError) as e:
                result.failed += [
                    (c, f"server for {model.label} did not start: {e}") for c in pending
                ]
                bar.update(len(pending))
                continue
            for cell in pending:
                bar.set_postfix_str(cell.label)
                try:
                    _run_cell(sweep, cell, out, endpoint.base_url, endpoint.model, cell_timeout)
                    result.ran.append(cell)
                except Exception as e:  # recorded and reported; the sweep goes on
                    result.failed.append((cell, f"{type(e).__name__}: {e}"))
                bar.update(1)
    bar.close()
    return result


def _run_cell(
    sweep: Sweep, cell: Cell, out: Path, base_url: str, model: str, timeout: float | None
) -> None:
    """One vf-eval run, saved in a hidden directory that becomes the cell's once complete."""
    shared = sweep.shared
    env_args = sweep.env_args(cell)
    with atomic_directory(cell.directory(out)) as tmp:
        run_vf_eval(
            shared.env_id,
            model=model,
            base_url=base_url,
            output_dir=tmp,
            num_examples=shared.num_examples,
            rollouts_per_example=shared.rollouts_per_example,
            max_tokens=shared.max_tokens,
            env_args=env_args,
            sampling_args=shared.sampling_args or None,
            timeout=timeout,
        )
        record = {**asdict(cell), "served_model": model, "env_args": env_args}
        atomic_write_text(tmp / "cell.json", json.dumps(record, indent=2) + "\n")


# ---- the report ---------------------------------------------------------------------------


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
        ("examples × rollouts per example", _shape),
    ]


def _shape(summary: RunSummary) -> str:
    per_example = summary.rollouts_per_example
    return f"{summary.num_examples} × {per_example if per_example else 'uneven'}"


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
        groups, series, plot_dir / "reward.png", xlabel="environment setting",
        ylabel="mean reward per rollout", title=f"{env}: mean reward{pooled}",
        ci_label="95% CI (clustered by example)",
    )  # fmt: skip
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
