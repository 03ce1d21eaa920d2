"""One rollout's worker pipeline: parse the plan, run the worker, and record what happened.

An atomic plan is the worker's direct solve of the problem. A decomposed plan has the worker solve
every subproblem concurrently, each seeing only its own text, then combine them from the plan
and their results alone (prompts.py); which subproblems computed a new intermediate result is
then read off their results (independence.py). The direct-solve baseline (the efficiency
reference) is measured once per problem with the same worker; at temperature 0 an atomic plan
sends exactly the baseline request, so it reuses the cached reply instead of asking again.

A decomposition's answer must come from combining its subproblems' results. Two rules zero a
plan whose texts do the work themselves (`plan_leak`, with `leak_rule` naming the rule):

- `states_result`: the plan text or a subproblem states a result of the solution that the
  problem does not give, in any notation (steps.py), checked before any worker call;
- `answer_without_results`: the combination, asked with the same plan, the subproblems with
  their numbers masked (`masked`) and decoy results (numbers that are no result of the
  solution), still gives the answer. This counterfactual runs concurrently with the subproblems,
  its tokens not charged to the plan, and catches every instruction in the plan that makes the
  worker emit a given answer, in any wording or notation the worker understands ("reply with
  seventeen plus one", "if no solved parts are listed, say you cannot tell; otherwise answer
  this: what is 17 + 1?"). The masking keeps it independent of the worker: one that re-solves
  the problem from the subproblems' texts, rather than trusting the listed results, has no
  numbers to re-solve it from.

One rule cuts a plan that is not a decomposition to the pay of a direct solve that did no step
(`not_decomposed`: I = 0, so the reward is w_c, below the atomic plan's w_c + w_t * E): the plan
text holds the problem, its numbers and its wording (the problem handed to the combination), a
subproblem returned the answer by itself, every subproblem holds the problem and names no step
of it (the decomposition left to the worker, independence.py), or the combination still gives
the answer when the subproblems that computed a step get decoy results (the answer came from the
others: a whole problem hidden in one subproblem with its answer scaled, in any wording).
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import verifiers as vf

from vf_planner.answers import (
    among,
    final_number,
    format_number,
    numbers_match,
    parse_number,
)
from vf_planner.independence import Independence, independence
from vf_planner.notation import given_numbers, mask_numbers, stated_numbers
from vf_planner.plan import Plan, PlanError, PlanParser
from vf_planner.replies import last_reply_text
from vf_planner.steps import pastes_problem, plan_leak, solution_results
from vf_planner.worker import Worker, WorkerError, WorkerPool, WorkerReply, estimate_tokens

logger = logging.getLogger(__name__)


@dataclass
class Outcome:
    """Everything the rubric scores, JSON-friendly (saved in state["planner"])."""

    parse_error: str | None = None
    plan_leak: str | None = None
    leak_rule: str | None = None
    not_decomposed: str | None = None
    worker_error: str | None = None
    decomposed: bool = False
    subproblems: list[str] = field(default_factory=list)
    subproblem_replies: list[str] = field(default_factory=list)
    subproblem_results: list[float | None] = field(default_factory=list)
    counted: list[bool] = field(default_factory=list)
    final_reply: str = ""
    predicted: float | None = None
    correct: bool = False
    planner_tokens: int = 0
    worker_tokens: int = 0
    baseline_tokens: int = 0
    independence: float = 0.0


def planner_tokens(state: vf.State) -> int:
    """Tokens the planner generated in this rollout (server usage, else an estimate)."""
    usage = state.get("usage") or {}
    generated = int(usage.get("output_tokens", 0) or 0)
    return generated or estimate_tokens(last_reply_text(state.get("completion")))


@dataclass(frozen=True)
class Problem:
    """What the pipeline knows about the row: the question, its reference solution, the gold."""

    question: str
    solution: str
    gold: float | None

    @property
    def gold_unstated(self) -> bool:
        """Whether the answer is a number the problem does not state (a subproblem restating a
        stated fact that happens to be the answer has not solved anything)."""
        return self.gold is not None and not among(self.gold, stated_numbers(self.question))

    @classmethod
    def of(cls, state: vf.State) -> Problem:
        info = state["info"]
        return cls(info["question"], info.get("solution", ""), parse_number(str(state["answer"])))


class PlannerPipeline:
    """Runs the worker for a rollout's plan; never raises for bad plans or failing workers."""

    def __init__(self, parser: PlanParser, workers: WorkerPool) -> None:
        self.parser = parser
        self.workers = workers

    async def run(self, state: vf.State) -> Outcome:
        problem = Problem.of(state)
        outcome = Outcome(planner_tokens=planner_tokens(state))
        try:
            plan = self.parser.parse_plan(state.get("completion"))
        except PlanError as e:
            logger.info("malformed plan (scored 0): %s", e)
            outcome.parse_error = str(e)
            return outcome
        outcome.decomposed = plan.should_decompose
        outcome.subproblems = plan.subproblems
        if plan.should_decompose:
            outcome.plan_leak = plan_leak(
                plan.plan, plan.subproblems, problem.question, problem.solution, problem.gold
            )
            outcome.leak_rule = "states_result" if outcome.plan_leak else None
        if outcome.plan_leak is not None:
            logger.info("the plan does the work itself (scored 0): %s", outcome.plan_leak)
            return outcome
        try:
            worker = await self.workers.worker_for(state["client"], state["model"])
            await self._solve(worker, problem, plan, outcome)
        except WorkerError as e:
            logger.warning("worker failed (scored 0): %s", e)
            outcome.worker_error = str(e)
            return outcome
        outcome.predicted = final_number(outcome.final_reply)
        outcome.correct = numbers_match(outcome.predicted, problem.gold) and not outcome.plan_leak
        return outcome

    async def _solve(self, worker: Worker, problem: Problem, plan: Plan, outcome: Outcome) -> None:
        baseline = await self.workers.baseline(worker, problem.question)
        outcome.baseline_tokens = baseline.tokens
        if not plan.should_decompose:
            deterministic = worker.settings.temperature == 0
            final = baseline if deterministic else await worker.solve_direct(problem.question)
            outcome.worker_tokens = final.tokens
            outcome.final_reply = final.text
            return
        replies, decoyed = await asyncio.gather(
            worker.solve_subproblems(plan.subproblems), self._with_decoys(worker, problem, plan)
        )
        if numbers_match(final_number(decoyed.text), problem.gold):
            outcome.plan_leak = "the combination gives the answer without the subproblems' results"
            outcome.leak_rule = "answer_without_results"
        final = await worker.combine(plan.plan, plan.subproblems, replies)
        results = [final_number(r.text) for r in replies]
        scored = independence(
            problem.question, problem.solution, problem.gold, plan.subproblems, results
        )
        outcome.not_decomposed = _not_decomposed(problem, plan, results, scored)
        if outcome.not_decomposed is None and await self._answer_skips_counted_work(
            worker, problem, plan, replies, scored.counted
        ):
            outcome.not_decomposed = "the answer comes from subproblems that computed no step"
        if outcome.not_decomposed is not None:
            scored = Independence(score=0.0, counted=[False] * len(results))
        outcome.subproblem_replies = [r.text for r in replies]
        outcome.subproblem_results = results
        outcome.counted = scored.counted
        outcome.worker_tokens = sum(r.tokens for r in replies) + final.tokens
        outcome.final_reply = final.text
        outcome.independence = scored.score

    @staticmethod
    async def _with_decoys(worker: Worker, problem: Problem, plan: Plan) -> WorkerReply:
        """The combination request with decoy results in place of the subproblems' results."""
        values = decoys(problem, len(plan.subproblems))
        replies = [WorkerReply(f"Answer: {format_number(v)}", 0) for v in values]
        return await worker.combine(plan.plan, masked(plan.subproblems), replies)

    @staticmethod
    async def _answer_skips_counted_work(
        worker: Worker,
        problem: Problem,
        plan: Plan,
        replies: list[WorkerReply],
        counted: list[bool],
    ) -> bool:
        """Whether the combination still gives the answer when the subproblems that computed a
        step of the solution (the counted ones, and repeats of their results) get decoy
        results: then the answer came from the others (a whole problem hidden in one
        subproblem with its answer scaled, in any wording) and the counted steps were
        decoration. Asked only for a plan with both kinds; its tokens are not charged."""
        if all(counted) or not any(counted):
            return False
        results = [final_number(reply.text) for reply in replies]
        work = [r for r, was_counted in zip(results, counted, strict=True) if was_counted]
        values = iter(decoys(problem, len(replies)))
        mixed = [
            WorkerReply(f"Answer: {format_number(next(values))}", 0) if among(r, work) else reply
            for reply, r in zip(replies, results, strict=True)
        ]
        reply = await worker.combine(plan.plan, masked(plan.subproblems), mixed)
        return numbers_match(final_number(reply.text), problem.gold)


def masked(subproblems: list[str]) -> list[str]:
    """The subproblems as the counterfactual combinations show them: their words, without their
    numbers (notation.mask_numbers). A worker may re-solve a problem from the texts it is
    shown rather than trust the listed results; with the numbers masked, the only way to the
    answer without the results is the plan's own text, whatever the worker does."""
    return [mask_numbers(subproblem) for subproblem in subproblems]


def decoys(problem: Problem, count: int) -> list[float]:
    """`count` distinct numbers that are no number of the problem and no result of its solution,
    and such that no sum, difference, product or ratio of one with another decoy or with a
    number of the problem is the answer: an honest combination of decoys never gives it. They
    are primes from 37 on, away from GSM8K's round numbers."""
    given = given_numbers(problem.question)
    taken = [*given, *solution_results(problem.solution, problem.gold), problem.gold]
    chosen: list[float] = []
    spare: list[float] = []  # fresh but reaching the answer: decoys for a gold no choice avoids
    for candidate in _decoy_candidates():
        if len(chosen) == count:
            return chosen
        if among(candidate, taken):
            continue
        reaches = _reaches(candidate, [*chosen, *given], problem.gold)
        (spare if reaches else chosen).append(candidate)
    return chosen + spare[: count - len(chosen)]


@functools.cache
def _decoy_candidates() -> tuple[float, ...]:
    return tuple(float(p) for p in itertools.islice(_primes_from(37), DECOY_SEARCH))


def _primes_from(start: int) -> Iterator[int]:
    for n in itertools.count(start):
        if all(n % d for d in range(2, math.isqrt(n) + 1)):
            yield n


DECOY_SEARCH = 2000
"""How many primes `decoys` considers: far more than any plan has subproblems."""


def _reaches(value: float, others: list[float], gold: float) -> bool:
    """Whether one arithmetic operation of `value` with one of `others` gives `gold` (a product
    with 0 is 0 whatever `value` is, so it says nothing about `value`)."""
    for other in others:
        combos = [value + other, value - other, other - value, other / value]
        combos += [value * other, value / other] if other else []
        if among(gold, combos):
            return True
    return False


def _not_decomposed(
    problem: Problem, plan: Plan, results: list[float | None], scored: Independence
) -> str | None:
    """Why the plan is a direct solve in disguise rather than a decomposition, or None."""
    if pastes_problem(plan.plan, problem.question, problem.solution):
        return "the plan carries the whole problem"
    if scored.delegated and all(scored.delegated):
        return "every subproblem is the whole problem with no step of it named"
    for result, counted in zip(results, scored.counted, strict=True):
        if numbers_match(result, problem.gold) and problem.gold_unstated and not counted:
            return "a subproblem alone produced the answer"
    return None


def outcome_from_state(state: dict[str, Any]) -> Outcome | None:
    """The outcome saved in a state, if the pipeline already ran for it."""
    saved = state.get("planner")
    return Outcome(**saved) if isinstance(saved, dict) else None
