"""vf-eval vf-openspiel end to end through one real vf-vllm on the CPU serving the tiny random
model. Its replies are random text, so it mostly forfeits by illegal moves; the run must finish
and save results with the game metrics and the game record for every default case (a game whose
prompt outgrows the tiny model's context is aborted, and scores 0)."""

from __future__ import annotations

from pathlib import Path

import pytest
from vf_openspiel import DEFAULT_CASES

from rlvr.eval.vf_eval import run_vf_eval

pytestmark = pytest.mark.integration

METRICS = {"outcome", "legal_rate", "win", "draw", "loss", "illegal_attempts", "game_length"}


def test_vf_eval_openspiel_with_tiny_model(tiny_server, tmp_path: Path):
    """No -n / -r: vf-eval takes the package's [tool.verifiers.eval] table (21 x 1), which with one
    task per case is one game of every default case."""
    rows = run_vf_eval(
        "vf-openspiel",
        model=tiny_server.model,
        base_url=tiny_server.base_url,
        output_dir=tmp_path,
        num_examples=None,
        rollouts_per_example=None,
        max_tokens=48,
        env_args={"num_tasks_per_case": 1},
        sampling_args=tiny_server.sampling_args,
        state_columns=["openspiel"],
    )
    assert sorted(row["openspiel"]["case"] for row in rows) == sorted(DEFAULT_CASES)
    for row in rows:
        assert METRICS <= set(row["metrics"]), row["metrics"]
        record = row["openspiel"]
        assert record["ended_by"] in {"game_over", "forfeit", "aborted"}, record
        assert 0.0 <= row["reward"] <= 1.0
        if record["ended_by"] != "game_over":
            assert row["reward"] == 0.0
