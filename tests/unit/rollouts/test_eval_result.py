"""What an evaluation during training reports and logs (`rlvr.rollouts.eval_result`)."""

from __future__ import annotations

import pytest

from rlvr.batch import GroupResult, RolloutResult
from rlvr.rollouts.eval_result import EvalResult


def _rollout(reward: float, metrics: dict[str, float], truncated: bool = False) -> RolloutResult:
    return RolloutResult(0, reward, metrics, [], truncated, 1, 2, "p", "c")


def test_an_evaluation_averages_each_metric_over_the_rollouts_that_report_it():
    groups = [
        GroupResult([_rollout(1.0, {"f1": 1.0, "em": 1.0}), _rollout(0.0, {"f1": 0.5})]),
        GroupResult([_rollout(0.5, {"f1": 0.0}, truncated=True)], errored=1),
    ]
    result = EvalResult.of(groups, pass_threshold=1.0)
    assert result.reward == pytest.approx(0.5)
    assert list(result.metrics) == ["em", "f1"]  # sorted by name
    assert result.metrics == {"em": 1.0, "f1": 0.5}
    assert (result.num_rollouts, result.errored, result.truncated) == (3, 1, 1)
    assert result.pass_at_k == {1: pytest.approx(0.25), 2: pytest.approx(0.5)}
    assert result.logged("eval/math") == {
        "eval/math/reward": result.reward,
        "eval/math/em": 1.0,
        "eval/math/f1": 0.5,
        "eval/math/rollouts": 3,
        "eval/math/errored": 1,
        "eval/math/truncated": 1,
        "eval/math/pass@1": result.pass_at_k[1],
        "eval/math/pass@2": result.pass_at_k[2],
    }


def test_an_evaluation_of_nothing_reports_zero():
    result = EvalResult.of([], pass_threshold=1.0)
    assert (result.reward, result.metrics, result.num_rollouts) == (0.0, {}, 0)
