"""Rejection-sampled chat data: rollouts (in vf-eval's saved form) that reached a reward bar and
any metric conditions, written as chat rows that SFT (`rlvr.data.sft_rows`) reads back.
`export_rollouts` serves both `eval_report.py --export-sft` and `rlvr-demos`.
"""

from __future__ import annotations

import io
import json
import operator
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlvr.atomic import atomic_write_bytes, atomic_write_text
from rlvr.eval.vf_eval import ResultsError, Run, errored
from rlvr.pass_at_k import succeeded

OPERATORS: dict[str, Callable[[float, float], bool]] = {
    ">=": operator.ge,
    "<=": operator.le,
    "==": operator.eq,
    ">": operator.gt,
    "<": operator.lt,
}
REQUIREMENT = re.compile(
    r"^\s*([A-Za-z_][\w./-]*)\s*(>=|<=|==|>|<)\s*([-+]?[\d.]+(?:e[-+]?\d+)?)\s*$"
)


@dataclass(frozen=True)
class Requirement:
    """A condition on one of a rollout's metrics, e.g. `legal_rate>=1` or `forfeit==0`."""

    metric: str
    op: str
    value: float

    def holds(self, row: dict[str, Any], where: str) -> bool:
        metrics = row.get("metrics") or {}
        if self.metric not in metrics:
            known = ", ".join(sorted(metrics)) or "none"
            raise ResultsError(f"{where}: no metric {self.metric!r} (its metrics: {known})")
        return OPERATORS[self.op](float(metrics[self.metric]), self.value)

    def __str__(self) -> str:
        return f"{self.metric}{self.op}{self.value:g}"


def parse_requirement(text: str) -> Requirement:
    """`METRIC>=VALUE` (or <=, ==, >, <) -> Requirement; ValueError naming the text otherwise."""
    match = REQUIREMENT.match(text)
    if match is None:
        raise ValueError(f"requirement {text!r} is not METRIC<op>NUMBER, e.g. legal_rate>=1")
    metric, op, value = match.groups()
    return Requirement(metric, op, float(value))


def keeps(
    row: dict[str, Any], where: str, min_reward: float, require: Sequence[Requirement] = ()
) -> bool:
    """A rollout that ran cleanly, reached `min_reward` and meets every requirement."""
    if errored(row) or not succeeded(float(row.get("reward", 0.0)), min_reward):
        return False
    return all(r.holds(row, where) for r in require)


def export_rollouts(
    rollouts: Sequence[tuple[str, dict[str, Any]]],
    path: str | Path,
    min_reward: float,
    require: Sequence[Requirement] = (),
) -> tuple[int, int]:
    """Write every (where, saved rollout) that `keeps` as one chat row (`{"messages": prompt +
    completion}` as vf-eval saved them, plus `"tools"` when it had tools) atomically to `path`
    (.jsonl or .parquet); return (kept, total). `where` names the rollout in errors."""
    examples = [
        chat_example(row, where)
        for where, row in rollouts
        if keeps(row, where, min_reward, require)
    ]
    write_examples(examples, path)
    return len(examples), len(rollouts)


def export_chat_jsonl(
    runs: Sequence[Run], path: str | Path, min_reward: float, require: Sequence[Requirement] = ()
) -> tuple[int, int]:
    """`export_rollouts` over every rollout of saved vf-eval `runs`."""
    rollouts = [(f"{run.results}:{r.line}", r.row) for run in runs for r in run.rollouts]
    return export_rollouts(rollouts, path, min_reward, require)


def chat_example(row: dict[str, Any], where: str) -> dict[str, Any]:
    """One saved rollout as an SFT chat row (see `export_rollouts`)."""
    prompt, completion = row.get("prompt"), row.get("completion")
    if not isinstance(prompt, list) or not isinstance(completion, list):
        raise ResultsError(
            f"{where}: prompt and completion are not chat messages (a text-completion "
            "environment); chat export needs messages"
        )
    example: dict[str, Any] = {"messages": prompt + completion}
    if row.get("tool_defs"):
        example["tools"] = row["tool_defs"]
    return example


def write_examples(examples: list[dict[str, Any]], path: str | Path) -> None:
    """Chat rows to `path`, atomically: JSON lines, or Parquet for a `.parquet` path."""
    path = Path(path)
    if path.suffix.lower() != ".parquet":
        atomic_write_text(path, "".join(json.dumps(e) + "\n" for e in examples))
        return
    import datasets

    buffer = io.BytesIO()
    datasets.Dataset.from_list(examples).to_parquet(buffer)
    atomic_write_bytes(path, buffer.getvalue())
