"""When a training run evaluates and checkpoints, shared by the GRPO and SFT trainers.

One loop for both, so they agree on the details that matter for resuming: a stop after k steps
(as an interrupted run) always leaves a checkpoint at k; the last step always has one, written
once even when it falls on the cadence; an evaluation due on the last step runs once, after it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Schedule:
    total_steps: int
    eval_every: int
    """Evaluate after every N steps (0: never in between)."""
    save_every: int
    """Checkpoint after every N steps (0: only at the end)."""
    eval_at_start: bool
    """Evaluate before the first step of a fresh run (not of a resumed one)."""
    eval_at_end: bool


def run_steps(
    schedule: Schedule,
    start_step: int,
    stop_after: int | None,
    history: list[dict[str, float]],
    train_step: Callable[[int], dict[str, float]],
    evaluate: Callable[[int], Any],
    save: Callable[[int], Any],
) -> bool:
    """Run steps `start_step..total_steps-1`, appending each step's metrics to `history`.
    Returns False when `stop_after` cut the run short (the caller then skips the final save)."""
    total = schedule.total_steps
    if schedule.eval_at_start and start_step == 0:
        evaluate(0)
    for step in range(start_step, total):
        history.append(train_step(step))
        done = step + 1
        if stop_after is not None and done >= stop_after:
            save(done)
            return False
        if schedule.eval_every and done % schedule.eval_every == 0 and done < total:
            evaluate(done)
        if schedule.save_every and done % schedule.save_every == 0:
            save(done)
    if schedule.eval_at_end:
        evaluate(total)
    if not (schedule.save_every and total % schedule.save_every == 0):
        save(total)
    return True
