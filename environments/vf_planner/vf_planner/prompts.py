"""Prompt texts for the planner (the policy) and the frozen worker.

Each worker request kind has its own system prompt, so logs (and scripted test servers) can tell
a direct solve, a subproblem and a combination step apart.
"""

from __future__ import annotations

PLANNER_SYSTEM = """You plan how a separate solver model will answer a math word problem.
Decide whether the problem should be split into subproblems that the solver answers in parallel
(each one on its own, with the full problem as context), after which the solver combines their
results. Decomposing costs extra solver calls; it pays off when the parts are easier than the whole.

Reply with exactly one JSON object and nothing else:
{{"should_decompose": true, "subproblems": ["...", "..."], "plan": "how to combine the results"}}
or, to let the solver answer directly:
{{"should_decompose": false, "subproblems": [], "plan": "..."}}

Use at most {max_subproblems} subproblems. Each subproblem is one self-contained question about
this problem, not a restatement of the whole problem."""

ANSWER_FORMAT = "Finish with a last line of the form 'Answer: <number>'."

WORKER_DIRECT_SYSTEM = f"You solve math word problems step by step. {ANSWER_FORMAT}"

WORKER_SUBPROBLEM_SYSTEM = (
    "You solve one subproblem of a math word problem. The full problem is given for context; "
    f"answer only the subproblem. {ANSWER_FORMAT}"
)

WORKER_COMBINE_SYSTEM = (
    f"You answer a math word problem using the results of its solved subproblems. {ANSWER_FORMAT}"
)


def planner_system(max_subproblems: int) -> str:
    """The planner's system prompt with the subproblem limit filled in."""
    return PLANNER_SYSTEM.format(max_subproblems=max_subproblems)


def subproblem_prompt(question: str, subproblem: str) -> str:
    return f"Problem: {question}\n\nSubproblem: {subproblem}"


def combine_prompt(question: str, plan: str, results: list[tuple[str, str]]) -> str:
    """The combination request: the problem, the planner's plan, and each subproblem's result."""
    lines = [f"{i}. {sub}\n   Result: {result}" for i, (sub, result) in enumerate(results, 1)]
    solved = "\n".join(lines)
    return f"Problem: {question}\n\nPlan: {plan or '(none)'}\n\nSolved subproblems:\n{solved}"
