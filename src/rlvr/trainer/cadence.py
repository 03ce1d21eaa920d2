"""When a training run evaluates and checkpoints, shared by the GRPO and SFT trainers.

Each trainer owns its `for step` loop and asks a `Cadence` what is due after a step, so both
agree on the details that matter for resuming: a stop after k steps (as an interrupted run)
always leaves a checkpoint at k; the last step always has one, written once even when it falls
on the cadence; an evaluation due on the last step runs once, after it.
"""

from __future__ import annotations

from dataclasses import dataclass


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
