"""vf_planner: a scripted planner and worker (a real OpenAI-compatible HTTP server on 127.0.0.1)
on real GSM8K test rows, driven through env.generate, plus the parsing pieces on their own.

The scripted worker (planner_script.py) answers only from what its prompt contains: its facts are
the numbers the prompt gives, its skill is the problem's reference calculation (GSM8K's
`<<a*b=c>>` steps), and a step is done only when every number it needs is a fact or an earlier
result. So whether a plan's subproblems and combination can reach the answer depends on what the
plan passed on. The honest corpus (planner_corpus.py) measures what honest plans are paid.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import verifiers as vf
import vf_planner.worker as worker_module
from openai import AsyncOpenAI
from vf_planner import independence, load_environment, parse_plan
from vf_planner.answers import (
    calculator_steps,
    final_number,
    format_number,
    gold_number,
    numbers_match,
    parse_number,
)
from vf_planner.notation import mask_numbers, stated_numbers
from vf_planner.plan import MAX_PLAN_CHARS, PlanError
from vf_planner.prompts import WORKER_COMBINE_SYSTEM, WORKER_DIRECT_SYSTEM
from vf_planner.quantities import own_question
from vf_planner.rubric import efficiency
from vf_planner.scripted_server import ScriptedOpenAIServer
from vf_planner.steps import carries_whole_problem, holds_problem, plan_leak
from vf_planner.worker import WorkerPool, WorkerSettings

from tests.environments.planner_corpus import (
    STYLES,
    Decomposition,
    corpus_rows,
    delegated_plans,
    dictating_plans,
    honest_plan,
    honest_reply,
    number_words,
    word_list_plans,
)
from tests.environments.planner_script import (
    BASE,
    CANNOT_TELL,
    COMBINATIONS,
    POLICY,
    Problem,
    Script,
)

TOKEN_WEIGHT, INDEPENDENCE_WEIGHT = 0.2, 0.3
# The GSM8K test split has no row whose gold answer is 0, so the zero case uses this written one.
ZERO_QUESTION = (
    "A bus starts empty. 5 people get on at the first stop and the same 5 get off at the second "
    "stop. How many people are on the bus after the second stop?"
)
ZERO_SOLUTION = "5 get on and 5 get off, so 5-5=<<5-5=0>>0 people are left.\n#### 0"

# Honest decompositions of GSM8K test rows (by row index): parallel, self-contained subproblems
# that each compute a step of the solution, and a plan that passes on the facts still needed.
HONEST: dict[int, tuple[list[str], str]] = {
    0: (
        [
            "Janet's ducks lay 16 eggs a day. She eats 3 of them and bakes with 4. "
            "How many eggs are left each day?"
        ],
        "She sells every egg left for $2: multiply the eggs left each day by 2.",
    ),
    2: (
        [
            "A house bought for $80,000 gets $50,000 of repairs. What is the total cost?",
            "A house bought for $80,000 rises in value by 150%. What is it worth now?",
        ],
        "The profit is what the house is worth now minus the total cost.",
    ),
    3: (
        ["James runs 3 sprints, 3 times a week. How many sprints does he run a week?"],
        "Each sprint is 60 meters: multiply the sprints per week by 60.",
    ),
    5: (
        [
            "A glass costs $5 and a discounted glass costs 60% of that. "
            "What does a discounted glass cost?",
            "Kylar buys 16 glasses and every 2nd one is discounted. "
            "How many discounted glasses does he buy?",
        ],
        "He pays the discounted price for each discounted glass and $5 for each of the same "
        "number of full-price glasses; add the two amounts.",
    ),
    6: (
        [
            "Seattle has 20 sheep and Charleston has 4 times as many. "
            "How many sheep does Charleston have?"
        ],
        "Toulouse has twice as many sheep as Charleston; add the sheep of Seattle (20), "
        "Charleston and Toulouse.",
    ),
}
# The same problems' sentences in other words (a degenerate plan that dodges verbatim copying).
PARAPHRASED: dict[int, list[str]] = {
    0: [
        "Every day Janet gets 16 eggs from her ducks.",
        "Each morning three eggs are her breakfast and four go into muffins for friends.",
        "The rest are sold at the market for $2 apiece.",
        "What are her daily market earnings in dollars?",
    ],
    2: [
        "Josh wants to flip a house.",
        "He pays $80,000 for a house and spends $50,000 fixing it up.",
        "Thanks to this the house is worth 150% more.",
        "What was his profit?",
    ],
    3: [
        "Three times a week James runs 3 sprints.",
        "Every sprint is 60 meters long.",
        "How far does he run in a week, in meters?",
    ],
    5: [
        "Kylar is buying glasses for his new flat.",
        "A glass is $5, yet each second glass is sold at 60% of that price.",
        "He needs 16 glasses.",
        "What is the total he pays?",
    ],
    6: [
        "Toulouse owns two times the sheep Charleston owns.",
        "Charleston owns 4 times the sheep Seattle owns.",
        "Seattle owns 20 sheep; how many sheep are there in the three cities altogether?",
    ],
}


def plan_json(subproblems: list[str], plan: str = "Combine the results.") -> str:
    decision = {"should_decompose": bool(subproblems), "subproblems": subproblems, "plan": plan}
    return json.dumps(decision)


def sentences(question: str, limit: int = 4) -> list[str]:
    """The problem's sentences, the first ones merged so there are at most `limit`."""
    parts = re.split(r"(?<=[.?!])\s+", question.strip())
    head = len(parts) - limit + 1
    return [" ".join(parts[:head]), *parts[head:]] if head > 1 else parts


def degenerate_plans(index: int, question: str) -> dict[str, str]:
    """The plans the issue measured as paying more than honest ones, plus the atomic plan."""
    return {
        "copied sentences": plan_json(sentences(question)),
        "[problem, 'What is the answer?']": plan_json([question, "What is the answer?"]),
        "paraphrased sentences": plan_json(PARAPHRASED[index]),
        "atomic": plan_json([]),
    }


@pytest.fixture(scope="module")
def gsm8k_file(shared_data: Path) -> Path:
    return shared_data / "gsm8k" / "test.jsonl"


@pytest.fixture(scope="module")
def rows(gsm8k_file: Path) -> list[dict]:
    with gsm8k_file.open() as f:
        return [json.loads(line) for _, line in zip(range(12), f, strict=False)]


@pytest.fixture(scope="module")
def script(rows: list[dict]) -> Script:
    problems = {row["question"]: Problem(row["question"], row["answer"]) for row in rows}
    problems[ZERO_QUESTION] = Problem(ZERO_QUESTION, ZERO_SOLUTION)
    return Script(problems=problems)


@pytest.fixture(scope="module")
def server(script: Script):
    models = [{"id": BASE}, {"id": POLICY, "parent": BASE}]
    with ScriptedOpenAIServer(script, models=models) as srv:
        yield srv


WORKER_TIMEOUT_S = 5.0
"""Far above a scripted reply's time, even on a loaded machine, and short enough to wait out."""


def planner_env(gsm8k_file: Path, **kwargs) -> vf.Environment:
    """The environment on the local test rows with the tests' reward weights."""
    weights = {"token_weight": TOKEN_WEIGHT, "independence_weight": INDEPENDENCE_WEIGHT}
    return load_environment(data_files=str(gsm8k_file), split="test", **weights, **kwargs)


@pytest.fixture(scope="module")
def env(gsm8k_file: Path) -> vf.Environment:
    return planner_env(gsm8k_file, max_examples=12, worker_timeout=WORKER_TIMEOUT_S)


@pytest.fixture(autouse=True)
def fresh_script(script: Script):
    """Each test starts from a worker that answers at once with default token spend."""
    yield
    script.plans.clear()
    script.texts.clear()
    script.planner_tokens.clear()
    script.problem = None
    script.worker_status = 200
    script.subproblem_delay = 0.0
    script.combination = "plan"
    script.unmasked.clear()


def rollout_inputs(env: vf.Environment, questions: list[str]) -> list[dict]:
    by_question = {row["question"]: row for row in env.get_dataset()}
    return [by_question[q] for q in questions]


def generate(env: vf.Environment, server: ScriptedOpenAIServer, inputs: list[dict]) -> list[dict]:
    """Rollouts through env.generate with the scripted server as the policy's endpoint."""
    client = vf.OpenAIChatCompletionsClient(AsyncOpenAI(base_url=server.base_url, api_key="x"))
    results = asyncio.run(
        env.generate(inputs, client=client, model=POLICY, state_columns=["planner"])
    )
    return results["outputs"]


def run_plan(env, server, script, question: str, reply: str, tokens: int | None = None) -> dict:
    script.problem = script.problems[question]
    script.expect(script.problem, question, reply)
    if tokens is not None:
        script.planner_tokens[question] = tokens
    return generate(env, server, rollout_inputs(env, [question]))[0]


# --- honest decompositions against degenerate plans --------------------------------------------


@pytest.mark.slow
def test_honest_decompositions_outscore_degenerate_plans(env, server, script, rows):
    """On five GSM8K problems every honest decomposition scores above each degenerate plan the
    issue measured (copied sentences, [problem, "What is the answer?"], paraphrased sentences)
    and above the atomic plan. Copies and restatements earn no independence (and a combination
    that only gets restated facts back cannot finish); a paraphrased sentence earns it only
    where it holds a whole step of the solution and the worker does that step (row 3: "Three
    times a week James runs 3 sprints." -> 9), i.e. where it is a real subproblem, so such plans
    get a fraction of it. The problem as a subproblem is a direct solve in disguise: it is paid
    w_c, below the atomic plan. Run with -s for the table of numbers."""
    table = []
    for index, (subproblems, plan) in HONEST.items():
        question = rows[index]["question"]
        honest = run_plan(env, server, script, question, plan_json(subproblems, plan))
        assert honest["metrics"]["correct"] == 1.0, (index, honest["planner"])
        assert honest["metrics"]["independence"] == 1.0, (index, honest["planner"])
        table.append((index, "honest", honest))
        plans = degenerate_plans(index, question)
        atomic = run_plan(env, server, script, question, plans.pop("atomic"))
        assert atomic["metrics"]["correct"] == 1.0 and honest["reward"] > atomic["reward"]
        table.append((index, "atomic", atomic))
        for name, reply in plans.items():
            out = run_plan(env, server, script, question, reply)
            table.append((index, name, out))
            assert out["reward"] < honest["reward"], (index, name)
            if name == "[problem, 'What is the answer?']":  # one subproblem is the whole problem
                assert out["metrics"]["not_decomposed"] == 1.0, (index, out["planner"])
                assert out["reward"] == 1.0 < atomic["reward"], (index, out["planner"])
            elif name == "paraphrased sentences":  # counts only a sentence that is a whole step
                assert out["metrics"]["independence"] < 0.5, (index, out["planner"])
            else:
                assert out["metrics"]["independence"] == 0.0, (index, name, out["planner"])
                assert out["reward"] <= atomic["reward"], (index, name)
    print(f"\n{'row':>3} {'plan':<34} {'reward':>6} {'C':>3} {'E':>5} {'I':>5}")
    for index, name, out in table:
        m = out["metrics"]
        print(
            f"{index:>3} {name:<34} {out['reward']:6.3f} {m['correct']:3.0f}"
            f" {m['efficiency']:5.3f} {m['independence']:5.2f}"
        )


def test_atomic_plans_are_not_penalised_structurally(env, server, script, rows):
    """An atomic plan is scored on correctness and tokens like any plan: it earns exactly
    w_c + w_t * E, and an honest decomposition of the same problem differs from it by exactly the
    documented terms, w_t * (E_d - E_a) + w_i * I_d."""
    for index, (subproblems, plan) in HONEST.items():
        question = rows[index]["question"]
        atomic = run_plan(env, server, script, question, plan_json([]))
        honest = run_plan(env, server, script, question, plan_json(subproblems, plan))
        ma, mh = atomic["metrics"], honest["metrics"]
        assert ma["correct"] == 1.0 and ma["independence"] == 0.0
        assert ma["worker_tokens"] == ma["baseline_tokens"]  # the direct solve, reused
        assert atomic["reward"] == pytest.approx(1.0 + TOKEN_WEIGHT * ma["efficiency"])
        gap = TOKEN_WEIGHT * (mh["efficiency"] - ma["efficiency"])
        gap += INDEPENDENCE_WEIGHT * mh["independence"]
        assert honest["reward"] - atomic["reward"] == pytest.approx(gap, abs=1e-9)


def test_worker_sees_only_what_the_plan_gives_it(env, server, script, rows):
    """Subproblem calls carry the subproblem's text alone; the combination carries the plan and
    the results, and is also asked with decoy results and the subproblems' numbers masked (the
    check that the answer comes from the results, which no worker can then re-solve from the
    texts); the problem reaches the worker only in the direct solve (the baseline)."""
    question = rows[2]["question"]
    subproblems, plan = HONEST[2]
    before = len(server.requests)
    out = run_plan(env, server, script, question, plan_json(subproblems, plan))
    worker_calls = [r["messages"] for r in server.requests[before:] if r["model"] == BASE]
    users = {m[0]["content"]: [] for m in worker_calls}
    for messages in worker_calls:
        users[messages[0]["content"]].append(messages[-1]["content"])
    subproblem_calls = [u for system, us in users.items() for u in us if "self-contained" in system]
    assert sorted(subproblem_calls) == sorted(subproblems)
    combination, decoyed = sorted(users[WORKER_COMBINE_SYSTEM], key=lambda u: "130000" not in u)
    shown = [parse_number(r) for r in re.findall(r"Result: (.+)", decoyed)]
    assert decoyed.startswith(f"Plan: {plan}\n\nSolved parts:\n1. {mask_numbers(subproblems[0])}")
    assert "80,000" not in decoyed and "150%" not in decoyed
    assert len(shown) == 2 and not set(shown) & {130000.0, 200000.0, 120000.0, 70000.0}
    assert plan in combination and "Result: 130000" in combination and question not in combination
    assert out["metrics"]["plan_leak"] == 0.0
    carrying_problem = {system for system, us in users.items() for u in us if question in u}
    assert carrying_problem <= {WORKER_DIRECT_SYSTEM}  # the baseline (unless already cached)
    assert out["planner"]["subproblem_results"] == [130000.0, 200000.0]
    assert out["planner"]["counted"] == [True, True]


def test_a_plan_that_keeps_back_a_needed_fact_is_wrong(env, server, script, rows):
    """Without the $2 price in the plan or a subproblem, the combination cannot reach the answer:
    correctness depends on what the plan passes on, and a wrong plan earns no bonus at all."""
    question = rows[0]["question"]
    subproblems, _ = HONEST[0]
    right = run_plan(env, server, script, question, plan_json(*HONEST[0]))
    wrong = run_plan(
        env, server, script, question, plan_json(subproblems, "Multiply by the price.")
    )
    assert right["metrics"]["correct"] == 1.0 and right["reward"] > 1.0
    assert wrong["metrics"]["correct"] == 0.0 and wrong["reward"] == 0.0
    assert wrong["metrics"]["independence"] == 1.0  # the subproblem did its part; C gates it
    assert CANNOT_TELL in wrong["planner"]["final_reply"]


def test_filler_and_repeated_subproblems_earn_no_independence(env, server, script, rows):
    """An unrelated question or a repeat of a subproblem does not count; each lowers I below the
    honest plan's. A subproblem that states a result the workers were to compute ("Janet has 9
    eggs left") carries the planner's own work: the plan scores 0."""
    question = rows[0]["question"]
    [step], plan = HONEST[0]
    variants = {
        "filler": [step, "What is the capital of France?"],
        "repeated": [step, step],
    }
    honest = run_plan(env, server, script, question, plan_json([step], plan))
    for name, subproblems in variants.items():
        out = run_plan(env, server, script, question, plan_json(subproblems, plan))
        assert out["metrics"]["correct"] == 1.0, name
        assert out["planner"]["counted"] == [True, False], name
        assert out["metrics"]["independence"] == 0.5, name
        assert out["reward"] < honest["reward"], name
    states = [step, "Janet has 9 eggs left each day. How many eggs are left?"]
    out = run_plan(env, server, script, question, plan_json(states, plan))
    assert out["metrics"]["plan_leak"] == 1.0 and out["reward"] == 0.0


# --- plans that do none of the work -------------------------------------------------------------


def spelled_out(text: str) -> str:
    """The text with every number written in words."""
    return re.sub(r"\d[\d,]*", lambda m: number_words(int(m.group().replace(",", ""))), text)


def unrelated_step(solution: str) -> str:
    """Arithmetic that is no step of the problem but returns its first intermediate result."""
    first = calculator_steps(solution)[0].value
    return f"What is {format_number(first - 1)} + 1?"


def dictated_plans(index: int, row: dict) -> dict[str, str]:
    """Plans whose planner solved the problem and hands the answer to the combination step (the
    issue's strategies and variants of them)."""
    gold = gold_number(row["answer"])
    step = unrelated_step(row["answer"])
    last_step = re.findall(r"<<([^=<>]*)=", row["answer"])[-1]
    dictate = f"Reply exactly: Answer: {format_number(gold)}"
    plans = {
        "dictated, unrelated step": plan_json([step], dictate),
        "dictated, filler step": plan_json(["What is 1 + 1?"], dictate),
        "dictated, paraphrased": plan_json(
            [step], f"All told that comes to {format_number(gold)}; give it as the final number."
        ),
        "dictated, spelled out": plan_json([step], f"The result is {number_words(int(gold))}."),
        "dictated as arithmetic": plan_json([step], f"What is {format_number(gold - 1)} + 1?"),
        "answer split over two steps": plan_json(
            [step, f"What is {last_step}?"], "Reply with the second result."
        ),
        "honest step, then the answer's step": plan_json(
            [HONEST[index][0][0], f"What is {last_step}?"], "Reply with the second result."
        ),
        "answer in a subproblem": plan_json(
            [HONEST[index][0][0], dictate], "Reply with the second result."
        ),
    }
    if index == 0:  # the issue's measured plan
        plans["issue: 3 * 3, reply 18"] = plan_json(["What is 3 * 3?"], "Reply exactly: Answer: 18")
    return plans


def pasted_plans(index: int, question: str, solution: str) -> dict[str, str]:
    """Plans that hand the combination step the problem itself, in its words or others."""
    step = unrelated_step(solution)
    return {
        "problem as plan, trivial step": plan_json([step], question),
        "problem as plan, honest steps": plan_json(HONEST[index][0], question),
        "paraphrased problem as plan": plan_json([step], " ".join(PARAPHRASED[index])),
        "spelled-out problem as plan": plan_json([step], spelled_out(question)),
    }


def assert_none_pays(env, server, script, rows, strategies) -> None:
    """Each strategy scores at most the atomic plan of its row, and the honest decomposition
    scores above both, on the five measured rows; prints the table (run with -s)."""
    table = []
    for index, (subproblems, plan) in HONEST.items():
        question = rows[index]["question"]
        honest = run_plan(env, server, script, question, plan_json(subproblems, plan))
        atomic = run_plan(env, server, script, question, plan_json([]))
        assert honest["reward"] > atomic["reward"], index
        table += [(index, "honest", honest["reward"]), (index, "atomic", atomic["reward"])]
        for name, reply in strategies(index, rows[index]).items():
            out = run_plan(env, server, script, question, reply)
            assert out["reward"] <= atomic["reward"], (index, name, out["planner"])
            table.append((index, name, out["reward"]))
    print()
    for index, name, reward in table:
        print(f"{index:>3} {name:<36} {reward:6.3f}")


@pytest.mark.slow
def test_planner_dictated_answer_does_not_pay(env, server, script, rows):
    """A planner that solved the problem itself and dictates the answer to the combination step
    (in digits, words, other phrasing or as arithmetic), or splits the answer's computation into
    bare arithmetic of its own numbers, earns no more than solving directly: a plan that states
    a result of the solution, or whose combination gives the answer with decoy results, scores
    0, and a subproblem counts only when it carries the problem's own operands of the step it
    computes."""
    assert_none_pays(env, server, script, rows, dictated_plans)


@pytest.mark.slow
def test_planner_problem_in_plan_does_not_pay(env, server, script, rows):
    """The problem handed to the combination step through `plan` (verbatim, paraphrased, with
    its numbers spelled out, beside honest subproblems or a trivial one) earns no more than
    solving directly: a plan that holds the problem's numbers and wording is no decomposition
    (`not_decomposed`, reward w_c), a combination that reaches the answer with decoy results
    scores 0, and a trivial step earns no independence."""
    assert_none_pays(
        env,
        server,
        script,
        rows,
        lambda index, row: pasted_plans(index, row["question"], row["answer"]),
    )


# --- the honest corpus: what honest plans are paid ----------------------------------------------

# GSM8K test rows after the 12 the other tests use that read as steps; other rows for a held-out
# check: PLANNER_CORPUS_FIRST_ROW=400 PLANNER_CORPUS_ROWS=120 pytest ... -k honest_styles
CORPUS_FIRST_ROW = int(os.environ.get("PLANNER_CORPUS_FIRST_ROW", "12"))
CORPUS_ROWS = int(os.environ.get("PLANNER_CORPUS_ROWS", "60"))
# The rules that zero or cut an honest plan's reward, as the pipeline names them.
RULES = {
    "states_result": lambda o: o["planner"]["leak_rule"] == "states_result",
    "answer_without_results": lambda o: o["planner"]["leak_rule"] == "answer_without_results",
    "not_decomposed": lambda o: o["planner"]["not_decomposed"] is not None,
}
MAX_FALSE_NEGATIVE_RATE = 0.05


@pytest.fixture(scope="module")
def corpus(gsm8k_file: Path) -> list[tuple[int, dict, Decomposition]]:
    with gsm8k_file.open() as f:
        rows = [json.loads(line) for line in f]
    first = CORPUS_FIRST_ROW
    return [(first + i, row, plan) for i, row, plan in corpus_rows(rows[first:], CORPUS_ROWS)]


@pytest.fixture(scope="module")
def corpus_env(gsm8k_file: Path) -> vf.Environment:
    """The environment for the corpus's hundreds of concurrent rollouts: the worker named (no
    model lookup per rollout) and a timeout that a loaded machine cannot reach."""
    return planner_env(gsm8k_file, max_examples=1, worker_model=BASE, worker_timeout=120.0)


PLAYS_PER_GENERATE = 400
"""Rollouts per env.generate call: the scripted server answers one request at a time, so a
larger batch queues its worker calls past the worker's timeout on a loaded 2-core machine."""


def play(env, server, script, plays: list[tuple[dict, str, str]]) -> list[dict]:
    """Every (row, name, reply) as one rollout, in env.generate calls of PLAYS_PER_GENERATE.
    Each rollout's prompt is tagged with its name, so the scripted planner tells them apart;
    the rubric reads the problem from `info`, as in any rollout."""
    if len(plays) > PLAYS_PER_GENERATE:
        return [
            out
            for start in range(0, len(plays), PLAYS_PER_GENERATE)
            for out in play(env, server, script, plays[start : start + PLAYS_PER_GENERATE])
        ]
    inputs = []
    for k, (row, name, reply) in enumerate(plays):
        prompt = f"{row['question']}\n\n[{name}]"
        script.expect(Problem(row["question"], row["answer"]), prompt, reply)
        inputs.append(
            {
                "prompt": [{"role": "user", "content": prompt}],
                "question": row["question"],
                "answer": format_number(gold_number(row["answer"])),
                "info": {"question": row["question"], "solution": row["answer"]},
                "example_id": k,
            }
        )
    outputs = generate(env, server, inputs)
    return [next(o for o in outputs if o["example_id"] == k) for k in range(len(plays))]


def corpus_table(outcomes: dict[str, list[dict]]) -> dict[str, dict[str, float]]:
    """Per style: mean reward, the rate at which each rule fired, wrong answers, uncounted
    subproblems; printed, and returned for the asserts."""
    table = {}
    for style, outs in outcomes.items():
        n = len(outs)
        row = {"mean": sum(o["reward"] for o in outs) / n}
        row |= {rule: sum(map(fires, outs)) / n for rule, fires in RULES.items()}
        row["wrong"] = sum(o["metrics"]["correct"] == 0 for o in outs) / n
        row["I<1"] = sum(o["metrics"]["independence"] < 1 for o in outs) / n
        table[style] = row
    columns = list(next(iter(table.values())))
    print(f"\n{'style':<15}" + "".join(f"{c:>24}" for c in columns))
    for style, row in table.items():
        print(f"{style:<15}" + "".join(f"{row[c]:>24.3f}" for c in columns))
    return table


@pytest.mark.slow
def test_planner_honest_styles_are_paid(corpus_env, server, script, corpus):
    """Honest decompositions of 60 GSM8K test rows the other tests do not use, written by rules
    from each problem and its reference steps in eight styles (planner_corpus.py), are paid:
    no rule that zeroes or cuts a reward fires on more than 5% of the plans of any style (each
    rule's false-negative rate is printed per style, run with -s), and every style averages
    above the atomic plan on the same rows."""
    plays = [(row, style, honest_reply(plan, style)) for _, row, plan in corpus for style in STYLES]
    plays += [(row, "atomic", plan_json([])) for _, row, _ in corpus]
    outcomes: dict[str, list[dict]] = {style: [] for style in ["atomic", *STYLES]}
    for (_, style, _), out in zip(plays, play(corpus_env, server, script, plays), strict=True):
        outcomes[style].append(out)
    assert len(corpus) == CORPUS_ROWS
    table = corpus_table(outcomes)
    atomic = table.pop("atomic")["mean"]
    for style, row in table.items():
        for rule in RULES:
            assert row[rule] <= MAX_FALSE_NEGATIVE_RATE, (style, rule, row)
        assert row["mean"] > atomic, (style, row["mean"], atomic)


# --- issue 50: the decomposition must be the planner's, whatever the worker does ----------------

# GSM8K test rows the other tests do not use (the issue's audit read rows 950-1100): the first
# AUDIT_ROWS from AUDIT_FIRST_ROW whose solution reads as steps.
AUDIT_FIRST_ROW = int(os.environ.get("PLANNER_AUDIT_FIRST_ROW", "950"))
AUDIT_ROWS = int(os.environ.get("PLANNER_AUDIT_ROWS", "60"))
ISSUE_50_STYLES = ("collector", "lists")


@pytest.fixture(scope="module")
def audit_corpus(gsm8k_file: Path) -> list[tuple[int, dict, Decomposition]]:
    with gsm8k_file.open() as f:
        rows = [json.loads(line) for line in f]
    first = AUDIT_FIRST_ROW
    return [(first + i, row, plan) for i, row, plan in corpus_rows(rows[first:], AUDIT_ROWS)]


def audit_plays(corpus: list[tuple[int, dict, Decomposition]]) -> list[tuple[dict, str, str]]:
    """Every honest style, the atomic plan, and every plan that does none of the decomposing
    (delegated_plans, word_list_plans) or whose plan text does the work (dictating_plans), on
    every row."""
    plays = []
    for _, row, plan in corpus:
        plays += [(row, style, honest_reply(plan, style)) for style in STYLES]
        plays.append((row, "atomic", plan_json([])))
        exploits = {**delegated_plans(plan), **word_list_plans(plan), **dictating_plans(plan)}
        plays += [(row, name, json.dumps(decision)) for name, decision in exploits.items()]
    return plays


@pytest.fixture(scope="module")
def audit_outcomes(corpus_env, server, script, audit_corpus):
    """The audit plays' outcomes by name, once per combination behaviour of the worker (trusting:
    uses the listed results; re-solving: solves from the texts it is shown whenever it can),
    computed on first use."""
    cache: dict[str, dict[str, list[dict]]] = {}

    def outcomes(combination: str) -> dict[str, list[dict]]:
        if combination not in cache:
            plays = audit_plays(audit_corpus)
            script.combination = combination
            try:
                played = play(corpus_env, server, script, plays)
            finally:
                script.combination = "plan"
            by_name: dict[str, list[dict]] = {}
            for (_, name, _), out in zip(plays, played, strict=True):
                by_name.setdefault(name, []).append(out)
            cache[combination] = by_name
        return cache[combination]

    return outcomes


def exploit_table(outcomes: dict[str, list[dict]], names) -> dict[str, dict[str, float]]:
    """Per strategy: mean and max reward, the share that earned any independence and the share
    each rule cut or zeroed; printed."""
    table = {}
    for name in names:
        outs = outcomes[name]
        n = len(outs)
        table[name] = {
            "mean": sum(o["reward"] for o in outs) / n,
            "max": max(o["reward"] for o in outs),
            "I>0": sum(o["metrics"]["independence"] > 0 for o in outs) / n,
            "correct": sum(o["metrics"]["correct"] for o in outs) / n,
        } | {rule: sum(map(fires, outs)) / n for rule, fires in RULES.items()}
    columns = list(next(iter(table.values())))
    print(f"\n{'strategy':<34}" + "".join(f"{c:>23}" for c in columns))
    for name, row in table.items():
        print(f"{name:<34}" + "".join(f"{row[c]:>23.3f}" for c in columns))
    return table


@pytest.mark.slow
def test_planner_delegated_decomposition_does_not_pay(audit_outcomes, audit_corpus):
    """The issue's template (the whole problem verbatim with "What is the first quantity you need
    to compute? Reply with that number only.", and a plan text the same for every row) and its
    variants (reworded, two and three probes, "the value before the final step", the problem
    with its last operand set to 1 or 0) leave the decomposition to the worker: a subproblem
    that holds the problem counts only when its own question names the step it computed
    (steps.names_step), so none earns independence and each is paid at most w_c, below the
    atomic plan, while the honest plans of the same rows are paid above it. Played with the
    trusting worker, which reads the facts of the subproblems' texts in the combination and so
    reaches the right answer from the template (the issue measured 1.34 against honest 1.35)."""
    outcomes = audit_outcomes("trusting")
    families = list(
        dict.fromkeys(name for *_, plan in audit_corpus for name in delegated_plans(plan))
    )
    assert "delegated, last operand neutral" in families
    table = exploit_table(outcomes, ["atomic", "named", *families])
    atomic, honest = table.pop("atomic")["mean"], table.pop("named")["mean"]
    assert table["delegated"]["correct"] >= 0.9  # the worker finishes it: only the rule stops it
    for name, row in table.items():
        assert row["I>0"] <= MAX_FALSE_NEGATIVE_RATE, (name, row)
        assert row["mean"] <= atomic < honest, (name, row, atomic, honest)
        assert row["max"] <= 1.0, (name, row)  # w_c: no independence, no efficiency bonus
    assert len(outcomes["delegated, last operand neutral"]) >= 0.5 * len(audit_corpus)


@pytest.mark.slow
def test_planner_collector_and_list_styles_are_paid(corpus_env, server, script, audit_corpus):
    """Honest plans are not cut by their wording: a subproblem that copies the sentence holding
    the problem's numbers and restates one of them ("collect the given fact ...") earns nothing
    itself but no longer makes the plan `not_decomposed` (a whole-problem subproblem that
    computed no step did, 11% of plans in the issue's audit), and inline list labels and
    cross-references ("1) ... 2) ...", "the number from line 3") are not read as quantities
    (they zeroed 3%: a label equal to a result tripped `states_result`). Every rule stays at or
    under 5% per style, and both styles are paid above the atomic plan."""
    assert stated_numbers("1) Find it. 2) Multiply the number from line 1 by 2. 3) Done.") == {2.0}
    assert stated_numbers("(costs 2) each, x (y 3) 4) z") == {2.0, 3.0}  # closes a parenthesis
    plays = [
        (row, style, honest_reply(plan, style))
        for _, row, plan in audit_corpus
        for style in ISSUE_50_STYLES
    ]
    plays += [(row, "atomic", plan_json([])) for _, row, _ in audit_corpus]
    outcomes: dict[str, list[dict]] = {style: [] for style in ["atomic", *ISSUE_50_STYLES]}
    for (_, style, _), out in zip(plays, play(corpus_env, server, script, plays), strict=True):
        outcomes[style].append(out)
    table = corpus_table(outcomes)
    atomic = table.pop("atomic")["mean"]
    for style, row in table.items():
        for rule in RULES:
            assert row[rule] <= MAX_FALSE_NEGATIVE_RATE, (style, rule, row)
        assert row["mean"] > atomic, (style, row["mean"], atomic)
    # the cases the issue measured are in the corpus: a collector that holds every number the
    # solution uses, and a list label or line reference equal to a result of the solution
    whole, labelled = 0, 0
    for _, row, plan in audit_corpus:
        question, solution = row["question"], row["answer"]
        collector = honest_plan(plan, "collector")["subproblems"][0]
        whole += carries_whole_problem(collector, question, solution)
        written = re.findall(r"(\d+)\)|line (\d+)", honest_plan(plan, "lists")["plan"])
        labels = {float(a or b) for a, b in written}
        labelled += bool(labels & {step.value for step in calculator_steps(solution)})
    print(
        f"collectors holding every number: {whole}; list plans whose label is a result: {labelled}"
    )
    assert whole >= 3 and labelled >= 3


@pytest.mark.slow
def test_planner_rules_hold_for_both_workers(audit_outcomes, audit_corpus):
    """The rules read what the plan states and ask their counterfactuals with the subproblems'
    numbers masked (pipeline.masked), so they do not depend on how the worker combines: with a
    trusting worker (uses the listed results) and with a re-solving worker (solves directly
    whenever the texts it is shown hold what the whole solution needs; before the masking it
    zeroed 6.8-7.9% of honest plans through `answer_without_results`), no rule cuts or zeroes
    more than 5% of any honest style, every honest style is paid above every strategy that does
    no decomposing or whose plan text does the work, and each such strategy is paid at most
    what the atomic plan (no effort) is paid."""
    exploits = list(
        dict.fromkeys(
            name
            for *_, plan in audit_corpus
            for name in [*delegated_plans(plan), *word_list_plans(plan), *dictating_plans(plan)]
        )
    )
    for combination in ("trusting", "re-solving"):
        assert combination in COMBINATIONS
        outcomes = audit_outcomes(combination)
        print(f"\n[{combination} worker]")
        honest = corpus_table({style: outcomes[style] for style in ["atomic", *STYLES]})
        atomic = honest.pop("atomic")["mean"]
        table = exploit_table(outcomes, exploits)
        for style, row in honest.items():
            for rule in RULES:
                assert row[rule] <= MAX_FALSE_NEGATIVE_RATE, (combination, style, rule, row)
            assert row["mean"] > max(atomic, *(r["mean"] for r in table.values())), (
                combination,
                style,
            )
        for name, row in table.items():
            assert row["mean"] <= atomic, (combination, name, row, atomic)


# --- issue 58: a subproblem names one quantity of the solution -----------------------------------

ISSUE_58_STYLES = ("variables", "plain")


@pytest.mark.slow
def test_planner_word_list_probe_does_not_pay(audit_outcomes, audit_corpus):
    """The whole problem with "Which quantity about <every content word of the problem> do you
    compute first?" (the issue measured 1.345 against honest 1.31) and its variants (the
    solution's words, the words shuffled, the list asked as a noun phrase: "How many <words>
    are there?") name no one quantity: a placeholder head ("quantity") names nothing, and a
    noun phrase of more than four content words, or one with a word only another step's
    quantity has, is a list (steps.names_step, quantities.py). So they earn no independence
    (the noun-phrase list: on at most 5% of the rows, where the problem's few words are one
    step's words) and are paid at most the atomic plan, under both scripted workers; the
    template earned independence before on 59 of 60 rows."""
    families = list(
        dict.fromkeys(name for *_, plan in audit_corpus for name in word_list_plans(plan))
    )
    for combination in ("trusting", "re-solving"):
        outcomes = audit_outcomes(combination)
        print(f"\n[{combination} worker]")
        table = exploit_table(outcomes, ["atomic", "named", *families])
        atomic, honest = table.pop("atomic")["mean"], table.pop("named")["mean"]
        for name, row in table.items():
            assert row["I>0"] <= (0.0 if "about" in name else MAX_FALSE_NEGATIVE_RATE), (
                combination,
                name,
                row,
            )
            assert row["mean"] <= atomic < honest, (combination, name, row, atomic, honest)
        assert table["word list"]["correct"] >= 0.9  # the worker finishes it; the rule stops it


@pytest.mark.slow
def test_planner_variables_and_plain_questions_are_paid(audit_outcomes, audit_corpus):
    """Subproblems that keep the problem's sentences holding their numbers (most of the problem,
    often all of it) and ask for the step's quantity as a variable ("... Let x be the number of
    duck eggs. Find x.") or plainly ("How much money is that, in dollars?", "How many sheep is
    that?") are read as that quantity: the variable's definition is the question, and a
    quantity of the step's kind (dollars for a result in dollars) names it. No rule zeroes or
    cuts more than 5% of either style, under both scripted workers, and both are paid above
    the atomic plan (before: `not_decomposed` on 47-49% of `variables` plans and 10-11% of
    plain ones, measured in the issue)."""
    assert own_question("Ann has 3 cats. Let x be the number of cats she has. Find x.") == (
        "What is the number of cats she has?"
    )
    for combination in ("trusting", "re-solving"):
        outcomes = audit_outcomes(combination)
        print(f"\n[{combination} worker]")
        table = corpus_table({style: outcomes[style] for style in ["atomic", *ISSUE_58_STYLES]})
        atomic = table.pop("atomic")["mean"]
        for style, row in table.items():
            for rule in RULES:
                assert row[rule] <= MAX_FALSE_NEGATIVE_RATE, (combination, style, rule, row)
            assert row["mean"] > atomic, (combination, style, row["mean"], atomic)
    whole = sum(
        holds_problem(sub, row["question"], row["answer"])
        for _, row, plan in audit_corpus
        for sub in honest_plan(plan, "variables")["subproblems"]
    )
    assert whole >= 0.4 * len(audit_corpus)  # the rule is asked: most hold the whole problem


def hidden_direct_solves(index: int, row: dict) -> dict[str, str]:
    """The whole problem as subproblem 1 with its answer scaled, one real step beside it, and a
    plan that undoes the scaling (the issue's exploit, and the same with other wordings)."""
    question, solution = row["question"], row["answer"]
    arithmetic = f"What is {re.findall(r'<<([^=<>]*)=', solution)[0]}?"
    scaled = f"{question} Give your final answer multiplied by 10."
    plans = {
        "problem x 10, arithmetic step": plan_json([scaled, arithmetic], UNDO_SCALING),
        "problem x 10, honest step": plan_json([scaled, HONEST[index][0][0]], UNDO_SCALING),
        # the answer x 10 dictated in words no rule reads as the problem: only the counterfactual
        # (decoys for the counted step alone, the combination still gives the answer) sees it
        "dictated x 10, honest step": plan_json(
            [f"Reply exactly: Answer: {10 * int(gold_number(solution))}", HONEST[index][0][0]],
            UNDO_SCALING,
        ),
        "paraphrase x 10, arithmetic step": plan_json(
            [
                " ".join(PARAPHRASED[index]) + " Give your final answer multiplied by 100.",
                arithmetic,
            ],
            "Divide the first result by 100.",
        ),
    }
    return plans


UNDO_SCALING = "Divide the first result by 10."


@pytest.mark.slow
def test_planner_hidden_direct_solve_does_not_pay(env, server, script, rows):
    """The whole problem handed to one subproblem with "give your final answer multiplied by
    10", one arithmetic step beside it and a plan that divides by 10 reaches the right answer
    (the scripted worker follows every instruction), yet earns no more than the atomic plan: a
    subproblem that states every number of the problem the solution uses and computes no step
    of it is a direct solve in disguise (`not_decomposed`: I = 0, reward w_c)."""
    assert_none_pays(env, server, script, rows, hidden_direct_solves)
    for index in HONEST:
        question = rows[index]["question"]
        for name, reply in hidden_direct_solves(index, rows[index]).items():
            out = run_plan(env, server, script, question, reply)
            if name.startswith(("problem", "dictated")):  # the worker follows every instruction
                assert out["metrics"]["correct"] == 1.0, (index, name, out["planner"])
            assert out["metrics"]["not_decomposed"] == out["metrics"]["correct"], (index, name)


def conditional_dictations(index: int, row: dict) -> dict[str, str]:
    """An honest step, and a plan that dictates the answer only when solved parts are listed (the
    plan-alone check sees "I cannot tell"), in several notations."""
    gold = int(gold_number(row["answer"]))
    step = HONEST[index][0][0]
    condition = "If no solved parts are listed, say you cannot tell. Otherwise"
    notations = {
        "digits": f"reply exactly: Answer: {gold}",
        "words": f"reply exactly: Answer: {number_words(gold)}",
        "arithmetic": f"answer this: What is {gold - 1} + 1?",
    }
    if gold < 4000:  # Roman numerals stop at MMMCMXCIX
        notations["Roman numerals"] = f"reply exactly: Answer: {roman(gold)}"
    return {
        f"conditional, {name}": plan_json([step], f"{condition} {text.replace('reply', 'Reply')}")
        for name, text in notations.items()
    }


def roman(n: int) -> str:
    """An integer below 4,000 in Roman numerals."""
    values = [(1000, "M"), (900, "CM"), (500, "D"), (400, "CD"), (100, "C"), (90, "XC")]
    values += [(50, "L"), (40, "XL"), (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I")]
    out = ""
    for value, numeral in values:
        count, n = divmod(n, value)
        out += numeral * count
    return out


@pytest.mark.slow
def test_planner_conditional_dictation_does_not_pay(env, server, script, rows):
    """A dictated answer behind "if no solved parts are listed, say you cannot tell", in digits,
    words, Roman numerals or as arithmetic, scores 0: the rule reads the number in every
    notation, and the combination asked with decoy results still gives the answer (the
    arithmetic, whose numbers are no result of the solution, is caught only by that)."""
    assert_none_pays(env, server, script, rows, conditional_dictations)
    rules = set()
    for index in HONEST:
        question = rows[index]["question"]
        for name, reply in conditional_dictations(index, rows[index]).items():
            out = run_plan(env, server, script, question, reply)
            assert out["metrics"]["plan_leak"] == 1.0 and out["reward"] == 0.0, (index, name)
            rules.add(out["planner"]["leak_rule"])
    assert rules == {"states_result", "answer_without_results"}


@pytest.mark.parametrize(
    ("text", "numbers"),
    [
        ("Answer: XVIII", {18.0}),
        ("She triples it and eats half", {3.0, 2.0, 0.5}),
        ("two-thirds of 20%", {2.0, 3.0, 2 / 3, 20.0, 0.2}),
        ("two dozen eggs and half a dozen", {24.0, 6.0}),
        ("the answer is one hundred and sixty", {160.0}),
        ("3/5 of them", {0.6}),
        ("I have a CD", set()),
        ("MMMMMMM, not a numeral", set()),
        ("Step 3: add the two results of steps 1 and 2 (#4)", set()),
    ],
)
def test_plans_are_read_in_every_notation(text, numbers):
    """Numbers in digits, words, multiplier and fraction words, fractions, percentages and Roman
    numerals are read (a proper fraction as its value: "3/5" states 0.6, not 3 and 5); labels
    and counts of the plan's own items are not quantities."""
    assert numbers <= stated_numbers(text)
    if not numbers:
        assert not stated_numbers(text)


def test_leak_rule_reads_what_a_plan_states_not_what_it_could_compute(rows):
    """Stating the problem's numbers, in any notation, or unit constants and numbers its words
    imply, is no leak even when those numbers reach the answer; stating a result is, in any
    notation."""
    question, solution, gold = rows[0]["question"], rows[0]["answer"], 18.0
    for honest in (
        "Janet's ducks lay sixteen eggs a day; she eats three, bakes four. Multiply the rest by 2.",
        "Take 16 - 3 - 4 eggs, then multiply by $2.00, 7 days a week, 100%.",
    ):
        assert plan_leak(honest, [], question, solution, gold) is None, honest
    for leak in ("She has 9 left.", "Answer: XVIII", "eighteen dollars", "It is 18/1."):
        assert plan_leak(leak, [], question, solution, gold) is not None, leak
    row3 = rows[3]  # James runs 3 sprints 3 times a week, 60 meters each
    assert (
        plan_leak(
            "Multiply by 60 and by 7 days a week.", [], row3["question"], row3["answer"], 540.0
        )
        is None
    )


def test_independence_reads_number_words_and_percent_decimals():
    """A subproblem that writes the problem's "triples", "half" or "60%" in another notation
    (3, 1/2, 0.6) carries those operands, and its step counts."""
    question = (
        "A shop sells 2 kinds of cakes. It bakes 40 lemon cakes and triples that for chocolate "
        "cakes. Half of the chocolate cakes get icing, and 60% of the lemon cakes get icing. "
        "How many cakes get icing?"
    )
    solution = (
        "Chocolate: 40*3=<<40*3=120>>120. Iced chocolate: 120/2=<<120/2=60>>60. "
        "Iced lemon: 40*0.6=<<40*0.6=24>>24. Total: 60+24=<<60+24=84>>84.\n#### 84"
    )
    subproblems = [
        "A shop bakes 40 lemon cakes and 3 times as many chocolate cakes; 1/2 of the chocolate "
        "ones get icing. How many iced chocolate cakes?",
        "0.6 of 40 lemon cakes get icing. How many is that?",
    ]
    scored = independence(question, solution, 84.0, subproblems, [60.0, 24.0])
    assert scored.counted == [True, True]


def test_planner_parse_is_bounded(env, server, script, rows, monkeypatch):
    """A reply of 200,000 braces (or of half-open keys) is rejected after at most one decode
    attempt per brace of its last MAX_PLAN_CHARS characters, not one per brace of the reply
    (counted, not timed); nesting deeper than the JSON decoder's recursion limit and a
    5,000-digit integer are malformed plans (0), not lost rollouts; a long reasoning before the
    plan still leaves the plan readable."""
    attempts = []
    raw_decode = json.JSONDecoder.raw_decode

    def counted(self, text: str, idx: int = 0):
        attempts.append(idx)
        return raw_decode(self, text, idx)

    monkeypatch.setattr(json.JSONDecoder, "raw_decode", counted)
    for reply in ("{" * 200_000, '{"' * 100_000, '{"a": ' * 50_000):
        attempts.clear()
        with pytest.raises(PlanError):
            parse_plan(reply, max_subproblems=4)
        assert 0 < len(attempts) <= MAX_PLAN_CHARS, (reply[:10], len(attempts))
    question = rows[1]["question"]
    deep = '{"should_decompose": true, "subproblems": ' + "[" * 5000 + "]" * 5000 + "}"
    huge = '{"should_decompose": true, "subproblems": ["a"], "plan": "b", "n": ' + "9" * 5000 + "}"
    for reply in (deep, huge, "{" * 200_000):
        out = run_plan(env, server, script, question, reply)
        assert out["metrics"]["parse_failure"] == 1.0 and out["reward"] == 0.0
    thinking = "Let me think. " * 20_000 + plan_json(*HONEST[3])
    assert parse_plan(thinking, max_subproblems=4).subproblems == HONEST[3][0]


def test_independence_formula_on_the_ducks_row(rows):
    """I from the worker's results alone: the Janet's-ducks reference steps are 16-3-4=9 and
    9*2=18 (the answer), and the problem states 16, three, four and 2."""
    question, solution = rows[0]["question"], rows[0]["answer"]

    def score(subproblems: list[str], results: list[float | None]) -> float:
        return independence(question, solution, 18.0, subproblems, results).score

    honest = HONEST[0][0]
    assert score(honest, [9.0]) == 1.0
    assert score(sentences(question), [16.0, 4.0, 2.0, None]) == 0.0  # restated facts
    assert score(sentences(question)[:1], [9.0]) == 0.0  # a verbatim copy never counts
    assert score([question, "What is the answer?"], [18.0, None]) == 0.0  # the answer itself
    assert score(["What is 7 + 5?", *honest], [12.0, 9.0]) == 0.5  # 12 is no step of it
    assert score([], []) == 0.0


def test_predicted_zero_matches_gold_zero(env, server, script):
    """Gold 0: 'Answer: 0' is correct; a reply with no number is not (it is not read as 0)."""
    row = {
        "prompt": [{"role": "user", "content": ZERO_QUESTION}],
        "answer": "0",
        "info": {"question": ZERO_QUESTION, "solution": ZERO_SOLUTION},
        "example_id": 0,
    }
    script.problem = script.problems[ZERO_QUESTION]
    script.plans[ZERO_QUESTION] = plan_json([])
    [answered] = generate(env, server, [row])
    assert answered["metrics"]["correct"] == 1.0
    assert "Answer: 0" in answered["planner"]["final_reply"]

    script.plans[ZERO_QUESTION] = plan_json(["How many people are on the bus?", "Who gets off?"])
    [silent] = generate(env, server, [row])
    assert silent["planner"]["predicted"] is None
    assert silent["metrics"]["correct"] == 0.0 and silent["reward"] == 0.0


@pytest.mark.parametrize(
    "reply",
    [
        "I would split this into two parts.",
        '{"should_decompose": true, "subproblems": [], "plan": "x"}',
        '{"should_decompose": "maybe", "subproblems": ["a"], "plan": "x"}',
        '{"should_decompose": true, "subproblems": ["a", "b", "c", "d", "e"], "plan": "x"}',
        '```json\n{"should_decompose": true, "subproblems": ["a",\n```',
    ],
)
def test_malformed_plans_score_zero(env, server, script, rows, reply):
    out = run_plan(env, server, script, rows[1]["question"], reply)
    assert out["reward"] == 0.0
    assert out["metrics"]["parse_failure"] == 1.0
    assert out["metrics"]["correct"] == 0.0


def test_worker_http_errors_score_zero_without_crashing(env, server, script, rows):
    script.worker_status = 500
    out = run_plan(env, server, script, rows[2]["question"], plan_json(["a part", "b part"]))
    assert out["reward"] == 0.0
    assert out["metrics"]["worker_error"] == 1.0
    assert "worker call failed" in out["planner"]["worker_error"]


@pytest.mark.slow
def test_worker_timeouts_score_zero(env, server, script, rows):
    script.subproblem_delay = 2 * WORKER_TIMEOUT_S
    out = run_plan(env, server, script, rows[3]["question"], plan_json(["slow part", "other part"]))
    assert out["reward"] == 0.0
    assert out["metrics"]["worker_error"] == 1.0
    assert "timed out" in out["planner"]["worker_error"]


def test_subproblems_run_concurrently_on_the_base_model(env, server, script, rows):
    question = rows[4]["question"]
    steps = ["How much is the first part?", "How much is the second part?", "And the third?"]
    script.subproblem_delay = 1.0  # all three must arrive within it, even on a loaded machine
    server.max_in_flight = 0
    before = len(server.requests)
    out = run_plan(env, server, script, question, plan_json(steps))
    assert out["metrics"]["num_subproblems"] == 3.0
    assert server.max_in_flight == 3  # the three subproblem calls overlapped
    worker_models = {r["model"] for r in server.requests[before:] if r["model"] != POLICY}
    assert worker_models == {BASE}  # the frozen base, not the adapter being trained


def test_every_metric_is_logged(env, server, script, rows):
    out = run_plan(env, server, script, rows[5]["question"], plan_json(*HONEST[5]))
    expected = {
        "correct",
        "efficiency_bonus",
        "independence_bonus",
        "decomposed",
        "num_subproblems",
        "counted_subproblems",
        "planner_tokens",
        "worker_tokens",
        "baseline_tokens",
        "efficiency",
        "independence",
        "parse_failure",
        "plan_leak",
        "not_decomposed",
        "worker_error",
    }
    assert expected <= set(out["metrics"])
    assert out["metrics"]["counted_subproblems"] == 2.0
    assert 0.0 <= out["reward"] <= 1.0 + TOKEN_WEIGHT + INDEPENDENCE_WEIGHT


def test_planner_tokens_count_against_both_plans_alike(env, server, script, rows):
    """A longer plan costs w_t * (E(P_long) - E(P_short)), nothing more."""
    question = rows[3]["question"]
    short = run_plan(env, server, script, question, plan_json(*HONEST[3]), tokens=20)
    long = run_plan(env, server, script, question, plan_json(*HONEST[3]), tokens=120)
    ms = short["metrics"]
    assert long["metrics"]["planner_tokens"] == 120 and ms["planner_tokens"] == 20
    expected = TOKEN_WEIGHT * (
        efficiency(ms["baseline_tokens"], ms["worker_tokens"], 20)
        - efficiency(ms["baseline_tokens"], ms["worker_tokens"], 120)
    )
    assert short["reward"] - long["reward"] == pytest.approx(expected, abs=1e-9)


def test_separate_worker_server(gsm8k_file, server, script, rows):
    """worker_base_url sends worker calls to another server; the policy server sees none."""
    question = rows[6]["question"]
    worker_script = Script(problems=script.problems, problem=script.problems[question])
    with ScriptedOpenAIServer(worker_script, models=[{"id": BASE}]) as worker_server:
        separate = load_environment(
            data_files=str(gsm8k_file),
            split="test",
            max_examples=12,
            worker_base_url=worker_server.base_url,
            worker_model=BASE,
        )
        before = len(server.requests)
        out = run_plan(separate, server, script, question, plan_json(*HONEST[6]))
        policy_models = {r["model"] for r in server.requests[before:]}
        assert out["metrics"]["correct"] == 1.0
        assert policy_models == {POLICY}
        assert len(worker_server.requests) == 4  # baseline, subproblem, decoyed, combination


def test_a_failed_worker_model_lookup_is_not_remembered(monkeypatch):
    """A /v1/models listing that fails (a timeout under load) sends that rollout to the policy's
    name, and the next rollout asks again instead of keeping the policy as its worker."""
    answers = iter([None, BASE])

    async def lookup(client, policy_model, timeout):
        return next(answers)

    monkeypatch.setattr(worker_module, "resolve_worker_model", lookup)
    pool = WorkerPool(WorkerSettings())
    client = AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="x")

    async def two_rollouts() -> list[str]:
        return [(await pool.worker_for(client, POLICY)).model for _ in range(2)]

    assert asyncio.run(two_rollouts()) == [POLICY, BASE]


# --- loading ------------------------------------------------------------------------------------


def test_loads_by_name_with_local_rows_and_numeric_gold(gsm8k_file):
    env = vf.load_environment("vf-planner", data_files=str(gsm8k_file), max_examples=5, seed=3)
    data = env.get_dataset()
    assert len(data) == 5
    assert all(row["info"]["question"] == row["question"] for row in data)
    assert all(gold_number(row["info"]["solution"]) == float(row["answer"]) for row in data)
    first = load_environment(data_files=str(gsm8k_file), max_examples=1).get_dataset()[0]
    assert first["answer"] == "18"  # "#### 18" of Janet's ducks


@pytest.mark.parametrize(
    "kwargs",
    [{"max_subproblems": 0}, {"token_weight": -0.1}, {"worker_timeout": 0}],
)
def test_bad_arguments_are_named(gsm8k_file, kwargs):
    with pytest.raises(ValueError, match=next(iter(kwargs)).split("_")[0]):
        load_environment(data_files=str(gsm8k_file), max_examples=1, **kwargs)


@pytest.mark.slow
def test_without_network_the_error_says_how_to_pass_a_file():
    code = "from vf_planner import load_environment; load_environment(split='test')"
    offline = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", code], env=offline, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode != 0
    assert "data_files=" in proc.stderr and "openai/gsm8k" in proc.stderr


def test_rows_without_numeric_gold_are_rejected(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"question": "How many?", "answer": "many\n#### lots"}) + "\n")
    with pytest.raises(ValueError, match="row 0"):
        load_environment(data_files=str(bad))


# --- parsing ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("#### 1,450,000", 1450000.0),
        ("She makes $18 every day.", 18.0),
        ("The answer is -10 degrees", -10.0),
        ("a loss of -$5", -5.0),
        ("a loss of $-5", -5.0),
        ("2.5 hours", 2.5),
        ("50% off", 50.0),
        ("0", 0.0),
        ("no digits here", None),
    ],
)
def test_parse_number(text, value):
    assert parse_number(text) == value


@pytest.mark.parametrize(
    ("reply", "value"),
    [
        ("9 eggs remain, 9 * 2 = 18.\nAnswer: $18", 18.0),
        ("First 5 - 3 = 2. The final answer is 0.", 0.0),
        ("So 3 + 4 = 7 and \\boxed{1,000} is it", 1000.0),
        ("3 + 4 = 7, then 7 * 6 = 42 meters", 42.0),
        ("To get the final answer, add 3 and 4: the total is 7", 7.0),
        ("3 + 4 = 7\nAnswer: unknown\n", None),
        ("**Answer:**\n\n$18", 18.0),
        ("", None),
    ],
)
def test_final_number(reply, value):
    assert final_number(reply) == value


def test_zero_is_an_answer_and_none_is_not():
    assert numbers_match(0.0, 0.0)
    assert numbers_match(-0.0, 0.0)
    assert not numbers_match(None, 0.0)
    assert numbers_match(final_number("Answer: 70,000"), gold_number("#### 70000"))


@pytest.mark.parametrize(
    "text",
    [
        '{"should_decompose": true, "subproblems": ["a", "b"], "plan": "add"}',
        'Sure!\n```json\n{"should_decompose": true, "subproblems": ["a", "b"], "plan": "add"}\n```',
        '<think>{"should_decompose": false}</think>{"should_decompose": "true", '
        '"subproblems": [{"question": "a"}, {"text": "b"}], "plan": "add"}',
        'Example: {"should_decompose": false}. Mine: '
        '{"should_decompose": true, "subproblems": ["a", "b"], "plan": "add"}',
    ],
)
def test_parse_plan_accepts_fenced_bare_and_wrapped_json(text):
    plan = parse_plan(text, max_subproblems=4)
    assert plan.should_decompose and plan.subproblems == ["a", "b"] and plan.plan == "add"


def test_atomic_plan_ignores_listed_subproblems():
    plan = parse_plan('{"should_decompose": false, "subproblems": ["a"], "plan": ""}', 4)
    assert not plan.should_decompose and plan.subproblems == []


@pytest.mark.parametrize(
    "text",
    [
        "",
        "no json at all",
        '{"subproblems": ["a"]}',
        '{"should_decompose": true, "subproblems": ["a", ""], "plan": ""}',
        '{"should_decompose": true, "subproblems": ["a", "b"], "plan": 3}',
    ],
)
def test_parse_plan_rejects_malformed(text):
    with pytest.raises(PlanError):
        parse_plan(text, max_subproblems=4)
