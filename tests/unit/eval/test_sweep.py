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
from dataclasses import astuple
from pathlib import Path

import pytest

from rlvr.eval import vf_eval
from rlvr.eval.stats import Estimate, clustered_mean
from rlvr.eval.sweep.inputs import Shared, SweepError, parse_grid, parse_models, parse_seeds, plan
from rlvr.eval.sweep.report import build_sweep_report, write_report
from rlvr.eval.sweep.run import load_sweep, run_sweep
from rlvr.eval.vf_eval import ResultsError

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "scripts" / "eval_sweep.py"
UNREACHABLE = "http://127.0.0.1:9/v1"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

# The stand-in vf-eval: example e's rollout j gets reward REWARDS[model][level][e][j] (the env
# arg `level`), + 0.5 * seed; an env arg `fail` makes it exit 1. Every call is logged.
FAKE_VF_EVAL = """
args = sys.argv[1:]
opt = lambda flag: args[args.index(flag) + 1]
out, model, n, r = Path(opt("-o")), opt("-m"), int(opt("-n")), int(opt("-r"))
env_args = json.loads(opt("-a")) if "-a" in args else {}
with open(os.environ["FAKE_LOG"], "a") as log:
    log.write(json.dumps({"model": model, "env_args": env_args}) + "\\n")
together = int(os.environ.get("FAKE_TOGETHER", "1"))  # wait for this many calls of the model
for _ in range(600):
    started = [json.loads(line)["model"] for line in open(os.environ["FAKE_LOG"])]
    if started.count(model) >= together:
        break
    time.sleep(0.1)
else:
    print(f"ran alone: {together} calls of {model} never ran at once", file=sys.stderr)
    sys.exit(1)
if env_args.get("fail"):
    print("environment exploded", file=sys.stderr)
    sys.exit(1)
table = json.loads(os.environ["FAKE_REWARDS"])[model][str(env_args.get("level"))]
run = out / "evals" / f"{args[0]}--{model}" / "abc123"
run.mkdir(parents=True)
rows = []
for e in range(n):
    for j in range(r):
        reward = table[e][j] + 0.5 * env_args.get("seed", 0)
        rows.append({
            "example_id": e, "prompt": [{"role": "user", "content": f"problem {e}"}],
            "completion": [{"role": "assistant", "content": "x" * (e + 1)}],
            "reward": reward, "error": None, "is_truncated": False,
            "metrics": {"correct": float(reward >= 1.0)},
            "token_usage": {"input_tokens": 3, "output_tokens": e + 1},
        })
(run / "results.jsonl").write_text("".join(json.dumps(row) + "\\n" for row in rows))
meta = {"env_id": args[0], "model": model, "env_args": env_args, "sampling_args": {}}
(run / "metadata.json").write_text(json.dumps(meta))
"""

REWARDS = {
    "served-a": {
        "1": [[1.0, 0.0], [0.0, 0.0], [1.0, 1.0]],
        "2": [[0.0, 0.0], [1.0, 0.0], [0.0, 0.0]],
    },
    "served-b": {
        "1": [[1.0, 1.0], [1.0, 0.0], [1.0, 1.0]],
        "2": [[0.0, 1.0], [1.0, 1.0], [0.0, 1.0]],
    },
}


@pytest.fixture
def fake_vf_eval(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Points the sweep at the stand-in vf-eval; returns the log of its calls."""
    script = tmp_path / "vf-eval"
    script.write_text(
        f"#!{sys.executable}\nimport json, os, sys, time\nfrom pathlib import Path\n{FAKE_VF_EVAL}"
    )
    script.chmod(0o755)
    monkeypatch.setattr(vf_eval, "VF_EVAL", script)
    log = tmp_path / "calls.jsonl"
    monkeypatch.setenv("FAKE_LOG", str(log))
    monkeypatch.setenv("FAKE_REWARDS", json.dumps(REWARDS))
    return log


def calls(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def assert_same(estimate: Estimate, expected: Estimate) -> bool:
    assert astuple(estimate) == pytest.approx(astuple(expected))
    return True


def make_sweep(models="a=served-a,b=served-b", grid=("level=1,2",), seeds=None, **shared):
    shared = Shared(**{"env_id": "vf-x", "num_examples": 3, "rollouts_per_example": 2, **shared})
    return plan(shared, parse_models(models), parse_grid(list(grid)), parse_seeds(seeds))


def test_sweep_inputs_parse_and_bad_ones_are_named():
    assert [(m.label, m.model) for m in parse_models("base=smollm2-135m,out/run/final")] == [
        ("base", "smollm2-135m"),
        ("out/run/final", "out/run/final"),
    ]
    settings = parse_grid(["retriever=bm25,hybrid", "k=3,5"])
    assert [s.label for s in settings] == [
        "retriever=bm25,k=3",
        "retriever=bm25,k=5",
        "retriever=hybrid,k=3",
        "retriever=hybrid,k=5",
    ]
    assert settings[1].args == {"retriever": "bm25", "k": 5}
    assert parse_grid(['files=["a,b.jsonl", "c.jsonl"]'])[0].args == {"files": "a,b.jsonl"}
    assert parse_grid([]) == parse_grid([])  # one default setting
    assert [s.label for s in parse_grid([])] == ["default"]
    assert parse_seeds("0-2,7") == [0, 1, 2, 7] and parse_seeds(None) == [None]
    for bad in ("x", "1,1", ""):
        with pytest.raises(SweepError, match="--seeds"):
            parse_seeds(bad)
    with pytest.raises(SweepError, match="KEY=VALUE"):
        parse_grid(["retriever"])
    with pytest.raises(SweepError, match="collide"):
        plan(Shared("vf-x", 1, 1), parse_models("a/b=m,a_b=n"), parse_grid([]), [None])
    with pytest.raises(SweepError, match="'seed', which setting seed=1 sets too"):
        make_sweep(grid=("seed=1",), seeds="0,1")


def test_sweep_runs_every_cell_and_reports_their_numbers(fake_vf_eval: Path, tmp_path: Path):
    sweep = make_sweep()
    out = tmp_path / "sweep"
    result = run_sweep(sweep, out, base_url=UNREACHABLE, progress=False)
    assert (len(result.ran), result.skipped, result.failed) == (4, [], [])
    assert [c["model"] for c in calls(fake_vf_eval)] == ["served-a"] * 2 + ["served-b"] * 2
    report = build_sweep_report(sweep, out)
    by_row = {row.model: row.summaries for row in report.rows}
    # a / level=1: rewards [1,0],[0,0],[1,1]: mean 0.5; pass@1 = (1/2 + 0 + 1) / 3
    a1 = by_row["a"][0]
    assert a1.reward.mean == pytest.approx(0.5)
    assert_same(a1.reward, clustered_mean([[1.0, 0.0], [0.0, 0.0], [1.0, 1.0]]))
    assert a1.pass_at_k == pytest.approx({"1": 0.5, "2": 2 / 3})
    assert by_row["b"][1].reward.mean == pytest.approx(4 / 6)
    # b against a, paired by example: level=1 per-example differences (1-.5, .5-0, 1-1)
    (setting, diff), (_, diff2) = report.comparisons
    assert (setting, diff.name, diff.baseline, diff.paired_examples) == ("level=1", "b", "a", 3)
    assert diff.difference.mean == pytest.approx((0.5 + 0.5 + 0.0) / 3)
    assert diff2.difference.mean == pytest.approx((0.5 + 0.5 + 0.5) / 3)

    md = write_report(sweep, out).read_text()
    assert "## mean reward [95% CI]" in md and "## pass@2" in md and "## `correct`" in md
    assert "| a | default | 0.500 [" in md
    assert "![Mean reward](plots/reward.png)" in md and "![pass@k](plots/pass_at_k.png)" in md
    for png in ("reward.png", "pass_at_k.png"):
        assert (out / "plots" / png).read_bytes().startswith(PNG_MAGIC)
    saved = json.loads((out / "report.json").read_text())
    assert saved["rows"][0]["summaries"][0]["reward"]["mean"] == pytest.approx(0.5)


def test_sweep_resumes_only_missing_cells_and_keeps_finished_ones(
    fake_vf_eval: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    sweep = make_sweep()
    out = tmp_path / "sweep"
    first = out / "cells" / "a" / "level=1" / "default-seed"
    run_sweep(sweep, out, base_url=UNREACHABLE, progress=False)
    stamp = (first / "cell.json").stat().st_mtime_ns
    # an interrupted cell (vf-eval killed mid-run) leaves only a hidden temporary directory
    b2 = out / "cells" / "b" / "level=2" / "default-seed"
    b2.rename(b2.parent / ".tmp-default-seed-x")
    fake_vf_eval.unlink()
    result = run_sweep(sweep, out, base_url=UNREACHABLE, progress=False)
    assert [c.label for c in result.ran] == ["b / level=2"] and len(result.skipped) == 3
    assert calls(fake_vf_eval) == [{"model": "served-b", "env_args": {"level": 2}}]
    assert (first / "cell.json").stat().st_mtime_ns == stamp
    assert not list(out.rglob(".tmp-*"))
    # cells may be added, by a run that names only them; the record (and report) keeps all
    level3 = {model: {**table, "3": [[0.0, 0.0]] * 3} for model, table in REWARDS.items()}
    monkeypatch.setenv("FAKE_REWARDS", json.dumps(level3))
    assert (
        len(
            run_sweep(
                make_sweep("a=served-a", grid=("level=3",)),
                out,
                base_url=UNREACHABLE,
                progress=False,
            ).ran
        )
        == 1
    )
    recorded = load_sweep(out)
    assert [s.label for s in recorded.settings] == ["level=1", "level=2", "level=3"]
    report = build_sweep_report(recorded, out)
    assert report.missing == ["b / level=3"] and len(report.rows) == 2
    with pytest.raises(SweepError, match="num_examples: was 3, now 5"):
        run_sweep(make_sweep(num_examples=5), out, base_url=UNREACHABLE, progress=False)
    with pytest.raises(SweepError, match="model label 'a' was .*served-a.*, now .*served-c"):
        run_sweep(make_sweep("a=served-c"), out, base_url=UNREACHABLE, progress=False)


def test_sweep_records_failed_cells_and_reports_the_rest(fake_vf_eval, tmp_path):
    sweep = make_sweep(grid=("level=1", "fail=false,true"))
    out = tmp_path / "sweep"
    result = run_sweep(sweep, out, base_url=UNREACHABLE, progress=False)
    assert len(result.ran) == 2 and len(result.failed) == 2
    (cell, reason), _ = result.failed
    assert cell.setting.label == "level=1,fail=true" and "environment exploded" in reason
    report = build_sweep_report(sweep, out)
    assert report.missing == ["a / level=1,fail=true", "b / level=1,fail=true"]
    assert "**Not run yet (2):**" in write_report(sweep, out).read_text()
    empty = make_sweep(grid=("level=1", "fail=true"))
    with pytest.raises(ResultsError, match="no finished cells"):
        build_sweep_report(empty, tmp_path / "nothing")


def test_sweep_jobs_run_a_models_cells_at_once(fake_vf_eval, tmp_path, monkeypatch):
    """With --jobs 4 each model's four cells run at once (every stand-in call waits until all
    four of its model have started, so one at a time would fail them all); the numbers are a
    sequential sweep's, and a failing cell among them is recorded while the others finish."""
    monkeypatch.setenv("FAKE_TOGETHER", "4")
    sweep = make_sweep(grid=("level=1,2", "fail=false,true"))
    result = run_sweep(sweep, tmp_path / "together", base_url=UNREACHABLE, progress=False, jobs=4)
    assert len(result.ran) == 4 and len(result.failed) == 4
    assert all("environment exploded" in reason for _, reason in result.failed)
    monkeypatch.setenv("FAKE_TOGETHER", "1")
    alone = run_sweep(sweep, tmp_path / "alone", base_url=UNREACHABLE, progress=False)
    assert [c.label for c in alone.ran] == [c.label for c in result.ran]
    together = build_sweep_report(sweep, tmp_path / "together")
    sequential = build_sweep_report(sweep, tmp_path / "alone")
    for a, b in zip(together.rows, sequential.rows, strict=True):
        for x, y in zip(a.summaries, b.summaries, strict=True):
            assert (x is None) == (y is None)  # a failed cell's column is empty in both
            if x is not None:
                assert_same(x.reward, y.reward)


def test_sweep_pools_seeds_by_prompt(fake_vf_eval, tmp_path):
    """Seeds set the env arg `seed`; the pooled row clusters the seeds' rollouts of the same
    prompt together (3 clusters of 4, not 6 of 2)."""
    sweep = make_sweep(grid=("level=1",), seeds="0,1")
    out = tmp_path / "sweep"
    run_sweep(sweep, out, base_url=UNREACHABLE, progress=False)
    assert {c["env_args"]["seed"] for c in calls(fake_vf_eval)} == {0, 1}
    report = build_sweep_report(sweep, out)
    rows = [(row.model, row.seed) for row in report.rows]
    assert rows == [("a", 0), ("a", 1), ("a", "all"), ("b", 0), ("b", 1), ("b", "all")]
    pooled = report.rows[2].summaries[0]
    seed0, seed1 = [[1.0, 0.0], [0.0, 0.0], [1.0, 1.0]], [[1.5, 0.5], [0.5, 0.5], [1.5, 1.5]]
    expected = clustered_mean([a + b for a, b in zip(seed0, seed1, strict=True)])
    assert_same(pooled.reward, expected) and pooled.reward.n == 3
    assert report.pooled["a"][0] == pooled
    # each seed's own row is that cell alone
    assert_same(report.rows[1].summaries[0].reward, clustered_mean(seed1))
    (_, diff) = report.comparisons[0]
    assert diff.paired_examples == 3


@pytest.mark.slow
def test_sweep_report_only_needs_the_directory(fake_vf_eval, tmp_path):
    out = tmp_path / "sweep"
    run_sweep(make_sweep(), out, base_url=UNREACHABLE, progress=False)
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--report-only", "--out", str(out), "--threshold", "0.5"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "# Evaluation sweep: vf-x" in proc.stdout and "pass@k counts reward ≥ 0.5" in proc.stdout
    assert load_sweep(out).models == make_sweep().models
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--report-only", "--out", str(tmp_path / "none")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1 and proc.stderr.startswith("error:") and "sweep.json" in proc.stderr


# ---- the real vf-eval ------------------------------------------------------------------------


@pytest.mark.slow
def test_sweep_records_models_whose_server_does_not_start(fake_vf_eval, tmp_path):
    """Without --base-url each model gets its own vf-vllm; one that cannot be served fails its
    cells with the reason and the next model is still tried."""
    adapter = tmp_path / "broken-adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"r": 8}))
    shared = Shared("vf-x", num_examples=1, rollouts_per_example=1)
    models = parse_models(f"gone=/nonexistent/model,broken={adapter}")
    sweep = plan(shared, models, parse_grid(["level=1,2"]), [None])
    result = run_sweep(sweep, tmp_path / "sweep", progress=False)
    assert result.ran == [] and len(result.failed) == 4
    reasons = {cell.model.label: reason for cell, reason in result.failed}
    assert reasons["gone"].startswith("server for gone did not start: vf-vllm exited")
    assert "/nonexistent/model" in reasons["gone"]
    assert "names no base_model_name_or_path" in reasons["broken"]
    assert calls(fake_vf_eval) == []
