"""vf-eval vf-deepscaler end to end against a real vf-vllm on the CPU (the tiny random model).

With no env args and no hub access, the environment falls back to its generated problems: this
is the fresh-machine path. The model's text is random, so only completion and saved results are
checked (rewards must still lie in [0, 1] with every metric logged); a second run scores the
real DeepScaleR rows with ``use_think``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rlvr.evaluation import run_vf_eval

pytestmark = [pytest.mark.integration, pytest.mark.slow]

METRICS = {"math_reward", "correct", "has_boxed", "completion_chars"}


def evaluate(server, out_dir: Path, env_args: dict) -> list[dict]:
    """Run vf-eval on 2 examples x 1 rollout and return the saved rollouts."""
    rows = run_vf_eval(
        "vf-deepscaler",
        model=server.model,
        base_url=server.base_url,
        output_dir=out_dir,
        num_examples=2,
        max_tokens=64,
        env_args=env_args,
        sampling_args=server.sampling_args,
    )
    assert len(rows) == 2
    for row in rows:
        assert 0.0 <= row["reward"] <= 1.0
        assert METRICS <= set(row["metrics"]), row["metrics"]
    return rows


def test_vf_eval_on_generated_problems(tiny_server, tmp_path: Path):
    rows = evaluate(tiny_server, tmp_path / "generated", {})
    assert all(row["info"]["source"].startswith("generated:") for row in rows)


def test_vf_eval_on_real_rows_with_think(tiny_server, shared_data: Path, tmp_path: Path):
    env_args = {
        "data_files": str(shared_data / "deepscaler" / "preview_first803.jsonl"),
        "max_examples": 4,
        "use_think": True,
    }
    rows = evaluate(tiny_server, tmp_path / "real", env_args)
    assert all("format" in row["metrics"] for row in rows)
