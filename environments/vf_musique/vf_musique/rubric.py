"""The MuSiQue rubric: the answerability decision, answer (EM, F1), evidence (citations,
retrieval), format, combined reward.

Everything is read from the completion and the row's `info`, never from live rollout state, so
saved results (dict messages, tool calls as JSON strings) score the same as fresh rollouts.

    answerable row, answer given:         0.35 EM + 0.35 F1 + 0.20 citation F1 + 0.10 retrieval
    answerable row, a refusal:            0
    unanswerable row, a refusal:          if backed ("earned"): 0.80 + 0.20 citation F1, else 0
    unanswerable row, answer given:       0
    no accepted submit_answer call:       0

* "unanswerable" is backed when the agent did what finding the gap takes (`backed`). MuSiQue-Full
  removes the evidence of one hop and keeps the supporting paragraphs of the hops before it, so
  the agent must have been shown and have cited every supporting paragraph the row keeps, and
  have searched for the first missing hop with a focused query (`hops`): one that asks for that
  hop (names the earlier answers it builds on, or holds at least half of a first hop's terms)
  and for nothing else (no term of another hop's sub-question beyond the hop's own, and not the
  whole question), within a few distinct searches per hop (`hops.few_searches`). No search,
  junk searches, the question searched again and again, with small changes or extra words,
  or a shotgun of question slices back nothing. A refusal is "unanswerable" in any common
  phrasing and package (`refusals.is_refusal`).

* EM and F1 use SQuAD normalisation, best over the answer and its aliases; an answer in a form
  a correct answer takes ("in 2003", "Pittsburgh, Pennsylvania", "1895-03-14") is the gold
  (`answers.judge_answer`), whatever wraps it ("The answer is probably Stanley [3].",
  '{"answer": "Stanley"}': `wrappers`); a reply is scored by the answer it commits to, right or
  wrong, and a refusal beside a guess commits to neither.
* citation precision and recall count a cited paragraph as right only when it supports the answer
  and a search showed it in this episode: citing a paragraph never shown costs precision, not the
  answer. Citation F1 is their harmonic mean, so citing everything scores lower than citing the
  right ones.
* retrieval = recall x min(1, budget / shown): recall is the share of supporting paragraphs that
  searches showed; `shown` counts the distinct paragraphs shown; the budget is top_n (the
  environment's default) per hop. Searching hop by hop with the default top_n keeps the factor at
  1; showing every paragraph (two searches with top_n=10) divides the term by about three.

The reward lies in [0, 1]; every term is also logged as a metric, and so is the answerability
decision (see `answerability`).
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import verifiers as vf

from .answers import AnswerContext, is_refusal, judge_answer
from .dataset import UNANSWERABLE
from .hops import content_terms, distinct_searches, few_searches, searched_missing_hop
from .messages import ParsedToolCall, tool_calls
from .outcome_rubric import OutcomeRubric
from .replies import get_field, message_text
from .scoring import (
    best_over_golds,
    exact_match,
    f_score,
    precision_recall,
    token_f1,
)
from .tools import (
    DEFAULT_TOP_N,
    ERROR_PREFIX,
    SUBMITTED_MESSAGE,
    Submission,
    ToolUseError,
    parse_submission,
)

DEFAULT_WEIGHTS: dict[str, float] = {
    "exact_match": 0.35,
    "f1": 0.35,
    "citation_f1": 0.20,
    "retrieval_score": 0.10,
}
_DOC_ID_LINE = re.compile(r"^Document ID: (\d+)$", re.MULTILINE)


@dataclass(frozen=True)
class RolloutFacts:
    """What the rubric needs from one completion."""

    submission: Submission | None
    retrieved: frozenset[int]
    queries: tuple[Counter[str], ...]
    tool_errors: int


def _arguments(call: ParsedToolCall) -> dict[str, Any]:
    try:
        args = json.loads(call.arguments)
    except (ValueError, RecursionError):  # also 5,000-digit numbers and deep nesting
        return {}
    return args if isinstance(args, dict) else {}


def _search_terms(calls: Iterable[ParsedToolCall]) -> tuple[Counter[str], ...]:
    """Answered searches' queries as content terms; a query of stopwords alone is none."""
    queries = (content_terms(str(_arguments(c).get("query", ""))) for c in calls)
    return tuple(query for query in queries if query)


def backed(facts: RolloutFacts, cited: set[int], info: Mapping[str, Any]) -> bool:
    """An "unanswerable" verdict backed by the work that finds the gap: every supporting
    paragraph the row keeps was shown and cited, and a focused search looked for the first
    missing hop (`hops.searched_missing_hop`)."""
    evidence = set(info.get("supporting_ids") or [])
    found = evidence <= set(facts.retrieved) and evidence <= cited
    aimed = few_searches(facts.queries, int(info.get("n_hops") or len(info.get("hops") or [])))
    return found and aimed and searched_missing_hop(facts.queries, info)


def read_rollout(completion: Any) -> RolloutFacts:
    """Accepted submission, documents shown by the tools, answered searches' terms, and the
    number of error replies."""
    messages = completion if isinstance(completion, list) else []
    replies = {
        str(get_field(m, "tool_call_id")): message_text(m)
        for m in messages
        if get_field(m, "role") == "tool"
    }
    calls = [call for m in messages for call in tool_calls(m) if call.id in replies]
    answered = [c for c in calls if not replies[c.id].startswith(ERROR_PREFIX)]
    submission = None
    for call in answered:
        if call.name == "submit_answer" and replies[call.id].startswith(SUBMITTED_MESSAGE):
            args = _arguments(call)
            try:
                submission = parse_submission(args.get("answer"), args.get("cited_doc_ids"))
            except ToolUseError:
                submission = None
            break
    searches = [c for c in answered if c.name == "retrieve_documents"]
    shown = frozenset(int(i) for c in searches for i in _DOC_ID_LINE.findall(replies[c.id]))
    errors = sum(1 for text in replies.values() if text.startswith(ERROR_PREFIX))
    return RolloutFacts(submission, shown, _search_terms(searches), errors)


def answer_scores(
    answer: str | None, claimed: bool, answerable: bool, info: Mapping[str, Any]
) -> tuple[float, float]:
    """Exact match and token F1 of the answer. On an unanswerable row only a refusal (in any
    phrasing) is right; on an answerable row a form of the gold or an alias (`answers`) counts
    as the gold, anything else gets SQuAD EM and F1, best over the golds. A wrapped reply is
    scored by the answer it commits to (`answers.judge_answer`)."""
    if not answerable:
        return float(claimed), float(claimed)
    golds = [str(gold) for gold in info.get("answers") or []]
    em = best_over_golds(exact_match, answer, golds)
    matched, scored = judge_answer(answer, golds, AnswerContext(info))
    if em or matched is not None:
        return 1.0, 1.0
    return em, best_over_golds(token_f1, scored, golds)


def score_components(
    completion: Any, info: Mapping[str, Any], top_n: int = DEFAULT_TOP_N
) -> dict[str, float]:
    """Every rubric term for one rollout (rewarded terms in [0, 1]; counts are logged only);
    `top_n` is the environment's default documents per search (the retrieval budget per hop)."""
    facts = read_rollout(completion)
    submitted = facts.submission is not None
    gold_docs = set(info.get("supporting_ids") or [])
    answer = facts.submission.answer if submitted else None
    cited = set(facts.submission.cited_doc_ids) if submitted else set()
    retrieval_p, retrieval_r = precision_recall(set(facts.retrieved), gold_docs)
    citation_p, citation_r = precision_recall(cited, gold_docs, credited=set(facts.retrieved))
    budget = int(info.get("n_hops", 2)) * top_n
    economy = min(1.0, budget / len(facts.retrieved)) if facts.retrieved else 1.0
    claimed = submitted and is_refusal(answer, UNANSWERABLE)
    answerable = bool(info.get("answerable", True))
    golds = info.get("answers") or []
    em, f1 = answer_scores(answer, claimed, answerable, info)
    earned = claimed and backed(facts, cited, info)
    return {
        "correct": em if answerable else float(earned),
        "exact_match": em,
        "f1": f1,
        "squad_exact_match": best_over_golds(exact_match, answer, golds),
        "retrieval_recall": retrieval_r,
        "retrieval_precision": retrieval_p,
        "retrieval_score": retrieval_r * economy,
        "docs_shown": float(len(facts.retrieved)),
        "citation_recall": citation_r if submitted else 0.0,
        "citation_precision": citation_p if submitted else 0.0,
        "citation_f1": f_score(citation_p, citation_r) if submitted else 0.0,
        "format": float(submitted),
        "searches": float(distinct_searches(facts.queries)),
        "said_unanswerable": float(claimed),
        "unanswerable_hit": float(claimed and not answerable),
        "unanswerable_miss": float(not claimed and not answerable),
        "unanswerable_earned": float(earned),
        "tool_errors": float(facts.tool_errors),
    }


def combine(
    components: Mapping[str, float], weights: Mapping[str, float], answerable: bool
) -> float:
    """The combined reward (module docstring): the answerability decision first, then the
    weighted answer and evidence terms on answerable rows."""
    if not components["format"]:
        return 0.0
    if not answerable:
        cite = weights.get("citation_f1", 0.0)
        return components["unanswerable_earned"] * (1.0 - cite + cite * components["citation_f1"])
    if components["said_unanswerable"]:
        return 0.0
    weighted = math.fsum(weight * components[name] for name, weight in weights.items())
    return min(1.0, weighted)


def answerability(rollouts: Iterable[Mapping[str, float]]) -> dict[str, float]:
    """Precision and recall of the "unanswerable" decision over rollouts' metrics (or over the
    means a trainer logs: the ratios are the same). NaN where nothing was claimed / missed."""
    totals = {"said_unanswerable": 0.0, "unanswerable_hit": 0.0, "unanswerable_miss": 0.0}
    for metrics in rollouts:
        for name in totals:
            totals[name] += metrics[name]
    hit, said = totals["unanswerable_hit"], totals["said_unanswerable"]
    relevant = hit + totals["unanswerable_miss"]
    return {
        "precision": hit / said if said else math.nan,
        "recall": hit / relevant if relevant else math.nan,
    }


def check_weights(weights: Mapping[str, float]) -> dict[str, float]:
    """Known terms, non-negative, summing to 1, so the reward stays within [0, 1]."""
    unknown = sorted(set(weights) - set(DEFAULT_WEIGHTS))
    if unknown:
        raise ValueError(
            f"reward_weights: unknown term(s) {unknown}; use {sorted(DEFAULT_WEIGHTS)}"
        )
    if any(w < 0 for w in weights.values()) or abs(math.fsum(weights.values()) - 1.0) > 1e-9:
        raise ValueError(f"reward_weights must be non-negative and sum to 1; got {weights}")
    return dict(weights)


@dataclass(frozen=True)
class ScoredRollout:
    """The outcome of one rollout: every rubric term (`score_components`) and whether its row
    is answerable."""

    components: Mapping[str, float]
    answerable: bool


class MuSiQueRubric(OutcomeRubric[ScoredRollout]):
    """combined_reward (weight 1) plus every component as a zero-weight metric."""

    METRICS = (
        "correct",
        "exact_match",
        "f1",
        "squad_exact_match",
        "retrieval_recall",
        "retrieval_precision",
        "retrieval_score",
        "docs_shown",
        "citation_recall",
        "citation_precision",
        "citation_f1",
        "format",
        "searches",
        "said_unanswerable",
        "unanswerable_hit",
        "unanswerable_miss",
        "unanswerable_earned",
        "tool_errors",
    )

    def __init__(
        self,
        reward_weights: Mapping[str, float] | None = None,
        top_n: int = DEFAULT_TOP_N,
        parser: vf.Parser | None = None,
    ) -> None:
        metrics = {name: _component(name) for name in self.METRICS}
        scores = {"combined_reward": self.combined_reward, **metrics}
        super().__init__(scores, {"combined_reward": 1.0}, parser)
        self.reward_weights = check_weights(reward_weights or DEFAULT_WEIGHTS)
        self.top_n = top_n

    async def read_outcome(self, state: vf.State) -> ScoredRollout:
        """Scores the completion and the row's `info` (never live rollout state)."""
        info = state.get("info", {})
        components = score_components(state["completion"], info, self.top_n)
        return ScoredRollout(components, bool(info.get("answerable", True)))

    def combined_reward(self, rollout: ScoredRollout) -> float:
        return combine(rollout.components, self.reward_weights, rollout.answerable)


def _component(name: str) -> Callable[[ScoredRollout], float]:
    return lambda rollout: rollout.components[name]
