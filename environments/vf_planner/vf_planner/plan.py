"""The planner's output format and its parser.

The planner answers with one JSON object `{"should_decompose": bool, "subproblems": [...],
"plan": str}`, bare or in a ``` fence, possibly after reasoning (only the text after it is read,
see replies.strip_reasoning). Parsing is lenient about where the object sits and how subproblems
are spelled, and strict about what it means: a plan that asks for decomposition without
subproblems, or with more than allowed, is malformed (scored 0), because guessing what the
planner meant would reward plans it did not make.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import verifiers as vf

from vf_planner.replies import last_reply_text, strip_reasoning

_FENCE = re.compile(r"```(?:json|JSON)?\s*\n?(.*?)```", re.DOTALL)
# Only the end of a reply is searched for the plan: each `{` costs a decode attempt, whose error
# costs a scan of the text before it, so an unbounded reply ("{" * 200_000) would block the
# event loop for seconds. A plan of max_subproblems questions fits with room to spare.
MAX_PLAN_CHARS = 8_000
# Keys under which a subproblem given as an object may carry its text.
_SUBPROBLEM_KEYS = ("question", "subproblem", "problem", "text", "description", "task")


class PlanError(ValueError):
    """The planner's reply is not a usable plan; the message says why (it is logged)."""


@dataclass(frozen=True)
class Plan:
    """A parsed planner decision. `subproblems` is empty for an atomic plan."""

    should_decompose: bool
    subproblems: list[str] = field(default_factory=list)
    plan: str = ""


def _json_objects(text: str) -> list[dict[str, Any]]:
    """Every JSON object that starts somewhere in `text` and decodes cleanly. Anything the
    decoder raises (RecursionError for deep nesting, ValueError for a 5,000-digit integer) only
    means no object starts there: a reply can make a plan malformed, never crash the rollout."""
    decoder = json.JSONDecoder()
    found = []
    for start in (m.start() for m in re.finditer(r"\{", text)):
        try:
            obj, _ = decoder.raw_decode(text, start)
        except (ValueError, RecursionError):
            continue
        if isinstance(obj, dict):
            found.append(obj)
    return found


def _as_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise PlanError(f"should_decompose must be true or false, got {value!r}")


def _as_subproblem(item: Any) -> str:
    if isinstance(item, Mapping):
        item = next((item[k] for k in _SUBPROBLEM_KEYS if isinstance(item.get(k), str)), None)
    if not isinstance(item, str) or not item.strip():
        raise PlanError(f"each subproblem must be a non-empty string, got {item!r}")
    return item.strip()


def parse_plan(text: str, max_subproblems: int) -> Plan:
    """Parse the planner's reply; raise PlanError with the reason when it is not a usable plan.

    The last JSON object that has a `should_decompose` key wins (fenced objects first), so an
    example restated in the reasoning does not shadow the final answer; it must lie within the
    last MAX_PLAN_CHARS characters of the answer part.
    """
    text = strip_reasoning(text)[-MAX_PLAN_CHARS:]
    candidates = [obj for block in _FENCE.findall(text) for obj in _json_objects(block)]
    candidates = candidates or _json_objects(text)
    plans = [obj for obj in candidates if "should_decompose" in obj]
    if not plans:
        raise PlanError("no JSON object with a should_decompose key")
    raw = plans[-1]
    should_decompose = _as_bool(raw["should_decompose"])
    plan_text = raw.get("plan", "")
    if not isinstance(plan_text, str):
        raise PlanError(f"plan must be a string, got {plan_text!r}")
    if not should_decompose:
        return Plan(should_decompose=False, subproblems=[], plan=plan_text.strip())
    items = raw.get("subproblems")
    if not isinstance(items, list) or not items:
        raise PlanError("should_decompose is true but subproblems is not a non-empty list")
    if len(items) > max_subproblems:
        raise PlanError(f"{len(items)} subproblems, more than max_subproblems={max_subproblems}")
    return Plan(True, [_as_subproblem(item) for item in items], plan_text.strip())


class PlanParser(vf.Parser):
    """verifiers parser for the planner's reply; `parse_answer` gives the plan as JSON or None."""

    def __init__(self, max_subproblems: int) -> None:
        super().__init__()
        self.max_subproblems = max_subproblems

    def parse_plan(self, completion: vf.Messages) -> Plan:
        """The plan in the last assistant message; raises PlanError when malformed."""
        return parse_plan(last_reply_text(completion), self.max_subproblems)

    def parse_answer(self, completion: vf.Messages) -> str | None:
        try:
            return json.dumps(asdict(self.parse_plan(completion)))
        except PlanError:
            return None
