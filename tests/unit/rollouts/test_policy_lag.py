"""Which weight versions generate a batch: with merged pushes and async_level >= 1, a push
that begins while a batch runs serves its later requests under the same name; adapter sync
names every request's version."""

from __future__ import annotations

import asyncio
import threading

import pytest
import verifiers as vf
from datasets import Dataset
from transformers import AutoTokenizer

from rlvr.config import load_config
from rlvr.rollouts.worker import RolloutWorker

from .test_rollouts import FINAL, ScriptedClient, correct, publish


class GatedClient(ScriptedClient):
    """Answers the first `free` requests at once and the rest once `gate` is set: a batch
    stays in flight until the test says."""

    def __init__(self, tokenizer, free: int, gate: threading.Event):
        super().__init__(tokenizer, [FINAL])
        self.free, self.gate = free, gate

    async def get_native_response(self, *args, **kwargs):
        self.free -= 1
        while self.free < 0 and not self.gate.is_set():
            await asyncio.sleep(0.01)
        return await super().get_native_response(*args, **kwargs)


@pytest.mark.parametrize(("names", "newest"), [("merged", 1), ("adapter", 0)])
def test_a_push_during_a_batch_is_counted_where_it_can_serve_it(tiny_model_dir, names, newest):
    """async_level 1: batch 1 starts with version 0; the trainer may push version 1 once it
    has started. Under one served name that push serves the batch's remaining requests
    (policy lag 1 down to 0); a per-version adapter name keeps the batch on version 0."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    env = vf.SingleTurnEnv(
        dataset=Dataset.from_list([{"question": f"q{i}", "answer": "42"} for i in range(4)]),
        rubric=vf.Rubric(funcs=[correct]),
    )
    cfg = load_config(
        overrides=[
            "batch.batch_size=4",
            "batch.rollouts_per_example=2",
            "batch.async_level=1",
            "max_steps=3",
        ]
    )
    gate = threading.Event()
    model = (lambda v: "policy") if names == "merged" else (lambda v: f"policy-v{v}")
    worker = RolloutWorker(
        env, env.get_dataset(), cfg, lambda url: GatedClient(tokenizer, 4, gate), served_name=model
    ).start()
    try:
        first = worker.get(0, timeout_s=60)  # its 4 requests answered; batch 1's wait
        publish(worker, 1)  # once batch 1 has started, as the trainer pushes version 1
        gate.set()
        second = worker.get(1, timeout_s=60)
    finally:
        gate.set()
        worker.close()
    assert (first.min_policy_version, first.newest_policy_version) == (0, 0)
    assert second.min_policy_version == 0 and second.newest_policy_version == newest
