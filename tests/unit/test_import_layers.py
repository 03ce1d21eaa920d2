"""Imports inside `rlvr` point down a declared layer order, except a short allow-list.

The order, lowest first (a unit may import its own layer and any layer below it):

    0  ground floor   rlvr.finite, rlvr.atomic, rlvr.batch, rlvr.config, rlvr.scripted,
                      rlvr.messages, rlvr.pass_at_k, rlvr.jsonl
    1  building parts rlvr.model, rlvr.data, rlvr.reasoning_vocab, rlvr.layout
    2  step machinery rlvr.rollouts, rlvr.weight_sync, rlvr.server, rlvr.envserver,
                      rlvr.distill
    3  the loop       rlvr.trainer
    4  top            rlvr.eval, rlvr.demo, rlvr (the package's own __init__)

A "unit" is a subpackage (`rlvr.trainer`) or a top-level module (`rlvr.finite`). The check parses
source with `ast` and never imports it, so it sees imports inside functions too.

Where the order departs from the first sketch, the import graph decided:
- `rlvr.scripted` (a scripted model client) imports only `rlvr.messages` and `rlvr.data.arithmetic`
  scripts demonstrations with it, so it sits on the ground floor rather than the top.
- `rlvr.layout` (the micro-batch layouts) imports only the ground floor: the trainer hands it
  the model and the scorer its self-check needs, so it sits with the building parts.
- `rlvr.server` and `rlvr.weight_sync` are the two ends of one weight transfer and import each
  other (the server's CPU engine joins the rendezvous; the push registers the server's engine), so
  they share a floor; one floor lower, the server would add four exceptions to save two.
- `rlvr.jsonl` (the JSONL reader) is read by every floor, so it sits on the ground floor; the
  demonstrations (`rlvr-demos`) and the exports of rollouts generate from or read evaluation
  runs, so they live in `rlvr.eval`.

The one arrow that still points up is listed in ALLOWED_UP with its reason: the vLLM processor
reads its name from the server plugin that owns it. A new upward import fails with file:line
and the two units, so it has to be moved down or added there with a reason.

Run `python tests/unit/test_import_layers.py [SRC]` to print the upward arrows of any src dir
(the default is this checkout's `src`).
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"

LAYERS: tuple[tuple[str, ...], ...] = (
    (
        "rlvr.finite",
        "rlvr.atomic",
        "rlvr.batch",
        "rlvr.config",
        "rlvr.scripted",
        "rlvr.messages",
        "rlvr.pass_at_k",
        "rlvr.jsonl",
    ),
    ("rlvr.model", "rlvr.data", "rlvr.reasoning_vocab", "rlvr.layout"),
    ("rlvr.rollouts", "rlvr.weight_sync", "rlvr.server", "rlvr.envserver", "rlvr.distill"),
    ("rlvr.trainer",),
    ("rlvr.eval", "rlvr.demo", "rlvr"),
)
LAYER_OF: dict[str, int] = {unit: level for level, units in enumerate(LAYERS) for unit in units}

# (importing file relative to src, imported unit) -> why the arrow may point up.
ALLOWED_UP: dict[tuple[str, str], str] = {
    ("rlvr/reasoning_vocab/vllm.py", "rlvr.server"): "the vLLM processor is registered under "
    "the name the server's plugin declares (REASONING_VOCAB_PROCESSOR)",
}


@dataclass(frozen=True)
class Arrow:
    """One import statement from one unit of `rlvr` to another."""

    path: str
    line: int
    source: str
    target: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.source} -> {self.target}"


def unit_of(module: str) -> str:
    """Return the unit of a dotted `rlvr` module (`rlvr.trainer.loss` -> `rlvr.trainer`)."""
    return ".".join(module.split(".")[:2])


def module_name(path: Path, src: Path) -> str:
    """Return the dotted module name of a source file under `src`."""
    parts = list(path.relative_to(src).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(tree: ast.AST, package: str) -> list[tuple[int, str]]:
    """Return (line, module) for every import of an `rlvr` module in `tree`, nested ones included.

    `package` is the importing module's package, used to resolve relative imports."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            if base == "rlvr":  # `from rlvr import trainer` names the unit after `import`
                found += [(node.lineno, f"rlvr.{alias.name}") for alias in node.names]
            else:
                found.append((node.lineno, base))
    return [(line, name) for line, name in found if name == "rlvr" or name.startswith("rlvr.")]


def arrows(src: Path) -> list[Arrow]:
    """Return every import from one `rlvr` unit to another under `src`, sorted by file and line."""
    found: list[Arrow] = []
    for path in sorted((src / "rlvr").rglob("*.py")):
        module = module_name(path, src)
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        source = unit_of(module)
        tree = ast.parse(path.read_text(), filename=str(path))
        for line, name in imported_modules(tree, package):
            target = unit_of(name)
            if target != source:
                found.append(Arrow(str(path.relative_to(src)), line, source, target))
    return found


def upward_arrows(src: Path) -> list[Arrow]:
    """Return the arrows whose target sits on a higher layer than their source.

    Raises ValueError naming any unit the layer table does not place, so a new package must be
    given a floor before it can be imported."""
    found = arrows(src)
    unplaced = sorted({u for a in found for u in (a.source, a.target)} - LAYER_OF.keys())
    if unplaced:
        raise ValueError(f"units with no layer in LAYERS: {unplaced}")
    return [a for a in found if LAYER_OF[a.target] > LAYER_OF[a.source]]


def test_every_unit_has_a_layer() -> None:
    units = {unit_of(module_name(p, SRC)) for p in (SRC / "rlvr").rglob("*.py")}
    assert units <= LAYER_OF.keys(), (
        f"place these units in LAYERS: {sorted(units - LAYER_OF.keys())}"
    )


def test_every_unit_has_a_row_in_the_architecture_doc() -> None:
    """docs/architecture.md's package table is the map: each package and top-level module of
    `rlvr` is named there (`rlvr/trainer/`, `rlvr/finite.py`)."""
    table = (SRC.parent / "docs" / "architecture.md").read_text()
    paths = {
        f"`rlvr/{p.name}/`" if p.is_dir() else f"`rlvr/{p.name}`"
        for p in (SRC / "rlvr").iterdir()
        if (p.is_dir() and (p / "__init__.py").exists())
        or (p.suffix == ".py" and p.name != "__init__.py")
    }
    assert {p for p in paths if p not in table} == set()


def test_no_new_upward_imports() -> None:
    up = upward_arrows(SRC)
    unexpected = [str(a) for a in up if (a.path, a.target) not in ALLOWED_UP]
    assert not unexpected, "imports that point up the layers:\n" + "\n".join(unexpected)


def test_allow_list_has_no_stale_entries() -> None:
    present = {(a.path, a.target) for a in upward_arrows(SRC)}
    stale = sorted(set(ALLOWED_UP) - present)
    assert not stale, f"allowed upward imports that no longer exist (remove them): {stale}"


def test_counter_sees_nested_relative_and_package_imports(tmp_path: Path) -> None:
    pkg = tmp_path / "rlvr"
    (pkg / "config").mkdir(parents=True)
    (pkg / "trainer").mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "trainer" / "__init__.py").write_text("")
    (pkg / "trainer" / "loss.py").write_text("from rlvr.config import x\n")
    (pkg / "config" / "__init__.py").write_text(
        "from . import sections\n"
        "def f():\n    import rlvr.trainer.loss\n"
        "def g():\n    from rlvr import trainer\n"
    )
    (pkg / "config" / "sections.py").write_text("from ..trainer.loss import y\n")
    got = [str(a) for a in upward_arrows(tmp_path)]
    assert got == [
        "rlvr/config/__init__.py:3: rlvr.config -> rlvr.trainer",
        "rlvr/config/__init__.py:5: rlvr.config -> rlvr.trainer",
        "rlvr/config/sections.py:1: rlvr.config -> rlvr.trainer",
    ]


def main(argv: list[str]) -> None:
    """Print the count and list of upward arrows under argv[1] (default: this checkout's src)."""
    src = Path(argv[1]) if len(argv) > 1 else SRC
    up = upward_arrows(src)
    print(f"{len(up)} upward imports in {src}")
    for arrow in up:
        print(f"  {arrow}")


if __name__ == "__main__":
    main(sys.argv)
