"""What a step's rollouts become in training (`build_train_batch`): a mixture's metrics per
environment, and DAPO's soft overlong penalty, which shapes advantages and nothing else."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from rlvr.batch import GroupResult, RolloutResult, Sample, StepBatch
from rlvr.config import load_config
from rlvr.rollouts.to_samples import rollout_result
from rlvr.trainer.advantages import overlong_penalty
from rlvr.trainer.train_batch import build_train_batch


def rollout(
    reward: float, longest: int = 4, metrics: dict | None = None, cut: bool = False
) -> RolloutResult:
    sample = Sample([1, 2, 3], [0, 1, 1], [0.0, -1.0, -1.0])
    return RolloutResult(
        0, reward, metrics or {}, [sample], cut, 1, longest, "p", "c", "", longest, cut
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


def test_overlong_penalty_is_linear_in_flat_groups():
    """The penalty is subtracted after the std division, centred and unscaled: in a group whose
    environment rewards are all equal, the advantages are the penalty's own deviations, so a
    reply one token into the buffer loses 1/8 of what a reply cut at the cap loses (scaling
    by the penalty's own spread would give both about -1.4). Such a group counts as zero
    variance, and `drop_zero_variance` drops it; elsewhere the rewards' std scales the rewards
    alone."""
    cfg = load_config(overrides=["loss.overlong_buffer=8"])
    flat = GroupResult([rollout(1.0, n) for n in (10, 13, 20)], reply_cap=20)
    two = GroupResult([rollout(1.0, n) for n in (12, 13)], reply_cap=20)
    mixed = GroupResult([rollout(1.0, 13), rollout(0.0, 10)], reply_cap=20)
    train = build_train_batch(step(flat, two, mixed), cfg)
    advantages = [s.advantage for s in train.samples]
    penalties = [0.0, 1 / 8, 1.0]
    mean = sum(penalties) / 3
    assert advantages[:3] == pytest.approx([mean - p for p in penalties])
    assert advantages[3:5] == pytest.approx([1 / 16, -1 / 16])
    assert advantages[5:] == pytest.approx([1 - 1 / 16, -1 + 1 / 16], abs=1e-5)
    assert train.metrics["rollouts/zero_variance_groups"] == 2
    drop = load_config(overrides=["loss.overlong_buffer=8", "loss.drop_zero_variance=true"])
    dropped = build_train_batch(step(flat, two, mixed), drop)
    assert dropped.metrics["rollouts/dropped_groups"] == 2 and len(dropped.samples) == 2


def turn(prompt: int, completion: int, truncated: bool = False, **reply) -> dict:
    """A trajectory step as verifiers records it: a turn cut to `max_seq_len` keeps only the
    completion ids that fit, and is marked truncated (as is one that stopped at max_tokens).
    `reply` (`generated`, `finish`): the server's response beside it, with the completion as
    generated and its finish reason."""
    step = {
        "tokens": {
            "prompt_ids": list(range(prompt)),
            "completion_ids": [7] * completion,
            "completion_logprobs": [-0.5] * completion,
        },
        "is_truncated": truncated,
    }
    if reply:
        tokens = SimpleNamespace(completion_ids=[7] * reply["generated"])
        message = SimpleNamespace(tokens=tokens, finish_reason=reply["finish"])
        step["response"] = SimpleNamespace(message=message)
    return step


def test_overlong_penalty_counts_cut_replies():
    """Prompt 600, max_tokens 1024, max_seq_len 1200: a reply that ran to its cap keeps 600 of
    its tokens after verifiers' cut, and still gets the full penalty; so does a reply that
    stopped at max_tokens. The penalty measures each turn, not the rollout's turns together:
    two turns of 700 tokens are 1,400 tokens of replies but none reaches the buffer."""
    loss = load_config(overrides=["loss.overlong_buffer=256"]).loss
    ran = {"generated": 1024, "finish": "length"}
    for step in [turn(600, 600, True), turn(600, 600, True, **ran)]:
        cut = rollout_result({"reward": 1.0, "trajectory": [step]}, 1200, False)
        assert cut.capped_reply and overlong_penalty(cut, 1024, loss) == 1.0
    capped = rollout_result({"reward": 1.0, "trajectory": [turn(10, 1024, True)]}, 4096, False)
    assert overlong_penalty(capped, 1024, loss) == 1.0
    turns = [turn(10, 700), turn(720, 700)]
    two = rollout_result({"reward": 1.0, "trajectory": turns}, 4096, False)
    assert (two.longest_reply, two.capped_reply) == (700, False)
    assert overlong_penalty(two, 1024, loss) == 0
    ramp = rollout_result({"reward": 1.0, "trajectory": [turn(10, 896)]}, 4096, False)
    assert overlong_penalty(ramp, 1024, loss) == 0.5


def test_overlong_penalty_measures_the_reply_not_the_cut():
    """max_seq_len 1200, max_tokens 1024: a 20-token reply that stopped on its own after a
    1,190-token prompt is cut to 10 tokens and marked truncated, yet reached nowhere near its
    cap (DAPO's eq. 13: no penalty); an 896-token reply that stopped after a 600-token prompt
    (cut to 600) pays what 896 tokens pay, not the cap's."""
    loss = load_config(overrides=["loss.overlong_buffer=256"]).loss
    short = turn(1190, 10, True, generated=20, finish="stop")
    result = rollout_result({"reward": 1.0, "trajectory": [short]}, 1200, False)
    assert result.truncated and not result.capped_reply and result.longest_reply == 20
    assert overlong_penalty(result, 1024, loss) == 0.0
    long = turn(600, 600, True, generated=896, finish="stop")
    result = rollout_result({"reward": 1.0, "trajectory": [long]}, 1200, False)
    assert overlong_penalty(result, 1024, loss) == 0.5
    as_dict = {"message": {"tokens": {"completion_ids": [7] * 20}, "finish_reason": "stop"}}
    kept = {**turn(1190, 10, True), "response": as_dict}
    result = rollout_result({"reward": 1.0, "trajectory": [kept]}, 1200, False)
    assert (result.longest_reply, result.capped_reply) == (20, False)
