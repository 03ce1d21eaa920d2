"""The figures of sweeps, run reports and model cards (rlvr.eval.plots, scripts/plot_run.py): which
series are drawn, what bad input says, and that each call leaves a PNG."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rlvr.eval.plots import (
    metric_label,
    metric_series,
    plot_before_after,
    plot_estimate_bars,
    plot_pass_at_k,
    plot_run_curves,
    plot_runs_compared,
    read_metrics,
    run_curve_keys,
    spread_band,
)
from rlvr.eval.stats import Estimate

ROOT = Path(__file__).resolve().parents[3]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data.startswith(PNG_MAGIC)
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def write_metrics(path: Path, records: list[dict], tail: str = "") -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + tail)
    return path


RECORDS = [
    {"step": 1, "reward/mean": 0.1, "reward/std": 0.3, "loss/kl_ref": 0.0, "time/step": 2.5},
    {"step": 2, "reward/mean": 0.3, "reward/std": 0.2, "loss/kl_ref": 0.0, "time/step": 2.0},
    {"step": 2, "eval/reward": 0.25},
    {"step": 3, "reward/mean": 0.4, "mismatch_kl": float("nan"), "time/step": 2.1},
]


def test_sweep_plots_read_a_live_metrics_file_and_name_bad_lines(tmp_path: Path):
    # a run still writing its last line: that line is left out
    path = write_metrics(tmp_path / "metrics.jsonl", RECORDS, tail='{"step": 4, "rew')
    assert [r["step"] for r in read_metrics(path)] == [1, 2, 2, 3]
    assert metric_series(read_metrics(path), "eval/reward") == ([2], [0.25])
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"step": 1}\n{oops\n{"step": 3}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: not valid JSON"):
        read_metrics(bad)
    bad.write_text('{"reward/mean": 1}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:1: expected a JSON object with an integer"):
        read_metrics(bad)


def test_sweep_plots_draw_the_logged_curves_and_skip_the_rest():
    keys = ["reward/mean", "loss/kl_ref", "mismatch_kl", "time/step", "not/logged"]
    # KL to the reference is 0 without a reference model; mismatch_kl here is only NaN
    assert run_curve_keys(RECORDS, keys) == ["reward/mean", "time/step"]
    assert run_curve_keys(RECORDS, keys, skip_all_zero=False) == [
        "reward/mean",
        "loss/kl_ref",
        "time/step",
    ]
    with pytest.raises(ValueError, match="the run has: eval/reward, loss/kl_ref, mismatch_kl"):
        run_curve_keys(RECORDS, ["not/logged"])
    assert metric_label("time/weight_push") == "weight push time (s)"
    assert metric_label("mismatch_kl") == "sampler-trainer KL (nats/token)"
    assert metric_label("env/correct") == "env/correct"


def test_sweep_plots_reward_band_stays_within_the_logged_range():
    records = [
        {"step": 1, "reward/mean": 0.1, "reward/std": 0.3, "reward/min": 0.0, "reward/max": 1.0},
        {"step": 2, "reward/mean": 0.9, "reward/std": 0.3, "reward/min": 0.5, "reward/max": 1.0},
        {"step": 3, "reward/mean": 0.5, "reward/std": 0.25},  # no range logged: the plain band
        {"step": 4, "reward/mean": 0.5},  # no std: no band
    ]
    steps, values = metric_series(records, "reward/mean")
    xs, low, high = spread_band(records, "reward/mean", steps, values)
    assert xs == [1, 2, 3]
    assert low == pytest.approx([0.0, 0.6, 0.25]) and high == pytest.approx([0.4, 1.0, 0.75])
    assert spread_band(records[3:], "reward/mean", [4], [0.5]) == ([], [], [])


def test_sweep_plots_write_pngs_laid_out_by_panel_count(tmp_path: Path):
    path = write_metrics(tmp_path / "metrics.jsonl", RECORDS)
    one = plot_run_curves(path, tmp_path / "one.png", ["reward/mean"])
    two = plot_run_curves(RECORDS, tmp_path / "two.png")  # reward, time: side by side
    many = [{**r, "mismatch_kl": 1e-9 * 10 ** r["step"], "entropy": 1.0} for r in RECORDS]
    four = plot_run_curves(many, tmp_path / "four.png", ["reward/mean", "mismatch_kl", "entropy"])
    (w1, h1), (w2, h2), (w4, h4) = png_size(one), png_size(two), png_size(four)
    assert (w2, h2) == (2 * w1, h1) and (w4, h4) == (2 * w1, 2 * h1)


def test_sweep_plots_bars_with_ci_and_pass_at_k(tmp_path: Path):
    with_ci, without = Estimate(0.4, 0.3, 0.5, 8), Estimate(0.2, None, None, 1)
    bars = plot_estimate_bars(
        ["bm25", "hybrid"],
        {"base": [with_ci, None], "trained": [without, with_ci]},
        tmp_path / "bars.png",
        title="a title long enough to need wrapping " * 3,
    )
    assert png_size(bars)[0] > 0
    with pytest.raises(ValueError, match="series 'base' has 1 values for 2 groups"):
        plot_estimate_bars(["a", "b"], {"base": [with_ci]}, tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()
    before_after = plot_before_after(["vf-x"], [without], [with_ci], tmp_path / "ba.png")
    curves = plot_pass_at_k(
        {"base": {"1": 0.2, "2": 0.3}, "ft": {1: 0.4, 2: 0.5, 4: 0.6}}, tmp_path / "pass.png"
    )
    for path in (before_after, curves):
        assert path.read_bytes().startswith(PNG_MAGIC)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ba.png", "bars.png", "pass.png"]


@pytest.mark.slow
def test_sweep_plots_plot_run_cli(tmp_path: Path):
    run = tmp_path / "run"
    run.mkdir()
    write_metrics(run / "metrics.jsonl", RECORDS)
    script = [sys.executable, str(ROOT / "scripts" / "plot_run.py")]
    done = subprocess.run([*script, str(run)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert png_size(run / "curves.png")[0] > 0
    missing = subprocess.run(
        [*script, str(run), "--keys", "val/loss"], capture_output=True, text=True, timeout=120
    )
    assert missing.returncode == 1 and missing.stderr.startswith("error: none of ['val/loss']")


def test_reasoning_vocab_plots_compare_runs_on_shared_panels(tmp_path: Path):
    """bench/reasoning_vocab.py's figure: baseline and variant on one panel per metric; a key
    only one run logged still gets its panel, keys nobody logged get none."""
    variant = [{**r, "reasoning/reasoning_id_share": 0.5} for r in RECORDS]
    runs = {"baseline": RECORDS, "expanded": variant}
    one = plot_runs_compared(runs, tmp_path / "one.png", ["reward/mean", "not/logged"])
    two = plot_runs_compared(
        runs, tmp_path / "two.png", ["reward/mean", "reasoning/reasoning_id_share"]
    )
    assert png_size(two) == (2 * png_size(one)[0], png_size(one)[1])
    with pytest.raises(ValueError, match="no run logged any of"):
        plot_runs_compared(runs, tmp_path / "none.png", ["not/logged"])
