"""The independence term: the share of a plan's subproblems that did a distinct piece of the work.

A subproblem counts when it is not a verbatim copy of the problem's text and the worker, seeing
only that subproblem, computed a result that

- is an intermediate result of the reference solution (GSM8K's `<<...=result>>` annotations)
  that follows from the problem's own numbers the subproblem states (steps.py): the subproblem
  must carry the operands of the step it claims, so "What is 3 * 3?" earns nothing for the 9 of
  `16-3-4=9`, and neither does arithmetic on numbers the planner worked out itself,
- is not a number the subproblem itself states, in any notation (notation.py: "triples", "half",
  "60%" as 0.6): the worker must have computed it, not copied it (a result that equals another
  number of the problem still counts when the subproblem does not state it: the worker saw only
  the subproblem),
- is not the final answer (a subproblem that alone yields the answer did not decompose anything),
  unless an earlier step of the solution has the same value (row 19: 6 miles left, 6 mph),
- no earlier subproblem of the plan already produced it,
- and, for a subproblem that holds the problem itself (every number the solution uses and 35%
  of its wording, or all but one and half of it: steps.holds_problem), its own question names the
  step it computed (steps.names_step): the problem with a generic probe ("What is the first
  quantity you need to compute?", "the value before the final step") or with the problem's own
  question leaves the decomposition to the worker, whatever the worker then returns.

    I = counted subproblems / subproblems         in [0, 1]; 0 for an atomic plan

Apart from the copy check, the term is read from what the worker computed, not from the wording
of the subproblems: restating the whole problem (its result is the final answer), sentences that
only state facts (the worker can only restate their numbers), or unrelated questions (their
results are no step of the solution) earn nothing, however they are paraphrased. A paraphrased
sentence counts only where it holds a whole computation step of the solution and the worker does
that step, i.e. where it is a real subproblem.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from vf_planner.answers import among, calculator_steps, intermediate_values
from vf_planner.notation import stated_numbers
from vf_planner.steps import holds_problem, names_step, reachable

_WORDS = re.compile(r"\w+")


def copied_from(subproblem: str, question: str) -> bool:
    """Whether the subproblem's words appear, in order and adjacent, in the problem's text."""
    words = " ".join(_WORDS.findall(subproblem.lower()))
    text = " ".join(_WORDS.findall(question.lower()))
    return bool(words) and f" {words} " in f" {text} "


@dataclass(frozen=True)
class Independence:
    score: float
    counted: list[bool]
    delegated: list[bool] = field(default_factory=list)
    """Per subproblem: it holds the whole problem and its question names no step it computed
    (the worker, not the planner, chose what it computed)."""


def independence(
    question: str,
    solution: str,
    gold: float | None,
    subproblems: list[str],
    results: list[float | None],
) -> Independence:
    """I for a decomposed plan, with which subproblems counted (see the module docstring)."""
    intermediates = intermediate_values(solution)
    annotated = bool(calculator_steps(solution))
    final = {gold} if gold is not None and not among(gold, intermediates[:-1]) else set()
    counted: list[bool] = []
    delegated: list[bool] = []
    found: list[float] = []
    for subproblem, result in zip(subproblems, results, strict=True):
        carried = reachable(subproblem, question, solution) if annotated else intermediates
        whole = holds_problem(subproblem, question, solution)
        delegated.append(whole and not names_step(subproblem, question, solution, result))
        new = (
            not copied_from(subproblem, question)
            and not delegated[-1]
            and among(result, carried)
            and not among(result, final | stated_numbers(subproblem))
            and not among(result, found)
        )
        counted.append(new)
        if new and result is not None:
            found.append(result)
    score = sum(counted) / len(subproblems) if subproblems else 0.0
    return Independence(score=score, counted=counted, delegated=delegated)
