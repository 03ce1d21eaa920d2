"""Rejection-sampled chat data: the rollouts of vf-eval runs that reached a reward bar, written
as chat JSONL that SFT (`rlvr.data.sft_rows`) reads back, e.g. `eval_report.py --export-sft`."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlvr.atomic import atomic_write_text
from rlvr.eval.vf_eval import ResultsError, Rollout, Run, errored, succeeded


def export_chat_jsonl(runs: Sequence[Run], path: str | Path, min_reward: float) -> tuple[int, int]:
    """Write every rollout of `runs` with reward >= `min_reward` that did not error as one chat
    example per line, atomically, and return (kept, total rollouts).

    A line is `{"messages": prompt + completion}` with the messages exactly as vf-eval saved them
    (tool calls, which it saves as JSON strings, and tool messages included), plus `"tools"`, the
    environment's tool definitions as saved, when the rollout had tools: a chat template needs
    them to render tool calls.
    """
    lines = [
        json.dumps(_chat_example(run, rollout))
        for run in runs
        for rollout in run.rollouts
        if not errored(rollout.row) and succeeded(rollout.reward, min_reward)
    ]
    atomic_write_text(path, "".join(line + "\n" for line in lines))
    return len(lines), sum(len(run.rollouts) for run in runs)


def _chat_example(run: Run, rollout: Rollout) -> dict[str, Any]:
    prompt, completion = rollout.row.get("prompt"), rollout.row.get("completion")
    if not isinstance(prompt, list) or not isinstance(completion, list):
        raise ResultsError(
            f"{run.results}:{rollout.line}: prompt and completion are not chat messages "
            "(a text-completion environment); chat export needs messages"
        )
    example: dict[str, Any] = {"messages": prompt + completion}
    if rollout.row.get("tool_defs"):
        example["tools"] = rollout.row["tool_defs"]
    return example
