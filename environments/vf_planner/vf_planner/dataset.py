"""GSM8K rows for the planner: from the Hugging Face Hub, or from a local JSONL/Parquet file."""

from __future__ import annotations

from pathlib import Path

from datasets import Dataset, load_dataset

from vf_planner.answers import format_number, gold_number

_LOCAL_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}


def _load_rows(
    dataset_name: str, dataset_config: str | None, data_files: str | list[str] | None, split: str
) -> Dataset:
    if data_files is None:
        try:
            return load_dataset(dataset_name, dataset_config, split=split)
        except Exception as e:
            raise RuntimeError(
                f"could not load {dataset_name!r} (config {dataset_config!r}, split {split!r}) "
                f"from the Hugging Face Hub: {type(e).__name__}: {e}. Without network, pass a "
                "local file with question/answer columns, e.g. load_environment(data_files="
                "'/path/to/gsm8k_test.jsonl') or vf-eval vf-planner -a "
                '\'{"data_files": "/path/to/gsm8k_test.jsonl"}\''
            ) from e
    files = [data_files] if isinstance(data_files, str) else list(data_files)
    missing = [f for f in files if not Path(f).is_file()]
    if missing:
        raise FileNotFoundError(f"data_files not found: {missing}")
    suffixes = {Path(f).suffix.lower() for f in files}
    if len(suffixes) != 1 or next(iter(suffixes)) not in _LOCAL_FORMATS:
        raise ValueError(f"data_files must all be .jsonl/.json or all .parquet, got {files}")
    builder = _LOCAL_FORMATS[suffixes.pop()]
    return load_dataset(builder, data_files={split: files}, split=split)


def _check_gold(rows: Dataset) -> None:
    """Fail loudly on rows without a question or a numeric gold answer (named by index)."""
    for column in ("question", "answer"):
        if column not in rows.column_names:
            raise ValueError(f"dataset has no {column!r} column (columns: {rows.column_names})")
    for index, answer in enumerate(rows["answer"]):
        if gold_number(str(answer)) is None:
            raise ValueError(f"row {index}: answer {answer!r} has no number after '####'")


def load_planner_dataset(
    dataset_name: str = "openai/gsm8k",
    dataset_config: str | None = "main",
    data_files: str | list[str] | None = None,
    split: str = "train",
    max_examples: int = -1,
    seed: int | None = None,
) -> Dataset:
    """Rows with `question`, `answer` (the gold number as text) and `info.question`.

    `seed` shuffles before `max_examples` rows are taken, so a seeded subset is a random sample.
    """
    rows = _load_rows(dataset_name, dataset_config, data_files, split)
    if seed is not None:
        rows = rows.shuffle(seed=seed)
    if max_examples > 0:
        rows = rows.select(range(min(max_examples, len(rows))))
    _check_gold(rows)

    def to_row(row: dict) -> dict:
        return {
            "question": row["question"],
            "answer": format_number(gold_number(str(row["answer"]))),
            "info": {"question": row["question"], "solution": str(row["answer"])},
        }

    return rows.map(to_row, remove_columns=rows.column_names)
