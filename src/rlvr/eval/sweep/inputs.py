"""A sweep's inputs parsed from the command line, and the plan of cells they make (`plan`).

The models, the grid of environment settings and the seeds come from `parse_models`,
`parse_grid` and `parse_seeds`; a `Sweep` also holds the settings every cell shares."""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

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
        return (
            out
            / CELLS
            / directory_name(self.model.label)
            / directory_name(self.setting.label)
            / seed
        )


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


def is_done(cell_dir: Path) -> bool:
    """A cell is finished when its directory exists (with its cell.json): the directory only
    appears, complete, once vf-eval has saved its results (see `rlvr.eval.sweep.run`)."""
    return (cell_dir / "cell.json").is_file()


def directory_name(label: str) -> str:
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
        safe = [directory_name(label) for label in labels]
        if len(set(safe)) != len(safe):
            raise SweepError(f"{kind} labels {labels} collide as directory names {safe}")
    if seeds != [None]:
        clash = [s.label for s in settings if shared.seed_arg in s.args]
        if shared.seed_arg in shared.base_env_args or clash:
            where = "--env-args" if not clash else f"setting {clash[0]}"
            raise SweepError(f"--seeds sets {shared.seed_arg!r}, which {where} sets too")
    return Sweep(shared, models, settings, seeds)
