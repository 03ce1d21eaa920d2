"""vf-eval vf-openspiel end to end through one real vf-vllm on the CPU serving the tiny random
model. Its replies are random text, so it mostly forfeits by illegal moves; the run must finish
every game (no aborted rollouts) and save results with the game metrics and the game record."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
METRICS = {"outcome", "legal_rate", "win", "draw", "loss", "illegal_attempts", "game_length"}


def test_vf_eval_openspiel_with_tiny_model(tiny_server, tmp_path: Path):
    env_args = {"game_types": "tic_tac_toe,kuhn_poker", "num_tasks_per_case": 1}
    cmd = [
        str(ROOT / ".venv" / "bin" / "vf-eval"), "vf-openspiel",
        "-m", tiny_server.model, "-b", tiny_server.base_url, "-k", "OPENSPIEL_TEST_KEY",
        "-n", "2", "-r", "1", "-t", "48", "-s", "-d", "-C", "openspiel", "-o", str(tmp_path),
        "-a", json.dumps(env_args),
    ]  # fmt: skip
    env = {**os.environ, "OPENSPIEL_TEST_KEY": "EMPTY"}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    results = list(tmp_path.rglob("results.jsonl"))
    assert results, f"no results saved under {tmp_path}:\n{proc.stdout[-2000:]}"
    rows = [json.loads(line) for line in results[0].read_text().splitlines() if line.strip()]
    assert sorted(row["openspiel"]["case"] for row in rows) == ["kuhn_poker", "tic_tac_toe"]
    for row in rows:
        assert METRICS <= set(row["metrics"]), row["metrics"]
        record = row["openspiel"]
        assert record["ended_by"] in {"game_over", "forfeit"}, record
        assert 0.0 <= row["reward"] <= 1.0
        if record["ended_by"] == "forfeit":
            assert row["reward"] == 0.0
