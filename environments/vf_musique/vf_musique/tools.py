"""The two tools the model sees, and the validation of a submission.

Both take a hidden `state` argument that the environment injects from the rollout (it is removed
from the tool schema): `retrieve_documents` reaches the question's own paragraphs through it and
records which document IDs it has shown; `submit_answer` stores the accepted submission in it.
Problems raise `ToolUseError`, whose message becomes the tool reply, so the model can correct
itself and the rollout goes on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .retrieval import QuestionIndex, Retriever, format_documents

MAX_TOP_N = 10
DEFAULT_TOP_N = 3
MAX_ANSWER_WORDS = 20
SUBMITTED_MESSAGE = "Answer submitted."
ERROR_PREFIX = "Error: "
SLOW_RETRIEVERS = frozenset({"semantic", "hybrid"})


class ToolUseError(Exception):
    """A mistake in a tool call, explained to the model in the tool reply."""


@dataclass(frozen=True)
class Submission:
    answer: str
    cited_doc_ids: tuple[int, ...]


def _doc_id(value: Any) -> int:
    """A document ID given as an int or a string of digits."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    raise ToolUseError(f'cited_doc_ids must hold document IDs such as "3"; got {value!r}')


def parse_submission(answer: Any, cited_doc_ids: Any) -> Submission:
    """A single short answer string and a list of document IDs, or a ToolUseError saying why not.

    A list of candidate answers is refused outright; a long string is refused too, so hedging
    with many candidates in one string cannot be submitted either. "One line" means no line
    break of any kind (\\n, \\r, \\r\\n, the Unicode line and paragraph separators): the rule
    str.splitlines applies."""
    if not isinstance(answer, str):
        raise ToolUseError(
            f"answer must be one string (a single answer, not a list); got {type(answer).__name__}"
        )
    answer = answer.strip()
    if not answer:
        raise ToolUseError("answer is empty; submit a single short answer")
    if len(answer.splitlines()) > 1 or len(answer.split()) > MAX_ANSWER_WORDS:
        raise ToolUseError(
            f"answer must be a single short answer on one line of at most {MAX_ANSWER_WORDS} "
            "words (a name, date, number or phrase), not a sentence or a list of candidates"
        )
    if not isinstance(cited_doc_ids, list):
        raise ToolUseError(
            'cited_doc_ids must be a list of document IDs such as ["3", "7"]; '
            f"got {cited_doc_ids!r}"
        )
    cited = tuple(dict.fromkeys(_doc_id(value) for value in cited_doc_ids))
    return Submission(answer=answer, cited_doc_ids=cited)


def make_retrieve_documents(
    index_for: Callable[[dict[str, Any]], QuestionIndex], retriever: Retriever, default_top_n: int
) -> Callable[..., Any]:
    """The search tool for one environment configuration (retriever and default `top_n`)."""

    async def retrieve_documents(query: str, top_n: int = default_top_n, state: Any = None) -> str:
        """Search the documents available for this question.

        Ask about one fact at a time (one hop of the question) and use what you learn to write
        the next query.

        Args:
            query: A short search query, e.g. "Van Hook Township county".
            top_n: How many documents to return (1 to 10).

        Returns:
            Blocks that each start with "Document ID: <id>", then the title and the text.
        """
        if not isinstance(query, str) or not query.strip():
            raise ToolUseError("query must be a non-empty string")
        if isinstance(top_n, bool) or not isinstance(top_n, int) or not 1 <= top_n <= MAX_TOP_N:
            raise ToolUseError(f"top_n must be an integer from 1 to {MAX_TOP_N}; got {top_n!r}")
        index = index_for(state["info"])
        if retriever in SLOW_RETRIEVERS:  # embedding a query must not stall the event loop
            docs = await asyncio.to_thread(index.search, query, retriever, top_n)
        else:
            docs = index.search(query, retriever, top_n)
        seen = state["seen_doc_ids"]
        seen.extend(d.idx for d in docs if d.idx not in seen)
        return format_documents(docs)

    return retrieve_documents


def submit_answer(answer: str, cited_doc_ids: list[str], state: Any = None) -> str:
    """Submit your final answer with the IDs of the documents that support it. This ends the
    episode, so call it once, after you have found the evidence.

    Args:
        answer: One short answer (a name, date, number or phrase), not a sentence or a list.
        cited_doc_ids: IDs of the retrieved documents that support the answer, e.g. ["3", "7"].

    Returns:
        A confirmation, or an error explaining what to fix.
    """
    submission = parse_submission(answer, cited_doc_ids)
    seen = state["seen_doc_ids"]
    unseen = [doc_id for doc_id in submission.cited_doc_ids if doc_id not in seen]
    state["submission"] = {
        "answer": submission.answer,
        "cited_doc_ids": list(submission.cited_doc_ids),
    }
    if unseen:  # accepted: an unseen citation costs citation precision, not the answer
        return (
            f"{SUBMITTED_MESSAGE} Document ID(s) {unseen} were never returned by "
            "retrieve_documents in this episode and count as wrong citations."
        )
    return SUBMITTED_MESSAGE
