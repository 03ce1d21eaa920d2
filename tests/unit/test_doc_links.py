"""Every relative link in README.md, docs/*.md and environments/*/README.md points at a file or
folder that exists, and every `#anchor` (alone or after a Markdown file) names a heading of the
target, slugged as GitHub does. Links to http(s) and mailto are skipped; so is anything inside
code blocks and inline code."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted([ROOT / "README.md", *ROOT.glob("docs/*.md"), *ROOT.glob("environments/*/README.md")])

FENCE = re.compile(r"^ {0,3}(```|~~~).*?^ {0,3}\1[^\n]*$", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"(`+).+?\1", re.DOTALL)
# [text](target) and ![alt](target); the target may carry a "title"
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$", re.MULTILINE)
SKIP = ("http://", "https://", "mailto:")


def without_fences(text: str) -> str:
    """The text with fenced blocks blanked (line count kept)."""
    return FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)


def without_code(text: str) -> str:
    """The text with fenced blocks and inline code blanked (line count kept)."""
    return INLINE_CODE.sub("", without_fences(text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup and punctuation dropped, lowercase, spaces -> '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = re.sub(r"<[^>]+>", "", text).lower()
    text = "".join(c for c in text if c.isalnum() or c in " -_")
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a Markdown file, with GitHub's -1, -2 suffixes for repeats."""
    seen: dict[str, int] = {}
    found = set()
    # a heading's inline code is part of its anchor, as on GitHub
    for heading in HEADING.findall(without_fences(path.read_text())):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def links(path: Path) -> list[str]:
    return [t for t in LINK.findall(without_code(path.read_text())) if not t.startswith(SKIP)]


def test_slug_follows_github():
    assert slug("Did the weights arrive?") == "did-the-weights-arrive"
    assert slug("Multi-node training (SLURM)") == "multi-node-training-slurm"
    assert slug("The `vf-vllm` server, step 2") == "the-vf-vllm-server-step-2"
    assert slug("What is inside") == "what-is-inside"


def test_the_documents_exist():
    assert ROOT / "README.md" in DOCS
    assert (ROOT / "docs" / "README.md") in DOCS
    assert any(p.parent.parent.name == "environments" for p in DOCS)


@pytest.mark.parametrize("doc", DOCS, ids=[str(p.relative_to(ROOT)) for p in DOCS])
def test_relative_links_resolve(doc: Path):
    broken = []
    for target in links(doc):
        path_part, _, anchor = target.partition("#")
        dest = (doc.parent / unquote(path_part)).resolve() if path_part else doc
        if not dest.exists():
            broken.append(f"{target}: no such file {dest}")
            continue
        if anchor and dest.is_file() and dest.suffix == ".md":
            if unquote(anchor).lower() not in anchors(dest):
                broken.append(f"{target}: no heading #{anchor} in {dest.relative_to(ROOT)}")
        elif anchor and dest.is_dir():
            broken.append(f"{target}: an anchor on a folder")
    assert not broken, f"{doc.relative_to(ROOT)}:\n" + "\n".join(broken)


def test_readme_is_a_front_door():
    lines = len((ROOT / "README.md").read_text().splitlines())
    assert lines <= 250, f"README.md has {lines} lines: move the manual's parts to docs/"


def test_anchors_keep_a_headings_inline_code(tmp_path: Path):
    page = tmp_path / "page.md"
    page.write_text("# Run `make demo` now\n\n```\n# not a heading\n```\n")
    assert anchors(page) == {"run-make-demo-now"}
