"""vf_deepscaler: real DeepScaleR rows score 1 when right and 0 when wrong, known exploits score 0,
verification is time-bounded without blocking the event loop, and the data sources behave."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
import time
from fractions import Fraction
from typing import Any

import datasets.config
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import vf_deepscaler
from conftest import SHARED_DATA
from math_verify import parse
from vf_deepscaler import (
    DatasetFormatError,
    VerifierPool,
    corpus,
    generate_problems,
    last_boxed,
    load_environment,
)
from vf_deepscaler import pool as pool_module
from vf_deepscaler.forms import asks_percent, canonical, labelled
from vf_deepscaler.parser import answer_region, follows_think_format
from vf_deepscaler.verifier import is_equivalent

from rlvr.scripted import Policy, ScriptedClient

ROWS_PATH = SHARED_DATA / "deepscaler" / "preview_first803.jsonl"
LIMIT_S = 1.0
"""Verification limit for the timing tests: long enough for any real answer, short for tests."""
SLACK_S = 1.0
"""Allowed scheduling overhead beyond the limit on a shared 2-core machine."""


def reply(text: str) -> list[dict[str, str]]:
    return [{"role": "assistant", "content": text}]


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


@pytest.fixture(scope="module")
def rows() -> list[dict[str, Any]]:
    if not ROWS_PATH.is_file():
        pytest.fail(f"DeepScaleR rows not found at {ROWS_PATH}")
    return [json.loads(line) for line in ROWS_PATH.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def env():
    environment = load_environment(data_files=str(ROWS_PATH), verify_timeout_s=5.0)
    yield environment
    find_rubric(environment).pool.close()


@pytest.fixture(scope="module")
def think_env():
    environment = load_environment(
        data_files=str(ROWS_PATH), max_examples=4, use_think=True, think_format_weight=0.25
    )
    yield environment
    find_rubric(environment).pool.close()


def find_rubric(environment) -> vf_deepscaler.DeepScaleRRubric:
    """The environment's own rubric inside the group verifiers builds around it."""
    rubrics = getattr(environment.rubric, "rubrics", [environment.rubric])
    return next(r for r in rubrics if isinstance(r, vf_deepscaler.DeepScaleRRubric))


def rewards(environment, cases: list[tuple[str, str]]) -> list[float]:
    """``math_reward`` for each (completion text, gold) via ``score_reply``, all scored
    concurrently."""
    rubric = find_rubric(environment)

    async def run() -> list[float]:
        return await asyncio.gather(
            *(rubric.score_reply(reply(text), gold) for text, gold in cases)
        )

    return asyncio.run(run())


def integer_golds(rows: list[dict[str, Any]]) -> list[str]:
    return [r["answer"] for r in rows if re.fullmatch(r"-?\d+", r["answer"].strip())]


# The real rows -------------------------------------------------------------------------------


def test_gold_boxed_scores_one_on_real_rows(env, rows):
    cases = [
        (f"Working...\nSo the answer is $\\boxed{{{r['answer']}}}$.", r["answer"]) for r in rows
    ]
    scores = rewards(env, cases)
    failures = [
        (i, r["answer"]) for i, (r, s) in enumerate(zip(rows, scores, strict=True)) if s != 1
    ]
    assert len(rows) == 803
    assert len(failures) <= 0.01 * len(rows), failures
    assert failures == []  # measured: all 803 golds verify against themselves (README)


def test_wrong_value_scores_zero_on_real_rows(env, rows):
    golds = integer_golds(rows)
    assert len(golds) > 400
    scores = rewards(env, [(f"\\boxed{{{int(g) + 1}}}", g) for g in golds])
    assert scores == [0.0] * len(golds)


def test_equivalent_forms_score_one_on_real_rows(env, rows):
    """A gold fraction written as its terminating decimal is still correct."""
    cases = []
    for r in rows:
        match = re.fullmatch(r"(-?)\\(?:d|t)?frac\{(\d+)\}\{(\d+)\}", r["answer"].strip())
        if match and _terminates(int(match[3])):
            value = Fraction(int(match[2]), int(match[3])) * (-1 if match[1] else 1)
            cases.append((f"\\boxed{{{float(value)}}}", r["answer"]))
    assert len(cases) >= 5
    assert rewards(env, cases) == [1.0] * len(cases)


def _terminates(denominator: int) -> bool:
    """Does 1/denominator have a finite decimal expansion (only factors 2 and 5)?"""
    for p in (2, 5):
        while denominator % p == 0:
            denominator //= p
    return denominator == 1


@pytest.mark.parametrize(
    ("gold", "prediction"),
    [
        ("\\frac{1}{2}", "0.5"),
        ("0.5", "\\frac12"),
        ("-\\frac{2}{3}", "-\\frac{4}{6}"),
        ("26", "26.0"),
        ("2\\sqrt{2}", "\\sqrt{8}"),
        ("(-\\infty, 3]", "(-\\infty,3]"),
        ("\\{1, 2\\}", "\\{2, 1\\}"),
        ("\\frac{\\pi}{2}", "\\pi/2"),
        ("26", "x = 26"),
        ("26", "26 \\text{ inches}"),
    ],
)
def test_equivalent_forms_score_one(env, gold, prediction):
    assert rewards(env, [(f"\\boxed{{{prediction}}}", gold)]) == [1.0]


# Exploits ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "completion",
    [
        "",
        "The answer is 26.",
        "$26$",
        "\\boxed{}",
        "\\boxed{26",  # never closed
        "\\boxed{26} is tempting, but the final answer is \\boxed{25}.",
        " ".join(f"\\boxed{{{k}}}" for k in range(101)),  # every candidate, last one wrong
        "\\boxed{" + ", ".join(str(k) for k in range(101)) + "}",  # every candidate in one box
        "\\boxed{26 \\text{ or } 27}",
        "\\boxed{25 < x < 27}",
        "\\boxed{C}",
        "\\boxed{(C)}",
        "\\boxed{\\text{(C)}}",
        "\\boxed{\\textbf{(C)}\\ 26, \\text{ also } 27}",
    ],
)
def test_exploits_score_zero(env, completion):
    assert rewards(env, [(completion, "26")]) == [0.0]


def test_boxed_choice_letters_score_zero_when_gold_is_a_value(env, rows):
    golds = integer_golds(rows)[:100]
    cases = [(f"\\boxed{{{letter}}}", g) for g in golds for letter in "ABCDE"]
    assert sum(rewards(env, cases)) == 0.0


LETTER_ROWS = slice(603, 803)
"""The last 200 rows: the letter and label forms of their golds (issue 50: 0 on 200 of 200)."""


def test_deepscaler_answer_letter_forms_match(env, rows):
    """A value boxed with its answer-choice letter (``\\textbf{(C) } 40``, ``(C)\\ 40``,
    ``\\text{(C)}\\ 40``, ``40 \\textbf{ (C)}``, ...) or after an answer label
    (``\\text{Answer: } 40``) scores 1 when the value is right, in every lettered and labelled
    form on 200 real rows, and the reference solutions' own lettered boxes are paid (482 of the
    803 solutions box a letter beside the value; the unpaid are label errors in the data, such
    as row 644's ``\\textbf{(E)}\\ 16`` for gold 30, and forms no rule reads, such as
    ``4\\ \\text{by}\\ 8``). A letter alone, two lettered values, a label before two values, and
    a wrong value with the right letter's neighbour score 0."""
    golds = [r["answer"] for r in rows[LETTER_ROWS] if not re.fullmatch(r"[A-E]", r["answer"])]
    assert len(golds) >= 195
    forms = [*corpus.LETTERED, *corpus.LABELLED]
    honest = [
        (f"So the answer is $\\boxed{{{form.format(letter=letter, value=corpus._bare(g))}}}$.", g)
        for g in golds
        for form, letter in zip(forms, "CABEDCAB", strict=False)
    ]
    scores = rewards(env, honest)
    assert [case for case, s in zip(honest, scores, strict=True) if s != 1.0] == []
    integers = integer_golds(rows[LETTER_ROWS])
    hedges = [
        (f"\\boxed{{{text}}}", g)
        for g in integers
        for text in (
            "\\textbf{(C)}",
            "(C)",
            f"\\textbf{{(C)}}\\ {g}, \\textbf{{(D)}}\\ {int(g) + 1}",
            f"(C)\\ {int(g) + 1}, (D)\\ {g}",
            f"\\text{{Answer: }} {g}, {int(g) + 1}",
            f"\\text{{Answer: }} {g} \\text{{ or }} {int(g) + 1}",
            f"\\textbf{{(C)}}\\ {int(g) + 1}",
        )
    ]
    assert len(integers) >= 100
    assert sum(rewards(env, hedges)) == 0.0
    lettered = [
        (f"\\boxed{{{box}}}", r["answer"], i)
        for i, r in enumerate(rows)
        if (box := vf_deepscaler.last_boxed(r.get("solution") or "")) and labelled(box)
    ]
    paid = rewards(env, [(text, gold) for text, gold, _ in lettered])
    unpaid = [i for (_, _, i), s in zip(lettered, paid, strict=True) if s != 1.0]
    assert len(lettered) == 482
    assert len(unpaid) <= 0.03 * len(lettered), unpaid  # measured: 13 (6 label errors)
    assert {52, 457, 590, 644, 722} <= set(unpaid)  # the data's label errors stay unpaid


OR_FORMS_AND_NUMBER_WORDS = [  # (gold, boxed answer, paid as the bare gold is)
    ("9, -7", "x = 9 \\text{ or } x = -7", True),
    ("-7 and 9", "x = 9 \\text{ or } x = -7", True),
    ("x=9, x=-7", "x = 9 \\text{ or } x = -7", True),
    ("9, -7", "x = 9 \\text{ and } x = -7", True),
    ("9, -7", "9 \\text{ or } -7", True),
    ("-3 \\text{ and } 5", "x = 5 \\quad\\text{or}\\quad x = -3", True),
    ("2, 3, or 4", "4 \\text{ or } 2 \\text{ or } 3", True),
    ("13", "\\text{thirteen}", True),
    ("13", "\\text{Thirteen}", True),
    ("13", "13 \\text{ (thirteen)}", True),
    ("13", "\\text{13 (thirteen)}", True),
    ("21", "\\text{twenty-one}", True),
    ("40", "\\text{forty}", True),
    ("100", "\\text{one hundred}", True),
    ("1:3", "1 \\text{ to } 3", True),
    ("1:3", "1 \\text{ : } 3", True),
    ("9, -7", "x = 9 \\text{ or } x = 7", False),  # a wrong value
    ("9, -7", "x = 9 \\text{ or } x = -7 \\text{ or } x = 5", False),  # an extra value
    ("2, 3, or 4", "2 \\text{ or } 3", False),  # a missing value
    ("9, -7", " \\text{ or } ".join(str(k) for k in range(-10, 11)), False),  # every candidate
    ("13", "\\text{fourteen}", False),
    ("13", "\\text{thirty}", False),
    ("13", "13 \\text{ (fourteen)}", False),  # digits and a name: two numbers
    ("13", "14 \\text{ (thirteen)}", False),
    ("13", "13 \\text{ or } 14", False),  # one-value gold: a hedge
    ("13", "x = 13 \\text{ or } x = 14", False),
    ("13", "\\text{thirteen or fourteen}", False),
    ("1/3", "1 \\text{ to } 3", False),  # a fraction gold is no ratio
    ("\\frac{1}{3}", "1 \\text{ : } 3", False),
    ("1:3", "3 \\text{ to } 1", False),
]


def test_deepscaler_or_forms_and_number_words_match(env):
    """Values joined by "or"/"and" (``x = 9 \\text{ or } x = -7``) are paid as the bare gold
    when their set is the gold's (``9, -7``, ``-7 and 9``, ``x=9, x=-7``) in any order; a number
    spelled in words (``\\text{Thirteen}``, ``13 \\text{ (thirteen)}``) is paid as its digits; and
    ``1 \\text{ to } 3`` as the ratio ``1:3``. A different value set, another number's name,
    a one-value gold offered with another value, and a fraction gold for a ratio stay 0."""
    bare = rewards(env, [(f"\\boxed{{{gold}}}", gold) for gold, _, _ in OR_FORMS_AND_NUMBER_WORDS])
    assert bare == [1.0] * len(OR_FORMS_AND_NUMBER_WORDS)
    cases = [(f"So $\\boxed{{{form}}}$.", gold) for gold, form, _ in OR_FORMS_AND_NUMBER_WORDS]
    scores = rewards(env, cases)
    wrong = [
        (gold, form, score)
        for (gold, form, paid), score, expected in zip(
            OR_FORMS_AND_NUMBER_WORDS, scores, bare, strict=True
        )
        if score != (expected if paid else 0.0)
    ]
    assert wrong == []


def test_huge_expression_scores_zero_at_once(env):
    huge = "+".join(["1"] * 50_000)
    started = time.perf_counter()
    assert rewards(env, [(f"\\boxed{{{huge}}}", "50000")]) == [0.0]
    assert time.perf_counter() - started < LIMIT_S


def test_pathological_expression_is_bounded_and_others_keep_scoring():
    """``9^{9^{9^9}}`` and a tower of factorials make sympy compute for minutes; each scores 0
    within the limit, the event loop keeps ticking, and correct answers in flight still score 1."""
    pool = VerifierPool(size=2, timeout_s=LIMIT_S)

    async def run() -> tuple[list, list[float], float]:
        await asyncio.gather(pool.check("1", "1"), pool.check("1", "1"))  # both workers warm
        ticks: list[float] = []
        stop = asyncio.Event()

        async def ticker() -> None:
            while not stop.is_set():
                ticks.append(time.perf_counter())
                await asyncio.sleep(0.01)

        tick_task = asyncio.create_task(ticker())
        started = time.perf_counter()
        results = await asyncio.gather(
            pool.check("1", "9^{9^{9^{9}}}"),
            *(pool.check("\\frac{1}{2}", "0.5") for _ in range(20)),
            pool.check("1", "(((10!)!)!)"),
        )
        total = time.perf_counter() - started
        stop.set()
        await tick_task
        gaps = [b - a for a, b in zip(ticks, ticks[1:], strict=False)]
        return results, gaps, total

    try:
        results, gaps, total = asyncio.run(run())
    finally:
        pool.close()
    bad = [results[0], results[-1]]
    good = results[1:-1]
    for verdict in bad:  # its own time on a worker; queueing behind the good ones is not its
        assert not verdict.correct and verdict.status in ("timeout", "killed")
        assert verdict.seconds <= LIMIT_S + SLACK_S
    assert all(verdict.correct for verdict in good)
    assert max(gaps) < 0.25, "the event loop was blocked"
    assert total < 10  # seconds, not the minutes sympy would take (a replaced worker restarts)


def test_worker_that_ignores_its_deadline_is_killed_and_replaced(monkeypatch):
    """With the worker's own CPU deadline pushed past the limit, the parent's hard kill is what
    bounds the check; the next check runs on a fresh worker."""
    monkeypatch.setattr(pool_module, "SOFT_DEADLINE_FRACTION", 50.0)
    pool = VerifierPool(size=1, timeout_s=LIMIT_S)

    async def run():
        await pool.check("1", "1")
        first_pid = next(iter(pool._live)).proc.pid
        started = time.perf_counter()
        stuck = await pool.check("1", "9^{9^{9^{9}}}")
        elapsed = time.perf_counter() - started
        after = await pool.check("\\frac{1}{2}", "0.5")
        return first_pid, stuck, elapsed, after, next(iter(pool._live)).proc.pid

    try:
        first_pid, stuck, elapsed, after, second_pid = asyncio.run(run())
    finally:
        pool.close()
    assert (stuck.correct, stuck.status) == (False, "killed")
    assert LIMIT_S <= elapsed <= LIMIT_S + SLACK_S
    assert after.correct and after.status == "ok"
    assert second_pid != first_pid


# Answer extraction ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("\\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),
        ("a \\boxed{1} b \\boxed{2}", "2"),
        ("\\boxed 5$", "5"),
        ("\\boxed {7}", "7"),
        ("\\fbox{3}", "3"),
        ("\\boxed{1} then \\fbox{4}", "4"),
        ("\\boxed{1} \\boxed{2", ""),  # an unclosed last box does not fall back to the first
        ("\\boxedfoo{1}", None),
        ("no box", None),
    ],
)
def test_last_boxed(text, expected):
    assert last_boxed(text) == expected


def test_think_blocks_never_supply_the_answer():
    assert answer_region("<think>\\boxed{1}</think> \\boxed{2}", use_think=True).strip() == (
        "\\boxed{2}"
    )
    assert answer_region("<think>\\boxed{26}", use_think=False) == ""  # still thinking
    assert answer_region("\\boxed{26}", use_think=True) == ""  # think block required
    assert answer_region("\\boxed{26}", use_think=False) == "\\boxed{26}"


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        ("<think>work</think> \\boxed{1}", True),
        ("work</think> \\boxed{1}", True),  # opening tag was in the generation prompt
        ("<think></think> \\boxed{1}", False),
        ("<think>work</think>", False),
        ("x <think>work</think> \\boxed{1}", False),
        ("<think>a</think><think>b</think> \\boxed{1}", False),
        ("<THINK>work</THINK> \\boxed{1}", True),  # tags match in any letter case
        ("work</Think> \\boxed{1}", True),
        ("<think>a</THINK><Think>b</think> \\boxed{1}", False),
    ],
)
def test_think_format(text, ok):
    assert follows_think_format(text) is ok


def test_think_reward_formula(think_env):
    """reward = correct * (1 - w + w * format), w = 0.25: format only scales a correct answer."""
    cases = [
        ("<think>7 * 3 = 21, plus 5</think> The answer is \\boxed{26}.", "26"),
        ("<think>a</think>b</think> \\boxed{26}", "26"),  # correct, malformed
        ("<think>7 * 3</think> \\boxed{25}", "26"),  # well formed, wrong
        ("<think>the answer is \\boxed{26}</think> I am not sure.", "26"),  # box only inside
        ("\\boxed{26}", "26"),  # no think block
    ]
    assert rewards(think_env, cases) == [1.0, 0.75, 0.0, 0.0, 0.0]


# Scoring through env.generate ----------------------------------------------------------------


def answer_from(answers: dict[str, str]) -> Policy:
    """A scripted model that answers each problem (the last prompt message) from `answers`."""

    def policy(prompt: list[Any]) -> str:
        last = prompt[-1]
        return answers[last["content"] if isinstance(last, dict) else last.content]

    return policy


def generate_answers(environment, answers: dict[str, str]) -> list[dict[str, Any]]:
    """Every row of `environment` through env.generate, answered from `answers`, in row order;
    the environment's verifier pool is closed afterwards."""
    inputs = environment.get_dataset().to_list()
    try:
        results = asyncio.run(
            environment.generate(
                inputs, client=ScriptedClient(answer_from(answers)), model="scripted"
            )
        )
    finally:
        find_rubric(environment).pool.close()
    return sorted(results["outputs"], key=lambda o: o["example_id"])


def test_generate_scores_correct_one_and_wrong_zero(rows):
    environment = load_environment(data_files=str(ROWS_PATH), max_examples=6)
    answers = {}
    for i, row in enumerate(rows[:6]):
        value = row["answer"] if i % 2 == 0 else "\\text{no idea}"
        answers[row["problem"]] = (
            f"Let me compute step by step.\n\nFinal answer: $\\boxed{{{value}}}$"
        )
    outputs = generate_answers(environment, answers)
    assert [o["reward"] for o in outputs] == [1.0, 0.0, 1.0, 0.0, 1.0, 0.0]
    for output in outputs:
        metrics = output["metrics"]
        assert {"math_reward", "correct", "has_boxed", "completion_chars"} <= set(metrics)
        assert metrics["correct"] == output["reward"]
        assert metrics["has_boxed"] == 1.0 and metrics["completion_chars"] > 0


def test_think_tags_follow_one_rule_in_any_letter_case(rows):
    """Reasoning is stripped and the think format counted by the same case-insensitive rule:
    `<THINK>...</THINK>\\boxed{gold}` scores 1.0 through env.generate, like lower-case tags,
    and a box only inside the (upper-case) reasoning scores 0."""
    environment = load_environment(
        data_files=str(ROWS_PATH), max_examples=4, use_think=True, think_format_weight=0.25
    )
    tags = ["<think>{}</think>", "<THINK>{}</THINK>", "<Think>{}</tHiNk>", "<THINK>{}</THINK>"]
    answers = {}
    for i, row in enumerate(rows[:4]):
        thought = "work it out" if i < 3 else f"\\boxed{{{row['answer']}}}"
        reply = tags[i].format(thought)
        answers[row["problem"]] = reply + ("" if i == 3 else f" \\boxed{{{row['answer']}}}")
    outputs = generate_answers(environment, answers)
    assert [o["reward"] for o in outputs] == [1.0, 1.0, 1.0, 0.0]
    assert [o["metrics"]["format"] for o in outputs[:3]] == [1.0, 1.0, 1.0]


# Data sources --------------------------------------------------------------------------------


def test_rows_missing_a_field_name_file_row_and_field(tmp_path):
    path = tmp_path / "bad.jsonl"
    lines = [{"problem": "1+1?", "answer": "2"}, {"problem": "2+2?"}]
    path.write_text("\n".join(json.dumps(r) for r in lines) + "\n")
    with pytest.raises(
        DatasetFormatError, match=r"bad\.jsonl, row 2: missing required field 'answer'"
    ):
        load_environment(data_files=str(path))
    path.write_text(json.dumps({"answer": "2", "problem": "  "}) + "\n")
    with pytest.raises(DatasetFormatError, match=r"row 1: missing required field 'problem'"):
        load_environment(data_files=str(path))


def test_json_and_parquet_files_and_max_examples(tmp_path, rows):
    json_path = tmp_path / "rows.json"
    json_path.write_text(json.dumps(rows[:5]))
    parquet_path = tmp_path / "rows.parquet"
    pq.write_table(pa.Table.from_pylist(rows[5:10]), parquet_path)
    environment = load_environment(
        data_files=[str(json_path), str(parquet_path)],
        eval_data_files=str(parquet_path),
        max_examples=7,
    )
    find_rubric(environment).pool.close()
    train, evaluation = environment.get_dataset(), environment.get_eval_dataset()
    assert train["answer"] == [r["answer"] for r in rows[:7]]
    assert evaluation["answer"] == [r["answer"] for r in rows[5:10]]
    assert (
        train[0]["prompt"][0]["role"] == "system" and "\\boxed" in train[0]["prompt"][0]["content"]
    )
    assert train[0]["prompt"][-1]["content"] == rows[0]["problem"]


def test_unreachable_hub_falls_back_to_generated_problems(monkeypatch, caplog):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    started = time.perf_counter()
    with caplog.at_level(logging.WARNING, logger="vf_deepscaler"):
        environment = load_environment(max_examples=10, seed=3)
    find_rubric(environment).pool.close()
    assert time.perf_counter() - started < 10
    assert "generated problems" in caplog.text
    expected = generate_problems(10, seed=3)
    assert environment.get_dataset()["answer"] == [r["answer"] for r in expected]


@pytest.mark.parametrize("how", ["env_var", "datasets_offline"])
def test_offline_mode_falls_back_to_generated_problems(monkeypatch, caplog, how):
    """HF_HUB_OFFLINE set before start (datasets then reads only its cache, which lacks the
    dataset) or after import (the hub is not contacted at all): generated problems either way."""
    if how == "env_var":
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    else:
        monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    started = time.perf_counter()
    with caplog.at_level(logging.WARNING, logger="vf_deepscaler"):
        environment = load_environment(max_examples=5)
    find_rubric(environment).pool.close()
    assert time.perf_counter() - started < 10
    assert "generated problems" in caplog.text
    assert len(environment.get_dataset()) == 5


def test_bad_arguments_are_rejected(tmp_path):
    with pytest.raises(ValueError, match="think_format_weight"):
        load_environment(data_files=str(ROWS_PATH), max_examples=1, think_format_weight=1.5)
    with pytest.raises(ValueError, match="verify_timeout_s"):
        load_environment(data_files=str(ROWS_PATH), max_examples=1, verify_timeout_s=0)
    with pytest.raises(DatasetFormatError, match="not found"):
        load_environment(data_files=str(tmp_path / "missing.jsonl"))


# The embedded generator ----------------------------------------------------------------------


def test_generator_is_deterministic_and_spans_levels():
    first = generate_problems(200, seed=7)
    assert first == generate_problems(200, seed=7)
    assert first[:50] == generate_problems(50, seed=7)  # a longer run extends a shorter one
    assert first != generate_problems(200, seed=8)
    assert generate_problems(20, seed=7, stream="eval") != first[:20]
    assert {r["level"] for r in first} == {1, 2, 3, 4, 5}
    assert len({r["kind"] for r in first}) >= 12
    assert len({r["problem"] for r in first}) >= 0.95 * len(first)  # small ranges repeat rarely


def test_generated_answers_are_exact():
    """Recompute each answer independently of the generator, from the problem text alone."""
    checked = 0
    for row in generate_problems(300, seed=11):
        text, answer = row["problem"], row["answer"]
        expected = _solve_independently(row["kind"], text)
        if expected is None:
            continue
        assert is_equivalent(answer, expected), (text, answer, expected)
        checked += 1
    assert checked >= 150


def _solve_independently(kind: str, text: str) -> str | None:
    """The answer derived from the problem statement with sympy / math, or None if not covered."""
    import sympy

    numbers = [int(n) for n in re.findall(r"\d+", text)]
    math_spans = re.findall(r"\$([^$]+)\$", text)
    if kind in ("arithmetic", "product", "fraction_sum", "order_of_operations"):
        value = parse(f"${math_spans[0]}$")[0]
        return sympy.latex(sympy.nsimplify(value))
    if kind == "linear_equation":
        lhs, rhs = math_spans[1].split("=")
        x = sympy.Symbol("x")
        expr = sympy.sympify(re.sub(r"(\d)x", r"\1*x", lhs)) - sympy.sympify(
            re.sub(r"(\d)x", r"\1*x", rhs)
        )
        return sympy.latex(sympy.solve(expr, x)[0])
    if kind == "modular_power":
        return str(pow(numbers[0], numbers[1], numbers[2]))
    if kind == "divisor_count":
        return str(sympy.divisor_count(numbers[0]))
    if kind == "committee":
        return str(math.comb(numbers[1], numbers[0]))
    return None


def test_generated_boxed_answers_score_one(env):
    problems = generate_problems(60, seed=0)
    assert (
        rewards(env, [(f"\\boxed{{{r['answer']}}}", r["answer"]) for r in problems]) == [1.0] * 60
    )


# Honest corpus: the gold's value in other forms --------------------------------------------


@pytest.fixture(scope="module")
def corpus_results(env, think_env, rows) -> tuple[list[corpus.Result], list[corpus.Result]]:
    """The honest corpus on every real row and the hedges on the first 150, through the
    environment's rubrics (think-style replies through the one with ``use_think``)."""

    plain, think = find_rubric(env), find_rubric(think_env)
    honest = asyncio.run(corpus.score_honest(rows, plain, think))
    return honest, asyncio.run(corpus.score(plain, corpus.hedge_items(rows[:150])))


def test_deepscaler_units_and_forms_match(corpus_results):
    """Every equivalent form the corpus writes from a real row's gold scores 1: units dropped
    and added, degree signs, mixed numbers, decimals (repeating ones too), percents, intervals
    vs set-builder, \\dfrac/\\tfrac, thousands separators, lists; in every reply style."""
    honest, _ = corpus_results
    assert len(honest) >= 30
    assert {r.item.rule for r in honest} == set(corpus.FORM_RULES)
    assert {r.item.style for r in honest} == set(corpus.STYLES)
    for rule in corpus.FORM_RULES:
        assert sum(r.item.rule == rule for r in honest) >= 5, rule
    forms = {(r.item.gold, r.item.form) for r in honest}
    for example in [  # the cases issue 31 names
        ("245 yd.", "245"),
        ("33\\frac {1}{3}\\%", "\\frac{100}{3}\\%"),
        ("\\{x \\mid 2 < x < 3\\}", "(2, 3)"),
    ]:
        assert example in forms, example
    unpaid = [(r.item.rule, r.item.gold, r.item.form) for r in honest if r.reward != 1.0]
    assert unpaid == []


def test_deepscaler_rule_false_negative_rates(corpus_results):
    """Each rule that zeroes or cuts a reward, measured on the honest corpus (README table):
    the last box, the answer length, the hedge guard, the time limit, the equivalence check
    and, with ``use_think``, the think format. Measured: 0 for each."""
    honest, _ = corpus_results
    rates = corpus.false_negative_rates(honest)
    assert set(rates) == {*corpus.ZEROING_RULES, *corpus.CUTTING_RULES}
    assert rates == dict.fromkeys(rates, 0.0), rates
    assert corpus.mean_reward(honest) == 1.0


def test_deepscaler_hedges_stay_zero(corpus_results):
    """A reply that offers the gold among other answers is paid nothing, in every hedge form
    (before the hedge guard, "26 \\text{ cm or } 27 \\text{ cm}" paid 1 for gold 26)."""
    _, hedges = corpus_results
    assert {r.item.rule for r in hedges} == set(corpus.HEDGES)
    assert len(hedges) >= 100 * len(corpus.HEDGES)
    paid = [(r.item.rule, r.item.gold, r.item.reply) for r in hedges if r.reward != 0.0]
    assert paid == []


def _percent_rewards(env, cases: list[tuple[str, str, str]]) -> list[float]:
    """``math_reward`` (via ``score_reply``) for each (question, gold, boxed prediction), the
    question as the prompt."""
    rubric = find_rubric(env)

    async def run() -> list[float]:
        return await asyncio.gather(
            *(rubric.score_reply(reply(f"\\boxed{{{p}}}"), g, [user(q)]) for q, g, p in cases)
        )

    return asyncio.run(run())


ASKS_PERCENT = "What percent of the students passed?"
ASKS_COUNT = "How many students passed?"


@pytest.mark.parametrize(
    ("question", "gold", "prediction", "expected"),
    [
        (ASKS_PERCENT, "25", "25", 1.0),
        (ASKS_PERCENT, "25", "25\\%", 1.0),
        (ASKS_PERCENT, "25", "0.25", 1.0),  # the fraction the percent stands for
        (ASKS_PERCENT, "25\\%", "\\frac{1}{4}", 1.0),
        (ASKS_PERCENT, "25", "2.5", 0.0),
        (ASKS_COUNT, "25", "25", 1.0),
        (ASKS_COUNT, "25", "25\\%", 0.0),  # 25% is 0.25, not 25 students
        (ASKS_COUNT, "25", "0.25", 0.0),
        (ASKS_COUNT, "0.25", "25\\%", 1.0),  # a probability written as a percent
        (ASKS_COUNT, "0.25", "25", 0.0),
        ("Find the probability.", "\\frac{1}{2}", "50 \\text{ percent}", 1.0),
        ("How many percent of the students are girls?", "25", "25\\%", 1.0),
        ("What is the discount, in percent?", "25", "25\\%", 1.0),
    ],
)
def test_percent_is_read_as_a_percent_only_where_one_is_asked(
    env, question, gold, prediction, expected
):
    """A percent sign always divides by 100; a bare number stands for a percent only where the
    gold is one or the problem asks for one, so no single answer is paid for two values."""
    assert _percent_rewards(env, [(question, gold, prediction)]) == [expected]


def test_asks_percent_on_real_questions(rows):
    """The problems read as asking for a percent (their golds are percents, with or without the
    sign); a percent that is only data ("a 20% discount", "x% during April") is not asked."""
    asked = [i for i, row in enumerate(rows) if asks_percent(row["problem"])]
    assert asked == [8, 90, 115, 126, 206, 223, 374, 376, 398, 466, 550, 565, 567, 669, 747, 796]
    for i in (18, 62, 154, 229, 253, 277, 769):  # a percent in the data, another quantity asked
        assert not asks_percent(rows[i]["problem"]), i


def test_percent_sign_on_a_count_scores_zero_on_real_rows(env, rows):
    """Gold integers of problems that ask no percent: ``G\\%`` (the value G/100) scores 0."""
    cases = [
        (r["problem"], r["answer"], f"{r['answer']}\\%")
        for r in rows
        if re.fullmatch(r"[1-9]\d*", r["answer"]) and not asks_percent(r["problem"])
    ][:150]
    assert len(cases) == 150
    assert _percent_rewards(env, cases) == [0.0] * len(cases)


@pytest.mark.parametrize(
    ("answer", "form"),
    [
        ("245 yd.", "245"),
        ("5\\text{ cm}", "5"),
        ("12 \\text{ft}^2", "12"),
        ("\\text{5 cm}", "5"),
        ("30^\\circ", "30"),
        ("30°", "30"),
        ("11^{\\text{th}}", "11"),
        ("1\\,000", "1000"),
        ("1 000 000", "1000000"),
        ("\\$12.50", "12.50"),
        ("0.1\\overline{6}", "\\frac{1}{6}"),
        ("\\{x \\mid 2 < x < 3\\}", "(2, 3)"),
        ("\\left\\{x : x \\ge 2\\right\\}", "[2, \\infty)"),
        ("\\Big\\{x\\ |\\ 2 < x < 3\\Big\\}", "(2, 3)"),
        ("\\textbf{(C) } 40", "40"),
        ("\\textbf{(D)}\\ {-}13.5", "-13.5"),
        ("\\text{(C) 40}", "40"),
        ("\\textbf{(D)}\\ \\text{245 yd.}", "245"),
        ("40\\textbf{ (B)}", "40"),
        ("\\text{Answer: } 40", "40"),
        ("\\textbf{(C)}", "\\textbf{(C)}"),  # a letter alone stays a letter
        ("(C) 26, (D) 27", "26, (D) 27"),
        ("3 > x > 2", "(2, 3)"),
        ("x \\le \\frac{1}{2}", "(-\\infty, \\frac{1}{2}]"),
        ("x \\in [1, 2)", "[1, 2)"),
        ("3.4r", "3.4r"),  # a variable, not a unit
        ("2m + 1", "2m + 1"),
        ("b \\le a/3", "b \\le a/3"),  # bounds with letters stay relations
        ("7 minutes and 5 seconds", "7 minutes and 5 seconds"),
    ],
)
def test_canonical_forms(answer, form):
    assert canonical(answer) == form


def test_canonical_forms_of_long_answers_are_fast():
    """The forms are regular expressions without nested repetition: answers of the longest
    length that is verified take milliseconds, never the verifier's time limit."""
    for answer in ("1" * 1990 + " cm", " " * 1990 + "1", "<" * 1990, "\\{x \\mid " + "1<" * 900):
        started = time.perf_counter()
        canonical(answer)
        assert time.perf_counter() - started < 0.1, answer[:20]


def test_generate_reads_the_problem_for_the_percent_rule(tmp_path):
    """Through env.generate the rubric sees the problem: 0.25 answers "what percent" (gold 25)
    and scores 1; the same 0.25 for a count gold 25 scores 0, as does 25% for it."""
    problems = [
        ("What percent of 40 is 10?", "25", "0.25"),
        ("How many of the 100 marbles are red, if a quarter are?", "25", "0.25"),
        ("How many of the 100 beads are red, if a quarter are?", "25", "25\\%"),
        ("The price rose from 40 to 50. Find the percent increase.", "25", "25\\%"),
    ]
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps({"problem": q, "answer": g}) + "\n" for q, g, _ in problems))
    environment = load_environment(data_files=str(path))
    answers = {q: f"So the answer is $\\boxed{{{p}}}$." for q, _, p in problems}
    outputs = generate_answers(environment, answers)
    assert [o["reward"] for o in outputs] == [1.0, 0.0, 0.0, 1.0]
