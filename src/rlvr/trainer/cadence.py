"""The run loop of the GRPO and SFT trainers (`run_steps`), and when it evaluates and
checkpoints (`Cadence`).

Both trainers run the same loop, so they agree on what resuming needs: a stop after k steps
(as an interrupted run) always leaves a checkpoint at k; the last step always has one, written
once even when it falls on the cadence; an evaluation due on the last step runs once, after it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class Cadence:
    total_steps: int
    eval_every: int
    """Evaluate after every N steps (0: never in between)."""
    save_every: int
    """Checkpoint after every N steps (0: only at the end)."""
    eval_at_start: bool
    """Evaluate before the first step of a fresh run (not of a resumed one)."""
    eval_at_end: bool

    def evaluate_first(self, start_step: int) -> bool:
        """Evaluate before training: only a fresh run, never a resumed one."""
        return self.eval_at_start and start_step == 0

    def stop_here(self, done: int, stop_after: int | None) -> bool:
        """An interrupted run stops after `stop_after` steps (it saves there, no final save)."""
        return stop_after is not None and done >= stop_after

    def evaluate_after(self, done: int) -> bool:
        """An evaluation in between; the one due on the last step runs once, at the end."""
        return bool(self.eval_every) and done % self.eval_every == 0 and done < self.total_steps

    def save_after(self, done: int) -> bool:
        """A checkpoint after `done` steps on the cadence (the loop saves the last step once
        more only when the cadence missed it)."""
        return bool(self.save_every) and done % self.save_every == 0


class Steps(Protocol):
    """What `run_steps` drives: a trainer's step, evaluation, checkpoint and final save, and
    the metrics of the steps it has run."""

    history: list[dict[str, float]]

    def train_step(self, step: int) -> dict[str, float]: ...

    def evaluate(self, step: int) -> Any: ...

    def save(self, step: int) -> Any: ...

    def save_final(self) -> Any: ...


def run_steps(
    trainer: Steps, cadence: Cadence, start_step: int, stop_after: int | None = None
) -> list[dict[str, float]]:
    """Train from `start_step` to the last step (or `stop_after` steps, saving there as an
    interrupted run would), evaluating and saving on the cadence; returns `trainer.history`,
    each step's metrics (kept up to date, so a run that raises still has the finished steps)."""
    history = trainer.history
    if cadence.evaluate_first(start_step):
        trainer.evaluate(0)
    for step in range(start_step, cadence.total_steps):
        history.append(trainer.train_step(step))
        done = step + 1
        if cadence.stop_here(done, stop_after):
            trainer.save(done)
            return history
        if cadence.evaluate_after(done):
            trainer.evaluate(done)
        if cadence.save_after(done):
            trainer.save(done)
    if cadence.eval_at_end:
        trainer.evaluate(cadence.total_steps)
    if not cadence.save_after(cadence.total_steps):
        trainer.save(cadence.total_steps)
    trainer.save_final()
    return history
