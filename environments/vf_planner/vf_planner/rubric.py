"""The planner's reward: correctness, then efficiency and independence for correct answers only.

    reward = w_c * C + w_t * C * E * S + w_i * C * I

    C   = 1 if the worker's final number equals the gold number and the plan's texts did not do
          the work (`plan_leak`, pipeline.py), else 0
    E   = B / (B + W + P)                  efficiency against the direct-solve baseline, in (0, 1)
          B = worker tokens of the direct solve of this problem (measured once, same worker)
          W = worker tokens this plan spent (direct solve, or subproblems + combination)
          P = tokens the planner generated
    I   = share of the subproblems whose result is a new intermediate result of the reference
          solution that follows from the problem's numbers they state (independence.py), in
          [0, 1]; 0 for an atomic plan, and 0 for a plan that is a direct solve in disguise
          (`not_decomposed`, pipeline.py: it earns w_c, less than the atomic plan)
    S   = 1 for an atomic plan, I for a decomposed one: a decomposition's savings are credited
          for the share of its subproblems that did a step of the work

Range: [0, w_c + w_t + w_i] ([0, 1.5] with the defaults). Malformed plans, plan texts that do the
work themselves (pipeline.py) and worker failures score 0. I is read from what the worker
computed from each subproblem alone, so copying, restating or paraphrasing the problem, or
padding with unrelated questions, earns none of it. A decomposition whose subproblems did none
of the work (the planner solved the problem and the subproblems only look busy) is a direct
solve in disguise: it earns w_c, less than the atomic plan's w_c + w_t * E, so it never pays to
pretend; an atomic plan is not charged for being atomic (it only forgoes w_i * I).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

import verifiers as vf

from vf_planner.outcome_rubric import OutcomeRubric
from vf_planner.pipeline import Outcome, PlannerPipeline, outcome_from_state


@dataclass(frozen=True)
class RewardWeights:
    correctness: float = 1.0
    token: float = 0.2
    independence: float = 0.3

    def __post_init__(self) -> None:
        for name in ("correctness", "token", "independence"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}_weight must be >= 0, got {getattr(self, name)}")


def efficiency(baseline_tokens: int, worker_tokens: int, planner_tokens: int) -> float:
    """E = B / (B + W + P): 0.5 when a plan costs what a direct solve costs, toward 1 if cheaper."""
    total = baseline_tokens + worker_tokens + planner_tokens
    return baseline_tokens / total if total > 0 else 0.0


def reward_components(outcome: Outcome) -> dict[str, float]:
    """The three weighted terms of the reward, each in [0, 1]."""
    correct = float(outcome.correct)
    credited = outcome.independence if outcome.decomposed else 1.0
    return {
        "correct": correct,
        "efficiency_bonus": correct
        * credited
        * efficiency(outcome.baseline_tokens, outcome.worker_tokens, outcome.planner_tokens),
        "independence_bonus": correct * outcome.independence,
    }


def _component(name: str) -> Callable[[Outcome], float]:
    return lambda o: reward_components(o)[name]


TERMS: dict[str, Callable[[Outcome], float]] = {
    name: _component(name) for name in ("correct", "efficiency_bonus", "independence_bonus")
}
"""The reward's terms (weighted by `RewardWeights`), logged first."""

# Logged with weight 0, so every input of the reward can be inspected per rollout.
METRICS: dict[str, Callable[[Outcome], float]] = {
    "decomposed": lambda o: float(o.decomposed),
    "num_subproblems": lambda o: float(len(o.subproblems)),
    "counted_subproblems": lambda o: float(sum(o.counted)),
    "planner_tokens": lambda o: float(o.planner_tokens),
    "worker_tokens": lambda o: float(o.worker_tokens),
    "baseline_tokens": lambda o: float(o.baseline_tokens),
    "efficiency": lambda o: efficiency(o.baseline_tokens, o.worker_tokens, o.planner_tokens),
    "independence": lambda o: o.independence,
    "parse_failure": lambda o: float(o.parse_error is not None),
    "plan_leak": lambda o: float(o.plan_leak is not None),
    "not_decomposed": lambda o: float(o.not_decomposed is not None),
    "worker_error": lambda o: float(o.worker_error is not None),
}


class PlannerRubric(OutcomeRubric[Outcome]):
    """Runs the worker pipeline once per rollout and scores its outcome."""

    def __init__(self, pipeline: PlannerPipeline, weights: RewardWeights) -> None:
        terms = {
            "correct": weights.correctness,
            "efficiency_bonus": weights.token,
            "independence_bonus": weights.independence,
        }
        super().__init__({**TERMS, **METRICS}, terms, parser=pipeline.parser)
        self.pipeline = pipeline
        self.weights_config = weights

    async def read_outcome(self, state: vf.State) -> Outcome:
        """The pipeline's outcome, kept in state["planner"] (saved with `-C planner`); a state
        that already holds one (a saved result) is not run again."""
        saved = outcome_from_state(state)
        if saved is None:
            saved = await self.pipeline.run(state)
            state["planner"] = asdict(saved)
        return saved
