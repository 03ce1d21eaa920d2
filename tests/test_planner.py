"""vf_planner: a scripted planner and worker (a real OpenAI-compatible HTTP server on 127.0.0.1)
on real GSM8K test rows, driven through env.generate, plus the parsing pieces on their own."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import verifiers as vf
from openai import AsyncOpenAI
from vf_planner import load_environment, parse_plan
from vf_planner.answers import final_number, gold_number, numbers_match, parse_number
from vf_planner.plan import PlanError
from vf_planner.prompts import WORKER_COMBINE_SYSTEM, WORKER_DIRECT_SYSTEM
from vf_planner.rubric import efficiency
from vf_planner.scripted_server import ScriptedOpenAIServer, ScriptedReply

POLICY = "planner-lora"  # served as a LoRA adapter of BASE, as vLLM lists it
BASE = "base-model"
TOKEN_WEIGHT, INDEPENDENCE_WEIGHT = 0.2, 0.3
# The GSM8K test split has no row whose gold answer is 0, so the zero case uses this written one.
ZERO_QUESTION = (
    "A bus starts empty. 5 people get on at the first stop and the same 5 get off at the second "
    "stop. How many people are on the bus after the second stop?"
)

# Janet's ducks (row 0 of the GSM8K test split): a sensible 2-step decomposition.
DUCK_STEPS = [
    "How many eggs does Janet have left each day after eating 3 and baking with 4 of her 16 eggs?",
    "How many dollars does Janet make per day selling her remaining eggs at $2 each?",
]


def plan_json(subproblems: list[str], plan: str = "Multiply the results.") -> str:
    decision = {"should_decompose": bool(subproblems), "subproblems": subproblems, "plan": plan}
    return json.dumps(decision)


@dataclass
class Script:
    """Plays the planner (model POLICY) and the worker (model BASE).

    The worker is always right unless a subproblem listed in `misleading` reaches the combination
    step (then it answers gold + 1). A direct solve spends `direct_tokens`; each subproblem and the
    combination spend `step_tokens`, so a 2-step plan costs the worker exactly what a direct solve
    costs (90 = 30 + 30 + 30).
    """

    gold: dict[str, float]
    plans: dict[str, str] = field(default_factory=dict)
    planner_tokens: dict[str, int] = field(default_factory=dict)
    misleading: set[str] = field(default_factory=set)
    direct_tokens: int = 90
    step_tokens: int = 30
    worker_status: int = 200
    subproblem_delay: float = 0.0
    unanswerable: set[str] = field(default_factory=set)

    def __call__(self, model: str, messages: list[dict]) -> ScriptedReply:
        user = messages[-1]["content"]
        if model == POLICY:
            return ScriptedReply(self.plans[user], self.planner_tokens.get(user, 40))
        if model != BASE:
            return ScriptedReply(f"model {model!r} not served", 0, status=404)
        if self.worker_status != 200:
            return ScriptedReply("worker down", 0, status=self.worker_status)
        question = next(q for q in self.gold if q in user)
        gold = self.gold[question]
        answer = "I cannot tell." if question in self.unanswerable else f"Answer: {gold:g}"
        system = messages[0]["content"]
        if system == WORKER_DIRECT_SYSTEM:
            return ScriptedReply(f"Working it out.\n{answer}", self.direct_tokens)
        if system == WORKER_COMBINE_SYSTEM:
            if any(sub in user for sub in self.misleading):
                return ScriptedReply(f"Answer: {gold + 1:g}", self.step_tokens)
            return ScriptedReply(answer, self.step_tokens)
        return ScriptedReply("Answer: 7", self.step_tokens, delay=self.subproblem_delay)


@pytest.fixture(scope="module")
def gsm8k_file(shared_data: Path) -> Path:
    return shared_data / "gsm8k" / "test.jsonl"


@pytest.fixture(scope="module")
def rows(gsm8k_file: Path) -> list[dict]:
    with gsm8k_file.open() as f:
        return [json.loads(line) for _, line in zip(range(12), f, strict=False)]


@pytest.fixture(scope="module")
def script(rows: list[dict]) -> Script:
    gold = {row["question"]: gold_number(row["answer"]) for row in rows}
    gold[ZERO_QUESTION] = 0.0
    return Script(gold=gold)


@pytest.fixture(scope="module")
def server(script: Script):
    models = [{"id": BASE}, {"id": POLICY, "parent": BASE}]
    with ScriptedOpenAIServer(script, models=models) as srv:
        yield srv


@pytest.fixture(scope="module")
def env(gsm8k_file: Path) -> vf.Environment:
    return load_environment(
        data_files=str(gsm8k_file),
        split="test",
        max_examples=12,
        token_weight=TOKEN_WEIGHT,
        independence_weight=INDEPENDENCE_WEIGHT,
        worker_timeout=2.0,
    )


@pytest.fixture(autouse=True)
def fresh_script(script: Script):
    """Each test starts from an always-right worker with default token spend."""
    yield
    script.plans.clear()
    script.planner_tokens.clear()
    script.misleading.clear()
    script.unanswerable.clear()
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


def run_plan(env, server, script, question: str, reply: str, tokens: int = 40) -> dict:
    script.plans[question] = reply
    script.planner_tokens[question] = tokens
    return generate(env, server, rollout_inputs(env, [question]))[0]


# --- end to end through env.generate -----------------------------------------------------------


def test_correct_plans_score_higher_than_wrong(env, server, script, rows):
    duck = rows[0]["question"]
    right = run_plan(env, server, script, duck, plan_json(DUCK_STEPS))
    script.misleading.add("How many eggs does Janet eat in a week?")
    wrong_steps = [DUCK_STEPS[0], "How many eggs does Janet eat in a week?"]
    wrong = run_plan(env, server, script, duck, plan_json(wrong_steps))

    assert right["metrics"]["correct"] == 1.0 and wrong["metrics"]["correct"] == 0.0
    assert right["reward"] > 1.0  # correctness plus bonuses
    assert wrong["reward"] == 0.0  # bonuses are only paid for correct answers
    assert right["planner"]["subproblems"] == DUCK_STEPS


def test_atomic_and_decomposed_differ_only_by_documented_independence(env, server, script, rows):
    """Always-right worker, same worker and planner tokens: the only difference is w_i * I."""
    duck = rows[0]["question"]
    decomposed = run_plan(env, server, script, duck, plan_json(DUCK_STEPS), tokens=40)
    atomic = run_plan(env, server, script, duck, plan_json([]), tokens=40)
    md, ma = decomposed["metrics"], atomic["metrics"]

    assert md["decomposed"] == 1.0 and ma["decomposed"] == 0.0
    assert md["correct"] == ma["correct"] == 1.0
    assert md["worker_tokens"] == ma["worker_tokens"] == md["baseline_tokens"] == 90
    assert md["efficiency_bonus"] == ma["efficiency_bonus"] == pytest.approx(90 / (90 + 90 + 40))
    assert ma["independence"] == ma["independence_bonus"] == 0.0  # no free independence
    assert 0.0 < md["independence_bonus"] == md["independence"] <= 1.0
    assert md["relevance"] >= 0.3
    gap = decomposed["reward"] - atomic["reward"]
    assert gap == pytest.approx(INDEPENDENCE_WEIGHT * md["independence"], abs=1e-9)


def test_planner_tokens_count_against_both_plans_alike(env, server, script, rows):
    """A longer plan costs w_t * (E_d - E_a) with E = B / (B + W + P), nothing more."""
    duck = rows[0]["question"]
    decomposed = run_plan(env, server, script, duck, plan_json(DUCK_STEPS), tokens=120)
    atomic = run_plan(env, server, script, duck, plan_json([]), tokens=20)
    md = decomposed["metrics"]
    expected = TOKEN_WEIGHT * (efficiency(90, 90, 120) - efficiency(90, 90, 20))
    expected += INDEPENDENCE_WEIGHT * md["independence"]
    assert md["planner_tokens"] == 120 and atomic["metrics"]["planner_tokens"] == 20
    assert decomposed["reward"] - atomic["reward"] == pytest.approx(expected, abs=1e-9)


def test_filler_subproblems_earn_no_independence(env, server, script, rows):
    """Padding a plan with an unrelated question raises raw independence but not the reward."""
    duck = rows[0]["question"]
    filler = run_plan(
        env, server, script, duck, plan_json([DUCK_STEPS[0], "What is the capital of France?"])
    )
    atomic = run_plan(env, server, script, duck, plan_json([]))
    mf = filler["metrics"]
    assert mf["correct"] == 1.0 and mf["independence"] > 0.5 and mf["relevance"] < 0.3
    assert mf["independence_bonus"] == 0.0
    assert filler["reward"] == pytest.approx(atomic["reward"])


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


def test_predicted_zero_matches_gold_zero(env, server, script):
    """Gold 0: 'Answer: 0' is correct; a reply with no number is not (it is not read as 0)."""
    row = {
        "prompt": [{"role": "user", "content": ZERO_QUESTION}],
        "answer": "0",
        "info": {"question": ZERO_QUESTION},
        "example_id": 0,
    }
    script.plans[ZERO_QUESTION] = plan_json([])
    [answered] = generate(env, server, [row])
    assert answered["metrics"]["correct"] == 1.0
    assert "Answer: 0" in answered["planner"]["final_reply"]

    script.unanswerable.add(ZERO_QUESTION)
    script.plans[ZERO_QUESTION] = plan_json(["How many people are on the bus?", "Who gets off?"])
    [silent] = generate(env, server, [row])
    assert silent["planner"]["predicted"] is None
    assert silent["metrics"]["correct"] == 0.0 and silent["reward"] == 0.0


def test_worker_http_errors_score_zero_without_crashing(env, server, script, rows):
    script.worker_status = 500
    out = run_plan(env, server, script, rows[2]["question"], plan_json(["a part", "b part"]))
    assert out["reward"] == 0.0
    assert out["metrics"]["worker_error"] == 1.0
    assert "worker call failed" in out["planner"]["worker_error"]


def test_worker_timeouts_score_zero(env, server, script, rows):
    script.subproblem_delay = 5.0  # above worker_timeout=2.0
    out = run_plan(env, server, script, rows[3]["question"], plan_json(["slow part", "other part"]))
    assert out["reward"] == 0.0
    assert out["metrics"]["worker_error"] == 1.0
    assert "timed out" in out["planner"]["worker_error"]


def test_subproblems_run_concurrently_on_the_base_model(env, server, script, rows):
    question = rows[4]["question"]
    steps = ["How much is the first part?", "How much is the second part?", "And the third?"]
    script.subproblem_delay = 0.3
    server.max_in_flight = 0
    before = len(server.requests)
    out = run_plan(env, server, script, question, plan_json(steps))
    assert out["metrics"]["num_subproblems"] == 3.0
    assert server.max_in_flight == 3  # the three subproblem calls overlapped
    worker_models = {r["model"] for r in server.requests[before:] if r["model"] != POLICY}
    assert worker_models == {BASE}  # the frozen base, not the adapter being trained


def test_every_metric_is_logged(env, server, script, rows):
    out = run_plan(env, server, script, rows[5]["question"], plan_json(["Part one?", "Part two?"]))
    expected = {
        "correct",
        "efficiency_bonus",
        "independence_bonus",
        "decomposed",
        "num_subproblems",
        "planner_tokens",
        "worker_tokens",
        "baseline_tokens",
        "efficiency",
        "independence",
        "relevance",
        "parse_failure",
        "worker_error",
    }
    assert expected <= set(out["metrics"])
    assert 0.0 <= out["reward"] <= 1.0 + TOKEN_WEIGHT + INDEPENDENCE_WEIGHT


def test_separate_worker_server(gsm8k_file, server, script, rows):
    """worker_base_url sends worker calls to another server; the policy server sees none."""
    worker_script = Script(gold=script.gold)
    with ScriptedOpenAIServer(worker_script, models=[{"id": BASE}]) as worker_server:
        separate = load_environment(
            data_files=str(gsm8k_file),
            split="test",
            max_examples=12,
            worker_base_url=worker_server.base_url,
            worker_model=BASE,
        )
        before = len(server.requests)
        out = run_plan(separate, server, script, rows[6]["question"], plan_json(DUCK_STEPS))
        policy_models = {r["model"] for r in server.requests[before:]}
        assert out["metrics"]["correct"] == 1.0
        assert policy_models == {POLICY}
        assert len(worker_server.requests) == 4  # baseline, two subproblems, combination


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
    [{"max_subproblems": 0}, {"token_weight": -0.1}, {"min_relevance": 2.0}, {"worker_timeout": 0}],
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
