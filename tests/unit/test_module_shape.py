"""Modules under src/rlvr stay small and open with a contract, not an essay.

Limits (issue 51): no module over 450 lines; no module docstring over 20 lines except a formula
header (FORMULA_HEADERS); docstrings at most 14% of the source lines. Run
`python tests/unit/test_module_shape.py` to print the figures.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "rlvr"
MAX_MODULE_LINES = 450
MAX_MODULE_DOCSTRING_LINES = 20
MAX_DOCSTRING_SHARE = 0.14
FORMULA_HEADERS = {"trainer/loss.py"}  # the loss's formulas, written out where they are coded

DOCUMENTED = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def docstring_lines(node: ast.AST) -> int:
    """Lines taken by `node`'s docstring (0 when it has none)."""
    body = getattr(node, "body", [])
    first = body[0] if body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
        if isinstance(first.value.value, str):
            return first.end_lineno - first.lineno + 1
    return 0


def modules() -> dict[str, str]:
    """Source text of every module, by path relative to src/rlvr."""
    return {str(p.relative_to(SRC)): p.read_text() for p in sorted(SRC.rglob("*.py"))}


def docstring_share(sources: dict[str, str]) -> float:
    """Docstring lines (modules, classes, functions) over all source lines."""
    total = sum(len(text.splitlines()) for text in sources.values())
    docs = sum(
        docstring_lines(node)
        for text in sources.values()
        for node in ast.walk(ast.parse(text))
        if isinstance(node, DOCUMENTED)
    )
    return docs / total


def test_no_module_is_over_450_lines() -> None:
    long = {p: len(t.splitlines()) for p, t in modules().items()}
    over = {p: n for p, n in long.items() if n > MAX_MODULE_LINES}
    assert not over, f"modules over {MAX_MODULE_LINES} lines (split by concern): {over}"


def test_module_docstrings_are_contracts() -> None:
    heads = {p: docstring_lines(ast.parse(t)) for p, t in modules().items()}
    over = {
        p: n
        for p, n in heads.items()
        if n > MAX_MODULE_DOCSTRING_LINES and p not in FORMULA_HEADERS
    }
    assert not over, f"module docstrings over {MAX_MODULE_DOCSTRING_LINES} lines: {over}"


def test_docstrings_are_at_most_14_percent_of_the_source() -> None:
    share = docstring_share(modules())
    assert share <= MAX_DOCSTRING_SHARE, f"docstrings are {share:.1%} of src/rlvr"


def test_docstring_lines_counts_every_kind_of_docstring() -> None:
    tree = ast.parse('"""a\nb"""\nclass C:\n    """c"""\n    def f(self):\n        x = "not"\n')
    counts = [docstring_lines(n) for n in ast.walk(tree) if isinstance(n, DOCUMENTED)]
    assert counts == [2, 1, 0]


if __name__ == "__main__":
    sources = modules()
    print(f"docstrings: {docstring_share(sources):.1%} of {len(sources)} modules' lines")
    for path, text in sources.items():
        lines, head = len(text.splitlines()), docstring_lines(ast.parse(text))
        if lines > MAX_MODULE_LINES or head > 8:
            print(f"  {path}: {lines} lines, module docstring {head}")
