"""Task rows for a 0.4 taskset: exported once from its own `load()` in the side venv, as the JSONL
of wire `task_data` dicts a `run` request carries, or read back from such a file."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from rlvr.jsonl import iter_jsonl

EXPORT_CODE = """
import itertools, json, sys
from verifiers.v1.utils.loaders import load_taskset, taskset_config_type

spec = json.loads(sys.argv[1])
config = taskset_config_type(spec["id"]).model_validate(spec["taskset"])
tasks = itertools.islice(load_taskset(config), spec["limit"])
with open(spec["out"], "w") as f:
    for task in tasks:
        f.write(json.dumps(task.data.model_dump(mode="json")) + "\\n")
"""
"""Run by the side venv's python with the JSON spec as argv[1]."""


def export_rows(
    taskset_id: str,
    out: str | Path,
    *,
    taskset_overrides: dict[str, Any] | None = None,
    limit: int | None = None,
    venv: str | Path,
) -> list[dict[str, Any]]:
    """Write the first `limit` rows (all when None) of taskset `taskset_id` (its config:
    `taskset_overrides`) to `out` as JSONL and return them; raises with 0.4's error on failure."""
    spec = {
        "id": taskset_id,
        "taskset": {**(taskset_overrides or {}), "id": taskset_id},
        "limit": limit,
        "out": str(out),
    }
    python = Path(venv) / "bin" / "python"
    done = subprocess.run(
        [str(python), "-c", EXPORT_CODE, json.dumps(spec)], capture_output=True, text=True
    )
    if done.returncode != 0:
        raise RuntimeError(f"exporting rows of {taskset_id!r} failed:\n{done.stderr[-3000:]}")
    return read_rows(out)


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """The `task_data` dicts of a rows JSONL file, in file order."""
    return [row for _, row in iter_jsonl(path)]
