"""vf_planner: a scripted planner and worker (a real OpenAI-compatible HTTP server on 127.0.0.1)
on real GSM8K test rows, driven through env.generate, plus the parsing pieces on their own.

The scripted worker answers only from what its prompt contains: its facts are the numbers written
in the prompt, its skill is the problem's reference calculation (GSM8K's `<<a*b=c>>` steps), and a
step is done only when every number it needs is a fact or an earlier result. So whether a plan's
subproblems and combination can reach the answer depends on what the plan passed on.
"""

from __future__ import annotations

import asyncio
import json
import operator
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import verifiers as vf
from openai import AsyncOpenAI
from vf_planner import independence, load_environment, parse_plan
from vf_planner.answers import (
    among,
    calculator_steps,
    final_number,
    format_number,
    gold_number,
    numbers_match,
    parse_number,
    stated_numbers,
)
from vf_planner.plan import PlanError
from vf_planner.prompts import WORKER_COMBINE_SYSTEM, WORKER_DIRECT_SYSTEM
from vf_planner.rubric import efficiency
from vf_planner.scripted_server import ScriptedOpenAIServer, ScriptedReply
from vf_planner.worker import estimate_tokens

POLICY = "planner-lora"  # served as a LoRA adapter of BASE, as vLLM lists it
BASE = "base-model"
TOKEN_WEIGHT, INDEPENDENCE_WEIGHT = 0.2, 0.3
CANNOT_TELL = "I cannot tell from what I was given."
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


@dataclass(frozen=True)
class Problem:
    question: str
    solution: str

    @property
    def gold(self) -> float:
        return gold_number(self.solution)


UNIT_CONSTANTS = (0.01, 1.0, 100.0)  # percent conversions anyone knows
IMPLIED = {"every second": 2.0, "every other": 2.0}  # numbers said in words stated_numbers skips


def facts_in(prompt: str) -> set[float]:
    """The numbers a prompt gives the worker."""
    implied = {value for words, value in IMPLIED.items() if words in prompt.lower()}
    return stated_numbers(prompt) | implied


def needed(operand: float, problem: Problem) -> float | None:
    """The fact a calculation operand must come from: the number itself (stated, an earlier
    result, or implied by words such as "every second"), a percentage as written (150 for the
    1.5 of "150%"), or None for a unit constant."""
    if among(operand * 100, stated_numbers(problem.question)):
        return operand * 100
    if among(operand, UNIT_CONSTANTS) and not among(operand, stated_numbers(problem.question)):
        return None
    return operand


def derive(facts: set[float], problem: Problem) -> list[float]:
    """The reference steps that can be done from `facts`, repeated until nothing new follows."""
    steps = calculator_steps(problem.solution)
    known, done = set(facts), set()
    progress = True
    while progress:
        progress = False
        for i, step in enumerate(steps):
            needs = [needed(op, problem) for op in step.operands]
            if i not in done and all(n is None or among(n, known) for n in needs):
                done.add(i)
                known.add(step.value)
                progress = True
    return [steps[i].value for i in sorted(done)]


REPLY_EXACTLY = re.compile(r"Reply exactly: (?P<line>.+)")
ARITHMETIC = re.compile(r"What is (?P<expression>[\d.]+(?:\s*[-+*/]\s*[\d.]+)+)\s*\?")
OPERATORS = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv}


def evaluate(expression: str) -> float:
    """A bare arithmetic expression, left to right ("8 + 1", "9 * 2", "200000 - 130000")."""
    tokens = re.findall(r"[\d.]+|[-+*/]", expression)
    value = float(tokens[0])
    for op, operand in zip(tokens[1::2], tokens[2::2], strict=True):
        value = OPERATORS[op](value, float(operand))
    return value


def obey(told: re.Match[str]) -> str:
    """The reply of a worker that does what its prompt tells it."""
    if "line" in told.groupdict():
        return told.group("line").strip()
    return f"Answer: {format_number(evaluate(told.group('expression')))}"


@dataclass
class Script:
    """Plays the planner (model POLICY) and the worker (model BASE).

    The planner replies with `plans[question]`. The worker knows which problem is being rolled out
    (`problem`) but uses nothing of it except its reference steps: facts come from its prompt. A
    direct solve or a combination answers the gold number when the steps reach it or its prompt
    states it (a worker told the answer repeats it), a subproblem answers its deepest result (or
    restates a number it was given); otherwise it says it cannot tell. Like any instruction
    follower it also repeats a line it is told to reply with ("Reply exactly: ...") and works out
    a bare arithmetic question ("What is 3 * 3?"). Each call spends 20 tokens plus 20 per step it
    works out.
    """

    problems: dict[str, Problem]
    problem: Problem | None = None
    plans: dict[str, str] = field(default_factory=dict)
    planner_tokens: dict[str, int] = field(default_factory=dict)
    worker_status: int = 200
    subproblem_delay: float = 0.0

    def __call__(self, model: str, messages: list[dict]) -> ScriptedReply:
        user = messages[-1]["content"]
        if model == POLICY:
            plan = self.plans[user]
            return ScriptedReply(plan, self.planner_tokens.get(user, estimate_tokens(plan)))
        if model != BASE:
            return ScriptedReply(f"model {model!r} not served", 0, status=404)
        if self.worker_status != 200:
            return ScriptedReply("worker down", 0, status=self.worker_status)
        instructions = user.partition("\n\nSolved parts:")[0]  # a combination: its plan
        told = REPLY_EXACTLY.search(instructions) or ARITHMETIC.search(instructions)
        if told:
            return ScriptedReply(obey(told), 20)
        facts = facts_in(user)
        steps = derive(facts, self.problem)
        tokens = 20 + 20 * len(steps)
        if messages[0]["content"] in (WORKER_DIRECT_SYSTEM, WORKER_COMBINE_SYSTEM):
            done = among(self.problem.gold, steps) or among(self.problem.gold, facts)
            reply = f"Answer: {format_number(self.problem.gold)}" if done else CANNOT_TELL
            return ScriptedReply(reply, tokens)
        result = steps[-1] if steps else max(facts, default=None)
        reply = CANNOT_TELL if result is None else f"Answer: {format_number(result)}"
        return ScriptedReply(reply, tokens, delay=self.subproblem_delay)


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


@pytest.fixture(scope="module")
def env(gsm8k_file: Path) -> vf.Environment:
    return load_environment(
        data_files=str(gsm8k_file),
        split="test",
        max_examples=12,
        token_weight=TOKEN_WEIGHT,
        independence_weight=INDEPENDENCE_WEIGHT,
        worker_timeout=WORKER_TIMEOUT_S,
    )


@pytest.fixture(autouse=True)
def fresh_script(script: Script):
    """Each test starts from a worker that answers at once with default token spend."""
    yield
    script.plans.clear()
    script.planner_tokens.clear()
    script.problem = None
    script.worker_status = 200
    script.subproblem_delay = 0.0


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
    script.plans[question] = reply
    if tokens is not None:
        script.planner_tokens[question] = tokens
    return generate(env, server, rollout_inputs(env, [question]))[0]


# --- honest decompositions against degenerate plans --------------------------------------------


def test_honest_decompositions_outscore_degenerate_plans(env, server, script, rows):
    """On five GSM8K problems every honest decomposition scores above each degenerate plan the
    issue measured (copied sentences, [problem, "What is the answer?"], paraphrased sentences)
    and above the atomic plan. Copies and restatements earn no independence; a paraphrased
    sentence earns it only where it holds a whole step of the solution and the worker does that
    step (row 3: "Three times a week James runs 3 sprints." -> 9), i.e. where it is a real
    subproblem, so such plans get a fraction of it. Run with -s for the table of numbers."""
    table = []
    for index, (subproblems, plan) in HONEST.items():
        question = rows[index]["question"]
        honest = run_plan(env, server, script, question, plan_json(subproblems, plan))
        assert honest["metrics"]["correct"] == 1.0, (index, honest["planner"])
        assert honest["metrics"]["independence"] == 1.0, (index, honest["planner"])
        table.append((index, "honest", honest))
        for name, reply in degenerate_plans(index, question).items():
            out = run_plan(env, server, script, question, reply)
            if name == "[problem, 'What is the answer?']":  # one subproblem is the whole problem
                assert out["metrics"]["plan_leak"] == 1.0 and out["reward"] == 0.0, index
                table.append((index, name, out))
                continue
            assert out["metrics"]["correct"] == 1.0, (index, name, out["planner"])
            if name == "paraphrased sentences":  # counts only a sentence that is a whole step
                assert out["metrics"]["independence"] < 0.5, (index, out["planner"])
            else:
                assert out["metrics"]["independence"] == 0.0, (index, name, out["planner"])
            assert out["reward"] < honest["reward"], (index, name)
            table.append((index, name, out))
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
    the results, and is also asked with the plan alone (the check that the plan does not carry
    the answer); the problem reaches the worker only in the direct solve (the baseline)."""
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
    alone, combination = sorted(users[WORKER_COMBINE_SYSTEM], key=len)
    assert alone == f"Plan: {plan}\n\nSolved parts:\n"
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

ONES = "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
ONES += "fifteen sixteen seventeen eighteen nineteen"
TENS = "x x twenty thirty forty fifty sixty seventy eighty ninety"


def number_words(n: int) -> str:
    """An integer below a million in words ("seventy thousand", "two hundred sixty")."""
    if n >= 1000:
        rest = f" {number_words(n % 1000)}" if n % 1000 else ""
        return f"{number_words(n // 1000)} thousand{rest}"
    if n >= 100:
        rest = f" {number_words(n % 100)}" if n % 100 else ""
        return f"{ONES.split()[n // 100]} hundred{rest}"
    if n >= 20:
        return TENS.split()[n // 10] + (f"-{ONES.split()[n % 10]}" if n % 10 else "")
    return ONES.split()[n]


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
    if index == 0:  # the measured plan
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


def test_planner_dictated_answer_does_not_pay(env, server, script, rows):
    """A planner that solved the problem itself and dictates the answer to the combination step
    (in digits, words, other phrasing or as arithmetic), or splits the answer's computation into
    bare arithmetic of its own numbers, earns no more than solving directly: a plan that states
    a result of the solution, or whose text alone gives the answer, scores 0, and a subproblem
    counts only when it carries the problem's own operands of the step it computes."""
    assert_none_pays(env, server, script, rows, dictated_plans)


def test_planner_problem_in_plan_does_not_pay(env, server, script, rows):
    """The problem handed to the combination step through `plan` (verbatim, paraphrased, with
    its numbers spelled out, beside honest subproblems or a trivial one) earns no more than
    solving directly: a plan whose numbers alone reach the answer scores 0."""
    assert_none_pays(
        env,
        server,
        script,
        rows,
        lambda index, row: pasted_plans(index, row["question"], row["answer"]),
    )


def test_planner_parse_is_bounded(env, server, script, rows):
    """A reply of 200,000 braces (or of half-open keys) is rejected in well under a second, not
    after one decode attempt per brace; nesting deeper than the JSON decoder's recursion limit
    and a 5,000-digit integer are malformed plans (0), not lost rollouts; a long reasoning
    before the plan still leaves the plan readable."""
    for reply in ("{" * 200_000, '{"' * 100_000, '{"a": ' * 50_000):
        start = time.perf_counter()
        with pytest.raises(PlanError):
            parse_plan(reply, max_subproblems=4)
        assert time.perf_counter() - start < 1.0, reply[:10]
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
        assert len(worker_server.requests) == 4  # baseline, subproblem, plan alone, combination


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
