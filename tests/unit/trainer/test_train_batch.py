"""What a step's rollouts become in training (`build_train_batch`): a mixture's metrics per
environment, and DAPO's soft overlong penalty, which shapes advantages and nothing else."""

from __future__ import annotations

import pytest

from rlvr.batch import GroupResult, RolloutResult, Sample, StepBatch
from rlvr.config import load_config
from rlvr.trainer.advantages import overlong_penalty
from rlvr.trainer.train_batch import build_train_batch


def rollout(reward: float, longest: int = 4, metrics: dict | None = None) -> RolloutResult:
    sample = Sample([1, 2, 3], [0, 1, 1], [0.0, -1.0, -1.0])
    return RolloutResult(
        0, reward, metrics or {}, [sample], False, 1, longest, "p", "c", longest_turn=longest
    )


def step(*groups: GroupResult) -> StepBatch:
    return StepBatch(
        0, list(groups), data_position=0, skipped_prompts=0, generate_s=1.0, min_policy_version=0
    )


def test_mixture_metrics_per_environment():
    """Each environment of a mixture logs its groups, rewards and own rubric metrics under
    `env/<name>/`, and the sample table names the environment of each row; a step of one
    environment logs none of that."""
    math = [rollout(r, metrics={"correct": r}) for r in (1.0, 0.0)]
    games = [rollout(r, metrics={"legal": 1.0}) for r in (0.5, 0.5)]
    batch = step(
        GroupResult(math, env="math"),
        GroupResult(math, env="math"),
        GroupResult(games, env="games"),
    )
    train = build_train_batch(batch, load_config(overrides=["logging.samples_per_step=6"]))
    metrics = train.metrics
    assert metrics["env/math/groups"] == 2 and metrics["env/games/groups"] == 1
    assert metrics["env/math/reward/mean"] == 0.5 and metrics["env/math/reward/max"] == 1.0
    assert metrics["env/games/reward/mean"] == 0.5 and metrics["env/games/legal"] == 1.0
    assert metrics["env/math/correct"] == 0.5 and "env/games/correct" not in metrics
    assert [row["env"] for row in train.table] == ["math"] * 4 + ["games"] * 2
    single = build_train_batch(step(GroupResult(math)), load_config())
    assert not any(k.startswith("env/math") for k in single.metrics)
    assert "env" not in single.table[0]


@pytest.mark.parametrize(
    ("longest", "expected"),
    [(10, 0.0), (12, 0.0), (14, 0.25), (20, 1.0)],
)
def test_overlong_penalty_formula(longest, expected):
    """DAPO's soft overlong punishment with a reply cap of 20 tokens and a buffer of 8: none up
    to 12 tokens, linear to the full penalty (0.5 here) at the cap."""
    loss = load_config(overrides=["loss.overlong_buffer=8", "loss.overlong_penalty=0.5"]).loss
    assert overlong_penalty(rollout(1.0, longest), 20, loss) == pytest.approx(0.5 * expected)
    assert overlong_penalty(rollout(1.0, longest), 20, load_config().loss) == 0.0  # off
    assert overlong_penalty(rollout(1.0, longest), None, loss) == 0.0  # no cap known


def test_overlong_penalty_shapes_advantages_only():
    """Two right answers, one of them cut at its cap: the penalty splits them (the short one
    gets the positive advantage) while the logged rewards stay the environment's."""
    cfg = load_config(overrides=["loss.overlong_buffer=8"])
    group = GroupResult([rollout(1.0, 5), rollout(1.0, 20)], reply_cap=20)
    train = build_train_batch(step(group), cfg)
    short, cut = (s.advantage for s in train.samples)
    assert short > 0 > cut
    assert train.metrics["reward/mean"] == 1.0
    assert train.metrics["rollouts/overlong_penalty"] == 0.5
    plain = build_train_batch(step(group), load_config())
    assert all(s.advantage == 0 for s in plain.samples)
    assert "rollouts/overlong_penalty" not in plain.metrics
