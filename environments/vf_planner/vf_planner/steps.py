"""What a plan's texts state about the reference solution, read as steps and results.

The reference solution is read as steps (GSM8K's `<<a*b=c>>` annotations). These checks use it:

- `stated_result` (`plan_leak`, scored 0): the plan text or a subproblem states a number that is
  a result of the solution (the answer, or an intermediate value) and that the problem does not
  give, in any notation (notation.py). It reads what the text *states*, never what the text's
  numbers could compute: an honest subproblem must state the problem's numbers it needs, and
  those numbers can always compute something.
- `carries_whole_problem`: a text states every number of the problem the solution uses.
  `pastes_problem`: a plan text that holds those numbers and the problem's own wording hands the
  problem to the combination (pipeline.py).
- `holds_problem` and `names_step` (independence.py): a subproblem that holds the problem
  itself (its numbers and a good share of its wording) counts only when its own question names
  the step it computed; a generic probe ("the first quantity you need to compute") leaves the
  decomposition to the worker.
- `reachable` (independence.py): a subproblem counts only when its result follows from the
  problem's numbers it states: "What is 3 * 3?" returns the 9 of `16-3-4=9` without carrying any
  of that step's operands, so the planner, not the worker, did the step.

An operand is available to a text when the text states it (in any notation: the 1.5 of "150%",
the 0.5 of "half") or when it is a constant the problem never states and no step
computes (the 100 of a percentage, the 7 days of a week).
"""

from __future__ import annotations

import re

from vf_planner.answers import among, calculator_steps, numbers_in
from vf_planner.notation import given_numbers, mask_numbers, stated_numbers
from vf_planner.quantities import asked_words, names_quantity, own_question, step_quantities


def solution_results(solution: str, gold: float | None) -> list[float]:
    """The numbers the solution computes: its annotated results and the answer (every number of
    its text when it has no annotations)."""
    steps = calculator_steps(solution)
    work = solution.rpartition("####")[0] if "####" in solution else solution
    results = [step.value for step in steps] if steps else numbers_in(work)
    return results + ([gold] if gold is not None else [])


def reachable(text: str, question: str, solution: str) -> list[float]:
    """The results of the solution's steps that follow from the problem's numbers `text` states,
    repeated until nothing new follows. Empty for a solution without annotated steps."""
    steps = calculator_steps(solution)
    given = given_numbers(question)
    results = [step.value for step in steps]
    known = [n for n in given_numbers(text) if among(n, given)]

    def available(operand: float) -> bool:
        return among(operand, known) or not (among(operand, given) or among(operand, results))

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


def stated_result(text: str, question: str, solution: str, gold: float | None) -> float | None:
    """A result of the solution that `text` states and the problem does not give, or None."""
    results = solution_results(solution, gold)
    given = given_numbers(question)
    computed = (n for n in sorted(stated_numbers(text)) if among(n, results))
    return next((n for n in computed if not among(n, given)), None)


def plan_leak(
    plan: str, subproblems: list[str], question: str, solution: str, gold: float | None
) -> str | None:
    """Why the plan's texts state the work themselves, or None when they do not.

    The plan text and the subproblems may state the problem's numbers, the numbers its words
    imply and unit constants, never a result the workers were to compute: the answer, or an
    intermediate value the planner worked out itself (in digits, words, fractions, Roman
    numerals, with or without units)."""
    for name, text in [("the plan", plan), *(("a subproblem", sub) for sub in subproblems)]:
        number = stated_result(text, question, solution, gold)
        if number is not None:
            return f"{name} states {number:g}, a result the workers were to compute"
    return None


def problem_numbers_used(question: str, solution: str) -> list[float]:
    """The numbers the problem gives that the solution's steps use as operands (an operand that
    an earlier step computed is that step's result, not the problem's number)."""
    given = given_numbers(question) - {0.0, 1.0, 100.0}
    steps = calculator_steps(solution)
    used: list[float] = []
    for index, step in enumerate(steps):
        earlier = [s.value for s in steps[:index]]
        for operand in step.operands:
            if among(operand, given) and not among(operand, earlier + used):
                used.append(operand)
    return used


def carries_whole_problem(subproblem: str, question: str, solution: str) -> bool:
    """Whether the subproblem states every number of the problem that the solution uses."""
    used = problem_numbers_used(question, solution)
    carried = given_numbers(subproblem)
    return bool(used) and all(among(n, carried) for n in used)


# The share of the problem's word trigrams above which a text holds the problem's own wording.
PASTED_SHARE = 0.5


def _trigrams(text: str) -> set[tuple[str, ...]]:
    words = re.findall(r"\w+", text.lower())
    return {tuple(words[i : i + 3]) for i in range(len(words) - 2)}


def wording_share(text: str, question: str) -> float:
    """The share of the problem's word trigrams that `text` holds."""
    wording = _trigrams(question)
    return len(_trigrams(text) & wording) / len(wording) if wording else 0.0


# The share of the problem's word trigrams above which a text that states every number the
# solution uses holds the problem (the problem reworded by rule, statements reordered and
# numbers spelled out, keeps 38% of them or more on GSM8K test rows 950-1319; the honest corpus's
# subproblems other than copied sentences keep at most 33%).
REWORDED_SHARE = 0.35


def holds_problem(subproblem: str, question: str, solution: str) -> bool:
    """Whether the subproblem is the problem itself, not a part of it: it states every number of
    the problem the solution uses and holds 35% of its wording, or it states all but one of
    them and holds half of its wording (the problem copied with its last operand set to 1 or 0
    is still the problem); for a solution that uses no number of the problem's own, half of
    its wording."""
    used = problem_numbers_used(question, solution)
    carried = given_numbers(subproblem)
    missing = sum(not among(n, carried) for n in used)
    if missing > 1 or (used and missing == len(used)):
        return False
    share = wording_share(subproblem, question)
    return share >= (PASTED_SHARE if missing or not used else REWORDED_SHARE)


def names_step(subproblem: str, question: str, solution: str, result: float | None) -> bool:
    """Whether the subproblem's own question names the step whose value it returned: it is not
    the problem's own question (copied from it), and the one quantity it asks for is the one
    that step's line of the reference solution computes ("How many minutes does he spend on the
    small holes?" for "He spends 3*30=<<3*30=90>>90 minutes digging small holes";
    quantities.py). A generic probe ("the first quantity you need to compute", "which quantity
    about <every word of the problem> ...") names none: the worker, not the planner, chose the
    step."""
    asked = own_question(subproblem)
    words = " ".join(re.findall(r"\w+", mask_numbers(asked).lower()))
    if words and words in " ".join(re.findall(r"\w+", mask_numbers(question).lower())):
        return False  # the problem's own question (any number changed): it asks the whole problem
    named = asked_words(asked)
    if not named:
        return False
    quantities = [q for line in solution.splitlines() for q in step_quantities(line)]
    steps = calculator_steps(solution)
    for index, (step, quantity) in enumerate(zip(steps, quantities, strict=False)):
        others = {w for j, q in enumerate(quantities) if j != index for w in q.words}
        if among(result, [step.value]) and names_quantity(named, quantity, others):
            return True
    return False


def pastes_problem(text: str, question: str, solution: str) -> bool:
    """Whether `text` holds the problem itself: every number the solution uses, and at least
    half of the problem's wording (its word trigrams; an honest plan that names quantities in
    its own words reuses under 40% of them, a pasted problem 65% or more even with its numbers
    spelled out)."""
    if not carries_whole_problem(text, question, solution):
        return False
    wording = _trigrams(question)
    return len(_trigrams(text) & wording) >= PASTED_SHARE * len(wording)
