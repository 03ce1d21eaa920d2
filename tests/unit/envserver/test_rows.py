"""Rows exported once from a 0.4 taskset's own `load()` (side venv), read back as wire dicts."""

from __future__ import annotations

import pytest

from rlvr.envserver.rows import export_rows, read_rows


@pytest.mark.slow
def test_export_writes_the_tasksets_rows_as_wire_task_data(side_venv, tmp_path) -> None:
    out = tmp_path / "rows.jsonl"
    rows = export_rows(
        "vf04-reverse-text", out, taskset_overrides={"seed": 3}, limit=2, venv=side_venv
    )
    assert rows == read_rows(out)
    assert [row["idx"] for row in rows] == [0, 1]
    assert all(row["prompt"] == row["text"] for row in rows)


@pytest.mark.slow
def test_export_failure_carries_the_side_error(side_venv, tmp_path) -> None:
    with pytest.raises(RuntimeError, match="no-such-taskset"):
        export_rows("no-such-taskset", tmp_path / "rows.jsonl", venv=side_venv)
