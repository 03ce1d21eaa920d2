"""vf-eval vf-deepscaler end to end against a real vf-vllm on the CPU (the tiny random model).

With no env args and no hub access, the environment falls back to its generated problems: this
is the fresh-machine path. The model's text is random, so only completion and saved results are
checked (rewards must still lie in [0, 1] with every metric logged); a second run scores the
real DeepScaleR rows with ``use_think``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rlvr.eval.vf_eval import run_vf_eval

pytestmark = [pytest.mark.integration, pytest.mark.slow]

METRICS = {"math_reward", "correct", "has_boxed", "completion_chars"}


def evaluate(server, out_dir: Path, env_args: dict, n: int | None = 2, r: int | None = 1):
    """Run vf-eval on n examples x r rollouts (None: the package's defaults) and return the saved
    rollouts."""
    rows = run_vf_eval(
        "vf-deepscaler",
        model=server.model,
        base_url=server.base_url,
        output_dir=out_dir,
        num_examples=n,
        rollouts_per_example=r,
        max_tokens=64,
        env_args=env_args,
        sampling_args=server.sampling_args,
    )
    for row in rows:
        assert 0.0 <= row["reward"] <= 1.0
        assert METRICS <= set(row["metrics"]), row["metrics"]
    return rows


def test_vf_eval_on_generated_problems_uses_the_packages_defaults(tiny_server, tmp_path: Path):
    """No -n / -r: 8 problems x 2 rollouts, the [tool.verifiers.eval] table beside the module."""
    rows = evaluate(tiny_server, tmp_path / "generated", {}, n=None, r=None)
    assert len(rows) == 8 * 2
    assert len({row["example_id"] for row in rows}) == 8
    assert all(row["info"]["source"].startswith("generated:") for row in rows)


def test_vf_eval_on_real_rows_with_think(tiny_server, shared_data: Path, tmp_path: Path):
    env_args = {
        "data_files": str(shared_data / "deepscaler" / "preview_first803.jsonl"),
        "max_examples": 4,
        "use_think": True,
    }
    rows = evaluate(tiny_server, tmp_path / "real", env_args)
    assert len(rows) == 2
    assert all("format" in row["metrics"] for row in rows)
