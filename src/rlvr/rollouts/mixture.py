"""Environment mixtures: several environments in one run, each step's groups drawn by weight.
A mixture loads as verifiers' `EnvGroup` (`load_mixture`); the trainer routes each row to its
own environment (`route`: its reply length, rubric and metrics); `MixtureOrder` follows the
weights exactly and depends on the position alone, so a checkpoint resumes it; `prompt_order`
picks it, or one permutation of every row. Design: docs/training.md#mixtures.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rlvr.config import Config, MixtureEnvConfig
from rlvr.rollouts.prompts import PromptOrder

ROUTE_KEY = "env_id"
"""Where verifiers' EnvGroup names a row's environment: `row["info"][ROUTE_KEY]`."""


def load_mixture(
    entries: Sequence[MixtureEnvConfig], load: Callable[[MixtureEnvConfig], Any]
) -> Any:
    """The environments of `envs:` (each loaded by `load`) as one verifiers `EnvGroup`, named
    by their labels."""
    import verifiers as vf

    return vf.EnvGroup([load(entry) for entry in entries], env_names=[e.label for e in entries])


def is_group(env: Any) -> bool:
    """Is `env` a verifiers EnvGroup (a mixture)?"""
    import verifiers as vf

    return isinstance(env, vf.EnvGroup)


def _info(row: Mapping[str, Any]) -> dict[str, Any]:
    info = row.get("info")
    if isinstance(info, str):
        info = json.loads(info) if info else {}
    return dict(info or {})


def row_route(row: Mapping[str, Any]) -> list[str]:
    """The environment names a row's `info["env_id"]` gives (outermost group first)."""
    value = _info(row).get(ROUTE_KEY)
    if value is None:
        return []
    return [value] if isinstance(value, str) else [str(v) for v in value]


@dataclass(frozen=True)
class Routed:
    """A row, and the environment that runs it with the row as that environment sees it."""

    env: Any
    row: dict
    name: str | None
    """The environment's name in the mixture ("a/b" inside nested groups); None outside one."""

    @property
    def entry(self) -> str:
        """The `envs:` entry the row came from ("" outside a mixture)."""
        return mixture_entry(self.name)


def mixture_entry(name: str | None) -> str:
    """The `envs:` entry a leaf environment's name belongs to: its first part ("" for None),
    where the entry's own settings (reply length, eval size) live."""
    return (name or "").split("/")[0]


def route(env: Any, row: Mapping[str, Any]) -> Routed:
    """The environment of `env` (a group or not) that runs `row`, and the row without the
    group's routing (what the environment's own dataset row looks like)."""
    names: list[str] = []
    row = dict(row)
    while is_group(env):
        path = row_route(row) or ([env.env_names[0]] if len(env.envs) == 1 else [])
        if not path:
            raise ValueError(
                f"row {row.get('example_id')} of an EnvGroup names no environment in "
                f"info[{ROUTE_KEY!r}]"
            )
        env = env.get_env_for_name(path[0])
        names.append(path[0])
        info = _info(row)
        if path[1:]:
            info[ROUTE_KEY] = path[1:] if len(path) > 2 else path[1]
        else:
            info.pop(ROUTE_KEY, None)
        row["info"] = info
    return Routed(env, row, "/".join(names) or None)


def leaves(env: Any) -> dict[str | None, Any]:
    """Every environment that runs rows, by its `Routed.name` (None: `env` is no group)."""
    if not is_group(env):
        return {None: env}
    found: dict[str | None, Any] = {}
    for name, child in zip(env.env_names, env.envs, strict=True):
        for inner, leaf in leaves(child).items():
            found[name if inner is None else f"{name}/{inner}"] = leaf
    return found


def routed_filter(
    env: Any, make: Callable[[Any], Callable[[dict], bool]]
) -> Callable[[dict], bool]:
    """A row predicate that asks `make(e)`'s predicate of the row's environment e (for prompt
    filters that depend on the environment, such as its tools)."""
    filters = {name: make(leaf) for name, leaf in leaves(env).items()}

    def check(row: dict) -> bool:
        routed = route(env, row)
        return filters[routed.name](routed.row)

    return check


def rows_by_env(dataset: Any, names: Sequence[str]) -> list[list[int]]:
    """The dataset's row indices for each of the group's top-level environments, in order."""
    column = dataset["info"] if "info" in dataset.column_names else [None] * len(dataset)
    found: dict[str, list[int]] = {name: [] for name in names}
    for index, info in enumerate(column):
        path = row_route({"info": info})
        if path and path[0] in found:
            found[path[0]].append(index)
    return [found[name] for name in names]


class MixtureOrder:
    """The order of a mixture's rows (a drop-in for `PromptOrder`): position p goes to the
    environment lagging furthest behind its share of p + 1 positions (ties: the first listed)
    and takes its next row in that environment's own `PromptOrder`."""

    def __init__(self, rows: Sequence[Sequence[int]], weights: Sequence[float], seed: int):
        empty = [i for i, indices in enumerate(rows) if not indices]
        if empty:
            raise ValueError(f"mixture environment #{empty[0]} has an empty training dataset")
        total = sum(weights)
        self._rows = [list(indices) for indices in rows]
        self._shares = [w / total for w in weights]
        self._orders = [PromptOrder(len(r), seed + 7919 * i) for i, r in enumerate(rows)]
        self._draws = [0] * len(rows)
        self._plan: list[tuple[int, int]] = []
        """Position -> (environment, its own draw number), extended as positions are read."""

    def env_of(self, position: int) -> int:
        """The environment (index into `rows`) that position `position` draws from."""
        self._extend(position + 1)
        return self._plan[position][0]

    def _extend(self, length: int) -> None:
        while len(self._plan) < length:
            due = len(self._plan) + 1
            lags = [
                share * due - draws for share, draws in zip(self._shares, self._draws, strict=True)
            ]
            env = max(range(len(lags)), key=lambda i: (lags[i], -i))
            self._plan.append((env, self._draws[env]))
            self._draws[env] += 1

    def rows(self, start: int, count: int) -> list[int]:
        self._extend(start + count)
        out = []
        for env, nth in self._plan[start : start + count]:
            (local,) = self._orders[env].rows(nth, 1)
            out.append(self._rows[env][local])
        return out


def prompt_order(env: Any, dataset: Any, cfg: Config) -> PromptOrder | MixtureOrder:
    """The order the rows of `dataset` are used in: drawn by the weights of `envs:`, or in one
    permutation of all rows (one environment, or a group the environment itself made)."""
    if cfg.envs and is_group(env):
        rows = rows_by_env(dataset, env.env_names)
        return MixtureOrder(rows, [entry.weight for entry in cfg.envs], cfg.seed)
    return PromptOrder(len(dataset), cfg.seed)
