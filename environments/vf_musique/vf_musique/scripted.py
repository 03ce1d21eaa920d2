"""A scripted demonstrator for warm starts: `hop_searcher` uses the tools as a good model would.

A model that never calls `retrieve_documents` well gives GRPO nothing to learn from, so the warm
start is SFT on demonstrations (`rlvr-demos --policy vf_musique.scripted:hop_searcher
--policy-args '{"data_files": ...}'`). The demonstrator knows its row (looked up by the question
text in the MuSiQue files it is given: it is an oracle for *what* to ask) but plays by the
rules a model plays by:

- one search per hop, in its own words: the hop's sub-question with the earlier hops' answers
  filled in, phrased by one of several templates chosen by the seed (a model fine-tuned on the
  rollouts must not learn one string);
- it reads the tool results: a hop counts as found only when a document the tool returned is
  that hop's supporting paragraph (matched by title and text, so the twin rows of MuSiQue-Full,
  which share a question, are told apart by what the search showed); a hop not found is asked
  again in other words with more documents, once;
- it cites the documents it used (the supporting paragraphs the searches showed) and answers in
  the environment's format (`submit_answer`: one short answer, the IDs as strings);
- where the system prompt allows "unanswerable" (MuSiQue-Full) and a hop's paragraph is not
  found after the retry, it stops there and declines, citing the hops it could answer.

`factory(seed)(messages)` returns the next turn's tool calls, as `rlvr.eval.demonstrations`
expects of a policy factory.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import verifiers as vf

from .dataset import UNANSWERABLE
from .messages import tool_calls
from .replies import get_field, message_text
from .retrieval import tokenize

Row = dict[str, Any]
Policy = Callable[[list[vf.Message]], list[vf.ToolCall]]
AnswerFor = Callable[[Row, random.Random], str]

RETRY_TOP_N = 6  # a hop not found is asked once more, in other words, with more documents
_REFERENCE = re.compile(r"#(\d+)")
_BLOCK = re.compile(r"^Document ID: (\d+)\nTitle: (.*)\nText: ", re.MULTILINE)
_LEADING_QUESTION_WORDS = re.compile(
    r"^(?:(?:in|on|at|for|from|of|by|to)\s+)?(?:what|which|who|whom|whose|where|when|how)"
    r"(?:\s+(?:is|was|are|were|did|does|do|has|had|have))?\s+",
    re.IGNORECASE,
)
REFUSALS = ("unanswerable", "Unanswerable", "not answerable", "cannot be determined")


class DemonstratorError(ValueError):
    """The demonstrator cannot play a row (not in its files, or its files are unreadable)."""


# ---- the rows it knows ---------------------------------------------------------------------


def read_book(data_files: str | Sequence[str]) -> dict[str, list[Row]]:
    """MuSiQue jsonl rows (original schema) keyed by question; MuSiQue-Full twins share one."""
    paths = [data_files] if isinstance(data_files, str) else list(data_files)
    if not paths:
        raise DemonstratorError("hop_searcher needs data_files: the MuSiQue jsonl rows it plays")
    book: dict[str, list[Row]] = {}
    for path in paths:
        try:
            lines = Path(path).read_text().splitlines()
            rows = [json.loads(line) for line in lines if line.strip()]
        except (OSError, ValueError) as err:
            raise DemonstratorError(f"hop_searcher: cannot read {path}: {err}") from err
        for row in rows:
            book.setdefault(row["question"], []).append(row)
    return book


def paragraph_key(title: str, text: str) -> tuple[str, str]:
    return title.strip(), text.strip()


def support_keys(rows: Sequence[Row], hop: int) -> set[tuple[str, str]]:
    """Title and text of hop `hop`'s supporting paragraph in every twin that keeps it."""
    keys = set()
    for row in rows:
        support = row["question_decomposition"][hop].get("paragraph_support_idx")
        keys |= {
            paragraph_key(p["title"], p["paragraph_text"])
            for p in row["paragraphs"]
            if support is not None and p["idx"] == support
        }
    return keys


def answerable_row(rows: Sequence[Row]) -> Row:
    """The twin whose gold is an answer (the only row when the question has no twin)."""
    return next((row for row in rows if row.get("answerable", True) is not False), rows[0])


# ---- what it says ----------------------------------------------------------------------------


def hop_text(row: Row, hop: int) -> str:
    """Hop `hop`'s sub-question with each `#k` replaced by hop k's answer."""
    steps = row["question_decomposition"]
    return _REFERENCE.sub(
        lambda m: steps[int(m.group(1)) - 1]["answer"], steps[hop]["question"]
    ).strip()


def _keywords(text: str) -> str:
    """The words a search engine reads (no stopwords), in their order and casing."""
    return " ".join(word for word in text.split() if tokenize(word))


def phrasings(question: str) -> list[str]:
    """Ways to ask one hop, all built from its own words: "X >> relation" as "X relation" and
    "relation of X", a natural sub-question as written, without its question words, and as
    key words."""
    if ">>" in question:
        subject, relation = (part.strip() for part in question.split(">>", 1))
        return [f"{subject} {relation}", f"{relation} of {subject}", f"{subject} {relation}?"]
    plain = question.rstrip(" ?").strip()
    stripped = _LEADING_QUESTION_WORDS.sub("", plain).strip() or plain
    return [f"{plain}?", stripped, _keywords(plain) or plain]


def gold_or_alias(row: Row, rng: random.Random) -> str:
    """The gold answer, now and then an alias of it (both score as the gold)."""
    aliases = [a for a in row.get("answer_aliases") or [] if a and len(a.split()) <= 8]
    return rng.choice(aliases) if aliases and rng.random() < 0.25 else row["answer"]


def call(name: str, args: dict[str, Any], call_id: str) -> vf.ToolCall:
    return vf.ToolCall(id=call_id, name=name, arguments=json.dumps(args))


# ---- reading the conversation ----------------------------------------------------------------


@dataclass(frozen=True)
class Search:
    """One answered search: the hop it asked for and the documents it showed."""

    hop: int
    shown: dict[int, tuple[str, str]]  # document ID -> (title, text)


def shown_documents(reply: str) -> dict[int, tuple[str, str]]:
    """Document ID -> (title, text) of a `retrieve_documents` reply."""
    heads = list(_BLOCK.finditer(reply))
    docs = {}
    for i, head in enumerate(heads):
        end = heads[i + 1].start() if i + 1 < len(heads) else len(reply)
        docs[int(head.group(1))] = paragraph_key(head.group(2), reply[head.end() : end])
    return docs


def past_searches(messages: list[Any]) -> list[Search]:
    """The searches so far, each with the hop its call id names (`h<hop>t<try>`)."""
    replies = {
        str(get_field(m, "tool_call_id")): message_text(m)
        for m in messages
        if get_field(m, "role") == "tool"
    }
    searches = []
    for message in messages:
        for c in tool_calls(message):
            if c.name == "retrieve_documents" and c.id in replies:
                hop = int(c.id[1 : c.id.index("t")])
                searches.append(Search(hop, shown_documents(replies[c.id])))
    return searches


def found(searches: Sequence[Search], hop: int, keys: set[tuple[str, str]]) -> list[int]:
    """IDs of the documents shown for `hop` that are its supporting paragraph."""
    return [
        doc_id for s in searches if s.hop == hop for doc_id, key in s.shown.items() if key in keys
    ]


# ---- the policy ------------------------------------------------------------------------------


class HopSearcher:
    """The policy: the next turn from the conversation so far (see the module docstring)."""

    def __init__(self, book: dict[str, list[Row]], seed: int, answer: AnswerFor) -> None:
        self.book = book
        self.seed = seed
        self.answer = answer

    def rng(self, row: Row, *choice: object) -> random.Random:
        """The seed's choices for one row (and hop), the same whatever order rollouts run in."""
        return random.Random(f"{self.seed}:{row['id']}:{choice}")

    def rows_of(self, messages: list[Any]) -> list[Row]:
        question = next(message_text(m) for m in messages if get_field(m, "role") == "user")
        rows = self.book.get(question.strip())
        if not rows:
            raise DemonstratorError(
                f"hop_searcher has no row for the question {question[:120]!r}; pass the "
                "environment's MuSiQue files as data_files"
            )
        return rows

    def __call__(self, messages: list[Any]) -> list[vf.ToolCall]:
        rows = self.rows_of(messages)
        row = answerable_row(rows)
        may_decline = UNANSWERABLE in message_text(messages[0])
        searches = past_searches(messages)
        cited: list[int] = []
        for hop in range(len(row["question_decomposition"])):
            tries = [s for s in searches if s.hop == hop]
            hits = found(searches, hop, support_keys(rows, hop))
            cited += [doc_id for doc_id in hits if doc_id not in cited]
            if hits or len(tries) >= 2:
                if not hits and may_decline:
                    return [self.submit(self.rng(row, "refusal").choice(REFUSALS), cited)]
                continue
            return [self.search(row, hop, len(tries))]
        return [self.submit(self.answer(row, self.rng(row, "answer")), cited)]

    def search(self, row: Row, hop: int, attempt: int) -> vf.ToolCall:
        """The query for `hop`: a seeded phrasing; the retry another one with more documents."""
        first, retry = self.rng(row, hop).sample(phrasings(hop_text(row, hop)), 2)
        if attempt == 0:
            return call("retrieve_documents", {"query": first}, f"h{hop}t0")
        return call("retrieve_documents", {"query": retry, "top_n": RETRY_TOP_N}, f"h{hop}t1")

    def submit(self, answer: str, cited: list[int]) -> vf.ToolCall:
        ids = [str(doc_id) for doc_id in cited]
        return call("submit_answer", {"answer": answer, "cited_doc_ids": ids}, "submit")


def hop_searcher(seed: int, data_files: str | Sequence[str] = ()) -> Policy:
    """Policy factory: the hop-by-hop searcher over the rows of `data_files` (MuSiQue jsonl),
    answering the gold (or an alias of it)."""
    return HopSearcher(read_book(data_files), seed, gold_or_alias)
