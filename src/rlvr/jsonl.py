"""Reading JSONL files (one JSON value per line) with errors that name the file and line.

Every JSONL this project reads goes through `iter_jsonl`: vf-eval's results.jsonl
(`rlvr.eval.vf_eval.iter_results`), a run's metrics.jsonl (`rlvr.eval.plots.read_metrics`),
prompt files (`rlvr.eval.predict.read_prompts`) and 0.4 task rows (`rlvr.envserver.rows`).
Each caller checks the shape of its own lines and raises its own error type, so the messages
stay those of the file kind being read.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def iter_jsonl(
    path: str | Path, error: type[Exception] = ValueError, *, unfinished_last_line: bool = False
) -> Iterator[tuple[int, Any]]:
    """(line number from 1, value) for every non-blank line of `path`; invalid JSON raises
    `error` naming file and line, except a last line without a newline (a file still being
    written) when `unfinished_last_line`."""
    with Path(path).open(encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if unfinished_last_line and not line.endswith("\n"):
                return
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except json.JSONDecodeError as e:
                raise error(f"{path}:{number}: not valid JSON ({e.msg})") from None
            yield number, value
