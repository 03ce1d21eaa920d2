"""vf-eval vf-openspiel end to end through one real vf-vllm on the CPU serving the tiny random
model. Its replies are random text, so it mostly forfeits by illegal moves; the run must finish
every game (no aborted rollouts) and save results with the game metrics and the game record."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlvr.evaluation import run_vf_eval

pytestmark = pytest.mark.integration

METRICS = {"outcome", "legal_rate", "win", "draw", "loss", "illegal_attempts", "game_length"}


def test_vf_eval_openspiel_with_tiny_model(tiny_server, tmp_path: Path):
    env_args = {"game_types": "tic_tac_toe,kuhn_poker", "num_tasks_per_case": 1}
    rows = run_vf_eval(
        "vf-openspiel",
        model=tiny_server.model,
        base_url=tiny_server.base_url,
        output_dir=tmp_path,
        num_examples=2,
        max_tokens=48,
        env_args=env_args,
        sampling_args=tiny_server.sampling_args,
        state_columns=["openspiel"],
    )
    assert sorted(row["openspiel"]["case"] for row in rows) == ["kuhn_poker", "tic_tac_toe"]
    for row in rows:
        assert METRICS <= set(row["metrics"]), row["metrics"]
        record = row["openspiel"]
        assert record["ended_by"] in {"game_over", "forfeit"}, record
        assert 0.0 <= row["reward"] <= 1.0
        if record["ended_by"] == "forfeit":
            assert row["reward"] == 0.0
