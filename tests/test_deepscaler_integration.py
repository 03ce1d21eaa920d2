"""vf-eval vf-deepscaler end to end against a real vf-vllm on the CPU (the tiny random model).

With no env args and no hub access, the environment falls back to its generated problems: this
is the fresh-machine path. The model's text is random, so only completion and saved results are
checked (rewards must still lie in [0, 1] with every metric logged); a second run scores the
real DeepScaleR rows with ``use_think``.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
METRICS = {"math_reward", "correct", "has_boxed", "completion_chars"}


def run_vf_eval(server, out_dir: Path, env_args: dict) -> list[dict]:
    """Run vf-eval on 2 examples x 1 rollout and return the saved rollouts."""
    cmd = [
        str(ROOT / ".venv" / "bin" / "vf-eval"), "vf-deepscaler",
        "-m", server.model, "-b", server.base_url, "-k", "DEEPSCALER_TEST_KEY",
        "-n", "2", "-r", "1", "-t", "64", "-s", "-d", "-o", str(out_dir),
        "-a", json.dumps(env_args),
    ]  # fmt: skip
    env = {**os.environ, "DEEPSCALER_TEST_KEY": "EMPTY"}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = list(out_dir.rglob("results.jsonl"))
    assert results, f"no results saved under {out_dir}:\n{proc.stdout[-2000:]}"
    rows = [json.loads(line) for line in results[0].read_text().splitlines() if line.strip()]
    assert len(rows) == 2
    for row in rows:
        assert 0.0 <= row["reward"] <= 1.0
        assert METRICS <= set(row["metrics"]), row["metrics"]
    return rows


def test_vf_eval_on_generated_problems(tiny_server, tmp_path: Path):
    rows = run_vf_eval(tiny_server, tmp_path / "generated", {})
    assert all(row["info"]["source"].startswith("generated:") for row in rows)


def test_vf_eval_on_real_rows_with_think(tiny_server, shared_data: Path, tmp_path: Path):
    env_args = {
        "data_files": str(shared_data / "deepscaler" / "preview_first803.jsonl"),
        "max_examples": 4,
        "use_think": True,
    }
    rows = run_vf_eval(tiny_server, tmp_path / "real", env_args)
    assert all("format" in row["metrics"] for row in rows)
