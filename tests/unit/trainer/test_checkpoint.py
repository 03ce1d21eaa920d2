"""Checkpoint files that outlive a refactor: the in-flight rollout batches a run saved."""

from __future__ import annotations

import pickle

from rlvr.batch import GroupResult, RolloutResult, Sample, StepBatch
from rlvr.trainer.checkpoint import IN_FLIGHT_FILE, load_in_flight

OLD_HOMES = {
    b"rlvr.batch\nSample": b"rlvr.trainer.micro_batches\nSample",
    b"rlvr.batch\nRolloutResult": b"rlvr.rollouts.to_samples\nRolloutResult",
    b"rlvr.batch\nGroupResult": b"rlvr.rollouts.groups\nGroupResult",
    b"rlvr.batch\nStepBatch": b"rlvr.rollouts.groups\nStepBatch",
}


def test_in_flight_batches_saved_before_the_nouns_moved_still_load(tmp_path):
    """A checkpoint written before the step's nouns moved to `rlvr.batch` names their old
    modules; a resumed run still reads its in-flight batches, as the same types."""
    sample = Sample([1, 2, 3], [0, 1, 1], [0.0, -0.5, -0.25], advantage=0.5)
    rollout = RolloutResult(7, 1.0, {"correct": 1.0}, [sample], False, 1, 2, "p", "c", "42")
    batch = StepBatch(3, [GroupResult([rollout], errored=1, errors=["boom"])], 12, 0, 1.5, 2)
    data = pickle.dumps([batch], protocol=0)  # text opcodes name each class's module
    for new, old in OLD_HOMES.items():
        assert new in data
        data = data.replace(new, old)
    (tmp_path / IN_FLIGHT_FILE).write_bytes(data)

    (loaded,) = load_in_flight(tmp_path)

    assert type(loaded) is StepBatch and loaded == batch
    assert type(loaded.groups[0].rollouts[0].samples[0]) is Sample
