"""Keeping the trainer off the cores vf-vllm generates on, when both share one CPU.

`pin_to_cores` binds the trainer's torch threads to `batch.trainer_cores`, so generation
running ahead (`batch.async_level` >= 1) does not share a core with the busy vLLM CPU worker.
Whether that pays depends on the machine: bench/train_step.py measures it, docs/benchmarks.md
has the numbers.
"""

from __future__ import annotations

import os

import torch


def pin_to_cores(cores: list[int]) -> None:
    """Run every thread of this process (and those it starts later) on `cores`, with as many
    torch threads as cores."""
    available = os.sched_getaffinity(0)
    if not set(cores) <= available:
        raise ValueError(
            f"batch.trainer_cores={cores}: this process may only use {sorted(available)}"
        )
    set_affinity(cores)
    torch.set_num_threads(len(cores))


def set_affinity(cores: list[int] | set[int]) -> None:
    """Every thread of this process on `cores`, unchecked: also to widen it back to the cores
    it had before `pin_to_cores` (which refuses cores outside the current affinity)."""
    for task in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(task), cores)
        except ProcessLookupError:  # a thread that ended meanwhile
            continue
