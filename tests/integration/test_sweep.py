"""Evaluation sweeps (rlvr.eval.sweep, scripts/eval_sweep.py).

Unit tests run the sweep against a stand-in vf-eval that saves rows in vf-eval's layout with
rewards chosen by the test, so the report's numbers can be checked exactly (and cells can fail
on purpose); the integration test runs a 2 x 2 sweep with the real vf-eval against the tiny
vf-vllm and checks the report against the cells' own rows.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from unit.eval.test_sweep import PNG_MAGIC, SCRIPT

from rlvr.eval.report import summarize
from rlvr.eval.sweep.run import load_sweep
from rlvr.eval.vf_eval import iter_results, load_run

ROOT = Path(__file__).resolve().parents[2]


# ---- the real vf-eval ------------------------------------------------------------------------


@pytest.mark.integration
def test_sweep_2x2_on_the_tiny_server(tiny_lora_server, shared_data: Path, tmp_path: Path):
    """Two models (the tiny model and a LoRA adapter on it, served together) x two settings of
    vf-deepscaler through the command line: every table number is the cell's own, the plots
    exist, and a second run runs nothing."""
    server = tiny_lora_server
    out = tmp_path / "sweep"
    data = str(shared_data / "deepscaler" / "preview_first803.jsonl")
    cmd = [
        sys.executable,
        str(SCRIPT),
        "vf-deepscaler",
        "--models",
        f"first={server.model},second={server.adapter}",
        "--grid",
        "use_think=false,true",
        "--env-args",
        json.dumps({"data_files": data}),
        "-n",
        "2",
        "-r",
        "2",
        "-t",
        "16",
        "-S",
        json.dumps(server.sampling_args),
        "--base-url",
        server.base_url,
        "--out",
        str(out),
        "--no-progress",
        "--jobs",
        "4",  # a model's two cells at once on the shared server
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "4 cells run, 0 already done, 0 failed" in proc.stderr

    sweep = load_sweep(out)
    report = json.loads((out / "report.json").read_text())
    for row in report["rows"]:
        for setting, summary in zip(sweep.settings, row["summaries"], strict=True):
            cell = out / "cells" / row["model"] / setting.label / "default-seed"
            rows = [r for path in cell.rglob("results.jsonl") for _, r in iter_results(path)]
            assert len(rows) == 4 and summary["num_rollouts"] == 4
            assert summary["reward"]["mean"] == pytest.approx(sum(r["reward"] for r in rows) / 4)
            tokens = sum(r["token_usage"]["output_tokens"] for r in rows) / 4
            assert summary["completion_tokens"] == pytest.approx(tokens)
            assert summary["metrics"]["completion_chars"] == pytest.approx(
                sum(r["metrics"]["completion_chars"] for r in rows) / 4
            )
            own = summarize(load_run(cell, "x"), 1.0)
            assert summary["pass_at_k"] == own.pass_at_k
            assert summary["env_args"] == {
                "data_files": data,
                "use_think": setting.args["use_think"],
            }
    md = (out / "report.md").read_text()
    first = report["rows"][0]["summaries"][0]["reward"]
    assert f"| first | default | {first['mean']:.3f} [{first['low']:.3f}, " in md
    for png in ("reward.png", "pass_at_k.png"):
        assert (out / "plots" / png).read_bytes().startswith(PNG_MAGIC)

    again = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert again.returncode == 0 and "0 cells run, 4 already done, 0 failed" in again.stderr
