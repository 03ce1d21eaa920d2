"""The scripted MuSiQue demonstrator (`vf_musique.scripted:hop_searcher`) played through the
environment's own rollout loop and rubric (`env.generate` with `rlvr.scripted.ScriptedClient`),
and through `rlvr-demos`, on the real rows in shared/data/musique."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from statistics import fmean
from typing import Any

import pytest
from vf_musique import load_environment
from vf_musique.answers import is_refusal
from vf_musique.scripted import (
    REFUSALS,
    DemonstratorError,
    HopSearcher,
    gold_or_alias,
    hop_searcher,
    read_book,
)

from rlvr.eval.demonstrations import main as demos
from rlvr.scripted import Policy, ScriptedClient


def run(env: Any, policy: Policy) -> list[dict[str, Any]]:
    """Every eval row of `env`, one rollout each, through env.generate (loop, tools, rubric)."""
    result = asyncio.run(
        env.generate(
            env.get_eval_dataset(),
            client=ScriptedClient(policy),
            model="scripted",
            on_progress=lambda *a: None,
        )
    )
    return result["outputs"]


def raw_rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def unanswerable_twin(row: dict[str, Any], hop: int) -> dict[str, Any]:
    """The row made unanswerable the MuSiQue-Full way: the supporting paragraphs of hop `hop`
    and of the hops after it are gone from the context; the earlier hops keep theirs."""
    steps = [dict(step) for step in row["question_decomposition"]]
    removed = {step.pop("paragraph_support_idx") for step in steps[hop:]}
    return {
        **row,
        "answerable": False,
        "question_decomposition": steps,
        "paragraphs": [p for p in row["paragraphs"] if p["idx"] not in removed],
    }


FIXTURE = Path("musique") / "fixture_small.jsonl"  # under shared_data (tests/conftest.py)
DEV = Path("musique") / "dev_sample.jsonl"


def test_hop_searcher_scores_at_least_0_9_with_valid_tool_calls_on_fixture(shared_data):
    """MuSiQue-Full fixture (6 answerable, 3 unanswerable rows): the rubric's mean reward is at
    least 0.9, every tool call got a result (tool_errors 0), every answerable row is answered
    right and every unanswerable one declined with a backed claim."""
    env = load_environment(data_files=str(shared_data / FIXTURE), dataset_config="full")
    outputs = run(env, hop_searcher(0, str(shared_data / FIXTURE)))
    assert len(outputs) == 9
    assert fmean(out["reward"] for out in outputs) >= 0.9
    for out in outputs:
        m = out["metrics"]
        assert (m["format"], m["tool_errors"]) == (1.0, 0.0), out["info"]["id"]
        if out["info"]["answerable"]:
            assert (m["exact_match"], m["said_unanswerable"]) == (1.0, 0.0)
            assert m["searches"] >= out["info"]["n_hops"]  # a search per hop
        else:
            assert (m["said_unanswerable"], m["unanswerable_earned"]) == (1.0, 1.0)


@pytest.mark.slow
def test_hop_searcher_on_200_dev_rows(shared_data):
    """The 200 dev rows: the right answer everywhere, the
    supporting paragraphs it was shown cited, no tool error."""
    env = load_environment(data_files=str(shared_data / DEV))
    outputs = run(env, hop_searcher(1, str(shared_data / DEV)))
    assert len(outputs) == 200
    assert all(out["metrics"]["exact_match"] == 1.0 for out in outputs)
    assert all(out["metrics"]["tool_errors"] == 0.0 for out in outputs)
    assert fmean(out["reward"] for out in outputs) >= 0.95
    parts = ("reward", "citation_f1", "retrieval_recall")
    means = [
        fmean(o["reward"] if k == "reward" else o["metrics"][k] for o in outputs) for k in parts
    ]
    print(
        "\nhop_searcher, 200 dev rows:",
        ", ".join(f"{k} {m:.3f}" for k, m in zip(parts, means, strict=True)),
    )


@pytest.mark.parametrize("missing", ["first", "last"])
def test_hop_searcher_declines_exactly_when_a_hop_is_missing(shared_data, tmp_path, missing):
    """Twins sharing a question in one file, as in MuSiQue-Full: the searcher answers the
    answerable one and declines the one whose hop evidence is gone, telling them apart only by
    what its searches showed; the claim is backed (earned) wherever it found the kept hops."""
    rows = [r for r in raw_rows(shared_data / DEV) if len(r["question_decomposition"]) == 2][:10]
    twins = [
        unanswerable_twin(r, 0 if missing == "first" else len(r["question_decomposition"]) - 1)
        for r in rows
    ]
    path = tmp_path / "twins.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows + twins))
    env = load_environment(data_files=str(path), dataset_config="full")
    outputs = run(env, hop_searcher(2, str(path)))
    answered = [out for out in outputs if out["info"]["answerable"]]
    declined = [out for out in outputs if not out["info"]["answerable"]]
    assert len(answered) == len(declined) == 10
    assert all(out["metrics"]["said_unanswerable"] == 0.0 for out in answered)
    assert all(out["metrics"]["said_unanswerable"] == 1.0 for out in declined)
    assert fmean(out["metrics"]["unanswerable_earned"] for out in declined) >= 0.9
    assert all(out["metrics"]["tool_errors"] == 0.0 for out in outputs)


def test_a_wrong_answer_from_the_hop_searcher_scores_low(shared_data):
    """The same searches and citations with a wrong answer: exact match 0 on every row and at
    most the evidence terms (0.3), where the right answer scores at least 0.9."""
    env = load_environment(data_files=str(shared_data / FIXTURE))
    book = read_book(str(shared_data / FIXTURE))
    honest = run(env, HopSearcher(book, 0, lambda row, rng: row["answer"]))
    wrong = run(env, HopSearcher(book, 0, lambda row, rng: "Paris"))
    assert fmean(out["reward"] for out in honest) >= 0.9
    assert all(out["metrics"]["exact_match"] == 0.0 for out in wrong)
    assert all(out["reward"] <= 0.3 + 1e-9 for out in wrong)
    assert fmean(out["reward"] for out in wrong) < 0.5 * fmean(out["reward"] for out in honest)


def test_seeds_vary_the_queries_and_answers(shared_data):
    """Several phrasings per hop and answers among the aliases, chosen by the seed: SFT on the
    rollouts sees more than one string per row."""
    book = read_book(str(shared_data / DEV))
    system = {"role": "system", "content": "Answer the question."}

    def first_query(seed: int, question: str) -> str:
        (first,) = HopSearcher(book, seed, gold_or_alias)(
            [system, {"role": "user", "content": question}]
        )
        return json.loads(first.arguments)["query"]

    varied = [q for q in list(book)[:40] if len({first_query(s, q) for s in range(6)}) > 1]
    assert len(varied) >= 30
    aliased = [rows[0] for rows in book.values() if rows[0].get("answer_aliases")][:20]
    searchers = [HopSearcher(book, seed, gold_or_alias) for seed in range(8)]
    answers = {s.answer(row, s.rng(row, "answer")) for s in searchers for row in aliased}
    assert len(answers) > len(aliased)


def test_refusal_phrasings_read_as_unanswerable():
    assert all(is_refusal(text) for text in REFUSALS)


def test_an_unknown_question_or_file_is_a_clear_error(shared_data, tmp_path):
    policy = hop_searcher(0, str(shared_data / FIXTURE))
    with pytest.raises(DemonstratorError, match="no row for the question 'Who won"):
        policy([{"role": "system", "content": ""}, {"role": "user", "content": "Who won?"}])
    with pytest.raises(DemonstratorError, match="cannot read"):
        hop_searcher(0, str(tmp_path / "missing.jsonl"))
    with pytest.raises(DemonstratorError, match="needs data_files"):
        hop_searcher(0)


def test_rlvr_demos_plays_the_hop_searcher(shared_data, tmp_path, capsys):
    """`rlvr-demos --policy vf_musique.scripted:hop_searcher --policy-args {data_files}` keeps
    every fixture rollout at reward >= 0.9 as a chat row with the tools and the model's calls."""
    out = tmp_path / "demos.jsonl"
    files = json.dumps({"data_files": str(shared_data / FIXTURE)})
    common = ["--env", "vf-musique", "--out", str(out), "--policy-args", files]
    env_args = json.dumps({"data_files": str(shared_data / FIXTURE), "dataset_config": "full"})
    policy = "vf_musique.scripted:hop_searcher"
    demos([*common, "--env-args", env_args, "--policy", policy, "--min-reward", "0.9"])
    assert "kept 9 of 9 rollouts" in capsys.readouterr().err
    rows = raw_rows(out)
    assert {tool["name"] for tool in rows[0]["tools"]} == {"retrieve_documents", "submit_answer"}
    calls = [m for m in rows[0]["messages"] if m["role"] == "assistant"]
    assert calls and all(m["tool_calls"] for m in calls)
    with pytest.raises(SystemExit, match="unexpected keyword argument 'top'"):
        bad = json.dumps({"data_files": str(shared_data / FIXTURE), "top": 1})
        demos([*common[:4], "--env-args", env_args, "--policy", policy, "--policy-args", bad])
