"""vf-eval vf-planner end to end: the embedded SmolLM2 is both the planner and the worker, through
one real vf-vllm on the CPU. The model is tiny, so the score may be low; the run must complete
and save results with the planner metrics and each rollout's pipeline trace."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlvr.eval.vf_eval import run_vf_eval

pytestmark = [pytest.mark.integration, pytest.mark.slow]

METRICS = {"correct", "decomposed", "worker_tokens", "planner_tokens", "parse_failure"}


def test_vf_eval_planner_with_smollm2(smollm2_server, shared_data: Path, tmp_path: Path):
    env_args = {
        "data_files": str(shared_data / "gsm8k" / "test.jsonl"),
        "split": "test",
        "max_examples": 2,
        "worker_max_tokens": 128,
    }
    rows = run_vf_eval(
        "vf-planner",
        model=smollm2_server.model,
        base_url=smollm2_server.base_url,
        output_dir=tmp_path,
        num_examples=2,
        max_tokens=256,
        env_args=env_args,
        sampling_args=smollm2_server.sampling_args,
        state_columns=["planner"],
        timeout=1500,
    )
    assert len(rows) == 2
    for row in rows:  # shown with -s: what the tiny planner and worker actually did
        print(row["reward"], row["metrics"], row["planner"]["parse_error"])
    for row in rows:
        assert METRICS <= set(row["metrics"]), row["metrics"]
        assert 0.0 <= row["reward"] <= 1.5
        trace = row["planner"]  # saved with -C planner: a parse error or the worker's final reply
        assert trace["parse_error"] or trace["worker_error"] or trace["final_reply"]
