"""Which results of the reference solution a text can reach, and what a plan may hand on.

Both checks that keep a decomposition honest read the reference solution as steps (GSM8K's
`<<a*b=c>>` annotations) and ask which of its results follow from a set of numbers:

- a subproblem counts toward independence only when its result follows from the numbers it
  states that the problem states (independence.py): "What is 3 * 3?" returns 9, a result of
  `16-3-4=9`, but carries none of that step's operands, so the planner, not the worker, did the
  step (or it is a coincidence);
- the plan text and the subproblems, which the combination step reads, must not carry the work
  either (`plan_leak`): stating a result of the solution (the answer, or an intermediate value
  the planner worked out itself) or enough of the problem's numbers to reach the answer through
  its steps makes the combination, or one subproblem, a direct solve in disguise.

An operand is available when the text states it (as written, or as a percentage: 150 for the
1.5 of "150%") or when it is a constant the problem never states and no step computes (the 100
of a percentage, the 2 of "every second glass"). Numbers a text states that the problem does not
(results the planner computed itself) are not available: each step must be reached from the
problem's own numbers.
"""

from __future__ import annotations

from vf_planner.answers import among, calculator_steps, stated_numbers


def _forms(number: float) -> tuple[float, float]:
    """A number and its percentage form (1.5 is written "150%")."""
    return number, number * 100


def reachable(text: str, question: str, solution: str) -> list[float]:
    """The results of the solution's steps that follow from the problem's numbers `text` states,
    repeated until nothing new follows. Empty for a solution without annotated steps."""
    steps = calculator_steps(solution)
    stated = stated_numbers(question)
    results = [step.value for step in steps]
    known = [n for n in stated_numbers(text) if any(among(f, stated) for f in _forms(n))]

    def available(operand: float) -> bool:
        if any(among(f, known) for f in _forms(operand)):
            return True
        return not any(among(f, stated) for f in _forms(operand)) and not among(operand, results)

    reached: list[float] = []
    progress = True
    while progress:
        progress = False
        for step in steps:
            if not among(step.value, reached) and all(map(available, step.operands)):
                reached.append(step.value)
                known.append(step.value)
                progress = True
    return reached


def plan_leak(
    plan: str, subproblems: list[str], question: str, solution: str, gold: float | None
) -> str | None:
    """Why the plan's texts carry the work themselves, or None when they do not.

    The plan text and the subproblems may state the problem's numbers (and constants such as the
    100 of a percentage), not a result of the solution the problem does not state (the answer, or
    an intermediate value the planner worked out itself); and no one of them may hold enough of
    the problem's numbers to reach the answer through the solution's steps (the problem handed
    over, in any wording, to the combination step or to a single subproblem)."""
    results = [step.value for step in calculator_steps(solution)]
    results += [gold] if gold is not None else []
    given = stated_numbers(question)
    for name, text in [("the plan", plan), *(("a subproblem", sub) for sub in subproblems)]:
        computed = [n for n in stated_numbers(text) if among(n, results) and not among(n, given)]
        if computed:
            return f"{name} states {computed[0]:g}, a result the workers were to compute"
        if among(gold, reachable(text, question, solution)):
            return f"{name} alone reaches the answer through the solution's steps"
    return None
