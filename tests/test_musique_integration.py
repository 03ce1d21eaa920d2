"""vf-eval vf-musique end to end through one real vf-vllm on the CPU serving the tiny random model
with tool calling on (hermes parser). Its replies are random text, so scores are not checked: the
run must finish without errors and save results that carry every rubric metric."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
METRICS = {
    "combined_reward",
    "exact_match",
    "f1",
    "retrieval_recall",
    "retrieval_precision",
    "citation_recall",
    "citation_precision",
    "citation_f1",
    "format",
    "hop_weight",
    "tool_errors",
}


def test_vf_eval_musique_with_tiny_model(tiny_server, shared_data: Path, tmp_path: Path):
    env_args = {
        "data_files": str(shared_data / "musique" / "fixture_small.jsonl"),
        "dataset_config": "full",
        "max_turns": 3,
    }
    cmd = [
        str(ROOT / ".venv" / "bin" / "vf-eval"), "vf-musique",
        "-m", tiny_server.model, "-b", tiny_server.base_url, "-k", "MUSIQUE_TEST_KEY",
        "-n", "2", "-r", "1", "-t", "48", "-s", "-d", "-o", str(tmp_path),
        "-a", json.dumps(env_args),
    ]  # fmt: skip
    env = {**os.environ, "MUSIQUE_TEST_KEY": "EMPTY"}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    results = list(tmp_path.rglob("results.jsonl"))
    assert results, f"no results saved under {tmp_path}:\n{proc.stdout[-2000:]}"
    rows = [json.loads(line) for line in results[0].read_text().splitlines() if line.strip()]
    assert len(rows) == 2
    for row in rows:
        assert row.get("error") is None, row["error"]
        assert METRICS <= set(row["metrics"]), row["metrics"]
        assert 0.0 <= row["reward"] <= 1.0
        assert row["completion"], "the model was never asked"
    metadata = json.loads(next(tmp_path.rglob("metadata.json")).read_text())
    # the tools went out without the injected state argument
    assert {tool["name"] for tool in metadata["tools"]} == {"retrieve_documents", "submit_answer"}
    assert '"state"' not in json.dumps(metadata["tools"])
