"""What one evaluation of the served policy reports (`EvalResult`): mean reward, the rubric's
metric means, pass@k, errored and truncated counts, and per environment for a mixture; and the
names it logs them under (`eval/...`, `eval/<environment>/...`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rlvr.batch import GroupResult
from rlvr.finite import metric_means
from rlvr.pass_at_k import mean_pass_at_k, succeeded


@dataclass
class EvalResult:
    """One evaluation of the served policy on the environment's eval set."""

    reward: float
    metrics: dict[str, float]
    num_rollouts: int
    errored: int
    truncated: int
    pass_at_k: dict[int, float] = field(default_factory=dict)
    """pass@k over the examples (k = 1, 2, 4, ... up to the rollouts per example): a rollout
    succeeds when its reward reaches `eval.pass_threshold`; an errored one fails."""
    per_env: dict[str, EvalResult] = field(default_factory=dict)
    """A mixture's evaluation of each environment on its own eval set (empty for one
    environment); the fields above then cover all of them together."""

    @classmethod
    def of(cls, groups: list[GroupResult], pass_threshold: float) -> EvalResult:
        """The evaluation that `groups` (one per eval example) make."""
        rollouts = [r for g in groups for r in g.rollouts]
        n = len(rollouts)
        passed = [sum(succeeded(r.reward, pass_threshold) for r in g.rollouts) for g in groups]
        tallies = [(len(g.rollouts) + g.errored, c) for g, c in zip(groups, passed, strict=True)]
        return cls(
            reward=sum(r.reward for r in rollouts) / n if n else 0.0,
            metrics=dict(sorted(metric_means(r.metrics for r in rollouts).items())),
            num_rollouts=n,
            errored=sum(g.errored for g in groups),
            truncated=sum(r.truncated for r in rollouts),
            pass_at_k=mean_pass_at_k(tallies),
        )

    def logged(self, prefix: str) -> dict[str, float]:
        """The metrics this evaluation logs under `prefix` (`eval`, `eval/<environment>`)."""
        return {
            f"{prefix}/reward": self.reward,
            **{f"{prefix}/{k}": v for k, v in self.metrics.items()},
            f"{prefix}/rollouts": self.num_rollouts,
            f"{prefix}/errored": self.errored,
            f"{prefix}/truncated": self.truncated,
            **{f"{prefix}/pass@{k}": value for k, value in self.pass_at_k.items()},
        }
