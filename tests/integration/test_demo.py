"""`make demo` (rlvr.demo) end to end at smoke size: its own vf-vllm, the weight push and
restore, vf-eval of the base model, the scripted warm start, its evaluation through a pushed
adapter, GRPO steps printed a line each, the trained policy's evaluation, the before/after lines
and the PNG. Whether the demo *learns* is measured by running it (README, docs/benchmarks.md):
one GRPO step cannot show that, and timing or reward thresholds stay out of tests."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from rlvr.eval.vf_eval import load_run

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_make_demo_runs_every_stage_and_reports_before_and_after(tmp_path):
    """As `make demo` runs it: its own process (the models it loads stay out of the suite's)."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "rlvr.demo",
            "--eval-examples",
            "2",
            "--train-steps",
            "1",
            "--output-dir",
            str(tmp_path),
            "batch.batch_size=8",  # 1 problem x 8 rollouts: every stage, less of it
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    out = done.stdout
    assert done.returncode == 0, done.stderr[-3000:]
    assert "answers changed after the push" in out and "restored exactly: True" in out
    for stage in ("base", "warm_start", "trained"):
        run = load_run(tmp_path / "eval" / stage, stage)
        assert len(run.rollouts) == 2 * 4  # 2 held-out problems x 4 rollouts
    assert (tmp_path / "warm_start" / "final" / "adapter_config.json").is_file()
    steps = [
        json.loads(line) for line in (tmp_path / "train" / "metrics.jsonl").read_text().splitlines()
    ]
    assert [s["step"] for s in steps if "reward/mean" in s] == [1]
    assert re.search(r"^step 1/1 \| reward \d\.\d{3} \| .*env/has_boxed", out, re.MULTILINE)
    for label in ("base:", "warm start:", "GRPO:"):
        assert re.search(rf"held-out reward, {label}\s+\d\.\d{{3}} \[", out)
    assert "paired difference, GRPO - warm start: " in out
    assert (tmp_path / "training_curves.png").stat().st_size > 10_000
    assert f"training curves: {tmp_path / 'training_curves.png'}" in out
