"""vf-eval vf-planner end to end: the embedded SmolLM2 is both the planner and the worker, through
one real vf-vllm on the CPU. The model is tiny, so the score may be low; the run must complete
and save results with the planner metrics and each rollout's pipeline trace."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
METRICS = {"correct", "decomposed", "worker_tokens", "planner_tokens", "parse_failure"}


def test_vf_eval_planner_with_smollm2(smollm2_server, shared_data: Path, tmp_path: Path):
    env_args = {
        "data_files": str(shared_data / "gsm8k" / "test.jsonl"),
        "split": "test",
        "max_examples": 2,
        "worker_max_tokens": 128,
    }
    cmd = [
        str(ROOT / ".venv" / "bin" / "vf-eval"), "vf-planner",
        "-m", smollm2_server.model, "-b", smollm2_server.base_url, "-k", "PLANNER_TEST_KEY",
        "-n", "2", "-r", "1", "-t", "256", "-s", "-d", "-C", "planner", "-o", str(tmp_path),
        "-a", json.dumps(env_args),
    ]  # fmt: skip
    env = {**os.environ, "PLANNER_TEST_KEY": "EMPTY"}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    results = list(tmp_path.rglob("results.jsonl"))
    assert results, f"no results saved under {tmp_path}:\n{proc.stdout[-2000:]}"
    rows = [json.loads(line) for line in results[0].read_text().splitlines() if line.strip()]
    assert len(rows) == 2
    for row in rows:  # shown with -s: what the tiny planner and worker actually did
        print(row["reward"], row["metrics"], row["planner"]["parse_error"])
    for row in rows:
        assert METRICS <= set(row["metrics"]), row["metrics"]
        assert 0.0 <= row["reward"] <= 1.5
        trace = row["planner"]  # saved with -C planner: a parse error or the worker's final reply
        assert trace["parse_error"] or trace["worker_error"] or trace["final_reply"]
