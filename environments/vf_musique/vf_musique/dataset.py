"""MuSiQue rows -> environment rows (question, answer, info).

Rows come from the Hugging Face Hub (`bdsaglam/musique`, configs `answerable` and `full`, splits
`train` and `validation`) or from local MuSiQue jsonl files in the original schema (as published
at github.com/StonyBrookNLP/musique). A row's paragraphs travel in `info` and reach the tools
through the rollout state; the prompt holds only the question.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any, Literal, get_args

from datasets import Dataset, load_dataset

from .hub import hub_reachable, offline_requested

DEFAULT_DATASET = "bdsaglam/musique"
DatasetConfig = Literal["answerable", "full"]
DATASET_CONFIGS: tuple[str, ...] = get_args(DatasetConfig)
UNANSWERABLE = "unanswerable"
REQUIRED_FIELDS = ("id", "question", "answer", "paragraphs", "question_decomposition")

DataFiles = str | list[str] | dict[str, str | list[str]]


class MusiqueDataError(RuntimeError):
    """MuSiQue could not be loaded; the message says how to fix it."""


def _local_file_hint() -> str:
    return (
        "Pass a local MuSiQue jsonl file instead: "
        "load_environment(data_files='path/to/musique_ans_v1.0_dev.jsonl'), or on the command line "
        'vf-eval vf-musique -a \'{"data_files": "path/to/musique_ans_v1.0_dev.jsonl"}\'. '
        "Files in the original schema from github.com/StonyBrookNLP/musique work as they are "
        "(use dataset_config='full' for MuSiQue-Full files with unanswerable rows)."
    )


def _load_from_hub(dataset_name: str, dataset_config: str, split: str) -> Dataset:
    where = f"{dataset_name!r} (config {dataset_config!r}, split {split!r})"
    if not offline_requested() and not hub_reachable():
        raise MusiqueDataError(
            f"Cannot load MuSiQue {where}: the Hugging Face Hub is not reachable from this "
            f"machine. {_local_file_hint()}"
        )
    try:
        return load_dataset(dataset_name, dataset_config, split=split)
    except (ConnectionError, OSError, ValueError) as err:
        raise MusiqueDataError(
            f"Cannot load MuSiQue {where} from the Hugging Face Hub ({err}). {_local_file_hint()}"
        ) from err


def _check_local_files(data_files: DataFiles) -> None:
    if isinstance(data_files, dict):
        paths = [p for v in data_files.values() for p in ([v] if isinstance(v, str) else v)]
    else:
        paths = [data_files] if isinstance(data_files, str) else list(data_files)
    missing = [p for p in paths if not Path(p).is_file()]
    if missing:
        raise FileNotFoundError(f"data_files: no such MuSiQue jsonl file(s): {missing}")


def _load_local(data_files: DataFiles, split: str) -> Dataset:
    """A jsonl file (or list) loads as one split; a {split: files} mapping is indexed by `split`."""
    _check_local_files(data_files)
    file_split = split if isinstance(data_files, dict) else "train"
    return load_dataset("json", data_files=data_files, split=file_split)


def load_raw(
    dataset_name: str, dataset_config: str, split: str, data_files: DataFiles | None
) -> Dataset:
    """Raw MuSiQue rows from local files when given, else from the Hub."""
    if dataset_config not in DATASET_CONFIGS:
        raise ValueError(f"dataset_config={dataset_config!r}; choose one of {DATASET_CONFIGS}")
    if data_files is None:
        raw = _load_from_hub(dataset_name, dataset_config, split)
    else:
        raw = _load_local(data_files, split)
    missing = [f for f in REQUIRED_FIELDS if f not in raw.column_names]
    if missing:
        source = data_files if data_files is not None else dataset_name
        raise MusiqueDataError(
            f"{source}: rows lack the MuSiQue field(s) {missing}; "
            f"expected at least {list(REQUIRED_FIELDS)}"
        )
    return raw


def _kept_paragraphs(row: dict[str, Any], noise_rate: float, seed: int) -> list[dict[str, Any]]:
    """All supporting paragraphs plus a seeded `noise_rate` share of the distractors."""
    paragraphs = row["paragraphs"]
    distractors = [p for p in paragraphs if not p.get("is_supporting")]
    n_dropped = len(distractors) - round(noise_rate * len(distractors))
    dropped = {
        p["idx"] for p in random.Random(f"{seed}:{row['id']}").sample(distractors, n_dropped)
    }
    return [
        {"idx": int(p["idx"]), "title": p["title"], "text": p["paragraph_text"]}
        for p in paragraphs
        if p["idx"] not in dropped
    ]


def to_example(row: dict[str, Any], noise_rate: float, seed: int) -> dict[str, Any]:
    """One environment row. Unanswerable rows (MuSiQue-Full) take the gold answer
    "unanswerable"; answerable rows keep the answer and its aliases as golds. `hops` keeps the
    decomposition (with each hop's supporting paragraph, None where MuSiQue-Full removed it), so
    the rubric can tell which hops an honest agent could answer before one went missing and
    whether a search asked for one hop or for the whole `question`; `pair_id` is the MuSiQue
    id, which an answerable question and its unanswerable twin share."""
    answerable = row.get("answerable", True) is not False
    golds = [row["answer"], *(row.get("answer_aliases") or [])] if answerable else [UNANSWERABLE]
    return {
        "question": row["question"],
        "answer": golds[0],
        "info": {
            "id": str(row["id"]),
            "question": row["question"],
            "answerable": answerable,
            "answers": golds,
            "pair_id": str(row["id"]),
            "n_hops": len(row["question_decomposition"]),
            "hops": [
                {
                    "question": h["question"],
                    "answer": h["answer"],
                    "support": h.get("paragraph_support_idx"),
                }
                for h in row["question_decomposition"]
            ],
            "supporting_ids": [int(p["idx"]) for p in row["paragraphs"] if p.get("is_supporting")],
            "paragraphs": _kept_paragraphs(row, noise_rate, seed),
        },
    }


def prepare(
    raw: Dataset, dataset_config: str, noise_rate: float, seed: int, max_examples: int
) -> Dataset:
    """Environment rows: `answerable` drops unanswerable rows, `full` keeps them."""
    if not 0.0 <= noise_rate <= 1.0:
        raise ValueError(f"noise_rate={noise_rate!r}; must be within [0, 1]")
    if dataset_config == "answerable" and "answerable" in raw.column_names:
        raw = raw.filter(lambda row: row["answerable"] is not False)
    if max_examples > 0:
        raw = raw.select(range(min(max_examples, len(raw))))
    # The datasets cache keys a map by the lambda, not by `to_example`'s code, so a cached map
    # would serve rows built by an older version of this environment; building them is cheap.
    return raw.map(
        lambda row: to_example(row, noise_rate, seed),
        remove_columns=raw.column_names,
        load_from_cache_file=False,
    )


def weight_by_hops(dataset: Dataset) -> Dataset:
    """Each training row repeated n_hops times, so a question is drawn in proportion to its hop
    count (2:3:4): a sampling weight, which survives the per-group reward normalisation of GRPO
    where scaling a question's rewards by a constant would not."""
    repeats = [i for i, info in enumerate(dataset["info"]) for _ in range(int(info["n_hops"]))]
    return dataset.select(repeats)
