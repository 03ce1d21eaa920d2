"""A scripted planner and frozen worker for vf_planner tests, served by ScriptedOpenAIServer.

The scripted worker answers only from what its prompt contains: its facts are the numbers the
prompt gives (in any notation the environment reads: digits, words, fractions, percentages, and
the constants its words imply, such as the 7 of "a week"), its skill is the problem's reference
calculation (GSM8K's `<<a*b=c>>` steps), and a step is done only when every number it needs is a
fact or an earlier result. So whether a plan's subproblems and combination reach the answer
depends on what the plan passed on.

Like an instruction-following model it answers the question it is asked: of the steps it can do,
a subproblem answers the one whose line in the reference solution best matches the words of
its question (the deepest one when no line does), and the problem's own question with the
answer. By default a combination reads the plan and the results it is shown, not the
subproblems' texts (the results are what the subproblems were for; other ways below). It also
does what it is told: repeats a line it is told to reply with (numbers in digits: "Answer:
XVIII" is repeated as "Answer: 18"),
works out bare arithmetic ("What is 3 * 3?"), multiplies its answer when told to ("give your
final answer multiplied by 10"), divides or multiplies a listed result when the plan says so,
and says it cannot tell when the plan tells it to for a prompt without solved parts. Asked to
"collect the given fact", it restates the number its prompt gives for it; asked for "the first
quantity you need to compute" (second, ..., "the value before the final step"), it gives the
step it computes first (second, ..., the last before the answer's).

How it combines is `Script.combination` (COMBINATIONS): "plan" (the default) reads the plan and
the listed results; "trusting" also reads the facts the parts' texts give, and uses the listed
results for the steps the parts asked for; "re-solving" solves the problem directly whenever
the texts it is shown hold the problem (every number its solution uses and half of its wording,
steps.pastes_problem; the results ignored), else trusts.
"""

from __future__ import annotations

import ast
import json
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property

from vf_planner.answers import (
    CalculatorStep,
    among,
    calculator_steps,
    final_number,
    format_number,
    gold_number,
    parse_number,
)
from vf_planner.notation import given_numbers, mask_numbers, roman_value, stated_numbers
from vf_planner.prompts import WORKER_COMBINE_SYSTEM, WORKER_DIRECT_SYSTEM
from vf_planner.scripted_server import ScriptedReply
from vf_planner.steps import pastes_problem
from vf_planner.worker import estimate_tokens

POLICY = "planner-lora"  # served as a LoRA adapter of BASE, as vLLM lists it
BASE = "base-model"
CANNOT_TELL = "I cannot tell from what I was given."
_ANNOTATION = re.compile(r"<<([^<>=]*)=([^<>]*)>>")
REPLY_EXACTLY = re.compile(r"Reply exactly: (?P<line>.+)")
ARITHMETIC = re.compile(r"What is (?P<expression>[\d.()\s]+(?:[-+*/][\d.()\s]+)+)\?")
SCALED = re.compile(r"multipl\w* by (?P<by>\d+)", re.IGNORECASE)
RESULT_OPERATION = re.compile(
    r"(?P<op>multiply|divide) the (?P<nth>first|second|third|fourth) result by (?P<by>\d+)",
    re.IGNORECASE,
)
WITHOUT_PARTS = re.compile(r"if no solved parts are listed", re.IGNORECASE)
RESTATE = re.compile(r"\bgiven fact\b", re.IGNORECASE)
PROBE = re.compile(
    r"\b(?P<nth>first|second|third|fourth) (?:quantity|number)\b|(?P<last>before the final step)"
    r"|\bwork out (?P<first>first)\b",
    re.IGNORECASE,
)
"""A question that leaves the step to the worker: the quantity it computes first, second, ...,
or the value before the final step."""
COMBINATIONS = ("plan", "trusting", "re-solving")
"""How the scripted worker combines (`Script.combination`): from the plan and the listed results
only; also from the facts the parts' texts give, trusting the listed results for the steps the
parts asked for; or solving the problem directly whenever the texts it is shown (plan and
parts, not the results) hold the problem, else trusting."""
_ORDINALS = ("first", "second", "third", "fourth")
_OPERATORS: dict[type, Callable[[float, float], float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}
_ROMAN_TOKEN = re.compile(r"\b[MDCLXVI]{2,}\b")
_STOPWORDS = {"what", "much", "many", "does", "value", "that", "this", "with", "from", "have"}
_STOPWORDS |= {"number", "amount"}  # "the number of rubies" asks for rubies


@dataclass(frozen=True)
class Problem:
    """A row as the scripted worker knows it; derived readings are computed once."""

    question: str
    solution: str

    @property
    def gold(self) -> float:
        return gold_number(self.solution)

    @cached_property
    def lines(self) -> list[str]:
        """The solution line of each calculator step, in the order of calculator_steps."""
        return [
            line
            for line in self.solution.splitlines()
            for _, result in _ANNOTATION.findall(line)
            if parse_number(result) is not None
        ]

    @cached_property
    def steps(self) -> list[CalculatorStep]:
        return calculator_steps(self.solution)

    @cached_property
    def given(self) -> set[float]:
        return given_numbers(self.question)

    def facts(self, text: str) -> set[float]:
        """The numbers a prompt gives: those it states, and the constants its words imply
        unless a step computes that number (a worker reading "years" knows 12 months, and does
        not take 12 for the 12 years a step computes)."""
        stated = stated_numbers(text)
        results = [step.value for step in self.steps]
        every = given_numbers(text)
        return {n for n in every if among(n, stated) or not among(n, results)}

    @cached_property
    def needed(self) -> list[list[float]]:
        """Per step, the operands that must be facts (numbers the problem gives, or earlier
        results), rather than constants the worker knows."""
        results = [step.value for step in self.steps]
        return [
            [op for op in step.operands if among(op, self.given) or among(op, results)]
            for step in self.steps
        ]


def derive(facts: set[float], problem: Problem, taken: frozenset[int] = frozenset()) -> list[int]:
    """The reference steps that can be done from `facts` (indices), repeated until nothing new
    follows; `taken` steps are never worked out (their results are given, or not)."""
    steps = problem.steps
    known, done = set(facts), set()
    progress = True
    while progress:
        progress = False
        for i, (step, needs) in enumerate(zip(steps, problem.needed, strict=True)):
            if i not in done | taken and all(among(op, known) for op in needs):
                done.add(i)
                known.add(step.value)
                progress = True
    return sorted(done)


def _words(text: str) -> set[str]:
    words = re.findall(r"[a-z]+", text.lower())
    return {w.removesuffix("s") for w in words if len(w) > 3 and w not in _STOPWORDS}


_FIND = re.compile(r"^(?:find|what is|compute)\s+(?P<name>[a-z])\W*$", re.IGNORECASE)


def _question(text: str) -> str:
    """The question a prompt asks: its last sentence ending with "?" or asking for a variable
    ("Find x.", then the sentence that says what x is); else the whole prompt."""
    said = re.split(r"(?<=[.?!])\s+", text.strip())
    asked = [s for s in said if s.endswith("?") or _FIND.match(s)]
    if not asked:
        return text
    find = _FIND.match(asked[-1])
    defined = [s for s in said if find and f"let {find.group('name').lower()} be" in s.lower()]
    return defined[-1] if defined else asked[-1]


def _line_words(line: str) -> set[str]:
    """A solution line's words, and "money" and "dollar" where it writes dollars ("$18")."""
    return _words(line) | ({"money", "dollar"} if "$" in line else set())


POINTS_BACK = re.compile(r"\bis that\b|^let [a-z] be\b", re.IGNORECASE)
"""A question about the statement before it ("How much money is that, in dollars?", "Let x be
the number of eggs.")."""


def asked_step(prompt: str, done: list[int], problem: Problem) -> int:
    """The step a subproblem asks for: the problem's question asks for the answer; otherwise the
    step whose solution line shares most words with the question (then the largest share of
    the line's words), the deepest on a tie, or, for a question about the statement before it
    ("is that"), the first of the tied steps that statement gives the numbers of."""
    question = _question(prompt)
    if question in problem.question and done[-1] == len(problem.lines) - 1:
        return done[-1]
    words, lines = _words(question), problem.lines

    def match(i: int) -> tuple[int, float, int]:
        shared = len(words & _line_words(lines[i]))
        return shared, shared / max(len(_line_words(lines[i])), 1), i

    best = max(done, key=match)
    if POINTS_BACK.search(question):  # "How many eggs is that?": the statement before it
        said = re.split(r"(?<=[.?!])\s+", prompt[: prompt.rfind(question)].strip())
        tied = [i for i in done if match(i)[0] == match(best)[0]]
        near = max(tied, key=lambda i: len(_words(said[-1]) & _line_words(lines[i])))
        return near if _words(said[-1]) & _line_words(lines[near]) else best
    return best


def probed_step(prompt: str, done: list[int], problem: Problem) -> int:
    """The step a subproblem asks for; for a generic probe, the one the worker computes first
    (second, ...) or the one before the final step, in the order of the reference solution."""
    probe = PROBE.search(_question(prompt))
    if probe is None:
        return asked_step(prompt, done, problem)
    if probe.group("last"):
        before = [i for i in done if i < len(problem.steps) - 1]
        return before[-1] if before else done[-1]
    nth = _ORDINALS.index((probe.group("nth") or probe.group("first")).lower())
    return done[min(nth, len(done) - 1)]


def evaluate(expression: str) -> float:
    """A bare arithmetic expression with + - * / and parentheses ("16 - 3 - 4", "9 * (2 + 1)")."""

    def value(node: ast.AST) -> float:
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return float(node.value)
        raise ValueError(f"not arithmetic: {expression!r}")

    return value(ast.parse(expression.strip(), mode="eval").body)


def in_digits(line: str) -> str:
    """A line with its Roman numerals written in digits, as a solver writes an answer."""
    return _ROMAN_TOKEN.sub(lambda m: str(roman_value(m.group())), line)


def obey(told: re.Match[str]) -> str:
    """The reply of a worker that does what its prompt tells it."""
    if "line" in told.groupdict():
        return in_digits(told.group("line").strip())
    return f"Answer: {format_number(evaluate(told.group('expression')))}"


def restated(text: str) -> float | None:
    """The number a "collect the given fact" question asks for: the stated number (outside the
    question) whose next words share most words with the question, the first on a tie."""
    question = _question(text)
    facts = text.replace(question, " ")
    best, score = None, -1
    for match in re.finditer(r"\$?\d[\d,]*(?:\.\d+)?%?", facts):
        value = parse_number(match.group())
        after = facts[match.end() : match.end() + 40]
        shared = len(_words(question) & _words(after))
        if value is not None and shared > score:
            best, score = value, shared
    return best


def answer(value: float | None) -> str:
    return CANNOT_TELL if value is None else f"Answer: {format_number(value)}"


@dataclass
class Script:
    """Plays the planner (model POLICY) and the worker (model BASE).

    The planner replies with `plans[prompt]`. The worker knows which problem is being rolled
    out (the one whose plan holds the text it is asked about, else `problem`) but uses nothing
    of it except its reference steps and their lines (to know
    which step a question asks for): facts come from its prompt (module docstring). Each call
    spends 20 tokens plus 20 per step it works out.
    """

    problems: dict[str, Problem]
    problem: Problem | None = None
    plans: dict[str, str] = field(default_factory=dict)
    planner_tokens: dict[str, int] = field(default_factory=dict)
    worker_status: int = 200
    subproblem_delay: float = 0.0
    texts: dict[str, Problem] = field(default_factory=dict)
    combination: str = "plan"
    unmasked: dict[str, str] = field(default_factory=dict)
    answered: dict[tuple[Problem, str], ScriptedReply] = field(default_factory=dict)

    def expect(self, problem: Problem, prompt: str, reply: str) -> None:
        """Play `reply` as the planner for `prompt`, and know the texts of that plan as
        belonging to `problem`, so rollouts of several problems can run at once."""
        self.plans[prompt] = reply
        self.texts[problem.question] = problem
        try:
            decision = json.loads(reply)
        except (ValueError, RecursionError):  # not a plan (the tests of malformed replies)
            return
        if not isinstance(decision, dict):
            return
        for text in [decision.get("plan", ""), *decision.get("subproblems", [])]:
            self.texts[text] = problem
        for text in decision.get("subproblems", []):
            self.unmasked[mask_numbers(text)] = text

    def problem_for(self, system: str, user: str) -> Problem | None:
        """The problem a worker request belongs to: by the text it carries (for a combination,
        a part's text before the plan's, which may be the same for every row), else
        `problem`."""
        keys = [user]
        if system == WORKER_COMBINE_SYSTEM:
            plan, _, solved = user.partition("\n\nSolved parts:")
            parts = re.findall(r"(?ms)^\d+\. (.*?)\n   Result: ", solved)
            keys = [*(self.unmasked.get(part, part) for part in parts), plan.removeprefix("Plan: ")]
        return next((self.texts[key] for key in keys if key in self.texts), self.problem)

    def __call__(self, model: str, messages: list[dict]) -> ScriptedReply:
        user = messages[-1]["content"]
        if model == POLICY:
            plan = self.plans[user]
            return ScriptedReply(plan, self.planner_tokens.get(user, estimate_tokens(plan)))
        if model != BASE:
            return ScriptedReply(f"model {model!r} not served", 0, status=404)
        if self.worker_status != 200:
            return ScriptedReply("worker down", 0, status=self.worker_status)
        system = messages[0]["content"]
        problem = self.problem_for(system, user)
        if system == WORKER_COMBINE_SYSTEM:
            return self.combine(problem, user)
        if system == WORKER_DIRECT_SYSTEM:
            return self.solve(problem, user)
        reply = self.subproblem(problem, user)
        return ScriptedReply(reply.text, reply.completion_tokens, delay=self.subproblem_delay)

    def solve(self, problem: Problem, question: str) -> ScriptedReply:
        """A direct solve: the answer when the steps reach it or the prompt states it."""
        facts = problem.facts(question)
        done = derive(facts, problem)
        solved = among(problem.gold, self._values(problem, done)) or among(problem.gold, facts)
        return ScriptedReply(answer(problem.gold if solved else None), 20 + 20 * len(done))

    def subproblem(self, problem: Problem, text: str) -> ScriptedReply:
        """The step the subproblem asks for, scaled when told; a stated number when it asks for
        no step the worker can do. Remembered per problem and text (the reply depends on nothing
        else, and every combination asks again which step each part asked for)."""
        key = (problem, text)
        if key not in self.answered:
            self.answered[key] = self._subproblem(problem, text)
        return self.answered[key]

    def _subproblem(self, problem: Problem, text: str) -> ScriptedReply:
        told = REPLY_EXACTLY.search(text) or ARITHMETIC.search(text)
        if told:
            return ScriptedReply(obey(told), 20)
        if RESTATE.search(text):
            return ScriptedReply(answer(restated(text)), 20)
        done = derive(problem.facts(text), problem)
        if not done:
            return ScriptedReply(answer(max(stated_numbers(text), default=None)), 20)
        result = self._values(problem, done)[done.index(probed_step(text, done, problem))]
        scaled = SCALED.search(text)
        result *= float(scaled.group("by")) if scaled else 1.0
        return ScriptedReply(answer(result), 20 + 20 * len(done))

    def combine(self, problem: Problem, prompt: str) -> ScriptedReply:
        """The combination from the plan and the listed results: each part's result stands for
        the step that part asked for, which the worker does not work out again (the results are
        what the parts were for), right or wrong."""
        plan, _, solved = prompt.partition("\n\nSolved parts:")
        parts = re.findall(r"(?ms)^\d+\. (.*?)\n   Result: (.*?)$", solved)
        results = [r for r in (parse_number(result) for _, result in parts) if r is not None]
        if WITHOUT_PARTS.search(plan) and not results:
            return ScriptedReply(CANNOT_TELL, 20)
        told = REPLY_EXACTLY.search(plan) or ARITHMETIC.search(plan)
        if told:
            return ScriptedReply(obey(told), 20)
        shown = " ".join([plan, *(sub for sub, _ in parts)])
        if self.combination == "re-solving" and pastes_problem(
            shown, problem.question, problem.solution
        ):
            done = derive(problem.facts(shown), problem)
            if among(problem.gold, self._values(problem, done)):
                return ScriptedReply(answer(problem.gold), 20 + 20 * len(done))
        operation = RESULT_OPERATION.search(plan)
        if operation:
            return ScriptedReply(answer(self._operate(operation, results)), 20)
        read = plan if self.combination == "plan" else shown
        facts = problem.facts(read) | set(results)
        done = derive(facts, problem, self._asked_steps(problem, [sub for sub, _ in parts]))
        told_answer = among(problem.gold, stated_numbers(plan)) and not among(
            problem.gold, stated_numbers(problem.question)
        )
        reached = [
            *self._values(problem, done),
            *results,
        ]  # a result that is the answer is passed on
        solved = among(problem.gold, reached) or told_answer
        return ScriptedReply(answer(problem.gold if solved else None), 20 + 20 * len(done))

    def _asked_steps(self, problem: Problem, subproblems: list[str]) -> frozenset[int]:
        """The steps the subproblems asked for (the steps whose value each one's answer is); a
        part shown with its numbers masked asked for what it asked when it was solved."""
        asked = [self.unmasked.get(sub, sub) for sub in subproblems]
        answers = [final_number(self.subproblem(problem, sub).text) for sub in asked]
        steps = problem.steps
        return frozenset(i for i, step in enumerate(steps) if among(step.value, answers))

    @staticmethod
    def _values(problem: Problem, done: list[int]) -> list[float]:
        return [problem.steps[i].value for i in done]

    @staticmethod
    def _operate(operation: re.Match[str], results: list[float]) -> float | None:
        nth = _ORDINALS.index(operation.group("nth").lower())
        if nth >= len(results):
            return None
        by = float(operation.group("by"))
        return results[nth] / by if operation.group("op").lower() == "divide" else results[nth] * by
