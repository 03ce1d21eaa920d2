"""Load a run's typed configuration: a YAML file plus dotted command-line overrides.

`load_config(path, overrides, cls)` knows no particular schema: it reads the file, applies
overrides such as `optim.lr=1e-5` (values parsed as YAML), checks every value against the
declared type, rejects unknown keys by their full dotted name (a typo fails before any model
loads) and calls the config's `validate()`. Default `cls`: the GRPO `Config`.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml

from rlvr.atomic import atomic_write_text
from rlvr.config.checks import ConfigError

AnyConfig = TypeVar("AnyConfig")
"""A run's config class: rlvr.config.grpo.Config or rlvr.config.sft.SFTConfig."""

RETIRED = {
    "server.probe_noise": "the exact check of every push replaced the probe's per-push noise "
    "model; delete the key (docs/weight-transfer.md#the-exact-check)",
}
"""Keys a release removed, by dotted name, with what replaced them: an old config fails with
the reason instead of a bare "unknown key"."""


def _type_name(hint: Any) -> str:
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")


def _coerce(value: Any, hint: Any, name: str) -> Any:
    """Check `value` against the type hint `hint`, converting only where it is lossless
    (int -> float). Returns the checked value or raises ConfigError naming `name`."""
    origin = typing.get_origin(hint)
    if hint is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        if value is None and type(None) in options:
            return None
        for option in options:
            if option is type(None):
                continue
            try:
                return _coerce(value, option, name)
            except ConfigError:
                continue
        raise ConfigError(f"{name}={value!r}: expected {_type_name(hint)}")
    if origin is Literal:
        if value not in typing.get_args(hint):
            raise ConfigError(f"{name}={value!r}: choose one of {list(typing.get_args(hint))}")
        return value
    if origin is list:
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{name}={value!r}: expected a list")
        (item,) = typing.get_args(hint)
        return [_coerce(v, item, f"{name}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{name}={value!r}: expected a mapping")
        return dict(value)
    if dataclasses.is_dataclass(hint):
        return from_dict(hint, value, name)
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint is bool and not isinstance(value, bool):
        raise ConfigError(f"{name}={value!r}: expected true or false")
    if hint is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise ConfigError(f"{name}={value!r}: expected an integer")
    if not isinstance(value, hint):
        raise ConfigError(f"{name}={value!r}: expected {_type_name(hint)}")
    return value


def from_dict(cls: type, data: Any, prefix: str = "") -> Any:
    """Build dataclass `cls` from a mapping, rejecting unknown keys by their dotted name.

    A section given only in part keeps its other fields at the defaults of the config that
    holds it (SFTConfig's `optim` defaults differ from OptimConfig's own)."""
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix or 'config'}: expected a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        where = f"{prefix}." if prefix else ""
        for key in unknown:
            if f"{where}{key}" in RETIRED:
                raise ConfigError(f"{where}{key} was removed: {RETIRED[where + key]}")
        raise ConfigError(
            f"unknown config key {where}{unknown[0]}; known keys here: {', '.join(sorted(fields))}"
        )
    kwargs = {}
    for key, value in data.items():
        default = fields[key].default_factory
        section = dataclasses.is_dataclass(hints[key]) and default is not dataclasses.MISSING
        if section and isinstance(value, dict):
            value = {**dataclasses.asdict(default()), **value}
        kwargs[key] = _coerce(value, hints[key], f"{prefix}.{key}" if prefix else key)
    return cls(**kwargs)


def parse_override(item: str) -> tuple[list[str], Any]:
    """`a.b=value` -> (["a", "b"], parsed value). Values are YAML: `1e-5`, `true`, `[a, b]`."""
    if "=" not in item:
        raise ConfigError(f"override {item!r} is not of the form dotted.key=value")
    key, raw = item.split("=", 1)
    key = key.strip().removeprefix("--").replace("-", "_")
    if not key:
        raise ConfigError(f"override {item!r} has an empty key")
    value = yaml.safe_load(raw) if raw.strip() else ""
    # YAML reads 1e-5 as a string (it wants 1.0e-5); numbers are what people mean.
    if isinstance(value, str):
        try:
            value = float(value) if any(c in value.lower() for c in ".e") else value
        except ValueError:
            pass
    return key.split("."), value


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """Set each dotted override in a nested dict (a copy); `env.args.x=1` creates mappings."""
    out = _deepcopy(data)
    for item in overrides:
        path, value = parse_override(item)
        node = out
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override {item!r}: {part} is not a section")
            node = child
        node[path[-1]] = value
    return out


def _deepcopy(data: Any) -> Any:
    if isinstance(data, dict):
        return {k: _deepcopy(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_deepcopy(v) for v in data]
    return data


def load_config(
    path: str | Path | None = None,
    overrides: list[str] | None = None,
    cls: type[AnyConfig] | None = None,
) -> AnyConfig:
    """Read an optional YAML file, apply dotted overrides, type-check and validate a `cls`
    (default: the GRPO `Config`)."""
    if cls is None:
        from rlvr.config.grpo import Config

        cls = Config
    data: dict = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file {path} does not exist")
        data = yaml.safe_load(path.read_text()) or {}
        if not isinstance(data, dict):
            raise ConfigError(f"config file {path} must hold a mapping at the top level")
    data = apply_overrides(data, overrides or [])
    config = from_dict(cls, data)
    config.validate()
    return config


def to_dict(config: Any) -> dict:
    """Return the config as plain nested dicts (the form saved and printed)."""
    return dataclasses.asdict(config)


def to_yaml(config: Any) -> str:
    """Return the config as YAML, fields in declaration order."""
    return yaml.safe_dump(to_dict(config), sort_keys=False, default_flow_style=False)


def save_config(config: Any, path: str | Path) -> None:
    """Write the full resolved config beside the run's outputs (atomically)."""
    atomic_write_text(Path(path), to_yaml(config))
