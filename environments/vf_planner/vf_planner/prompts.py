"""Prompt texts for the planner (the policy) and the frozen worker.

The worker sees only what the plan gives it: a subproblem call gets the subproblem's text alone,
and the combination call gets the planner's `plan` text and the subproblems with their results,
never the problem. The full problem reaches the worker only in a direct solve (an atomic plan,
and the baseline). So the facts a decomposed plan needs travel in its own words, and a plan that
does not decompose the reasoning cannot lean on the worker reading the problem.

Each worker request kind has its own system prompt, so logs (and scripted test servers) can tell
a direct solve, a subproblem and a combination step apart.
"""

from __future__ import annotations

PLANNER_SYSTEM = """You plan how a separate solver model will answer a math word problem.
You may split the problem into subproblems that the solver answers in parallel, one call each;
a last call then combines their results. The solver sees only what you give it:
- a subproblem call sees that subproblem's text and nothing else (not the problem, not the other
  subproblems, not their results), so write each one as a self-contained question that states
  every number it needs;
- the combining call sees your plan and the subproblems with their results, not the problem, so
  the plan must say how to combine the results and give any number still needed.
A subproblem is worth its call when it computes a new intermediate quantity: not a number stated
in the problem and not the final answer. Ask each subproblem for the quantity you chose, by name;
copying or restating the problem, or handing it over with "what do you compute first?", earns
nothing.

Reply with exactly one JSON object and nothing else:
{{"should_decompose": true, "subproblems": ["...", "..."], "plan": "how to combine the results"}}
or, to let the solver answer the whole problem directly:
{{"should_decompose": false, "subproblems": [], "plan": ""}}

Use at most {max_subproblems} subproblems."""

ANSWER_FORMAT = "Finish with a last line of the form 'Answer: <number>'."
ONLY_WHAT_IS_GIVEN = (
    "Use only the information given; if it is not enough, say so instead of guessing."
)

WORKER_DIRECT_SYSTEM = f"You solve math word problems step by step. {ANSWER_FORMAT}"

WORKER_SUBPROBLEM_SYSTEM = (
    f"You answer one self-contained math question step by step. {ONLY_WHAT_IS_GIVEN} "
    f"{ANSWER_FORMAT}"
)

WORKER_COMBINE_SYSTEM = (
    "You finish a math word problem from a plan and the results of its solved parts; the problem "
    f"itself is not shown to you. {ONLY_WHAT_IS_GIVEN} {ANSWER_FORMAT}"
)


def planner_system(max_subproblems: int) -> str:
    """The planner's system prompt with the subproblem limit filled in."""
    return PLANNER_SYSTEM.format(max_subproblems=max_subproblems)


def combine_prompt(plan: str, results: list[tuple[str, str]]) -> str:
    """The combination request: the planner's plan and each subproblem with its result."""
    lines = [f"{i}. {sub}\n   Result: {result}" for i, (sub, result) in enumerate(results, 1)]
    solved = "\n".join(lines)
    return f"Plan: {plan or '(none)'}\n\nSolved parts:\n{solved}"
