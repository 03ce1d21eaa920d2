"""Evaluation reports (rlvr.eval.report, rlvr.eval.stats, scripts/eval_report.py).

Unit tests write hand-built rollouts in the layout `vf-eval -s -o DIR` saves
(DIR/evals/<env>--<model>/<id>/results.jsonl + metadata.json) and check exact numbers worked out
by hand; the integration test runs the real vf-eval against a tiny vf-vllm and checks the report
against the raw rows.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlvr.eval.report import build_report, render_markdown, report_json
from rlvr.eval.vf_eval import load_run, run_vf_eval

# ---- pass@k ----------------------------------------------------------------------------------


# ---- confidence intervals --------------------------------------------------------------------


# ---- the other columns -----------------------------------------------------------------------


# ---- bad input -------------------------------------------------------------------------------


# ---- outputs ---------------------------------------------------------------------------------


# ---- the real vf-eval ------------------------------------------------------------------------


@pytest.mark.integration
def test_report_on_a_real_vf_eval_run(tiny_server, shared_data: Path, tmp_path: Path):
    """2 examples x 2 rollouts of vf-deepscaler on the tiny model: the report's numbers are the
    raw rows' numbers, and a run compared with itself differs by exactly 0."""
    env_args = {"data_files": str(shared_data / "deepscaler" / "preview_first803.jsonl")}
    rows = run_vf_eval(
        "vf-deepscaler",
        model=tiny_server.model,
        base_url=tiny_server.base_url,
        output_dir=tmp_path / "eval",
        num_examples=2,
        rollouts_per_example=2,
        max_tokens=32,
        env_args=env_args,
        sampling_args=tiny_server.sampling_args,
    )
    runs = [load_run(tmp_path / "eval", "base"), load_run(tmp_path / "eval", "again")]
    report = build_report(runs, threshold=1.0)
    summary = report.runs[0]
    assert (summary.env_id, summary.model) == ("vf-deepscaler", tiny_server.model)
    assert summary.env_args == env_args
    assert (summary.num_examples, summary.rollouts_per_example, summary.num_rollouts) == (2, 2, 4)
    assert summary.reward.mean == pytest.approx(sum(r["reward"] for r in rows) / 4)
    assert summary.reward.n == 2 and summary.reward.low is not None
    assert list(summary.pass_at_k) == ["1", "2"]
    assert summary.pass_at_k["1"] == sum(r["reward"] >= 1.0 for r in rows) / 4
    assert {"math_reward", "correct", "has_boxed", "completion_chars"} <= set(summary.metrics)
    assert summary.metrics["correct"] == pytest.approx(sum(r["correct"] for r in rows) / 4)
    # one assistant reply per rollout: the environment's own count of its characters agrees
    assert summary.completion_chars == pytest.approx(summary.metrics["completion_chars"])
    assert summary.errored == sum(r["error"] is not None for r in rows) / 4
    assert summary.truncated == sum(r["is_truncated"] for r in rows) / 4
    tokens = [r["token_usage"]["output_tokens"] for r in rows]
    assert summary.completion_tokens == pytest.approx(sum(tokens) / 4)
    assert all(0 < t <= 32 for t in tokens)
    (comparison,) = report.comparisons
    assert (comparison.paired_examples, comparison.prompts_differ) == (2, 0)
    assert (comparison.difference.mean, comparison.difference.low) == (0.0, 0.0)
    assert json.loads(report_json(report))["runs"][0]["num_rollouts"] == 4
    assert "# Evaluation report: vf-deepscaler" in render_markdown(report)
