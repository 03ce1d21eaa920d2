"""Evaluation reports (rlvr.eval.report, rlvr.eval.stats, scripts/eval_report.py).

Unit tests write hand-built rollouts in the layout `vf-eval -s -o DIR` saves
(DIR/evals/<env>--<model>/<id>/results.jsonl + metadata.json) and check exact numbers worked out
by hand; the integration test runs the real vf-eval against a tiny vf-vllm and checks the report
against the raw rows.
"""

from __future__ import annotations

import itertools
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rlvr.eval.export import export_chat_jsonl
from rlvr.eval.report import (
    build_report,
    metric_difference,
    metric_estimate,
    render_markdown,
    summarize,
)
from rlvr.eval.stats import clustered_mean, mean_with_ci
from rlvr.eval.vf_eval import ResultsError, load_run
from rlvr.pass_at_k import k_values, pass_at_k

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "scripts" / "eval_report.py"

# 97.5% quantiles of Student's t in closed form: 1 degree of freedom is the Cauchy distribution,
# tan(pi (p - 1/2)); 2 degrees of freedom, (2p - 1) / sqrt(2 p (1 - p)).
T1 = math.tan(math.pi * 0.475)
T2 = 0.95 / math.sqrt(2 * 0.975 * 0.025)


def rollout(example_id: int, reward: float, **fields: Any) -> dict[str, Any]:
    """A row as vf-eval 0.1.14 saves it: rubric metrics both under `metrics` and flattened."""
    metrics = {"correct": float(reward >= 1.0), "num_turns": 1.0}
    row = {
        "example_id": example_id,
        "prompt": [
            {"role": "system", "content": "Answer in \\boxed{}."},
            {"role": "user", "content": f"problem {example_id}"},
        ],
        "completion": [{"role": "assistant", "content": "\\boxed{4}", "tool_calls": None}],
        "answer": "4",
        "reward": reward,
        "error": None,
        "timing": {"total_ms": 1.0},
        "is_completed": True,
        "is_truncated": False,
        "stop_condition": "max_turns_reached",
        "metrics": metrics,
        "token_usage": {"input_tokens": 20.0, "output_tokens": 5.0},
        "tool_defs": None,
        **metrics,
    }
    return {**row, **fields}


def write_run(
    out: Path, rows: list[dict[str, Any]], env_id: str = "vf-deepscaler", model: str = "m"
) -> Path:
    """Save `rows` where `vf-eval ENV -m MODEL -s -o out` would, with its metadata; return out."""
    run = out / "evals" / f"{env_id}--{model}" / "0a1b2c3d"
    run.mkdir(parents=True)
    (run / "results.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    rollouts = {row["example_id"] for row in rows}
    metadata = {
        "env_id": env_id,
        "env_args": {"seed": 0},
        "model": model,
        "num_examples": len(rollouts),
        "rollouts_per_example": len(rows) // len(rollouts),
        "sampling_args": {"n": 1, "max_tokens": 64},
    }
    (run / "metadata.json").write_text(json.dumps(metadata))
    return out


def rows_of(rewards: dict[int, list[float]]) -> list[dict[str, Any]]:
    return [rollout(e, r) for e, rs in rewards.items() for r in rs]


def run_of(tmp_path: Path, rewards: dict[int, list[float]], name: str = "base", **kw: Any):
    return load_run(write_run(tmp_path / name, rows_of(rewards), **kw), name)


def cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True, timeout=120
    )


# ---- pass@k ----------------------------------------------------------------------------------


def test_pass_at_k_matches_the_closed_form_and_the_definition():
    # n=4, c=1: pass@2 = 1 - C(3,2)/C(4,2) = 1 - 3/6; c=2: 1 - C(2,2)/C(4,2) = 1 - 1/6.
    assert pass_at_k(4, 1, 1) == 0.25 and pass_at_k(4, 1, 2) == 0.5 and pass_at_k(4, 1, 4) == 1.0
    assert pass_at_k(4, 2, 2) == pytest.approx(5 / 6)
    assert pass_at_k(4, 0, 4) == 0.0 and pass_at_k(4, 4, 1) == 1.0
    # the definition: the share of k-subsets of the n rollouts that hold a success
    for n, c in [(4, 1), (4, 2), (5, 2), (8, 3)]:
        outcomes = [True] * c + [False] * (n - c)
        for k in range(1, n + 1):
            subsets = list(itertools.combinations(outcomes, k))
            assert pass_at_k(n, c, k) == pytest.approx(sum(map(any, subsets)) / len(subsets))
    assert k_values(1) == [1] and k_values(4) == [1, 2, 4] and k_values(6) == [1, 2, 4]
    with pytest.raises(ValueError):
        pass_at_k(2, 1, 3)


def test_report_pass_at_k_averages_examples(tmp_path: Path):
    run = run_of(tmp_path, {0: [1, 0, 0, 0], 1: [1, 1, 0, 0]})
    assert summarize(run, 1.0).pass_at_k == pytest.approx(
        {"1": (1 / 4 + 2 / 4) / 2, "2": (1 / 2 + 5 / 6) / 2, "4": 1.0}
    )


def test_threshold_decides_success_up_to_float_rounding(tmp_path: Path):
    # 0.1 + 0.2 + 0.7 (a weighted rubric sum) is 0.9999999999999999 in floats: still a success.
    rewards = {0: [0.5], 1: [1.0], 2: [0.1 + 0.2 + 0.7], 3: [0.99]}
    run = run_of(tmp_path, rewards)
    assert summarize(run, 1.0).pass_at_k == {"1": 0.5}
    assert summarize(run, 0.995).pass_at_k == {"1": 0.5}
    assert summarize(run, 0.5).pass_at_k == {"1": 1.0}
    assert summarize(run, 1.01).pass_at_k == {"1": 0.0}


# ---- confidence intervals --------------------------------------------------------------------


def test_clustered_ci_treats_the_example_as_the_unit():
    # per-example means 0.5, 1, 0: mean 0.5, sample variance 0.25, SE sqrt(0.25 / 3), 2 df.
    estimate = clustered_mean([[1, 0], [1, 1], [0, 0]])
    half = T2 * math.sqrt(0.25 / 3)
    assert (estimate.mean, estimate.n) == (0.5, 3)
    assert estimate.low == pytest.approx(0.5 - half) and estimate.high == pytest.approx(0.5 + half)
    # six "independent" rollouts would claim a much narrower interval (5 df, SE sqrt(0.3 / 6))
    naive = mean_with_ci([1, 0, 1, 1, 0, 0])
    assert naive.high - naive.low < (estimate.high - estimate.low) / 2
    # uneven clusters (CR1): residual sums 3 * 0.25 and -0.75, SE^2 = 2/1 * 1.125 / 4^2
    uneven = clustered_mean([[1, 1, 1], [0]])
    assert uneven.mean == 0.75 and uneven.high == pytest.approx(0.75 + T1 * 0.375)
    single = clustered_mean([[1, 0, 1]])
    assert (single.mean, single.low, single.high, single.n) == (pytest.approx(2 / 3), None, None, 1)


def test_paired_difference_uses_shared_examples_only(tmp_path: Path):
    base = run_of(tmp_path, {0: [1, 0], 1: [0, 0], 2: [1, 1], 3: [1, 1]}, "base")
    trained = run_of(tmp_path, {0: [1, 1], 1: [1, 0], 2: [1, 1], 4: [0, 0]}, "trained")
    report = build_report([base, trained])
    (comparison,) = report.comparisons
    # shared 0, 1, 2: differences 0.5, 0.5, 0 -> mean 1/3, variance 1/12, SE sqrt(1/36) = 1/6
    assert (comparison.name, comparison.baseline, comparison.paired_examples) == (
        "trained",
        "base",
        3,
    )
    assert comparison.prompts_differ == 0
    diff = comparison.difference
    assert diff.mean == pytest.approx(1 / 3) and diff.n == 3
    assert diff.low == pytest.approx(1 / 3 - T2 / 6) and diff.high == pytest.approx(1 / 3 + T2 / 6)
    markdown = render_markdown(report)
    assert "| trained | 3 (of 4 and 4) | +0.333 [-0.384, +1.050] |" in markdown
    assert "Warning" not in markdown


def test_different_prompts_for_the_same_example_id_are_flagged(tmp_path: Path):
    base = run_of(tmp_path, {0: [1], 1: [0]}, "base")
    rows = [rollout(0, 1.0), rollout(1, 1.0, prompt=[{"role": "user", "content": "other"}])]
    other = load_run(write_run(tmp_path / "other", rows), "other")
    report = build_report([base, other])
    assert report.comparisons[0].prompts_differ == 1
    assert "**Warning:** 1 of 2 paired examples of other" in render_markdown(report)


# ---- the other columns -----------------------------------------------------------------------


def test_summary_reads_metadata_metrics_errors_truncation_and_lengths(tmp_path: Path):
    error = {"error": "ValueError", "error_chain_repr": "ValueError('x')", "error_chain_str": "x"}
    rows = [
        rollout(0, 1.0, completion=[{"role": "assistant", "content": "abcd"}]),
        rollout(0, 0.0, is_truncated=True, token_usage={"output_tokens": 9.0}),
        rollout(1, 0.0, error=error, completion=[]),
        rollout(
            1,
            1.0,
            completion=[
                {"role": "assistant", "content": [{"type": "text", "text": "ab"}]},
                {"role": "tool", "content": "a tool result is not counted", "tool_call_id": "1"},
                {"role": "assistant", "content": "xyz"},
            ],
        ),
    ]
    summary = summarize(load_run(write_run(tmp_path / "run", rows, model="org/m"), "r"), 1.0)
    assert (summary.env_id, summary.model) == ("vf-deepscaler", "org/m")
    assert summary.sampling_args == {"n": 1, "max_tokens": 64}
    assert (summary.num_examples, summary.num_rollouts, summary.rollouts_per_example) == (2, 4, 2)
    assert summary.reward.mean == 0.5
    assert summary.metrics == {"correct": 0.5, "num_turns": 1.0}
    assert (summary.errored, summary.truncated) == (0.25, 0.25)
    assert summary.completion_chars == (4 + len("\\boxed{4}") + 0 + 5) / 4
    assert summary.completion_tokens == (5 + 9 + 5 + 5) / 4


def musique_full_row(example_id: int, pair: str, answerable: bool, right: bool) -> dict[str, Any]:
    """A MuSiQue-Full rollout: `info.pair_id` names its twin, `correct` says whether it was right
    (reward 1 when right, else 0, for simplicity)."""
    row = rollout(example_id, float(right), info={"pair_id": pair, "answerable": answerable})
    row["metrics"]["correct"] = float(right)
    return row


def test_musique_full_paired_metric_beside_the_mean(tmp_path: Path):
    """A pair counts only when both twins are right (each twin's share of right rollouts,
    multiplied): "always unanswerable" is right on every unanswerable row, 0.4 of the rows here,
    and on no pair; an example without its twin counts in no pair. Rows without pair ids show no
    paired row."""
    lazy = [
        musique_full_row(e, pair, answerable, right=not answerable)
        for e, pair, answerable in [(0, "a", True), (1, "a", False), (2, "b", True)]
        + [(3, "b", False), (4, "c", True)]
    ]
    honest = [
        musique_full_row(e, pair, answerable, right)
        for e, pair, answerable, rights in [
            (0, "a", True, [True, True]),
            (1, "a", False, [True, False]),
            (2, "b", True, [True, True]),
            (3, "b", False, [True, True]),
            (4, "c", True, [False, False]),
        ]
        for right in rights
    ]
    runs = [
        load_run(write_run(tmp_path / name, rows, env_id="vf-musique"), name)
        for name, rows in [("lazy", lazy), ("honest", honest)]
    ]
    report = build_report(runs)
    lazy_summary, honest_summary = report.runs
    assert lazy_summary.reward.mean == pytest.approx(0.4) and lazy_summary.paired == 0.0
    assert honest_summary.paired == pytest.approx((1.0 * 0.5 + 1.0 * 1.0) / 2)
    assert "| paired correct (both twins) | 0.000 | 0.750 |" in render_markdown(report)
    plain = build_report([run_of(tmp_path, {0: [1.0], 1: [0.0]})])
    assert plain.runs[0].paired is None and "paired correct" not in render_markdown(plain)


def test_fields_vf_eval_did_not_save_are_reported_as_missing(tmp_path: Path):
    rows = [{"example_id": 0, "reward": 1.0}, {"example_id": 0, "reward": 0.0}]
    out = tmp_path / "bare"
    (out / "x").mkdir(parents=True)
    (out / "x" / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = summarize(load_run(out, "bare"), 1.0)
    assert (summary.env_id, summary.model, summary.metrics) == (None, None, {})
    assert (summary.errored, summary.truncated, summary.completion_tokens) == (None, None, None)
    assert summary.pass_at_k == {"1": 0.5, "2": 1.0}
    assert "| errored | not saved |" in render_markdown(build_report([load_run(out, "bare")]))


def test_uneven_rollout_counts_use_each_examples_own_n(tmp_path: Path):
    # an interrupted run: example 0 has 2 rollouts (1 success), example 1 only 1 (a success)
    summary = summarize(run_of(tmp_path, {0: [1, 0], 1: [1]}), 1.0)
    assert summary.rollouts_per_example is None and summary.pass_at_k == {"1": 0.75}


def test_runs_of_different_environments_are_refused(tmp_path: Path):
    base = run_of(tmp_path, {0: [1]}, "base")
    other = run_of(tmp_path, {0: [1]}, "other", env_id="vf-musique")
    with pytest.raises(ResultsError, match="different environments.*vf-musique"):
        build_report([base, other])


# ---- bad input -------------------------------------------------------------------------------


def test_malformed_lines_name_the_file_and_line(tmp_path: Path):
    out = write_run(tmp_path / "run", rows_of({0: [1, 0]}))
    results = next(out.rglob("results.jsonl"))
    good = json.dumps(rollout(1, 1.0))
    results.write_text(results.read_text() + "\n" + good + "\n{not json\n")
    with pytest.raises(ResultsError, match=r"results\.jsonl:5: not valid JSON"):
        load_run(out, "run")
    results.write_text(good + "\n" + json.dumps({"example_id": 1, "score": 1}) + "\n")
    with pytest.raises(ResultsError, match=r"results\.jsonl:2: no 'reward' field"):
        load_run(out, "run")
    results.write_text(json.dumps({"example_id": 0, "reward": None}) + "\n")
    with pytest.raises(ResultsError, match=r":1: reward None is not a finite number"):
        load_run(out, "run")
    results.write_text(json.dumps(rollout("a", 1.0)) + "\n")
    with pytest.raises(ResultsError, match=r":1: example_id 'a' is not an integer"):
        load_run(out, "run")


def test_directories_without_exactly_one_run_are_refused(tmp_path: Path):
    with pytest.raises(ResultsError, match="no such directory"):
        load_run(tmp_path / "missing", "x")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ResultsError, match="no results.jsonl below it"):
        load_run(tmp_path / "empty", "x")
    write_run(tmp_path / "two", rows_of({0: [1]}), model="a")
    write_run(tmp_path / "two", rows_of({0: [1]}), model="b")
    with pytest.raises(ResultsError, match="holds 2 vf-eval runs; pass one of"):
        load_run(tmp_path / "two", "x")


@pytest.mark.slow
def test_cli_errors_are_one_line_without_a_traceback(tmp_path: Path):
    write_run(tmp_path / "run", [{"example_id": 0}])
    for args in [[tmp_path / "nothing-here"], [tmp_path / "run"]]:
        result = cli(*args)
        assert result.returncode != 0 and "Traceback" not in result.stderr
        assert result.stderr.startswith("error: ")
    result = cli(tmp_path / "run", "--names", "a,b")
    assert result.returncode == 2 and "--names has 2 names for 1 RUN_DIRs" in result.stderr


# ---- outputs ---------------------------------------------------------------------------------


def tool_rollout(reward: float) -> dict[str, Any]:
    """A tool-using rollout as vf-eval saves it: tool calls as JSON strings, tool messages."""
    call = json.dumps({"id": "c1", "name": "search", "arguments": '{"q": "x"}'})
    completion = [
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": "result", "tool_call_id": "c1"},
        {"role": "assistant", "content": "\\boxed{4}", "tool_calls": None},
    ]
    tools = [{"name": "search", "description": "d", "parameters": {"type": "object"}}]
    return rollout(3, reward, completion=completion, tool_defs=tools)


def test_metric_estimate_is_clustered_by_example_like_the_reward(tmp_path: Path):
    run = run_of(tmp_path, {0: [1, 0], 1: [1, 1], 2: [0, 0]})
    correct = metric_estimate(run, "correct")
    assert correct == summarize(run, 1.0).reward
    assert correct.n == 3 and correct.mean == pytest.approx(0.5)
    assert metric_estimate(run, "num_turns") == clustered_mean([[1.0, 1.0]] * 3)
    with pytest.raises(ResultsError, match="no rollout logged the metric 'win'"):
        metric_estimate(run, "win")


def test_metric_difference_pairs_a_reward_part_by_example(tmp_path: Path):
    def with_searches(rewards: dict[int, list[float]], searches: dict[int, float], name: str):
        rows = rows_of(rewards)
        for row in rows:  # an example without an entry never logs the part
            if row["example_id"] in searches:
                row["metrics"]["searches"] = searches[row["example_id"]]
        return load_run(write_run(tmp_path / name, rows), name)

    base = with_searches({0: [1, 0], 1: [0, 0], 2: [1, 1], 3: [0, 0]}, {0: 0, 1: 1, 2: 1}, "base")
    trained = with_searches({0: [1, 1], 1: [1, 0], 2: [1, 1], 4: [0, 0]}, {0: 2, 1: 2}, "trained")
    # `correct` is 1 where the reward is: the same pairing as the reward's (shared 0, 1, 2)
    correct = metric_difference(base, trained, "correct")
    assert correct == build_report([base, trained]).comparisons[0].difference
    assert correct.n == 3 and correct.mean == pytest.approx(1 / 3)
    # `searches`: example 2 is left out (not logged by `trained`), not read as 0: +2, +1
    searches = metric_difference(base, trained, "searches")
    assert searches.n == 2 and searches.mean == pytest.approx(1.5)
    assert searches.low == pytest.approx(1.5 - T1 * 0.5)
    with pytest.raises(ResultsError, match="share no example logging 'win'"):
        metric_difference(base, trained, "win")
    with pytest.raises(ResultsError, match="share no example ids"):
        metric_difference(base, run_of(tmp_path, {7: [1]}, "other"), "correct")


def test_export_keeps_exactly_the_clean_rollouts_at_the_bar(tmp_path: Path):
    error = {"error": "E", "error_chain_repr": "E()", "error_chain_str": "E"}
    rows = [
        rollout(0, 1.0),
        rollout(0, 0.0),
        rollout(1, 0.5),
        rollout(2, 1.0, error=error),
        tool_rollout(1.0),
    ]
    run = load_run(write_run(tmp_path / "run", rows), "run")
    out = tmp_path / "data" / "chat.jsonl"
    assert export_chat_jsonl([run], out, 1.0) == (2, 5)
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [line["messages"] for line in lines] == [
        rows[0]["prompt"] + rows[0]["completion"],
        rows[4]["prompt"] + rows[4]["completion"],
    ]
    assert "tools" not in lines[0] and lines[1]["tools"] == rows[4]["tool_defs"]
    assert export_chat_jsonl([run], out, 0.5) == (3, 5)
    assert not list(out.parent.glob(".*"))  # nothing left from the atomic write


def test_export_refuses_text_completions(tmp_path: Path):
    run = load_run(write_run(tmp_path / "run", [rollout(0, 1.0, completion="text")]), "run")
    with pytest.raises(ResultsError, match=r"results\.jsonl:1: .*not chat messages"):
        export_chat_jsonl([run], tmp_path / "chat.jsonl", 1.0)
    assert not (tmp_path / "chat.jsonl").exists()


def test_cli_writes_markdown_json_and_chat_data(tmp_path: Path):
    base = write_run(tmp_path / "base", rows_of({0: [1, 0], 1: [0, 0]}))
    trained = write_run(tmp_path / "trained", rows_of({0: [1, 1], 1: [1, 0]}))
    out = tmp_path / "report"
    result = cli(
        base,
        trained,
        "--names",
        "base,trained",
        "--threshold",
        "1",
        "--out",
        out / "r.md",
        "--json",
        out / "r.json",
        "--export-sft",
        out / "chat.jsonl",
        "--min-reward",
        "1",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == (out / "r.md").read_text()
    assert "| **mean reward** [95% CI] | 0.250 [" in result.stdout
    assert "kept 4 of 8 rollouts (reward >= 1, errored ones skipped)" in result.stderr
    report = json.loads((out / "r.json").read_text())
    assert [run["name"] for run in report["runs"]] == ["base", "trained"]
    assert [run["reward"]["mean"] for run in report["runs"]] == [0.25, 0.75]
    assert report["runs"][1]["pass_at_k"] == {"1": 0.75, "2": 1.0}
    assert report["comparisons"][0]["difference"]["mean"] == 0.5
    assert len((out / "chat.jsonl").read_text().splitlines()) == 4


# ---- the real vf-eval ------------------------------------------------------------------------
