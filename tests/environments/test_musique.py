"""vf-musique on real MuSiQue rows, driven through the real verifiers loop by scripted agents.

A scripted agent is a policy function (prompt messages -> tool calls or text) answering through
`rlvr.scripted.ScriptedClient`; the environment, its tools and its rubric run exactly as they do
against a model server.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
from collections.abc import Callable
from itertools import product
from pathlib import Path
from statistics import fmean
from typing import Any

import pytest
from verifiers.types import ToolCall
from vf_musique import DEFAULT_WEIGHTS, MusiqueDataError, answerability, load_environment
from vf_musique import dataset as musique_dataset
from vf_musique.answers import (
    MAX_FORM_CHARS,
    AnswerContext,
    is_refusal,
    judge_answer,
    matching_gold,
)
from vf_musique.hops import content_terms, few_searches, searched_missing_hop
from vf_musique.messages import parse_tool_call, tool_calls
from vf_musique.replies import get_field, message_text
from vf_musique.retrieval import (
    ENCODER,
    Document,
    IndexCache,
    QuestionIndex,
    reciprocal_rank_fusion,
)
from vf_musique.rubric import combine, read_rollout, score_components
from vf_musique.scoring import exact_match, normalize_answer, token_f1
from vf_musique.tools import parse_submission

from rlvr.scripted import Policy, ScriptedClient, render

from . import musique_corpus, musique_grammar
from .musique_corpus import sub_questions

DOC_ID = re.compile(r"^Document ID: (\d+)$", re.MULTILINE)


def read_rows(path: Path) -> dict[str, dict[str, Any]]:
    """Raw MuSiQue rows keyed by question (the scripted agent's oracle)."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {row["question"]: row for row in rows}


def call(name: str, args: dict[str, Any] | str, call_id: str) -> ToolCall:
    arguments = args if isinstance(args, str) else json.dumps(args)
    return ToolCall(id=call_id, name=name, arguments=arguments)


def question_of(prompt: list[Any]) -> str:
    return next(message_text(m) for m in prompt if get_field(m, "role") == "user")


def turns_taken(prompt: list[Any]) -> int:
    return sum(1 for m in prompt if get_field(m, "role") == "assistant")


def seen_doc_ids(prompt: list[Any]) -> set[int]:
    """Document IDs the tools have shown so far (what a model could cite)."""
    tool_texts = (message_text(m) for m in prompt if get_field(m, "role") == "tool")
    return {int(i) for text in tool_texts for i in DOC_ID.findall(text)}


def gold_answer(row: dict[str, Any]) -> str:
    return row["answer"] if row.get("answerable", True) else "unanswerable"


def supporting(row: dict[str, Any]) -> list[int]:
    return [p["idx"] for p in row["paragraphs"] if p["is_supporting"]]


def decomposition_agent(
    rows: dict[str, dict[str, Any]],
    answer: Callable[[dict[str, Any]], Any] = gold_answer,
    cite: Callable[[dict[str, Any], set[int]], list[int]] | None = None,
    top_n: int | None = None,
) -> Policy:
    """Retrieve once per decomposition step, then submit `answer(row)` citing `cite(row, seen)`
    (by default the supporting paragraphs it has seen)."""
    cite = cite or (lambda row, seen: [i for i in supporting(row) if i in seen])

    def policy(prompt: list[Any]) -> list[ToolCall]:
        row = rows[question_of(prompt)]
        queries = sub_questions(row)
        turn = turns_taken(prompt)
        if turn < len(queries):
            args: dict[str, Any] = {"query": queries[turn]}
            if top_n is not None:
                args["top_n"] = top_n
            return [call("retrieve_documents", args, f"r{turn}")]
        cited = [str(i) for i in cite(row, seen_doc_ids(prompt))]
        return [call("submit_answer", {"answer": answer(row), "cited_doc_ids": cited}, "final")]

    return policy


def run(env, policy: Policy, n: int = -1) -> list[dict[str, Any]]:
    """All rollouts of the env's eval rows through env.generate (the real loop and rubric)."""
    inputs = env.get_eval_dataset(n=n)
    result = asyncio.run(
        env.generate(
            inputs, client=ScriptedClient(policy), model="scripted", on_progress=lambda *a: None
        )
    )
    return result["outputs"]


def rollout_state(env, policy: Policy, row_index: int = 0, tokens: bool = False):
    """One rollout through env.rollout, returning the live State."""
    row = env.get_eval_dataset()[row_index]
    return asyncio.run(env.rollout(row, ScriptedClient(policy, tokens), "scripted", {}))


def tool_replies(completion: list[Any]) -> list[str]:
    return [message_text(m) for m in completion if get_field(m, "role") == "tool"]


@pytest.fixture(scope="session")
def fixture_path(shared_data: Path) -> Path:
    return shared_data / "musique" / "fixture_small.jsonl"


@pytest.fixture(scope="session")
def dev_path(shared_data: Path) -> Path:
    return shared_data / "musique" / "dev_sample.jsonl"


@pytest.fixture(scope="session")
def fixture_rows(fixture_path: Path) -> dict[str, dict[str, Any]]:
    return read_rows(fixture_path)


@pytest.fixture(scope="session")
def dev_rows(dev_path: Path) -> dict[str, dict[str, Any]]:
    return read_rows(dev_path)


@pytest.fixture(scope="session")
def full_env(fixture_path: Path):
    """MuSiQue-Full fixture: six answerable rows and three unanswerable ones."""
    return load_environment(data_files=str(fixture_path), dataset_config="full")


@pytest.fixture(scope="session")
def dev_env(dev_path: Path):
    return load_environment(data_files=str(dev_path))


# --- the scripted decomposition agent scores 1 -------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("retriever", ["bm25", "golden", "hybrid"])
def test_decomposition_agent_scores_one_on_fixture(fixture_path, fixture_rows, retriever):
    env = load_environment(data_files=str(fixture_path), dataset_config="full", retriever=retriever)
    outputs = run(env, decomposition_agent(fixture_rows))
    assert len(outputs) == 9
    for out in outputs:
        assert out["metrics"]["format"] == 1.0
        assert out["metrics"]["exact_match"] == 1.0
        assert out["metrics"]["citation_f1"] == 1.0
        assert out["reward"] == 1.0, out["info"]["id"]


@pytest.mark.slow
def test_decomposition_agent_on_200_dev_rows(dev_env, dev_rows):
    """Gold answers score EM/F1 1 everywhere; the reward is exactly the documented formula,
    1.0 wherever the sub-question searches surfaced every supporting paragraph."""
    outputs = run(dev_env, decomposition_agent(dev_rows))
    assert len(outputs) == 200
    for out in outputs:
        m = out["metrics"]
        assert (m["format"], m["exact_match"], m["f1"]) == (1, 1, 1)
        # it cites the supporting paragraphs it saw: all precise, recall = retrieval recall
        assert m["citation_recall"] == m["retrieval_recall"]
        assert m["citation_precision"] == (1.0 if m["citation_recall"] else 0.0)
        assert m["docs_shown"] <= 3 * out["info"]["n_hops"]  # within budget: score = recall
        assert m["retrieval_score"] == m["retrieval_recall"]
        expected = 0.7 + 0.2 * m["citation_f1"] + 0.1 * m["retrieval_score"]
        assert out["reward"] == pytest.approx(expected)
        if m["retrieval_recall"] == 1.0:
            assert out["reward"] == 1.0
    mean_reward = sum(out["reward"] for out in outputs) / len(outputs)
    assert mean_reward > 0.95


# --- wrong and exploit-shaped answers score low ------------------------------------------------


def test_wrong_answer_scores_low(full_env, fixture_rows):
    outputs = run(full_env, decomposition_agent(fixture_rows, answer=lambda row: "Paris"))
    for out in outputs:
        assert out["metrics"]["exact_match"] == 0.0
        assert out["metrics"]["f1"] == 0.0
        # evidence only (0.2 citations + 0.1 retrieval) where there is an answer to find; none on
        # an unanswerable row, where only "unanswerable" is right
        expected = 0.3 if out["info"]["answerable"] else 0.0
        assert out["reward"] == pytest.approx(expected)


def test_citing_every_document_scores_lower_than_right_citations(dev_env, dev_rows):
    right = run(dev_env, decomposition_agent(dev_rows, top_n=5), n=20)
    everything = run(
        dev_env, decomposition_agent(dev_rows, cite=lambda row, seen: sorted(seen), top_n=5), n=20
    )
    for good, greedy in zip(right, everything, strict=True):
        assert greedy["metrics"]["citation_recall"] == good["metrics"]["citation_recall"]
        assert greedy["metrics"]["citation_precision"] < 1.0
        assert greedy["reward"] < good["reward"]


def test_listing_candidate_answers_does_not_win(full_env, fixture_rows):
    def hedge(row: dict[str, Any]) -> str:
        candidates = [step["answer"] for step in row["question_decomposition"]]
        return ", ".join(candidates)  # the gold answer is among the candidates

    honest = run(full_env, decomposition_agent(fixture_rows), n=6)
    hedged = run(full_env, decomposition_agent(fixture_rows, answer=hedge), n=6)
    for good, bad in zip(honest, hedged, strict=True):
        assert bad["metrics"]["exact_match"] == 0.0
        assert bad["metrics"]["f1"] < 0.7
        assert bad["reward"] < good["reward"]


def test_answer_as_a_list_is_refused_and_the_rollout_goes_on(full_env, fixture_rows):
    """A list of candidates is not accepted; the agent then sends one answer and is scored."""
    base = decomposition_agent(fixture_rows)

    def policy(prompt):
        row = fixture_rows[question_of(prompt)]
        calls = base(prompt)
        if calls[0].name == "submit_answer" and not any(
            "answer must be one string" in message_text(m) for m in prompt
        ):
            args = json.loads(calls[0].arguments)
            args["answer"] = [gold_answer(row), "Paris"]
            return [call("submit_answer", args, "listed")]
        return calls

    out = run(full_env, policy, n=1)[0]
    replies = tool_replies(out["completion"])
    assert any(r.startswith("Error: answer must be one string") for r in replies)
    assert replies[-1] == "Answer submitted."
    assert out["reward"] == 1.0


# --- unanswerable rows and aliases ------------------------------------------------------------


def test_unanswerable_rows(full_env, fixture_rows, fixture_path):
    outputs = run(full_env, decomposition_agent(fixture_rows))
    unanswerable = [o for o in outputs if not o["info"]["answerable"]]
    assert len(unanswerable) == 3
    for out in unanswerable:
        assert out["answer"] == "unanswerable"
        assert out["metrics"]["exact_match"] == 1.0
        assert out["reward"] == 1.0
    # answering an unanswerable question with the (unsupported) original answer is wrong
    original = run(full_env, decomposition_agent(fixture_rows, answer=lambda row: row["answer"]))
    for out in original:
        expected = 1.0 if out["info"]["answerable"] else 0.0
        assert out["metrics"]["exact_match"] == expected
    # the answerable config drops them, and its prompt does not mention "unanswerable"
    answerable_env = load_environment(data_files=str(fixture_path))
    rows = answerable_env.get_eval_dataset()
    assert len(rows) == 6 and all(info["answerable"] for info in rows["info"])
    assert "unanswerable" not in answerable_env.system_prompt
    assert "unanswerable" in full_env.system_prompt


def always_unanswerable(
    rows: dict[str, dict[str, Any]], queries: Callable[[dict[str, Any]], list[str]]
) -> Policy:
    """Searches `queries(row)`, one per turn, then claims "unanswerable" citing nothing."""

    def policy(prompt: list[Any]) -> list[ToolCall]:
        searches = queries(rows[question_of(prompt)])
        turn = turns_taken(prompt)
        if turn < len(searches):
            return [call("retrieve_documents", {"query": searches[turn]}, f"r{turn}")]
        return [call("submit_answer", {"answer": "unanswerable", "cited_doc_ids": []}, "final")]

    return policy


def mean_reward(outputs: list[dict[str, Any]]) -> float:
    return sum(out["reward"] for out in outputs) / len(outputs)


def small_changes(question: str) -> list[str]:
    """The question searched again and again, reworded just enough to look like new queries."""
    return [
        question,
        f"{question} please",
        f"search: {question}",
        question.lower().rstrip("?"),
        f"{question} (again)",
    ]


def extra_words(question: str) -> list[str]:
    """The question with words put before or after it, so no query is the question verbatim."""
    return [
        f"documents about {question}",
        f"{question} wikipedia article",
        f"Find the paragraph that answers: {question} Give names, dates and places.",
    ]


def question_searches(rows: dict[str, dict[str, Any]]) -> dict[str, Policy]:
    """The no-effort "unanswerable" policies that search the question itself."""
    return {
        "question, small changes": always_unanswerable(
            rows, lambda r: small_changes(r["question"])
        ),
        "question, extra words": always_unanswerable(rows, lambda r: extra_words(r["question"])),
    }


def test_musique_full_junk_search_unanswerable_does_not_pay(
    full_env, fixture_rows, dev_env, dev_rows
):
    """No-effort "unanswerable" policies earn nothing on the MuSiQue-Full rows (6 answerable,
    3 unanswerable), the gold agent at least 0.9. "Unanswerable" pays only when backed: the
    supporting paragraphs the row keeps (the hops before the missing one) shown and cited, and
    a focused search for the missing hop (its own terms, none of the other hops', not the whole
    question). So no search, junk searches and the question searched repeatedly (with small
    changes or extra words) earn 0 on every row, also where the very first hop is missing; an
    agent that searches each hop's sub-question but always declines earns only on the rows
    whose first hop is missing, and never on an answerable row. The answerability decision is
    logged: its precision falls with every wrong claim, its recall with every missed one. Run
    with -s for the numbers."""
    junk = [f"zq{i} xv{i}" for i in range(4)]
    policies = {
        "no search": always_unanswerable(fixture_rows, lambda row: []),
        "junk searches": always_unanswerable(fixture_rows, lambda row: junk),
        **question_searches(fixture_rows),
        "each hop searched, nothing cited": always_unanswerable(fixture_rows, sub_questions),
    }
    full = {name: run(full_env, policy) for name, policy in policies.items()}
    honest = run(full_env, decomposition_agent(fixture_rows))
    for name, outputs in full.items():
        assert all(out["metrics"]["said_unanswerable"] == 1.0 for out in outputs)
        assert all(out["reward"] == 0.0 for out in outputs if out["info"]["answerable"]), name
        assert mean_reward(outputs) <= 0.25, name
    no_effort = ("no search", "junk searches", *question_searches(fixture_rows))
    for name in no_effort:
        assert all(out["reward"] == 0.0 for out in full[name]), name
    first_hop_missing = [o for o in honest if o["info"]["hops"][0]["support"] is None]
    assert len(first_hop_missing) == 2 and all(o["reward"] == 1.0 for o in first_hop_missing)
    assert mean_reward(honest) >= 0.9
    assert all(o["reward"] == 1.0 for o in honest if not o["info"]["answerable"])
    dev = run(dev_env, always_unanswerable(dev_rows, sub_questions))
    assert all(out["reward"] == 0.0 for out in dev)  # 200 answerable rows

    claimed = answerability(out["metrics"] for out in full["no search"])
    assert claimed == {"precision": pytest.approx(3 / 9), "recall": 1.0}
    assert answerability(out["metrics"] for out in honest) == {"precision": 1.0, "recall": 1.0}
    never = run(full_env, decomposition_agent(fixture_rows, answer=lambda row: row["answer"]))
    assert math.isnan(answerability(out["metrics"] for out in never)["precision"])
    assert answerability(out["metrics"] for out in never)["recall"] == 0.0
    print(
        "\nalways 'unanswerable' on the MuSiQue-Full fixture (6 answerable, 3 unanswerable):",
        {name: round(mean_reward(outputs), 3) for name, outputs in full.items()},
        f"on 200 answerable dev rows: {mean_reward(dev):.3f};",
        f"gold decomposition agent: {mean_reward(honest):.3f}",
    )


def without_hops_from(row: dict[str, Any], first_missing: int) -> dict[str, Any]:
    """The row made unanswerable the MuSiQue-Full way: the evidence of hop `first_missing` and
    of the hops after it is gone (the paragraphs stay, as distractors), the earlier hops keep
    theirs."""
    steps = [dict(step) for step in row["question_decomposition"]]
    removed = {step.pop("paragraph_support_idx") for step in steps[first_missing:]}
    paragraphs = [
        {**p, "is_supporting": p["is_supporting"] and p["idx"] not in removed}
        for p in row["paragraphs"]
    ]
    return {
        **row,
        "answerable": False,
        "question_decomposition": steps,
        "paragraphs": paragraphs,
    }


@pytest.mark.slow
@pytest.mark.parametrize("missing", ["first", "last"])
def test_question_searches_never_back_unanswerable_on_200_dev_rows(dev_rows, tmp_path, missing):
    """The 200 dev rows (unseen by the rule's design), each made unanswerable by removing its
    first or its last hop: the question searched repeatedly, with small changes or extra words,
    backs "unanswerable" on none of them; the gold agent (each hop's sub-question searched,
    the kept evidence it saw cited) on at least 90%."""
    rows = {
        q: without_hops_from(
            row, 0 if missing == "first" else len(row["question_decomposition"]) - 1
        )
        for q, row in dev_rows.items()
    }
    path = tmp_path / "unanswerable.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows.values()))
    env = load_environment(data_files=str(path), dataset_config="full")
    for name, policy in question_searches(rows).items():
        assert all(out["reward"] == 0.0 for out in run(env, policy)), name
    gold = run(env, decomposition_agent(rows))
    assert mean_reward(gold) >= 0.9
    print(
        f"\n{missing} hop removed, 200 dev rows: gold decomposition agent {mean_reward(gold):.3f}"
    )


def focused_for(info: dict[str, Any], *queries: str) -> bool:
    return searched_missing_hop([content_terms(q) for q in queries], info)


def test_a_missing_hop_counts_only_a_focused_search(full_env):
    """A query counts for the missing hop when it asks for that hop (half its terms, or the
    bridge answers it builds on) and for no other (no other hop's terms beyond its own, counted
    with repeats, and not the whole question); a hop with nothing to search for backs nothing."""
    infos = {info["id"]: info for info in full_env.get_eval_dataset()["info"]}
    first = infos["2hop__42543_20093"]  # writer of Crazy Little Thing Called Love; hop 1 missing
    assert focused_for(first, "who wrote crazy little thing called love")
    assert focused_for(first, "writer of Crazy Little Thing Called Love")
    assert not focused_for(
        first, first["question"], "the year Crazy Little Thing Called Love's writer died"
    )
    second = infos["2hop__150985_444333"]  # Routledge, publisher of the journal; hop 2 missing
    assert focused_for(second, "Routledge >> founded by")
    assert focused_for(second, "founder of Routledge")
    assert not focused_for(
        second, "founded by", "Routledge, publisher of Journal of Media Economics"
    )
    repeated = {
        "question": "Who is the father of Edward Baring's father?",
        "hops": [
            {"question": "Edward Baring >> father", "answer": "Thomas Baring", "support": None},
            {"question": "#1 >> father", "answer": "Francis Baring", "support": None},
        ],
    }
    assert focused_for(repeated, "Edward Baring's father")
    assert not focused_for(repeated, repeated["question"], "father of Edward Baring father")
    empty = {"question": "Who is it?", "hops": [{"question": "Who is it?", "support": None}]}
    assert not focused_for(empty, "who is it", "it")


@pytest.mark.slow
def test_showing_everything_scores_below_a_precise_agent(dev_env, dev_rows):
    """The same agent (one search per hop, gold answer, citing the supporting paragraphs it saw)
    with top_n=3 and with top_n=10: showing ~every paragraph lowers the retrieval term below the
    precise agent's wherever the precise one found the evidence, and on average."""
    precise = run(dev_env, decomposition_agent(dev_rows))
    everything = run(dev_env, decomposition_agent(dev_rows, top_n=10))
    for good, broad in zip(precise, everything, strict=True):
        assert good["metrics"]["exact_match"] == broad["metrics"]["exact_match"] == 1.0
        assert broad["metrics"]["docs_shown"] > good["metrics"]["docs_shown"]
        if good["metrics"]["retrieval_recall"] == 1.0:
            assert broad["reward"] < good["reward"], good["info"]["id"]
    assert mean_reward(everything) < mean_reward(precise)
    shown = sum(out["metrics"]["docs_shown"] for out in everything) / len(everything)
    print(
        f"\n200 dev rows: precise (top_n=3) {mean_reward(precise):.3f},"
        f" show-everything (top_n=10, {shown:.1f} paragraphs shown) {mean_reward(everything):.3f}"
    )


def test_an_unseen_citation_costs_citation_precision_not_the_answer(dev_env, dev_rows):
    """An agent that cites every supporting paragraph, seen or not (the issue's scripted agent):
    the submission is accepted with a note, the answer keeps its full score, and the unseen
    paragraphs count as wrong citations."""
    oracle = run(dev_env, decomposition_agent(dev_rows, cite=lambda row, seen: supporting(row)))
    missed = [out for out in oracle if out["metrics"]["retrieval_recall"] < 1.0]
    assert missed, "BM25's top 3 finds every supporting paragraph on every row"
    for out in oracle:
        m = out["metrics"]
        assert (m["format"], m["exact_match"], m["f1"]) == (1, 1, 1)
        assert m["citation_recall"] == m["retrieval_recall"]
        assert m["citation_precision"] == m["retrieval_recall"]  # cited = all supporting ones
        assert out["reward"] >= 0.7
    assert "count as wrong citations" in tool_replies(missed[0]["completion"])[-1]
    assert all(out["reward"] < 1.0 for out in missed)
    print(
        f"\ncites every supporting paragraph, top_n=3: mean {mean_reward(oracle):.3f};"
        f" {len(missed)} rows with an unseen citation, their mean {mean_reward(missed):.3f}"
    )


def test_aliases_score_exact_match_one(dev_env, dev_rows):
    with_aliases = {q: row for q, row in dev_rows.items() if row["answer_aliases"]}
    assert len(with_aliases) > 50
    outputs = run(
        dev_env,
        decomposition_agent(
            dev_rows, answer=lambda row: (row["answer_aliases"] or [row["answer"]])[-1]
        ),
    )
    scored = [o for o in outputs if o["info"]["answers"][1:]]
    assert len(scored) == len(with_aliases)
    assert all(o["metrics"]["exact_match"] == 1.0 for o in scored)


def test_alias_on_the_fixture_4hop_row(full_env, fixture_rows):
    outputs = run(
        full_env, decomposition_agent(fixture_rows, answer=lambda r: "alfredo stroessner")
    )
    row = next(o for o in outputs if o["info"]["id"].startswith("4hop2"))
    assert row["metrics"]["exact_match"] == 1.0


# --- conversation shape: tool messages, no leaked paragraphs ----------------------------------


def test_tool_messages_are_role_tool_and_model_turns_hold_only_assistant_messages(
    full_env, fixture_rows
):
    state = rollout_state(full_env, decomposition_agent(fixture_rows))
    completion = state["completion"]
    for message in completion:
        role = get_field(message, "role")
        assert role in {"assistant", "tool"}
        if role == "tool":
            assert get_field(message, "tool_call_id")
    assert [get_field(m, "role") for m in completion].count("tool") == 3  # 2 searches + submit
    # what a trainer gives loss to (each step's completion) is model output only
    for step in state["trajectory"]:
        assert [get_field(m, "role") for m in step["completion"]] == ["assistant"]
    assert state["stop_condition"] == "has_final_env_response"


def test_tool_messages_get_no_loss_in_the_trainers_token_masks(full_env, fixture_rows):
    """The trainer's own sample builder on this env's trajectory: loss falls on exactly the
    model's turns; the retrieved documents sit in the sequence with mask 0."""
    from rlvr.rollouts.to_samples import trajectory_samples

    state = rollout_state(full_env, decomposition_agent(fixture_rows), row_index=3, tokens=True)
    samples = trajectory_samples(state["trajectory"], max_seq_len=1_000_000)
    assert len(samples) == 1  # the turns extend each other, so one sequence trains every turn
    sample = samples[0]
    trained = "".join(chr(i) for i, m in zip(sample.input_ids, sample.loss_mask, strict=True) if m)
    untrained = "".join(
        chr(i) for i, m in zip(sample.input_ids, sample.loss_mask, strict=True) if not m
    )
    model_turns = [m for m in state["completion"] if get_field(m, "role") == "assistant"]
    assert trained == "".join(render(m) for m in model_turns)
    searches = [m for m in state["completion"][:-1] if get_field(m, "role") == "tool"]
    assert len(searches) == 4  # the 4-hop row: four searches, each result in the context
    for message in searches:
        assert render(message) in untrained
        assert "Document ID:" in message_text(message)
    assert "Document ID:" not in trained


def test_paragraphs_stay_out_of_prompt_and_tool_schema(full_env):
    row = full_env.get_eval_dataset()[0]
    prompt_text = json.dumps(row["prompt"])
    schema_text = json.dumps([t.model_dump() for t in full_env.tool_defs])
    for paragraph in row["info"]["paragraphs"]:
        assert paragraph["text"][:60] not in prompt_text
    assert "paragraphs" not in schema_text and "state" not in schema_text
    retrieve = next(t for t in full_env.tool_defs if t.name == "retrieve_documents")
    assert retrieve.parameters["required"] == ["query"]
    assert retrieve.parameters["properties"]["top_n"]["default"] == 3


# --- bad tool use is explained, never fatal ---------------------------------------------------


BAD_CALLS: list[tuple[list[ToolCall], str]] = [
    ([call("search_web", {"query": "x"}, "a")], "unknown tool 'search_web'"),
    (
        [call("retrieve_documents", {"query": f"q{k}"}, f"j{k}") for k in range(6)],
        "too many tool calls in one turn",
    ),
    ([call("retrieve_documents", "{query: Van Hook", "b")], "not valid JSON"),
    ([call("retrieve_documents", "[1, 2]", "c")], "must be a JSON object"),
    ([call("retrieve_documents", {"q": "x"}, "d")], "unknown argument(s) ['q']"),
    ([call("retrieve_documents", {"query": "x", "top_n": 50}, "e")], "top_n must be an integer"),
    ([call("retrieve_documents", {"query": "  "}, "f")], "query must be a non-empty string"),
    ([call("submit_answer", {"answer": "Stanley"}, "g")], "missing required argument(s)"),
    (
        [call("submit_answer", {"answer": "Stanley", "cited_doc_ids": ["doc 8"]}, "h")],
        "cited_doc_ids must hold document IDs",
    ),
    (
        [call("submit_answer", {"answer": "Stanley", "cited_doc_ids": "8"}, "i")],
        "cited_doc_ids must be a list",
    ),
]


LAST_CALL = call("search_the_web", {"query": "y"}, "last")


def test_bad_tool_use_gets_explained_and_the_rollout_runs_to_max_turns(fixture_path):
    """Each turn makes one kind of mistake; the last allowed turn's calls are answered too
    (the prompt promises N turns) and the episode ends with them."""
    env = load_environment(data_files=str(fixture_path), max_turns=len(BAD_CALLS) + 1)

    def policy(prompt):
        turn = turns_taken(prompt)
        return BAD_CALLS[turn][0] if turn < len(BAD_CALLS) else [LAST_CALL]

    state = rollout_state(env, policy)
    assert state["error"] is None
    assert state["stop_condition"] == "has_final_env_response"
    assert turns_taken(state["completion"]) == len(BAD_CALLS) + 1
    replies = tool_replies(state["completion"])
    errors = [r for r in replies if r.startswith("Error: ")]
    for _, expected in BAD_CALLS:
        assert any(expected in r for r in errors), expected
    assert len(replies) == sum(len(calls) for calls, _ in BAD_CALLS) + 1
    assert "unknown tool 'search_the_web'" in replies[-1]
    asyncio.run(env.rubric.score_rollout(state))
    assert state["reward"] == 0.0
    assert state["metrics"]["format"] == 0.0
    assert state["metrics"]["tool_errors"] == len(errors)


def test_a_submission_in_the_last_allowed_turn_is_paid(fixture_path, fixture_rows):
    """The prompt says "at most N turns": an agent that searches each hop and submits in turn
    N is paid as it is with turns to spare (verifiers alone stops before running turn N's
    calls); one that needs more turns is cut after its Nth and gets no (N+1)th."""
    agent = decomposition_agent(fixture_rows)
    limit = 3  # two searches and the submission of a two-hop question
    tight = {
        o["example_id"]: o
        for o in run(load_environment(data_files=str(fixture_path), max_turns=limit), agent)
    }
    roomy = {
        o["example_id"]: o
        for o in run(load_environment(data_files=str(fixture_path), max_turns=10), agent)
    }
    paid = 0
    for example_id, out in tight.items():
        hops = len(sub_questions(fixture_rows[question_of(out["prompt"])]))
        assert turns_taken(out["completion"]) == min(hops + 1, limit)
        if hops + 1 <= limit:
            assert out["reward"] == roomy[example_id]["reward"]
            paid += out["reward"] >= 0.9
        else:
            assert out["reward"] == 0.0
    assert paid >= 1, "no two-hop row was paid for its last-turn submission"


PATHOLOGICAL_ARGUMENTS = {
    "nested 2,000 deep": '{"query": ' + "[" * 2000 + "]" * 2000 + "}",
    "5,000-digit integer": '{"query": "Van Hook Township", "top_n": ' + "9" * 5000 + "}",
    "top-level list 2,000 deep": "[" * 2000 + "]" * 2000,
    "bare 5,000-digit integer": "1" * 5000,
}


def test_musique_pathological_tool_arguments_score_zero(fixture_path):
    """Tool arguments the JSON decoder cannot take (nesting past its recursion limit, integers
    past Python's digit limit) get an explained error reply, in searches and submissions alike;
    every rollout of the batch comes back, scored 0, with its errors counted."""
    env = load_environment(data_files=str(fixture_path), max_turns=3)
    calls = [
        call(name, arguments, f"{name[0]}{i}")
        for i, arguments in enumerate(PATHOLOGICAL_ARGUMENTS.values())
        for name in ("retrieve_documents", "submit_answer")
    ]

    def policy(prompt):
        turn = turns_taken(prompt)
        return calls[4 * turn : 4 * turn + 4] if turn < 2 else "I give up."

    outputs = run(env, policy, n=4)
    assert len(outputs) == 4
    for out in outputs:
        assert out["reward"] == 0.0 and out["metrics"]["format"] == 0.0
        assert out["metrics"]["tool_errors"] == len(calls)
        replies = tool_replies(out["completion"])
        assert all(r.startswith("Error: ") for r in replies) and len(replies) == len(calls)
        assert any("not valid JSON" in r for r in replies)


def test_an_answer_on_two_lines_is_refused_whatever_the_line_break(full_env, fixture_rows):
    """Every line break str.splitlines knows (\\n, \\r, \\r\\n, U+2028, U+2029, ...) makes
    the answer two lines, which is refused; the rollout then ends without a submission."""
    for brk in ("\n", "\r", "\r\n", "\u2028", "\u2029", "\x0b", "\x85"):
        agent = decomposition_agent(
            fixture_rows, answer=lambda row, b=brk: f"{row['answer']}{b}Paris"
        )
        [out] = run(full_env, agent, n=1)
        assert out["metrics"]["format"] == 0.0 and out["reward"] == 0.0, repr(brk)
        assert "one line" in tool_replies(out["completion"])[-1], repr(brk)


def test_plain_text_reply_ends_the_episode_with_zero(full_env):
    state = rollout_state(full_env, lambda prompt: "I think the answer is Paris.")
    asyncio.run(full_env.rubric.score_rollout(state))
    assert state["stop_condition"] == "no_tools_called"
    assert state["reward"] == 0.0


def test_calls_after_the_submission_are_ignored(full_env, fixture_rows):
    base = decomposition_agent(fixture_rows)

    def policy(prompt):
        calls = base(prompt)
        if calls[0].name == "submit_answer":
            return [*calls, call("submit_answer", {"answer": "Paris", "cited_doc_ids": []}, "late")]
        return calls

    out = run(full_env, policy, n=1)[0]
    assert tool_replies(out["completion"])[-1].startswith("Error: the answer was already submitted")
    assert out["reward"] == 1.0


# --- saved results rescore the same -----------------------------------------------------------


def test_saved_results_rescore_identically(full_env, fixture_rows):
    outputs = run(full_env, decomposition_agent(fixture_rows))
    for out in outputs:
        saved = json.loads(json.dumps(out["completion"], default=lambda m: m.model_dump()))
        assert all(isinstance(m, dict) for m in saved)
        rescored = score_components(saved, out["info"])
        for name, value in rescored.items():
            assert out["metrics"][name] == value, name


def test_tool_call_readers_accept_every_form():
    flat = {"id": "1", "name": "submit_answer", "arguments": '{"answer": "x"}'}
    forms = [ToolCall(**flat), flat, json.dumps(flat), {**flat, "arguments": {"answer": "x"}}]
    for form in forms:
        parsed = parse_tool_call(form)
        assert (parsed.id, parsed.name, json.loads(parsed.arguments)) == (
            "1",
            "submit_answer",
            {"answer": "x"},
        )
    assert parse_tool_call("not json") is None
    assert tool_calls({"role": "user", "tool_calls": [flat]}) == []


# --- reward options ---------------------------------------------------------------------------


def test_hop_weighting_is_a_sampling_weight(fixture_path, fixture_rows):
    """hop_weighting repeats each training row n_hops times (2:3:4), which GRPO's per-group
    normalisation cannot divide out; the eval rows stay one per question, the reward unscaled."""
    plain = load_environment(data_files=str(fixture_path), retriever="golden")
    weighted = load_environment(
        data_files=str(fixture_path), retriever="golden", hop_weighting=True
    )
    hops = [info["n_hops"] for info in plain.get_dataset()["info"]]
    train_ids = [info["id"] for info in weighted.get_dataset()["info"]]
    assert len(train_ids) == sum(hops) == 2 * 1 + 3 * 2 + 4 * 3
    for info in plain.get_dataset()["info"]:
        assert train_ids.count(info["id"]) == info["n_hops"]
    assert weighted.get_eval_dataset()["info"] == plain.get_dataset()["info"]
    assert all(out["reward"] == 1.0 for out in run(weighted, decomposition_agent(fixture_rows)))


def test_reward_weights_are_validated(fixture_path):
    with pytest.raises(ValueError, match="sum to 1"):
        load_environment(data_files=str(fixture_path), reward_weights={"f1": 0.5})
    with pytest.raises(ValueError, match="unknown term"):
        load_environment(data_files=str(fixture_path), reward_weights={"bleu": 1.0})
    assert sum(DEFAULT_WEIGHTS.values()) == pytest.approx(1.0)


def test_custom_weights_change_the_combination(fixture_path, fixture_rows):
    env = load_environment(data_files=str(fixture_path), reward_weights={"exact_match": 1.0})
    outputs = run(env, decomposition_agent(fixture_rows, cite=lambda row, seen: []))
    assert all(out["reward"] == 1.0 for out in outputs)


# --- data loading -----------------------------------------------------------------------------


def test_no_network_and_no_data_files_says_how_to_pass_a_file(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setattr(musique_dataset, "hub_reachable", lambda timeout=3.0: False)
    with pytest.raises(MusiqueDataError, match="data_files=") as err:
        load_environment()
    assert "bdsaglam/musique" in str(err.value)


def test_bad_arguments_are_named(tmp_path, fixture_path):
    with pytest.raises(FileNotFoundError, match="data_files"):
        load_environment(data_files=str(tmp_path / "missing.jsonl"))
    with pytest.raises(ValueError, match="retriever"):
        load_environment(data_files=str(fixture_path), retriever="tfidf")
    with pytest.raises(ValueError, match="dataset_config"):
        load_environment(data_files=str(fixture_path), dataset_config="all")
    with pytest.raises(ValueError, match="noise_rate"):
        load_environment(data_files=str(fixture_path), noise_rate=1.5)
    not_musique = tmp_path / "gsm8k.jsonl"
    not_musique.write_text(json.dumps({"question": "1+1?", "answer": "2"}) + "\n")
    with pytest.raises(MusiqueDataError, match="paragraphs"):
        load_environment(data_files=str(not_musique))


def test_noise_rate_keeps_supporting_paragraphs_and_is_seeded(fixture_path):
    def kept(noise_rate: float, seed: int) -> list[list[int]]:
        env = load_environment(data_files=str(fixture_path), noise_rate=noise_rate, seed=seed)
        return [[p["idx"] for p in info["paragraphs"]] for info in env.get_eval_dataset()["info"]]

    infos = load_environment(data_files=str(fixture_path)).get_eval_dataset()["info"]
    no_noise = kept(0.0, 0)
    for ids, info in zip(no_noise, infos, strict=True):
        assert ids == sorted(info["supporting_ids"])
    half = kept(0.5, 0)
    for ids, info in zip(half, infos, strict=True):
        n_support = len(info["supporting_ids"])
        assert set(info["supporting_ids"]) <= set(ids)
        assert len(ids) - n_support == round(0.5 * (20 - n_support))
    assert half == kept(0.5, 0)
    assert half != kept(0.5, 1)


def test_max_examples_and_separate_eval_files(fixture_path, dev_path):
    env = load_environment(
        data_files=str(dev_path), eval_data_files=str(fixture_path), max_examples=4
    )
    assert len(env.get_dataset()) == 4
    assert len(env.get_eval_dataset()) == 4
    assert env.get_eval_dataset()[0]["info"]["id"] == "2hop__574419_270105"


# --- retrieval --------------------------------------------------------------------------------


def test_bm25_index_is_built_once_per_question(fixture_path, fixture_rows):
    env = load_environment(data_files=str(fixture_path), dataset_config="full")
    run(env, decomposition_agent(fixture_rows))
    run(env, decomposition_agent(fixture_rows))
    assert env.index_cache.builds == 9  # 2 x 9 rollouts, 2-4 searches each, 9 indexes


def _index(rows: dict[str, dict[str, Any]], question_prefix: str) -> tuple[dict, QuestionIndex]:
    row = next(r for q, r in rows.items() if q.startswith(question_prefix))
    docs = [Document(p["idx"], p["title"], p["paragraph_text"]) for p in row["paragraphs"]]
    return row, QuestionIndex(docs, frozenset(supporting(row)))


def test_each_retriever_finds_the_first_hop(fixture_rows):
    row, index = _index(fixture_rows, "What is the seat of the county where Van Hook")
    first_hop = row["question_decomposition"][0]
    for retriever in ("bm25", "semantic", "hybrid", "golden"):
        top = index.search(sub_questions(row)[0], retriever, 3)
        assert first_hop["paragraph_support_idx"] in [d.idx for d in top], retriever


def test_semantic_model_loads_once_and_embeddings_are_cached(fixture_rows):
    _, index = _index(fixture_rows, "What is the seat of the county where Van Hook")
    first = index.embeddings()
    model = ENCODER._model
    index.search("county seat", "semantic", 3)
    index.search("courthouse", "hybrid", 3)
    assert index.embeddings() is first and ENCODER._model is model
    assert first.shape == (20, 384)


def test_golden_returns_the_supporting_paragraphs_first(fixture_rows):
    row, index = _index(fixture_rows, "Where does the city where Alexander Golitzen")
    top = index.search("anything at all", "golden", 4)
    assert sorted(d.idx for d in top) == sorted(supporting(row))


def test_reciprocal_rank_fusion_rewards_agreement():
    assert reciprocal_rank_fusion([[0, 1, 2], [1, 0, 2]])[-1] == 2
    assert reciprocal_rank_fusion([[0, 1, 2], [1, 2, 0]])[0] == 1


def test_index_cache_evicts_least_recently_used():
    cache = IndexCache(max_size=2)
    build = lambda: QuestionIndex([Document(0, "t", "x")], frozenset())  # noqa: E731
    a = cache.get("a", build)
    cache.get("b", build)
    assert cache.get("a", build) is a
    cache.get("c", build)  # evicts b
    cache.get("b", build)
    assert cache.builds == 4


def test_empty_corpus_and_empty_query_do_not_crash():
    assert QuestionIndex([], frozenset()).search("x", "bm25", 3) == []
    index = QuestionIndex([Document(0, "t", "the a an")], frozenset())
    assert [d.idx for d in index.search("the", "bm25", 3)] == [0]


# --- SQuAD scoring ----------------------------------------------------------------------------


def test_squad_normalisation_and_f1():
    assert normalize_answer("The  Green Bay!") == "green bay"
    assert exact_match("green bay", "Green Bay.") == 1.0
    assert token_f1("Green Bay Packers", "Green Bay") == pytest.approx(0.8)
    assert token_f1("", "Green Bay") == 0.0


# --- honest work is paid: the honest corpus (tests/environments/musique_corpus.py) -------------


def rows_file(tmp_path: Path, name: str, rows: list[dict[str, Any]]) -> str:
    path = tmp_path / f"{name}.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def rate(flags: list[bool]) -> float:
    return sum(flags) / len(flags) if flags else 0.0


def answerable_rows(dev_rows, fixture_rows) -> dict[str, dict[str, Any]]:
    rows = {**dev_rows, **fixture_rows}
    return {q: row for q, row in rows.items() if row.get("answerable", True)}


@pytest.mark.slow
def test_musique_natural_answers_are_paid(dev_rows, fixture_rows, tmp_path):
    """Correct answers as people write them (`answer_variants`: a preposition, a qualifier
    after a comma or in brackets, a fuller name, thousands separators and units, the other date
    order, casing), submitted by the gold decomposition agent on every answerable row that has
    a form besides casing (>= 30 rows), are paid like the gold string on the same row; hedges
    (the gold among other candidates, lists of guesses) never get exact match and earn less.
    The answer-form rule's false-negative rate (forms paid below the gold) is reported."""
    rows = answerable_rows(dev_rows, fixture_rows)
    forms = {q: musique_corpus.answer_variants(row) for q, row in rows.items()}
    natural = {q: rows[q] for q, v in forms.items() if {s for s, _ in v} - TRIVIAL_STYLES}
    assert len(natural) >= 30
    env = load_environment(data_files=rows_file(tmp_path, "natural", list(natural.values())))
    gold = {o["info"]["id"]: o["reward"] for o in run(env, decomposition_agent(natural))}
    paid: dict[str, list[float]] = {}
    below_gold: list[bool] = []
    for k in range(max(len(forms[q]) for q in natural)):
        answer = lambda row, k=k: dict(enumerate(forms[row["question"]])).get(k, ("", ""))[1]  # noqa: E731
        for out in run(env, decomposition_agent(natural, answer=answer)):
            variants = forms[out["info"]["question"]]
            if k < len(variants):
                paid.setdefault(variants[k][0], []).append(out["reward"])
                below_gold.append(out["reward"] < gold[out["info"]["id"]])
    hedged = []
    for k in range(len(musique_corpus.hedges(next(iter(natural.values()))))):
        answer = lambda row, k=k: musique_corpus.hedges(row)[k][1]  # noqa: E731
        for out in run(env, decomposition_agent(natural, answer=answer)):
            assert out["metrics"]["exact_match"] == 0.0, out["completion"][-2]
            assert out["reward"] < gold[out["info"]["id"]]
            hedged.append(out["reward"])
    rewards = [r for values in paid.values() for r in values]
    non_trivial = [r for s, values in paid.items() if s not in TRIVIAL_STYLES for r in values]
    print(
        f"\nnatural answers on {len(natural)} rows: gold {sum(gold.values()) / len(gold):.3f},",
        f"every form {sum(rewards) / len(rewards):.3f} ({len(rewards)}),",
        f"forms beyond casing {sum(non_trivial) / len(non_trivial):.3f} ({len(non_trivial)});",
        {s: round(sum(v) / len(v), 3) for s, v in paid.items()},
        f"answer-form false negatives {rate(below_gold):.3f};",
        f"hedges {sum(hedged) / len(hedged):.3f}",
    )
    assert sum(non_trivial) / len(non_trivial) >= 0.85
    assert rate(below_gold) <= 0.05
    # the examples: regions from general knowledge, a fuller name the documents write
    nowhere = AnswerContext({"paragraphs": []})
    for answer, gold_answer_ in [
        ("Pittsburgh, Pennsylvania", "Pittsburgh"),
        ("Moscow, Russia", "Moscow"),
        ("Austin, Texas, USA", "Austin"),
        ("in 2003", "2003"),
        ("1,400 meters", "1400"),
        ("3 March 1847", "March 3, 1847"),
    ]:
        assert matching_gold(answer, [gold_answer_], nowhere) == gold_answer_, answer
    carroll = AnswerContext(
        {"paragraphs": [{"title": "", "text": "Charles Carroll of Carrollton"}]}
    )
    assert matching_gold("Charles Carroll of Carrollton", ["Charles Carroll"], carroll)
    assert matching_gold("Charles Carroll of Annapolis", ["Charles Carroll"], carroll) is None
    for hedge in ("Pittsburgh, Moscow, Boston", "Pittsburgh or Moscow", "Moscow, Pittsburgh"):
        assert matching_gold(hedge, ["Pittsburgh"], nowhere) is None, hedge
    for scaled in ("1400 million", "1,400 thousand", "1400 percent", "about 1400 dozen"):
        assert matching_gold(scaled, ["1400"], nowhere) is None, scaled  # another number


TRIVIAL_STYLES = frozenset({"lower case", "full stop"})


def test_musique_refusal_phrasings_are_paid(full_env, fixture_rows, dev_rows):
    """Every common refusal phrasing (`REFUSALS`) is paid exactly like "unanswerable": backed
    on the fixture's unanswerable rows, 0 on its answerable ones; no gold answer or alias of the
    data reads as a refusal, and a refusal that hedges with an answer is not one. The refusal
    rule's false-negative rate (phrasings not recognised) is reported."""
    plain = run(full_env, decomposition_agent(fixture_rows))
    missed = []
    for phrasing in musique_corpus.REFUSALS:
        refuse = lambda row, p=phrasing: p if not row.get("answerable", True) else row["answer"]  # noqa: E731
        for out, ref in zip(
            run(full_env, decomposition_agent(fixture_rows, answer=refuse)), plain, strict=True
        ):
            assert out["reward"] == ref["reward"], (phrasing, out["info"]["id"])
        declined = run(
            full_env, decomposition_agent(fixture_rows, answer=lambda row, p=phrasing: p)
        )
        missed.append(any(out["metrics"]["said_unanswerable"] == 0.0 for out in declined))
        assert all(out["reward"] == 0.0 for out in declined if out["info"]["answerable"])
    golds = {
        g
        for row in [*dev_rows.values(), *fixture_rows.values()]
        for g in [row["answer"], *row["answer_aliases"]]
    }
    assert not [g for g in golds if is_refusal(g)]
    for hedge in ("unknown, probably Stanley", "Stanley or unanswerable", "not Stanley"):
        assert not is_refusal(hedge), hedge
    print(f"\nrefusal phrasings: {len(missed)}, false negatives {rate(missed):.3f}")
    assert rate(missed) == 0.0


def issued_queries(prompt: list[Any]) -> list[str]:
    """The queries the agent has sent so far."""
    calls = (c for m in prompt for c in tool_calls(m) if c.name == "retrieve_documents")
    return [str(json.loads(c.arguments).get("query", "")) for c in calls]


Tries = Callable[[str, str], list[dict[str, Any]]]
RETRIES: dict[str, Tries] = {
    "own words, then the sub-question": lambda own, sub: [
        {"query": own},
        {"query": sub},
        {"query": sub, "top_n": 6},
    ],
    "own words only": lambda own, sub: [{"query": own}, {"query": own, "top_n": 6}],
}


def own_words_agent(
    rows: dict[str, dict[str, Any]],
    style: str,
    refusal: Callable[[dict[str, Any]], str],
    tries: Tries = RETRIES["own words, then the sub-question"],
) -> Policy:
    """An honest searcher: hop by hop, a query in its own words (`own_words_queries` in
    `style`); when the hop's evidence did not show up, the next of `tries(own, sub)` (by
    default the hop's sub-question, then the same with top_n=6). A hop it cannot find ends the
    search with `refusal(row)`, else it submits the gold. It cites the supporting paragraphs it
    saw."""

    def policy(prompt: list[Any]) -> list[ToolCall]:
        row = rows[question_of(prompt)]
        issued, seen = issued_queries(prompt), seen_doc_ids(prompt)
        wordings = zip(
            musique_corpus.own_words_queries(row, style), sub_questions(row), strict=True
        )
        answer = gold_answer(row)
        for step, (own, sub) in zip(row["question_decomposition"], wordings, strict=True):
            if step.get("paragraph_support_idx") in seen:
                continue
            queries = tries(own, sub)
            attempts = sum(1 for query in issued if query in (own, sub))
            if attempts < len(queries):
                return [call("retrieve_documents", queries[attempts], f"r{len(issued)}")]
            answer = refusal(row)
            break
        cited = [str(i) for i in supporting(row) if i in seen]
        return [call("submit_answer", {"answer": answer, "cited_doc_ids": cited}, "final")]

    return policy


def slice_shotgun(rows: dict[str, dict[str, Any]], per_turn: int = 5) -> Policy:
    """Every 2-5 word slice of the question searched (5 a turn, as many turns as allowed),
    then "unanswerable" citing nothing: no decomposition at all."""

    def policy(prompt: list[Any]) -> list[ToolCall]:
        slices = musique_corpus.question_slices(question_of(prompt))
        turn = turns_taken(prompt)
        batch = slices[turn * per_turn : (turn + 1) * per_turn]
        if batch and turn < 8:
            return [
                call("retrieve_documents", {"query": q}, f"s{turn}_{i}")
                for i, q in enumerate(batch)
            ]
        return [call("submit_answer", {"answer": "unanswerable", "cited_doc_ids": []}, "final")]

    return policy


def backing_rules(out: dict[str, Any]) -> dict[str, bool]:
    """Which of the backing rules an "unanswerable" rollout passes."""
    facts = read_rollout(out["completion"])
    info = out["info"]
    evidence = set(info["supporting_ids"])
    cited = set(facts.submission.cited_doc_ids) if facts.submission else set()
    return {
        "evidence shown and cited": evidence <= facts.retrieved and evidence <= cited,
        "focused search for the missing hop": searched_missing_hop(facts.queries, info),
        "few searches": few_searches(facts.queries, info["n_hops"]),
    }


@pytest.mark.slow
def test_musique_slice_shotgun_does_not_pay(dev_rows, dev_env, tmp_path):
    """The 200 dev rows as answerable/unanswerable pairs (the twin loses its first hop, or its
    last): a policy that searches every 2-5 word slice of the question and declines everywhere
    earns at most 0.25 per pair; honest searchers in their own words (a bridge by surname, an
    entity without its relation, key words reordered; refusals in several phrasings) are paid
    on at least 90% of the unanswerable rows when they reword a hop they did not find as its
    sub-question, on at least 85% when they keep to their own words (BM25 then misses more
    kept evidence). Each backing rule's false-negative rate on the honest rollouts that found
    the kept evidence is reported, and is at most 5%."""
    answerable = run(dev_env, slice_shotgun(dev_rows))
    assert all(out["reward"] == 0.0 for out in answerable)
    refusals = musique_corpus.REFUSALS
    report: dict[str, Any] = {}
    for missing in ("first", "last"):
        twins = {
            q: without_hops_from(
                row, 0 if missing == "first" else len(row["question_decomposition"]) - 1
            )
            for q, row in dev_rows.items()
        }
        env = load_environment(
            data_files=rows_file(tmp_path, missing, list(twins.values())), dataset_config="full"
        )
        shotgun = run(env, slice_shotgun(twins))
        pair_mean = sum(
            a["reward"] + u["reward"] for a, u in zip(answerable, shotgun, strict=True)
        ) / (2 * len(shotgun))
        report[f"{missing} hop missing: shotgun per pair"] = round(pair_mean, 3)
        assert pair_mean <= 0.25, missing
        for (retry, tries), style in product(RETRIES.items(), musique_corpus.SEARCH_STYLES):
            refuse = lambda row: refusals[sum(map(ord, row["id"])) % len(refusals)]  # noqa: E731
            honest = run(env, own_words_agent(twins, style, refuse, tries))
            rules = [backing_rules(out) for out in honest]
            reached = [r for r in rules if r["evidence shown and cited"]]  # found the kept hops
            report[f"{missing} hop missing, {style}, {retry}"] = {
                "paid": round(rate([out["reward"] > 0 for out in honest]), 3),
                "mean": round(mean_reward(honest), 3),
                "evidence not found (retrieval)": round(1 - len(reached) / len(rules), 3),
                "false negatives where it was found": {
                    name: round(1 - rate([r[name] for r in reached]), 3)
                    for name in ("focused search for the missing hop", "few searches")
                },
            }
    print("\n", json.dumps(report, indent=1))
    for name, measured in report.items():
        if isinstance(measured, dict):
            assert measured["paid"] >= (0.9 if "sub-question" in name else 0.85), name
            assert max(measured["false negatives where it was found"].values()) <= 0.05, name


def test_long_answers_are_no_form_and_no_refusal_and_score_fast():
    """Answers past MAX_FORM_CHARS (a long run of spaces between two words passes the 20-word
    limit) get SQuAD's scores alone, in linear time: the qualifier pattern would backtrack
    quadratically over such a run."""
    context = AnswerContext({"paragraphs": []})
    started = time.monotonic()
    for answer in ("Stanley" + " " * 2_000_000 + "x", "Stanley," + " " * 2_000_000 + "x"):
        assert matching_gold(answer, ["Stanley"], context) is None
        assert not is_refusal(answer)
    assert matching_gold("Stanley, North Dakota", ["Stanley"], context) == "Stanley"
    padded = "Stanley," + " " * MAX_FORM_CHARS + "North Dakota"
    assert matching_gold(padded, ["Stanley"], context) is None
    assert time.monotonic() - started < 2.0


# --- rewards round 5 (issue 50): sentences, notations, units, countries, full names, reasoned -
# --- refusals are paid; the two-name hedge is not ----------------------------------------------

Forms = Callable[[dict[str, Any]], list[tuple[str, str]]]
Played = dict[str, list[tuple[float, float]]]


def resubmitted(completion: list[Any], answer: str) -> list[Any]:
    """A saved rollout (dict messages) with `answer` in its accepted submission instead, as
    the tool would have accepted it (`parse_submission`: one line, at most 20 words)."""
    messages = json.loads(json.dumps(completion, default=lambda m: m.model_dump()))
    for message in messages:
        for i, raw in enumerate(message.get("tool_calls") or []):
            parsed = parse_tool_call(raw)
            if parsed is not None and parsed.name == "submit_answer":
                args = json.loads(parsed.arguments)
                parse_submission(answer, args["cited_doc_ids"])  # raises where the tool refuses
                args["answer"] = answer
                message["tool_calls"][i] = {
                    "id": parsed.id,
                    "name": parsed.name,
                    "arguments": json.dumps(args),
                }
    return messages


def replayed_reward(out: dict[str, Any], answer: str) -> float:
    """The rubric's reward (`score_components`, `combine`: what MuSiQueRubric computes) for the
    rollout `out` with `answer` submitted instead."""
    info = out["info"]
    components = score_components(resubmitted(out["completion"], answer), info)
    return combine(components, DEFAULT_WEIGHTS, bool(info["answerable"]))


def play_forms(
    tmp_path: Path,
    name: str,
    rows: list[dict[str, Any]],
    forms: Forms,
    gold: Callable[[dict[str, Any]], str] = gold_answer,
    **env_args: Any,
) -> Played:
    """The gold decomposition agent plays every row through `env.generate` (the real loop,
    tools and rubric), submitting `gold(row)`; then each (style, answer) of `forms(row)` is
    submitted in its place in the saved rollout and rescored by the rubric (saved results
    rescore identically: `test_saved_results_rescore_identically`; the first style of every
    row is also played through the loop, and must score the same). Style -> [(reward, the
    gold's reward on the same row)]."""
    table = {row["question"]: forms(row) for row in rows}
    by_question = {row["question"]: row for row in rows}
    env = load_environment(data_files=rows_file(tmp_path, name, rows), **env_args)
    outputs = run(env, decomposition_agent(by_question, answer=gold))
    first = {row["question"]: forms[0][1] for row in rows if (forms := table[row["question"]])}
    looped = run(
        env, decomposition_agent(by_question, answer=lambda r: first.get(r["question"], gold(r)))
    )
    played: Played = {}
    for out, loop in zip(outputs, looped, strict=True):
        for k, (style, answer) in enumerate(table[out["info"]["question"]]):
            reward = replayed_reward(out, answer)
            if k == 0:
                assert reward == loop["reward"], (answer, out["info"]["id"])
            played.setdefault(style, []).append((reward, out["reward"]))
    return played


def honest_report(played: Played) -> dict[str, dict[str, float]]:
    """Per style: rows, mean reward, the gold's mean on the same rows, and the false-negative
    rate (the form paid below the gold string on its row)."""
    return {
        style: {
            "rows": len(pairs),
            "mean": round(sum(r for r, _ in pairs) / len(pairs), 3),
            "gold": round(sum(g for _, g in pairs) / len(pairs), 3),
            "false negatives": round(rate([r < g for r, g in pairs]), 3),
        }
        for style, pairs in played.items()
    }


def compact(report: dict[str, dict[str, float]]) -> str:
    """One line per style: mean (gold) [false negatives] rows."""
    return "\n".join(
        f"  {style}: {m['mean']:.3f} (gold {m['gold']:.3f}), false negatives "
        f"{m['false negatives']:.3f}, {m['rows']} rows"
        for style, m in report.items()
    )


def assert_paid(report: dict[str, dict[str, float]], limit: float = 0.05) -> None:
    for style, measured in report.items():
        assert measured["false negatives"] <= limit, (style, measured)


def merged(*reports: Played) -> Played:
    out: Played = {}
    for played in reports:
        for style, pairs in played.items():
            out.setdefault(style, []).extend(pairs)
    return out


def family_mean(played: Played) -> float:
    rewards = [r for pairs in played.values() for r, _ in pairs]
    return sum(rewards) / len(rewards)


def rows_in(dev_rows, fixture_rows) -> list[dict[str, Any]]:
    """The answerable rows of the shared files, one per question."""
    return list(answerable_rows(dev_rows, fixture_rows).values())


def other_answer(rows: list[dict[str, Any]]) -> Callable[[dict[str, Any]], str]:
    """Each row's first other candidate (`musique_corpus.other_candidates`)."""
    others = {row["question"]: musique_corpus.other_candidates(row, 1)[0] for row in rows}
    return lambda row: others[row["question"]]


def committed_baseline(
    tmp_path: Path,
    name: str,
    rows: list[dict[str, Any]],
    candidate: Callable[[dict[str, Any]], str],
) -> float:
    """The mean reward of committing to the gold or to `candidate(row)`, one of the two at
    random: the no-effort baseline of naming both."""
    played = play_forms(tmp_path, name, rows, lambda row: [("other", candidate(row))])
    return sum((r + g) / 2 for r, g in played["other"]) / len(played["other"])


@pytest.mark.slow
def test_musique_sentence_answers_are_paid(dev_rows, fixture_rows, tmp_path):
    """Correct answers in the sentences models write (`sentence_answers`: "The answer is X.",
    "Final answer: X", "Answer: X", "X (per the documents)", X with a source or an explanation
    after it, the question restated, ...), on every answerable row, are paid like the gold
    string: at most 5% of each style below it. A sentence is judged by the span it commits
    to, so one that names a second candidate (`sentence_hedges`, both orders) pays at most
    what committing to one of the two at random pays, never more, and below the honest mean;
    one that puts a second name beside the first without an explanation, or hedges, pays
    less."""
    rows = rows_in(dev_rows, fixture_rows)
    report = honest_report(play_forms(tmp_path, "sentences", rows, musique_corpus.sentence_answers))
    assert len(report) >= 15 and min(m["rows"] for m in report.values()) >= 50
    other = other_answer(rows)
    base = committed_baseline(tmp_path, "sentence_baseline", rows, other)
    hedges = play_forms(
        tmp_path,
        "sentence_hedges",
        rows,
        lambda row: musique_corpus.sentence_hedges(row, other(row)),
    )
    exploit = {style: family_mean({style: v}) for style, v in hedges.items()}
    print(
        f"\nsentences on {len(rows)} rows:\n{compact(report)}",
        "\nsentence hedges (both orders)",
        {style: round(mean, 3) for style, mean in exploit.items()},
        f"committing to one of the two at random {base:.3f}",
    )
    assert_paid(report)
    for style, mean in exploit.items():
        assert mean <= base + 1e-9, style  # a second name in an explanation: = the baseline
        assert mean < min(m["mean"] for m in report.values()), style
    # the span is judged alone: a wrapped wrong answer is paid like the wrong answer
    nowhere = AnswerContext({"paragraphs": []})
    assert judge_answer("The answer is Bismarck.", ["Stanley"], nowhere) == (None, "Bismarck")
    for hedge in ("Stanley - Bismarck", "Stanley. Bismarck.", "The answer is Stanley or Bismarck."):
        assert judge_answer(hedge, ["Stanley"], nowhere)[0] is None, hedge


@pytest.mark.slow
def test_musique_date_and_number_notations_are_paid(dev_rows, fixture_rows, tmp_path):
    """Dates, years and numbers in other notations (`notation_answers`: ISO 1895-03-14, US
    3/14/1895, "Mar. 14, 1895", "14th of March 1895", 14.03.1895; "AD 1895", "1895 CE";
    "273 282", number words; "48 per cent") are paid like the gold string: on the rows whose
    gold is a date, year or number, and on every row with a date, a year or a number its
    documents write made its gold (`document_value_rows`), at most 5% of each style below the
    gold. A wrong value in another notation (the next day, the next year, one more) pays no
    more than the same wrong value written as the gold is, and below the honest mean."""
    rows = rows_in(dev_rows, fixture_rows)
    sets = {
        "golds": [row for row in rows if musique_corpus.notation_answers(row)],
        **musique_corpus.document_value_rows(rows),
    }
    assert {kind: len(subset) >= 100 for kind, subset in sets.items() if kind != "golds"} == {
        "date": True,
        "year": True,
        "number": True,
    }
    played = merged(
        *(
            play_forms(tmp_path, f"notation_{kind}", subset, musique_corpus.notation_answers)
            for kind, subset in sets.items()
        )
    )
    report = honest_report(played)
    wrong = merged(
        *(
            play_forms(tmp_path, f"wrong_{kind}", subset, musique_corpus.wrong_values)
            for kind, subset in sets.items()
            if kind != "golds"
        )
    )
    as_gold = {s: v for s, v in wrong.items() if s.endswith("as the gold is written")}
    other = {s: v for s, v in wrong.items() if not s.endswith("as the gold is written")}
    exploit = {style: round(family_mean({style: v}), 3) for style, v in wrong.items()}
    print(
        f"\nnotations on {sum(map(len, sets.values()))} rows:\n{compact(report)}",
        f"\nwrong values {exploit}",
    )
    assert_paid(report)
    assert family_mean(other) <= family_mean(as_gold) + 1e-9
    assert max(exploit.values()) < min(m["mean"] for m in report.values())
    nowhere = AnswerContext({"paragraphs": []})
    for answer, gold in [
        ("1895-03-14", "March 14, 1895"),
        ("3/14/1895", "March 14, 1895"),
        ("Mar. 14, 1895", "March 14, 1895"),
        ("AD 1895", "1895"),
        ("273 282", "273,282"),
        ("thirty-five", "35"),
        ("one hundred and twenty", "120"),
    ]:
        assert matching_gold(answer, [gold], nowhere) == gold, answer
    for answer, gold in [
        ("3/4/1895", "April 3, 1895"),  # US order: March 4
        ("1895-03-15", "March 14, 1895"),
        ("1895 BC", "1895"),
        ("273 282", "273"),
        ("thirty-six", "35"),
    ]:
        assert matching_gold(answer, [gold], nowhere) is None, answer


@pytest.mark.slow
def test_musique_units_countries_and_full_names_are_paid(dev_rows, fixture_rows, tmp_path):
    """Measures with their unit abbreviated or spelled another way ("1,400 m" and "1,400
    meters" for "1,400 metres"; `measure_rows`: a measure the documents write made the gold),
    places with the country or state that holds them from general knowledge or from the hop
    that looks inside it ("Moscow, Russia"; `country_answers`), and a name beside its acronym
    or full name in brackets ("Kaufhaus des Westens (KaDeWe)"; `full_name_answers`, on acronyms
    the documents write in brackets and on acronym aliases) are paid like the gold: at most 5%
    of each style below it. A region that cannot hold the gold is no qualifier: a region beside
    a region ("Maine, Vermont"), a country beside a country-level gold, a hop's answer that the
    gold lies in (a province for its country), a region after a person."""
    rows = rows_in(dev_rows, fixture_rows)
    measures = musique_corpus.measure_rows(rows)
    places = [row for row in rows if musique_corpus.country_answers(row)]
    acronyms = musique_corpus.acronym_rows(rows)
    aliased = [row for row in rows if musique_corpus.full_name_answers(row)]
    assert len(measures) >= 50 and len(places) >= 10 and len(acronyms) >= 50
    played = merged(
        play_forms(tmp_path, "units", measures, musique_corpus.unit_answers),
        play_forms(tmp_path, "countries", places, musique_corpus.country_answers),
        play_forms(tmp_path, "acronyms", acronyms, musique_corpus.full_name_answers),
        play_forms(tmp_path, "aliased", aliased, musique_corpus.full_name_answers),
    )
    report = honest_report(played)
    wrong = play_forms(tmp_path, "wrong_units", measures, musique_corpus.wrong_measures)
    as_gold = {s: v for s, v in wrong.items() if s.endswith("as the gold is written")}
    other = {s: v for s, v in wrong.items() if not s.endswith("as the gold is written")}
    print(
        f"\nunits on {len(measures)} rows, countries on {len(places)}, full names on",
        f"{len(acronyms) + len(aliased)}:\n{compact(report)}",
        f"\nwrong measures { {s: round(family_mean({s: v}), 3) for s, v in wrong.items()} }",
    )
    assert_paid(report)
    assert family_mean(other) <= family_mean(as_gold) + 1e-9
    # the examples
    nowhere = AnswerContext({"paragraphs": []})
    for answer, gold in [
        ("1,400 m", "1,400 metres"),
        ("1,400 meters", "1,400 metres"),
        ("Kaufhaus des Westens (KaDeWe)", "KaDeWe"),
        ("KaDeWe (Kaufhaus des Westens)", "KaDeWe"),
        ("Maine, USA", "Maine"),
        ("Mexico City, Mexico", "Mexico City"),
    ]:
        assert matching_gold(answer, [gold], nowhere) == gold, answer
    via_russia = AnswerContext(
        {
            "question": "What is the capital of the country where the Kamchatka Peninsula is?",
            "hops": [
                {"question": "Kamchatka Peninsula >> country", "answer": "Russia"},
                {"question": "#1 >> capital", "answer": "Moscow"},
            ],
        }
    )
    assert matching_gold("Moscow, Russia", ["Moscow"], via_russia) == "Moscow"
    for answer, gold in [("Maine, Vermont", "Maine"), ("Russia, Ukraine", "Russia")]:
        assert matching_gold(answer, [gold], nowhere) is None, answer
    by_question = {row["question"]: row for row in rows}
    for answer, prefix in [
        ("Alfredo Stroessner's Paraguay, Yugoslavia", "Where is the embassy in the only"),
        ("SR Serbia, Vojvodina", "In which country is the province where Serbian"),
        ("Yeltsin, Russia", "Who was the first president in the country where the Kamchatka"),
    ]:
        row = next(r for q, r in by_question.items() if q.startswith(prefix))
        info = load_row_info(row)
        assert matching_gold(answer, info["answers"], AnswerContext(info)) is None, answer


def load_row_info(row: dict[str, Any]) -> dict[str, Any]:
    """The environment's `info` for one raw row."""
    return musique_dataset.to_example(row, 1.0, 0)["info"]


def first_missing(row: dict[str, Any]) -> int:
    """The first hop whose evidence MuSiQue-Full removed (no supporting paragraph)."""
    steps = row["question_decomposition"]
    return next((i for i, s in enumerate(steps) if s.get("paragraph_support_idx") is None), 0)


@pytest.mark.slow
def test_musique_reasoned_refusals_are_paid(dev_rows, fixture_rows, fixture_path, tmp_path):
    """Refusals that give their reason (`REASONED_REFUSALS`: "Not enough information in the
    documents to answer.", "I could not find this information in the documents.", ...; and
    `reasoned_refusals`, naming the missing fact: "I could not find the founder of Routledge in
    the documents.") are paid exactly like "unanswerable" on MuSiQue-Full rows: the fixture's
    unanswerable rows and the 200 dev rows made unanswerable (first or last hop removed); at
    most 5% of each phrasing below "unanswerable" (the rule is `answers.is_refusal`, which the
    rubric reads). On answerable rows every one of them earns 0, and a refusal hedged with an
    answer is no refusal."""
    reasons = [(p, p) for p in musique_corpus.REASONED_REFUSALS]
    played: Played = {}
    fixture = [row for row in read_rows(fixture_path).values() if not row.get("answerable", True)]
    sets = {
        "fixture": (fixture, first_missing),
        "first hop removed": (
            [without_hops_from(row, 0) for row in dev_rows.values()],
            first_missing,
        ),
        "last hop removed": (
            [
                without_hops_from(row, len(row["question_decomposition"]) - 1)
                for row in dev_rows.values()
            ],
            first_missing,
        ),
    }
    for kind, (subset, missing) in sets.items():
        forms = lambda row, missing=missing: [  # noqa: E731
            *reasons,
            *musique_corpus.reasoned_refusals(row, missing(row)),
        ]
        played = merged(
            played,
            play_forms(
                tmp_path, f"refusals_{kind.split()[0]}", subset, forms, dataset_config="full"
            ),
        )
    report = honest_report(played)
    answerable = rows_in(dev_rows, fixture_rows)
    declined = play_forms(
        tmp_path,
        "refusals_answerable",
        answerable,
        lambda row: [*reasons, *musique_corpus.reasoned_refusals(row, 0)],
    )
    print(
        f"\nreasoned refusals on {sum(len(s) for s, _ in sets.values())} unanswerable rows:",
        f"\n{compact(report)}",
        f"\non {len(answerable)} answerable rows: mean {family_mean(declined):.3f}",
    )
    assert_paid(report)
    assert all(r == 0.0 for pairs in declined.values() for r, _ in pairs)
    assert all(is_refusal(p) for p in musique_corpus.REASONED_REFUSALS)
    for hedged in (
        "Not enough information in the documents, but probably Stanley.",
        "I could not find it in the documents; it may be Stanley.",
        "Stanley, though the documents do not say.",
        "The documents do not say, maybe Stanley.",
        "Unanswerable. Stanley is the seat.",
    ):
        assert not is_refusal(hedged), hedged


@pytest.mark.slow
def test_musique_two_name_hedge_does_not_pay(dev_rows, fixture_rows, tmp_path):
    """Naming a second candidate beside the gold, "G, D" or "G (D)" (D a name a document
    holds beside the gold: `other_candidates`; a region only where the gold is a region, as a
    region after a place says which place), in both orders, is never read as the gold, and
    pays less than committing to one of the two at random (the no-effort baseline) and less
    than the honest answer, form by form. The qualifiers that say which gold stay paid: the
    country and state of a place, an acronym or its expansion (as in the test above)."""
    rows = rows_in(dev_rows, fixture_rows)
    candidates = {row["question"]: musique_corpus.other_candidates(row, 2) for row in rows}
    hedges = play_forms(
        tmp_path,
        "two_names",
        rows,
        lambda row: [
            form
            for other in candidates[row["question"]]
            for form in musique_corpus.two_name_hedges(row["answer"], other)
        ],
    )
    baseline = play_forms(
        tmp_path,
        "two_names_baseline",
        rows,
        lambda row: [("commit to the other", other) for other in candidates[row["question"]]],
    )
    committed = sum((r + g) / 2 for r, g in baseline["commit to the other"]) / len(
        baseline["commit to the other"]
    )
    honest = sum(g for _, g in baseline["commit to the other"]) / len(
        baseline["commit to the other"]
    )
    families = {
        "comma": {s: v for s, v in hedges.items() if "comma" in s},
        "brackets": {s: v for s, v in hedges.items() if "brackets" in s},
    }
    means = {name: round(family_mean(family), 3) for name, family in families.items()}
    print(
        f"\ntwo-name hedges on {len(rows)} rows, {len(baseline['commit to the other'])} pairs:",
        {s: round(family_mean({s: v}), 3) for s, v in hedges.items()},
        f"families (both orders) {means}; committing to one of the two at random",
        f"{committed:.3f}; the gold {honest:.3f}",
    )
    for name, mean in means.items():
        assert mean <= committed, name
        assert mean < honest, name
    read_as_gold = []
    for row in rows:
        info = load_row_info(row)
        ctx = AnswerContext(info)
        for other in candidates[row["question"]]:
            for style, form in musique_corpus.two_name_hedges(row["answer"], other):
                if judge_answer(form, info["answers"], ctx)[0] is not None:
                    read_as_gold.append((style, form))
        for _style, form in musique_corpus.country_answers(row):
            assert judge_answer(form, info["answers"], ctx)[0] is not None, form
    assert read_as_gold == []


# --- rewards round 6 (issue 58): what a reply commits to, whatever wraps it --------------------

GRAMMAR_PER_ROW = 20  # composed replies per held-out row (and 6 per row made a measure or name)


def grammar_rows(dev_rows, fixture_rows) -> list[dict[str, Any]]:
    """The held-out answerable rows the grammar tests measure on (`musique_grammar.held_out`)."""
    return musique_grammar.held_out(rows_in(dev_rows, fixture_rows))


def grammar_reward(row: dict[str, Any], info: dict[str, Any], answer: str) -> tuple[float, dict]:
    """The rubric's reward and components (`score_components`, `combine`: what MuSiQueRubric
    computes) for the gold decomposition rollout of `row` submitting `answer`."""
    components = score_components(musique_grammar.decomposition_rollout(row, answer), info)
    return combine(components, DEFAULT_WEIGHTS, bool(info["answerable"])), components


def family_rates(played: list[tuple[Any, bool]]) -> dict[str, dict[str, Any]]:
    """Per wrapper family: compositions wrapped in it, the share paid below the bare answer,
    and the values that were."""
    out: dict[str, dict[str, Any]] = {}
    for composition, missed in played:
        for family, value in composition.wrapped_by():
            entry = out.setdefault(family, {"n": 0, "missed": 0, "by value": {}})
            entry["n"] += 1
            entry["missed"] += missed
            if missed:
                entry["by value"][value] = entry["by value"].get(value, 0) + 1
    return {
        family: {"n": e["n"], "false negatives": round(e["missed"] / e["n"], 3), **e}
        for family, e in sorted(out.items())
    }


def print_rates(title: str, rates: dict[str, dict[str, Any]]) -> None:
    print(f"\n{title}")
    for family, e in rates.items():
        missed = f" {e['by value']}" if e["by value"] else ""
        print(f"  {family}: {e['false negatives']:.3f} of {e['n']}{missed}")


@pytest.mark.slow
def test_musique_honest_wrappers_compose(dev_rows, fixture_rows):
    """The gold wrapped by the wrapper grammar (`musique_grammar`: answer form x casing x
    markup x step chain x citation layout x hedge x announcement x label x container x trailing
    punctuation x whole-reply casing, seeded) on >= 100 held-out answerable rows (and the rows
    made from them whose gold is a measure or a name with diacritics their documents write) is
    paid like the bare gold on the same rollout, within 0.02, in every one of >= 2,000 composed
    replies and in each family alone. Run with -s for the per-family false-negative rates."""
    held = grammar_rows(dev_rows, fixture_rows)
    assert len(held) >= 100
    sets = [(row, musique_grammar.NONE) for row in held] + [
        (row, form) for form, rows in musique_grammar.form_rows(held).items() for row in rows
    ]
    composed: list[tuple[Any, bool]] = []
    alone: list[tuple[Any, bool]] = []
    drops: list[tuple[float, str, str]] = []
    for row, form in sets:
        info = load_row_info(row)
        bare, _ = grammar_reward(row, info, row["answer"])
        cited = musique_grammar.cited_ids(row)
        n = GRAMMAR_PER_ROW if form == musique_grammar.NONE else 6
        for played, compositions in (
            (composed, musique_grammar.honest_compositions(row, cited, n, form)),
            (alone, musique_grammar.single_wrapper_compositions(row, cited, form)),
        ):
            for composition in compositions:
                reward, _ = grammar_reward(row, info, composition.reply)
                drops.append((abs(bare - reward), composition.reply, row["answer"]))
                played.append((composition, abs(bare - reward) > 0.02))
    assert len(composed) >= 2000
    assert {form for _, form in sets} >= {"unit abbreviated", "diacritics dropped"}
    print_rates(
        f"composed wrappers, {len(composed)} replies on {len(sets)} rows", family_rates(composed)
    )
    print_rates(f"each family alone, {len(alone)} replies", family_rates(alone))
    worst = max(drops)
    assert worst[0] <= 0.02, (
        f"worst composition: {worst[1]!r} (gold {worst[2]!r}) off by {worst[0]:.3f}"
    )


@pytest.mark.slow
def test_musique_refusal_grammar_is_paid(dev_rows, fixture_rows):
    """Refusals composed by `musique_grammar.refusal_compositions` (phrasing x the missing hop
    as a reason x what was found before the gap x the join, some in a label, container, markup,
    citation or casing) on the held-out rows made unanswerable the MuSiQue-Full way (first or
    last hop removed; >= 500 replies) are paid exactly like the bare "unanswerable" on the same
    rollout; on the answerable rows the same replies are refusals and earn 0, what a wrong
    answer earns for its answer part (a wrong answer keeps only its evidence terms)."""
    played: list[tuple[Any, bool]] = []
    misses: list[tuple[str, float, float]] = []
    wrong: list[float] = []
    for row in grammar_rows(dev_rows, fixture_rows):
        answerable = load_row_info(row)
        other = musique_corpus.other_candidates(row, 1)[0]
        wrong.append(grammar_reward(row, answerable, other)[0])
        for missing in sorted({0, len(row["question_decomposition"]) - 1}):
            twin = without_hops_from(row, missing)
            info = load_row_info(twin)
            bare, _ = grammar_reward(twin, info, "unanswerable")
            assert bare > 0.0, twin["id"]  # the rollout backs the claim
            cited = musique_grammar.cited_ids(twin)
            for composition in musique_grammar.refusal_compositions(twin, missing, cited, 3):
                reward, _ = grammar_reward(twin, info, composition.reply)
                played.append((composition, reward != bare))
                if reward != bare:
                    misses.append((composition.reply, reward, bare))
                declined, components = grammar_reward(row, answerable, composition.reply)
                assert components["said_unanswerable"] == 1.0, composition.reply
                assert declined == 0.0, composition.reply
    assert len(played) >= 500
    print_rates(f"refusals, {len(played)} replies", family_rates(played))
    print(f"  the same on the answerable rows: 0.000; a wrong answer {sum(wrong) / len(wrong):.3f}")
    assert misses == [], misses[:5]


@pytest.mark.slow
def test_musique_two_candidate_compositions_do_not_pay(dev_rows, fixture_rows):
    """Replies naming two candidates, the gold and a name a document holds beside it
    (`musique_grammar.TWO_CANDIDATES`: "X or Y", "either X or Y", "X; alternatively Y", "X (or
    possibly Y)", ..., both orders, bare and wrapped), are never read as the gold and pay less
    on average than committing to one of the two at random; a refusal beside a guess
    (`REFUSAL_GUESSES`: "Unanswerable, but probably X", ...) is neither a refusal on the
    unanswerable twin nor the guess on the answerable row, and pays less than committing at
    random to the refusal or the guess over the pair."""
    two: dict[str, list[tuple[float, float]]] = {}
    guesses: dict[str, list[tuple[float, float]]] = {}
    for row in grammar_rows(dev_rows, fixture_rows):
        info = load_row_info(row)
        gold = row["answer"]
        other = musique_corpus.other_candidates(row, 1)[0]
        cited = musique_grammar.cited_ids(row)
        committed = (grammar_reward(row, info, gold)[0] + grammar_reward(row, info, other)[0]) / 2
        for x, y in ((gold, other), (other, gold)):
            for composition in musique_grammar.two_candidate_compositions(row, x, y, cited):
                reward, components = grammar_reward(row, info, composition.reply)
                assert components["exact_match"] == 0.0, composition.reply
                two.setdefault(composition.families["form"], []).append((reward, committed))
        twin = without_hops_from(row, len(row["question_decomposition"]) - 1)
        twin_info = load_row_info(twin)
        refusal_pays = grammar_reward(twin, twin_info, "unanswerable")[0]
        baseline = (grammar_reward(row, info, gold)[0] + refusal_pays) / 4  # at random, per pair
        forms = musique_grammar.REFUSAL_GUESSES
        for composition in musique_grammar.two_candidate_compositions(row, gold, "", cited, forms):
            on_answerable, components = grammar_reward(row, info, composition.reply)
            assert components["exact_match"] == 0.0, composition.reply
            on_twin, twin_components = grammar_reward(twin, twin_info, composition.reply)
            assert twin_components["said_unanswerable"] == 0.0, composition.reply
            pair = (on_answerable + on_twin) / 2
            guesses.setdefault(composition.families["form"], []).append((pair, baseline))
    means = {
        name: {style: (fmean(r for r, _ in v), fmean(b for _, b in v)) for style, v in t.items()}
        for name, t in (("two candidates", two), ("refusal and a guess", guesses))
    }
    counts = {"two candidates": two, "refusal and a guess": guesses}
    for name, styles in means.items():
        n = sum(len(v) for v in counts[name].values())
        print(f"\n{name}, {n} replies (reply mean, committing at random):")
        for style, (mean, base) in styles.items():
            print(f"  {style}: {mean:.3f} < {base:.3f}")
    for styles in means.values():
        for style, (mean, base) in styles.items():
            assert mean < base, style
