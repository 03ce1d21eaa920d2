"""A difficulty curriculum: prompts the policy always solves or always fails come up less often
(kept with chance `curriculum.keep_prob`, from each example's last group). The draw is seeded
by (seed, position) and the estimates travel in checkpoints, so a resumed run draws alike.
Design: docs/training.md#curriculum.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass, field

from rlvr.batch import GroupResult
from rlvr.config import CurriculumConfig
from rlvr.pass_at_k import succeeded


@dataclass
class Curriculum:
    """The pass-rate estimates and the draw that keeps or passes over a prompt."""

    cfg: CurriculumConfig
    seed: int
    rates: dict[int, float] = field(default_factory=dict)
    """Example id -> the pass rate of its last group."""

    def keeps(self, example_id: int, position: int) -> bool:
        """Use the example at this position of the prompt order?"""
        rate = self.rates.get(example_id)
        if rate is None or 0.0 < rate < 1.0:
            return True
        return random.Random(self.seed * 1_000_003 + position).random() < self.cfg.keep_prob

    def observe(self, groups: Iterable[GroupResult]) -> None:
        """Update the estimates with finished groups (a group whose rollouts all errored
        tells nothing and is left out)."""
        bar = self.cfg.pass_threshold
        for group in groups:
            if group.rollouts:
                passed = sum(succeeded(r.reward, bar) for r in group.rollouts)
                self.rates[group.rollouts[0].example_id] = passed / len(group.rollouts)

    def snapshot(self) -> dict[int, float]:
        return dict(self.rates)


def curriculum_metrics(rates: dict[int, float], set_aside: int) -> dict[str, float]:
    """`curriculum/`: the shares of tracked examples judged solved and hopeless, how many are
    tracked, and the prompts the step passed over."""
    tracked = max(len(rates), 1)
    return {
        "curriculum/solved_frac": sum(r == 1.0 for r in rates.values()) / tracked,
        "curriculum/hopeless_frac": sum(r == 0.0 for r in rates.values()) / tracked,
        "curriculum/tracked": len(rates),
        "curriculum/set_aside": set_aside,
    }
