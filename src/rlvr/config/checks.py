"""How a config section refuses a value: `require(ok, name, value, why)` raises ConfigError.

Every section's `validate()` and the loader's type checks raise ConfigError, whose message names
the dotted field and its value (tests match these messages).
"""

from __future__ import annotations

from typing import Any


class ConfigError(ValueError):
    """A config value or key is wrong; the message names the dotted field and the value."""


def require(ok: bool, name: str, value: Any, why: str = "must be positive") -> None:
    """Raise ConfigError naming the dotted field `name` and its value unless `ok`."""
    if not ok:
        raise ConfigError(f"{name}={value!r}: {why}")
