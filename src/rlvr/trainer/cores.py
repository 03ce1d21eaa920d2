"""Keeping the trainer off the cores vf-vllm generates on, when both share one CPU.

vLLM's CPU worker binds its threads to fixed cores (`VLLM_CPU_OMP_THREADS_BIND`; by default
every core but the last, which it leaves to its front end). A trainer whose torch threads
spread over all cores then shares one with the busy worker whenever generation runs ahead
(`batch.async_level` >= 1), and every parallel region waits for its slowest thread. Pinned
to the other cores (`batch.trainer_cores`), the trainer computes with fewer threads but at full
speed on each, while generation proceeds beside it. Which wins depends on the machine:
bench/train_step.py measures the three ways (no overlap, shared cores, disjoint cores) in one
run, and docs/benchmarks.md has what it measured.
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
