"""The MuSiQue rubric: answer (EM, F1), evidence (retrieval, citations), format, combined reward.

Everything is read from the completion and the row's `info`, never from live rollout state, so
saved results (dict messages, tool calls as JSON strings) score the same as fresh rollouts.

combined = format * hop_weight * (0.35 EM + 0.35 F1 + 0.20 citation F1 + 0.10 retrieval recall)

* format is 1 only when a `submit_answer` call was accepted; without one the reward is 0.
* EM and F1 use SQuAD normalisation, best over the answer and its aliases.
* citation F1 is the harmonic mean of citation precision and recall against the supporting
  paragraphs, so citing every document scores lower than citing the right ones.
* retrieval recall is the share of supporting paragraphs that appeared in tool outputs.
* hop_weight is 1, or with hop weighting on, n_hops / 4 (2-hop 0.5, 3-hop 0.75, 4-hop 1.0): it
  scales a question's whole reward, i.e. its weight in the policy gradient.

The reward lies in [0, 1]; every term is also logged as a metric.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

import verifiers as vf

from .messages import tool_calls
from .replies import get_field, message_text
from .scoring import best_over_golds, exact_match, f_score, precision_recall, token_f1
from .tools import ERROR_PREFIX, SUBMITTED_MESSAGE, Submission, ToolUseError, parse_submission

DEFAULT_WEIGHTS: dict[str, float] = {
    "exact_match": 0.35,
    "f1": 0.35,
    "citation_f1": 0.20,
    "retrieval_recall": 0.10,
}
MAX_HOPS = 4
_DOC_ID_LINE = re.compile(r"^Document ID: (\d+)$", re.MULTILINE)


@dataclass(frozen=True)
class RolloutFacts:
    """What the rubric needs from one completion."""

    submission: Submission | None
    retrieved: frozenset[int]
    tool_errors: int


def _accepted_submission(completion: list[Any], accepted_ids: set[str]) -> Submission | None:
    """The submit_answer call whose tool reply was the acceptance message."""
    for message in completion:
        for call in tool_calls(message):
            if call.name != "submit_answer" or call.id not in accepted_ids:
                continue
            try:
                args = json.loads(call.arguments)
                return parse_submission(args.get("answer"), args.get("cited_doc_ids"))
            except (json.JSONDecodeError, AttributeError, ToolUseError):
                return None
    return None


def read_rollout(completion: Any) -> RolloutFacts:
    """Accepted submission, documents shown by the tools, and the number of error replies."""
    messages = completion if isinstance(completion, list) else []
    tool_replies = [m for m in messages if get_field(m, "role") == "tool"]
    errors = [m for m in tool_replies if message_text(m).startswith(ERROR_PREFIX)]
    results = [
        message_text(m) for m in tool_replies if not message_text(m).startswith(ERROR_PREFIX)
    ]
    accepted = {
        str(get_field(m, "tool_call_id"))
        for m in tool_replies
        if message_text(m) == SUBMITTED_MESSAGE
    }
    retrieved = frozenset(int(i) for text in results for i in _DOC_ID_LINE.findall(text))
    return RolloutFacts(_accepted_submission(messages, accepted), retrieved, len(errors))


def hop_weight(info: dict[str, Any], enabled: bool) -> float:
    """n_hops / 4 clipped to [0.5, 1] when hop weighting is on, else 1."""
    if not enabled:
        return 1.0
    hops = min(max(int(info.get("n_hops", 2)), 2), MAX_HOPS)
    return hops / MAX_HOPS


def score_components(completion: Any, info: dict[str, Any]) -> dict[str, float]:
    """Every rubric term for one rollout, each in [0, 1] (tool_errors is a count)."""
    facts = read_rollout(completion)
    gold_docs = set(info.get("supporting_ids") or [])
    answer = facts.submission.answer if facts.submission else None
    cited = set(facts.submission.cited_doc_ids) if facts.submission else set()
    retrieval_p, retrieval_r = precision_recall(set(facts.retrieved), gold_docs)
    citation_p, citation_r = precision_recall(cited, gold_docs)
    golds = info.get("answers") or []
    submitted = facts.submission is not None
    return {
        "exact_match": best_over_golds(exact_match, answer, golds),
        "f1": best_over_golds(token_f1, answer, golds),
        "retrieval_recall": retrieval_r,
        "retrieval_precision": retrieval_p,
        "citation_recall": citation_r if submitted else 0.0,
        "citation_precision": citation_p if submitted else 0.0,
        "citation_f1": f_score(citation_p, citation_r) if submitted else 0.0,
        "format": float(submitted),
        "tool_errors": float(facts.tool_errors),
    }


def combine(components: dict[str, float], weights: dict[str, float], hop_w: float) -> float:
    """format * hop_weight * weighted sum of the weighted terms."""
    weighted = math.fsum(weight * components[name] for name, weight in weights.items())
    return min(1.0, components["format"] * hop_w * weighted)


def check_weights(weights: dict[str, float]) -> dict[str, float]:
    """Known terms, non-negative, summing to 1, so the reward stays within [0, 1]."""
    unknown = sorted(set(weights) - set(DEFAULT_WEIGHTS))
    if unknown:
        raise ValueError(
            f"reward_weights: unknown term(s) {unknown}; use {sorted(DEFAULT_WEIGHTS)}"
        )
    if any(w < 0 for w in weights.values()) or abs(math.fsum(weights.values()) - 1.0) > 1e-9:
        raise ValueError(f"reward_weights must be non-negative and sum to 1; got {weights}")
    return dict(weights)


class MuSiQueRubric(vf.Rubric):
    """combined_reward (weight 1) plus every component as a zero-weight metric."""

    METRICS = (
        "exact_match",
        "f1",
        "retrieval_recall",
        "retrieval_precision",
        "citation_recall",
        "citation_precision",
        "citation_f1",
        "format",
        "tool_errors",
    )

    def __init__(
        self,
        reward_weights: dict[str, float] | None = None,
        hop_weighting: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.reward_weights = check_weights(reward_weights or DEFAULT_WEIGHTS)
        self.hop_weighting = hop_weighting
        self.add_reward_func(self.combined_reward, weight=1.0)
        for name in self.METRICS:
            self.add_metric(self._metric(name))
        self.add_metric(self.hop_weight)

    def _metric(self, name: str):
        async def metric(completion: Any, info: dict[str, Any]) -> float:
            return score_components(completion, info)[name]

        metric.__name__ = name
        return metric

    async def hop_weight(self, info: dict[str, Any]) -> float:
        return hop_weight(info, self.hop_weighting)

    async def combined_reward(self, completion: Any, info: dict[str, Any]) -> float:
        components = score_components(completion, info)
        return combine(components, self.reward_weights, hop_weight(info, self.hop_weighting))
