"""Where the problems come from: local files, the Hugging Face Hub, or the built-in generator.

Local ``data_files`` never touch the network. A hub dataset is loaded only when the hub answers
quickly (``datasets`` itself retries for ~25 s before failing); with ``HF_HUB_OFFLINE=1`` it is
read from the local cache. When neither works, the environment uses problems it generates itself
(``generator.py``), so ``vf-eval vf-deepscaler`` runs on a machine with no data and no network.
The log says which source was used.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import datasets.config
from datasets import Dataset, load_dataset

from vf_deepscaler.generator import generate_problems
from vf_deepscaler.hub import hub_reachable, offline_requested

logger = logging.getLogger("vf_deepscaler")

DEFAULT_DATASET = "agentica-org/DeepScaleR-Preview-Dataset"
GENERATED_DEFAULT_ROWS = 2_000
REQUIRED_FIELDS = ("problem", "answer")

DataFiles = str | os.PathLike[str] | Sequence[str | os.PathLike[str]]


class DatasetFormatError(ValueError):
    """A row lacks a required field, or a data file cannot be read; the message says where."""


def load_problems(
    *,
    dataset_name: str | None,
    data_files: DataFiles | None,
    split: str,
    max_examples: int | None,
    seed: int,
    stream: str,
) -> Dataset:
    """Rows ``{"question", "answer", "info"}`` from the first source that applies:
    ``data_files``, then ``dataset_name`` on the hub, then the generator."""
    if data_files is not None:
        records = _local_records(_as_paths(data_files))
        source = f"local files {[str(p) for p in _as_paths(data_files)]}"
    else:
        if not dataset_name:
            raise ValueError("give dataset_name or data_files")
        hub_rows = _hub_rows(dataset_name, split)
        if hub_rows is None:
            return _generated(max_examples, seed, stream, requested=dataset_name)
        records = ((f"{dataset_name} [{split}], row {i + 1}", row) for i, row in hub_rows)
        source = f"hub dataset {dataset_name} [{split}]"
    examples = []
    for where, record in records:
        if max_examples is not None and len(examples) >= max_examples:
            break
        examples.append(_to_example(record, where))
    if not examples:
        raise DatasetFormatError(f"{source}: no rows")
    logger.info("vf_deepscaler %s data: %s (%d rows)", stream, source, len(examples))
    return Dataset.from_list(examples)


def _to_example(record: Any, where: str) -> dict[str, Any]:
    """Validate one row and keep what the environment uses."""
    if not isinstance(record, dict):
        raise DatasetFormatError(f"{where}: expected an object, got {type(record).__name__}")
    for field in REQUIRED_FIELDS:
        value = record.get(field)
        if value is None or not str(value).strip():
            raise DatasetFormatError(
                f"{where}: missing required field {field!r} (got {value!r}); "
                f"each row needs non-empty {' and '.join(map(repr, REQUIRED_FIELDS))}"
            )
    return {
        "question": str(record["problem"]),
        "answer": str(record["answer"]).strip(),
        "info": {"source": where},
    }


def _as_paths(data_files: DataFiles) -> list[Path]:
    if isinstance(data_files, (str, os.PathLike)):
        return [Path(data_files)]
    return [Path(p) for p in data_files]


def _local_records(paths: list[Path]) -> Iterator[tuple[str, Any]]:
    """``(where, record)`` for every row of every file; ``where`` names the file and row."""
    for path in paths:
        if not path.is_file():
            raise DatasetFormatError(f"{path}: data file not found")
        suffix = path.suffix.lower()
        if suffix == ".parquet":
            import pyarrow.parquet as pq

            for i, row in enumerate(pq.read_table(path).to_pylist()):
                yield f"{path}, row {i + 1}", row
        elif suffix in (".jsonl", ".json"):
            yield from _json_records(path)
        else:
            raise DatasetFormatError(
                f"{path}: unsupported data file type (use .jsonl, .json, .parquet)"
            )


def _json_records(path: Path) -> Iterator[tuple[str, Any]]:
    """A JSON array of objects, or JSON lines (rows are numbered by line)."""
    text = path.read_text(encoding="utf-8")
    if path.suffix.lower() == ".json" and text.lstrip().startswith("["):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DatasetFormatError(f"{path}: invalid JSON: {exc}") from exc
        for i, row in enumerate(rows):
            yield f"{path}, row {i + 1}", row
        return
    for line_no, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DatasetFormatError(f"{path}, row {line_no}: invalid JSON: {exc}") from exc
        yield f"{path}, row {line_no}", row


def _hub_rows(name: str, split: str) -> Iterator[tuple[int, Any]] | None:
    """Rows of a hub dataset, or None when the hub (or, offline, the cache) cannot supply it."""
    if datasets.config.HF_HUB_OFFLINE:  # cache only, fails fast when the dataset is not cached
        try:
            return enumerate(load_dataset(name, split=split))
        except OSError as exc:
            logger.warning("vf_deepscaler: offline and %s is not in the cache (%s)", name, exc)
            return None
    if offline_requested():
        # Set after `datasets` was imported, so it would ignore it; respect it here instead.
        logger.warning("vf_deepscaler: offline mode requested, not contacting the hub")
        return None
    if not hub_reachable():
        return None
    return enumerate(load_dataset(name, split=split))


def _generated(max_examples: int | None, seed: int, stream: str, requested: str) -> Dataset:
    n = max_examples or GENERATED_DEFAULT_ROWS
    logger.warning(
        "vf_deepscaler %s data: %s is not available here, using %d generated problems "
        "(seed=%d); pass data_files=... to use real rows",
        stream,
        requested,
        n,
        seed,
    )
    rows = generate_problems(n, seed=seed, stream=stream)
    return Dataset.from_list(
        [
            {
                "question": row["problem"],
                "answer": row["answer"],
                "info": {"source": f"generated:{row['kind']}:level{row['level']}"},
            }
            for row in rows
        ]
    )
