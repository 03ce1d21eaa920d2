"""What a run shows on the console, and how a step's values are reduced to metrics."""

import math

import numpy as np
import pytest

from rlvr.finite import finite_number, metric_means
from rlvr.trainer.metrics import distribution, step_line


def test_a_step_line_shows_the_reward_the_environments_metrics_kl_and_time():
    """Without a progress bar (log files, `make demo`) each GRPO step is one readable line;
    the environment's metrics say what the reward is made of, and a step that trained nothing
    says so where its mismatch-KL would be."""
    metrics = {
        "reward/mean": 0.234375,
        "env/has_boxed": 0.921875,
        "env/correct": 0.234375,
        "mismatch_kl": 1.2e-11,
        "time/step": 15.84,
        "loss/pg": 0.1,
    }
    assert step_line(3, 10, metrics) == (
        "step 3/10 | reward 0.234 | env/has_boxed 0.922  env/correct 0.234 | "
        "mismatch-KL 1.2e-11 | 15.8 s"
    )
    bare = {"reward/mean": 0.0, "mismatch_kl": 0.0, "time/step": 2.0}
    assert step_line(1, 1, bare) == "step 1/1 | reward 0.000 | mismatch-KL 0 | 2.0 s"
    flat = {"reward/mean": 0.0, "time/step": 2.0}
    assert step_line(2, 2, flat) == "step 2/2 | reward 0.000 | nothing trained | 2.0 s"
    one = {**bare, "servers/up": 1, "servers/total": 1}
    assert step_line(1, 1, one) == step_line(1, 1, bare), "one server goes without saying"
    lost = {**bare, "servers/up": 1, "servers/total": 2}
    assert step_line(1, 1, lost) == "step 1/1 | reward 0.000 | mismatch-KL 0 | servers 1/2 | 2.0 s"


def test_metric_reduction_leaves_out_what_is_not_a_finite_number():
    """statistics.pstdev raises "'float' object has no attribute 'numerator'" on NaN;
    infinities, None and strings are no numbers to average either."""
    values = [1.0, float("nan"), 0.0, float("inf"), np.float32(1.0), None, "1", True]
    assert distribution("reward", values) == {
        "reward/mean": pytest.approx(2 / 3),
        "reward/std": pytest.approx(math.sqrt(2) / 3),
        "reward/min": 0.0,
        "reward/max": 1.0,
    }
    assert distribution("reward", [float("nan")]) == {}
    rollouts = [{"f1": 0.5, "em": float("nan")}, {"f1": np.float64(1.0), "em": 1}, "broken"]
    assert metric_means(rollouts, "env") == {"env/f1": 0.75, "env/em": 1.0}
    assert [finite_number(v) for v in (2, np.int64(3), -float("inf"), False)] == [
        2.0,
        3.0,
        None,
        None,
    ]
