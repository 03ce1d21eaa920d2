"""`env_server.*`: a verifiers 0.4 taskset trained through its own EnvServer process.

Each field is checked by `EnvServerConfig.validate`. Design and limits:
docs/training.md#verifiers-04-environments.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from rlvr.config.checks import require


@dataclass
class EnvServerConfig:
    """`env_server.*` (or `envs[i].env_server.*`): which 0.4 taskset, from which side venv."""

    taskset: str = ""
    """The taskset id, as 0.4 resolves it (an installed module); empty: no EnvServer."""
    taskset_args: dict[str, Any] = field(default_factory=dict)
    """Overrides of the taskset's config (its `taskset.*` fields in 0.4)."""
    venv: str = ".venv-envserver"
    """The side virtualenv holding verifiers 0.4 and the taskset; built on first use."""
    requirements: list[str] = field(default_factory=list)
    """Extra pip requirements of the side venv (the taskset's package, a path or a name)."""
    harness: Literal["null"] = "null"
    """The model talks to the taskset directly; agent harnesses need sandboxes (out of scope)."""
    runtime: Literal["subprocess"] = "subprocess"
    """Episodes run in the server's own processes; remote sandboxes are out of scope."""
    tasks: str | None = None
    """A JSONL file of task rows (one task's data per line); None: the taskset's own rows,
    exported once into the side venv's folder."""
    eval_tasks: str | None = None
    """Task rows for evaluation (None: the training rows)."""
    workers: int = 1
    """EnvServer worker processes (0.4's pool scales up to this many)."""
    max_concurrent: int = 64
    """Episodes in flight on one worker."""
    startup_timeout_s: float = 180.0
    """How long the server may take to answer its first health request."""
    episode_timeout_s: float = 600.0
    """An episode still running after this long is cancelled and counts as errored."""

    @property
    def enabled(self) -> bool:
        return bool(self.taskset)

    def validate(self, where: str = "env_server") -> None:
        if not self.enabled:
            return
        for key in ("workers", "max_concurrent", "startup_timeout_s", "episode_timeout_s"):
            require(getattr(self, key) > 0, f"{where}.{key}", getattr(self, key))
