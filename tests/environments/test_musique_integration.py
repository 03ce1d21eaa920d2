"""vf-eval vf-musique end to end through one real vf-vllm on the CPU serving the tiny random model
with tool calling on (hermes parser). Its replies are random text, so scores are not checked: the
run must finish without errors and save results that carry every rubric metric."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlvr.eval.vf_eval import run_vf_eval

pytestmark = pytest.mark.integration

METRICS = {
    "combined_reward",
    "exact_match",
    "f1",
    "retrieval_recall",
    "retrieval_precision",
    "retrieval_score",
    "docs_shown",
    "citation_recall",
    "citation_precision",
    "citation_f1",
    "format",
    "searches",
    "said_unanswerable",
    "unanswerable_hit",
    "unanswerable_miss",
    "unanswerable_earned",
    "tool_errors",
}


def test_vf_eval_musique_with_tiny_model(tiny_server, shared_data: Path, tmp_path: Path):
    env_args = {
        "data_files": str(shared_data / "musique" / "fixture_small.jsonl"),
        "dataset_config": "full",
        "max_turns": 3,
    }
    rows = run_vf_eval(
        "vf-musique",
        model=tiny_server.model,
        base_url=tiny_server.base_url,
        output_dir=tmp_path,
        num_examples=2,
        max_tokens=48,
        env_args=env_args,
        sampling_args=tiny_server.sampling_args,
    )
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
