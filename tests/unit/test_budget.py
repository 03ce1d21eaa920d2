"""The duration budget's list of long tests (tests/budget.py) names tests that exist, each with a
reason, and stays short."""

from __future__ import annotations

import ast
from pathlib import Path

from budget import LONG, MAX_LONG, base_id, over_budget

ROOT = Path(__file__).resolve().parents[2]


def defined_tests(path: Path) -> set[str]:
    """The test functions defined at the top of a test file."""
    tree = ast.parse(path.read_text())
    return {
        node.name
        for node in tree.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.name.startswith("test_")
    }


def test_long_tests_exist_have_reasons_and_stay_few():
    assert len(LONG) <= MAX_LONG, f"{len(LONG)} long tests: shorten one before listing another"
    for (path, name), reason in LONG.items():
        assert name in defined_tests(ROOT / "tests" / path), f"no such test: {path}::{name}"
        assert len(reason.split()) >= 4, f"say why {path}::{name} needs the time"


def test_over_budget_names_unlisted_slow_tests_only():
    path, name = next(iter(LONG))
    durations = {
        f"tests/{path}::{name}[a]": 500.0,
        "tests/unit/test_x.py::test_slow[1]": 61.0,
        "tests/unit/test_x.py::test_slower": 90.0,
        "tests/unit/test_x.py::test_fast": 59.0,
    }
    assert over_budget(durations) == [
        ("tests/unit/test_x.py::test_slower", 90.0),
        ("tests/unit/test_x.py::test_slow[1]", 61.0),
    ]
    assert base_id("tests/unit/a.py::test_x[1-2]") == ("unit/a.py", "test_x")
