"""vf-musique: multi-hop question answering over MuSiQue with retrieval tools and citations."""

from __future__ import annotations

from typing import Any

from .dataset import (
    DEFAULT_DATASET,
    UNANSWERABLE,
    DataFiles,
    DatasetConfig,
    MusiqueDataError,
    load_raw,
    prepare,
    weight_by_hops,
)
from .env import MuSiQueEnv
from .prompts import system_prompt
from .retrieval import RETRIEVERS, IndexCache, Retriever
from .rubric import DEFAULT_WEIGHTS, MuSiQueRubric, answerability
from .tools import DEFAULT_TOP_N, MAX_TOP_N

__all__ = [
    "DEFAULT_SAMPLING_ARGS",
    "DEFAULT_WEIGHTS",
    "MuSiQueEnv",
    "MuSiQueRubric",
    "MusiqueDataError",
    "UNANSWERABLE",
    "answerability",
    "load_environment",
    "weight_by_hops",
]

# Reply budget per turn (bench/reply_lengths.py, embedded model's tokenizer): an honest turn is one
# tool call (a query per hop, then the submission), at most 66 tokens in the dev rows; the rest
# leaves room for a line of reasoning before it. `vf-eval -t`, the trainer's
# sampling.max_tokens, or a `sampling_args` argument here override it.
DEFAULT_SAMPLING_ARGS = {"max_tokens": 256}


def load_environment(
    dataset_name: str = DEFAULT_DATASET,
    dataset_config: DatasetConfig = "answerable",
    data_files: DataFiles | None = None,
    split: str = "train",
    max_examples: int = -1,
    eval_data_files: DataFiles | None = None,
    eval_split: str = "validation",
    retriever: Retriever = "bm25",
    top_n: int = DEFAULT_TOP_N,
    max_turns: int = 10,
    noise_rate: float = 1.0,
    seed: int = 0,
    hop_weighting: bool = False,
    reward_weights: dict[str, float] | None = None,
    max_tool_calls_per_turn: int = 5,
    **kwargs: Any,
) -> MuSiQueEnv:
    """Build the MuSiQue tool environment (see README.md for every argument).

    `data_files` (a local MuSiQue jsonl) skips the Hub; the eval set then comes from
    `eval_data_files` or, if absent, is the same rows (each once, also with `hop_weighting`).
    Without `data_files` both sets come from `dataset_name` on the Hub (`split`, `eval_split`);
    with no network that raises MusiqueDataError explaining how to pass a local file.
    """
    _check_args(retriever, top_n, max_turns, max_tool_calls_per_turn)

    def rows(files: DataFiles | None, which_split: str):
        raw = load_raw(dataset_name, dataset_config, which_split, files)
        return prepare(raw, dataset_config, noise_rate, seed, max_examples)

    dataset = rows(data_files, split)
    if eval_data_files is not None:
        eval_dataset = rows(eval_data_files, eval_split)
    elif data_files is not None:
        eval_dataset = dataset if hop_weighting else None  # unweighted: each question once
    else:
        eval_dataset = rows(None, eval_split)
    return MuSiQueEnv(
        retriever=retriever,
        top_n=top_n,
        max_tool_calls_per_turn=max_tool_calls_per_turn,
        index_cache=IndexCache(),
        dataset=weight_by_hops(dataset) if hop_weighting else dataset,
        eval_dataset=eval_dataset,
        system_prompt=system_prompt(dataset_config, max_turns),
        rubric=MuSiQueRubric(reward_weights=reward_weights, top_n=top_n),
        max_turns=max_turns,
        sampling_args={**DEFAULT_SAMPLING_ARGS, **kwargs.pop("sampling_args", {})},
        **kwargs,
    )


def _check_args(retriever: str, top_n: int, max_turns: int, max_tool_calls_per_turn: int) -> None:
    if retriever not in RETRIEVERS:
        raise ValueError(f"retriever={retriever!r}; choose one of {RETRIEVERS}")
    if not 1 <= top_n <= MAX_TOP_N:
        raise ValueError(f"top_n={top_n!r}; must be between 1 and {MAX_TOP_N}")
    if max_turns < 1 or max_tool_calls_per_turn < 1:
        raise ValueError(
            f"max_turns={max_turns!r} and max_tool_calls_per_turn={max_tool_calls_per_turn!r} "
            "must be at least 1"
        )
