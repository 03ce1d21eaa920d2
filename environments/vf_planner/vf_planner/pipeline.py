"""One rollout's worker pipeline: parse the plan, run the worker, and record what happened.

An atomic plan is the worker's direct solve of the problem. A decomposed plan has the worker solve
every subproblem concurrently, each seeing only its own text, then combine the results from the
plan alone (prompts.py); which subproblems computed a new intermediate result is then read off
their results (independence.py). The direct-solve baseline (the efficiency reference) is measured
once per problem with the same worker; at temperature 0 an atomic plan sends exactly the baseline
request, so it reuses the cached reply instead of asking again.

A decomposition's answer must come from combining its subproblems' results. A plan whose texts do
the work themselves scores 0 (`plan_leak`): a plan text or subproblem that states a result of the
solution or whose numbers reach the answer (steps.py), checked before any worker call; a plan
text from which the worker gets the answer without any results (the combination request is also
sent with the plan alone, concurrently with the subproblems, its tokens not charged to the plan,
which catches dictation in any wording the worker understands: "reply with seventeen plus one");
and a subproblem whose result is the answer (it solved the whole problem alone).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

import verifiers as vf

from vf_planner.answers import among, final_number, numbers_match, parse_number, stated_numbers
from vf_planner.independence import independence
from vf_planner.plan import Plan, PlanError, PlanParser
from vf_planner.replies import last_reply_text
from vf_planner.steps import plan_leak
from vf_planner.worker import Worker, WorkerError, WorkerPool, WorkerReply, estimate_tokens

logger = logging.getLogger(__name__)


@dataclass
class Outcome:
    """Everything the rubric scores, JSON-friendly (saved in state["planner"])."""

    parse_error: str | None = None
    plan_leak: str | None = None
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
        replies, alone = await asyncio.gather(
            worker.solve_subproblems(plan.subproblems), self._plan_alone(worker, plan)
        )
        if alone is not None and numbers_match(final_number(alone.text), problem.gold):
            outcome.plan_leak = "the worker gets the answer from the plan without any results"
        elif problem.gold_unstated and any(
            numbers_match(final_number(r.text), problem.gold) for r in replies
        ):
            outcome.plan_leak = "a subproblem alone produced the answer: nothing was decomposed"
        final = await worker.combine(plan.plan, plan.subproblems, replies)
        results = [final_number(r.text) for r in replies]
        scored = independence(
            problem.question, problem.solution, problem.gold, plan.subproblems, results
        )
        outcome.subproblem_replies = [r.text for r in replies]
        outcome.subproblem_results = results
        outcome.counted = scored.counted
        outcome.worker_tokens = sum(r.tokens for r in replies) + final.tokens
        outcome.final_reply = final.text
        outcome.independence = scored.score

    @staticmethod
    async def _plan_alone(worker: Worker, plan: Plan) -> WorkerReply | None:
        """The combination request with the plan and no solved parts (None for an empty plan,
        which cannot carry anything)."""
        return await worker.combine(plan.plan, [], []) if plan.plan else None


def outcome_from_state(state: dict[str, Any]) -> Outcome | None:
    """The outcome saved in a state, if the pipeline already ran for it."""
    saved = state.get("planner")
    return Outcome(**saved) if isinstance(saved, dict) else None
