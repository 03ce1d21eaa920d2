"""A served episode's message graph -> the rollout state the trainer samples from."""

from __future__ import annotations

import pytest

from rlvr.envserver.episode import episode_error, episode_state, is_truncated, reward, trajectory
from rlvr.rollouts.to_samples import rollout_result


def node(parent, ids, sampled_from=None, logprobs=(), role="user", links=()):
    """A wire node: `ids`, mask True from index `sampled_from` on (None: an input message)."""
    mask = [sampled_from is not None and i >= sampled_from for i in range(len(ids))]
    return {
        "parent": parent,
        "token_ids": list(ids),
        "mask": mask,
        "logprobs": list(logprobs),
        "sampled": sampled_from is not None,
        "message": {"role": "assistant" if sampled_from is not None else role, "content": "x"},
        "semantic_parents": list(links),
    }


def trace(nodes, calls=(), rewards=None, **extra):
    return {
        "version": 1,
        "agent": {"trainable": True},
        "nodes": nodes,
        "calls": list(calls),
        "rewards": rewards or {"correct": {"score": 1.0, "weight": 1.0}},
        "metrics": {},
        "errors": [],
        **extra,
    }


def episode(*traces, ok=True, errors=()):
    return {"ok": ok, "errors": list(errors), "traces": list(traces)}


def test_a_three_turn_chat_is_one_sample_masked_on_the_sampled_tokens_only() -> None:
    nodes = [
        node(None, [1, 2], role="system"),
        node(0, [3]),
        node(1, [90, 10, 11], sampled_from=1, logprobs=[-0.1, -0.2]),
        node(2, [4, 5]),
        node(3, [91, 12], sampled_from=1, logprobs=[-0.3]),
    ]
    state = episode_state(episode(trace(nodes)), {"example_id": 7})
    (sample,) = rollout_result(state, max_seq_len=100, mask_truncated=False).samples
    assert sample.input_ids == [1, 2, 3, 90, 10, 11, 4, 5, 91, 12]
    assert sample.loss_mask == [0, 0, 0, 0, 1, 1, 0, 0, 0, 1]
    assert sample.sampler_logprobs == [0, 0, 0, 0, -0.1, -0.2, 0, 0, 0, -0.3]


def test_each_branch_is_a_sample_and_a_shared_sampled_node_trains_once() -> None:
    nodes = [
        node(None, [1]),
        node(0, [9, 20, 21], sampled_from=1, logprobs=[-1.0, -2.0]),  # shared by both
        node(1, [2]),
        node(2, [9, 30], sampled_from=1, logprobs=[-3.0]),  # leaf of branch 1
        node(1, [3]),
        node(4, [9, 40], sampled_from=1, logprobs=[-4.0]),  # leaf of branch 2
    ]
    state = episode_state(episode(trace(nodes)), {})
    first, second = rollout_result(state, max_seq_len=100, mask_truncated=False).samples
    assert first.input_ids == [1, 9, 20, 21, 2, 9, 30]
    assert first.loss_mask == [0, 0, 1, 1, 0, 0, 1]
    assert second.input_ids == [1, 9, 20, 21, 3, 9, 40]
    assert second.loss_mask == [0, 0, 0, 0, 0, 0, 1]
    assert second.sampler_logprobs[-1] == -4.0


def test_a_compaction_attempt_nobody_resumed_from_does_not_train() -> None:
    nodes = [
        node(None, [1]),
        node(0, [9, 5], sampled_from=1, logprobs=[-1.0], links=[{"type": "compaction_attempt"}]),
        node(0, [2]),
        node(2, [9, 6], sampled_from=1, logprobs=[-2.0]),
    ]
    turns = trajectory(trace(nodes))
    assert [t["tokens"]["completion_ids"] for t in turns] == [[6]]
    nodes[3]["semantic_parents"] = [{"type": "compaction", "node": 1}]
    assert [t["tokens"]["completion_ids"] for t in trajectory(trace(nodes))] == [[5], [6]]


def test_reward_is_the_sum_of_score_times_weight_of_the_scored_entries() -> None:
    rewards = {"a": {"score": 0.5, "weight": 2.0}, "b": {"score": 1.0, "weight": 0.25}, "c": None}
    assert reward({"rewards": rewards}) == pytest.approx(1.25)
    assert reward({"rewards": {"a": {"score": float("nan"), "weight": 1.0}}}) is None


def test_truncation_follows_the_stop_condition_and_the_last_good_call() -> None:
    length = {"finish_reason": "length", "error": None}
    failed = {"finish_reason": "stop", "error": {"type": "X", "message": "boom"}}
    assert is_truncated({"stop_condition": "max_turns", "calls": []})
    assert is_truncated({"stop_condition": None, "calls": [length, failed]})
    assert not is_truncated({"stop_condition": None, "calls": [length, {"finish_reason": "stop"}]})
    cut = trace([node(None, [1]), node(0, [9, 5], sampled_from=1, logprobs=[-1.0])])
    cut["calls"] = [{"node": 1, "finish_reason": "length"}]
    result = rollout_result(episode_state(episode(cut), {}), 100, mask_truncated=True)
    assert result.truncated and result.capped_reply and result.samples == []


def test_max_seq_len_cuts_an_episode_as_it_cuts_a_classic_turn() -> None:
    """A 28-token sample at max_seq_len 16: the turn keeps the 16 tokens that fit, no loss
    token lies past them, it is marked truncated (so mask_truncated drops it), and the
    overlong penalty still measures its 17-token reply as generated, which stopped on its own."""
    reply = node(0, [90, *range(100, 117)], sampled_from=1, logprobs=[-0.5] * 17)
    long = trace([node(None, list(range(1, 11))), reply])
    long["calls"] = [{"node": 1, "finish_reason": "stop"}]
    state = episode_state(episode(long), {})
    result = rollout_result(state, max_seq_len=16, mask_truncated=False)
    (sample,) = result.samples
    assert len(sample) == 16 and sample.loss_mask == [0] * 11 + [1] * 5
    assert result.truncated and not result.capped_reply and result.longest_reply == 17
    assert rollout_result(state, max_seq_len=16, mask_truncated=True).samples == []
    assert not rollout_result(state, max_seq_len=28, mask_truncated=True).truncated


def test_an_errored_or_unfinished_or_multi_agent_episode_cannot_train() -> None:
    one = trace([node(None, [1]), node(0, [9, 5], sampled_from=1, logprobs=[-1.0])])
    assert episode_error(episode(one)) is None
    assert "Boom: no" in episode_error(episode(one, errors=[{"type": "Boom", "message": "no"}]))
    assert episode_error(episode(one, ok=False)) == "the episode did not complete"
    assert "2 trainable traces" in episode_error(episode(one, dict(one)))
    assert episode_state(episode(one, ok=False), {"example_id": 3})["error"]


def test_metrics_carry_each_named_score_and_the_traces_own_metrics() -> None:
    one = trace(
        [node(None, [1]), node(0, [9, 5], sampled_from=1, logprobs=[-1.0])],
        rewards={"exact": {"score": 0.0, "weight": 1.0}, "close": {"score": 0.8, "weight": 0.5}},
        metrics={"chars": 12.0, "skipped": None},
    )
    state = episode_state(episode(one), {})
    assert state["reward"] == pytest.approx(0.4)
    assert state["metrics"] == {"exact": 0.0, "close": 0.8, "chars": 12.0}


def test_logprobs_that_do_not_match_the_sampled_tokens_are_refused() -> None:
    bad = trace([node(None, [1]), node(0, [9, 5, 6], sampled_from=1, logprobs=[-1.0])])
    with pytest.raises(ValueError, match="2 sampled tokens but 1 log-probabilities"):
        trajectory(bad)
