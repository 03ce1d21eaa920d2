"""One rollout's worker pipeline: parse the plan, run the worker, and record what happened.

An atomic plan is the worker's direct solve of the problem. A decomposed plan has the worker solve
every subproblem concurrently, then combine the results; the subproblem embeddings are computed
in a thread at the same time. The direct-solve baseline (the efficiency reference) is measured
once per problem with the same worker; at temperature 0 an atomic plan sends exactly the baseline
request, so it reuses the cached reply instead of asking again.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

import verifiers as vf

from vf_planner.answers import final_number, numbers_match, parse_number
from vf_planner.embeddings import score_subproblems_async
from vf_planner.plan import Plan, PlanError, PlanParser, last_assistant_text
from vf_planner.worker import Worker, WorkerError, WorkerPool, estimate_tokens

logger = logging.getLogger(__name__)


@dataclass
class Outcome:
    """Everything the rubric scores, JSON-friendly (saved in state["planner"])."""

    parse_error: str | None = None
    worker_error: str | None = None
    decomposed: bool = False
    subproblems: list[str] = field(default_factory=list)
    subproblem_replies: list[str] = field(default_factory=list)
    final_reply: str = ""
    predicted: float | None = None
    correct: bool = False
    planner_tokens: int = 0
    worker_tokens: int = 0
    baseline_tokens: int = 0
    independence: float = 0.0
    relevance: float = 0.0


def planner_tokens(state: vf.State) -> int:
    """Tokens the planner generated in this rollout (server usage, else an estimate)."""
    usage = state.get("usage") or {}
    generated = int(usage.get("output_tokens", 0) or 0)
    return generated or estimate_tokens(last_assistant_text(state.get("completion")))


class PlannerPipeline:
    """Runs the worker for a rollout's plan; never raises for bad plans or failing workers."""

    def __init__(self, parser: PlanParser, workers: WorkerPool) -> None:
        self.parser = parser
        self.workers = workers

    async def run(self, state: vf.State) -> Outcome:
        question = state["info"]["question"]
        outcome = Outcome(planner_tokens=planner_tokens(state))
        try:
            plan = self.parser.parse_plan(state.get("completion"))
        except PlanError as e:
            logger.info("malformed plan (scored 0): %s", e)
            outcome.parse_error = str(e)
            return outcome
        outcome.decomposed = plan.should_decompose
        outcome.subproblems = plan.subproblems
        try:
            worker = await self.workers.worker_for(state["client"], state["model"])
            await self._solve(worker, question, plan, outcome)
        except WorkerError as e:
            logger.warning("worker failed (scored 0): %s", e)
            outcome.worker_error = str(e)
            return outcome
        outcome.predicted = final_number(outcome.final_reply)
        outcome.correct = numbers_match(outcome.predicted, parse_number(str(state["answer"])))
        return outcome

    async def _solve(self, worker: Worker, question: str, plan: Plan, outcome: Outcome) -> None:
        baseline = await self.workers.baseline(worker, question)
        outcome.baseline_tokens = baseline.tokens
        if not plan.should_decompose:
            deterministic = worker.settings.temperature == 0
            final = baseline if deterministic else await worker.solve_direct(question)
            outcome.worker_tokens = final.tokens
            outcome.final_reply = final.text
            return
        replies, scores = await asyncio.gather(
            worker.solve_subproblems(question, plan.subproblems),
            score_subproblems_async(question, plan.subproblems),
        )
        final = await worker.combine(question, plan.plan, plan.subproblems, replies)
        outcome.subproblem_replies = [r.text for r in replies]
        outcome.worker_tokens = sum(r.tokens for r in replies) + final.tokens
        outcome.final_reply = final.text
        outcome.independence = scores.independence
        outcome.relevance = scores.relevance


def outcome_from_state(state: dict[str, Any]) -> Outcome | None:
    """The outcome saved in a state, if the pipeline already ran for it."""
    saved = state.get("planner")
    return Outcome(**saved) if isinstance(saved, dict) else None
