"""The side virtualenv a verifiers 0.4 EnvServer runs from, built on first use.

0.4 cannot share our venv (the same distribution name as our 0.1.14; it needs openai<3 and
mcp==2.0.0). `ensure_side_venv` installs `verifiers==0.4.0` and the run's requirements, and
returns at once when a stamp says nothing changed. The venv's `bin/uv` is an offline stand-in:
0.4's `null` harness prepares its chat program with `uv sync --script`, whose dependencies the
venv already holds, so the program runs on the venv's python (a real uv earlier on PATH wins).

    python -m rlvr.envserver.side_venv [--venv .venv-envserver] [PIP_ARGS...]
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import venv as venvlib
from pathlib import Path

from rlvr.atomic import made_once

VERIFIERS_04 = "verifiers==0.4.0"
NULL_HARNESS_IMPORTS = "import openai, mcp, httpx, httpx2, tenacity, certifi, verifiers.v1.serve"
"""What 0.4's `null` harness program imports: checked once the venv is built."""
UV_STANDIN = """#!/bin/sh
# Offline stand-in for the two uv calls verifiers 0.4 makes to prepare a PEP 723 script.
here=$(cd "$(dirname "$0")" && pwd)
case "$*" in
  *--help*) echo "--script" ;;
  "sync --script"*) exit 0 ;;
  "python find --script"*) echo "$here/python" ;;
  *) echo "uv stand-in (rlvr side venv): unsupported: uv $*" >&2; exit 2 ;;
esac
"""


def stamp_of(requirements: list[str]) -> str:
    """A hash of what decides the install: the pins, the arguments and every named file."""
    digest = hashlib.sha256("\n".join([VERIFIERS_04, UV_STANDIN, *requirements]).encode())
    for arg in requirements:
        path = Path(arg)
        for named in (path, path / "pyproject.toml"):
            if named.is_file():
                digest.update(named.read_bytes())
    return digest.hexdigest()


def ensure_side_venv(venv: str | Path, requirements: list[str] | None = None) -> Path:
    """The side venv at `venv` with 0.4 and `requirements` (pip arguments: names, `-e PATH`,
    `-r FILE`) installed; builds it when its stamp differs. Returns its python."""
    root = Path(venv)
    python = root / "bin" / "python"
    stamp = root / ".rlvr-envserver-stamp"
    want = stamp_of(list(requirements or []))
    with made_once(root):  # another process may be building it: wait, then find it built
        if not (python.exists() and stamp.exists() and stamp.read_text() == want):
            _build(root, python, requirements or [])
            stamp.write_text(want)
    return python


def _build(root: Path, python: Path, requirements: list[str]) -> None:
    print(f"[side venv] installing {VERIFIERS_04} into {root} (about 2 minutes once)", flush=True)
    if not python.exists():
        venvlib.create(root, with_pip=True)
    pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, VERIFIERS_04, *requirements], check=True)
    subprocess.run([str(python), "-c", NULL_HARNESS_IMPORTS], check=True)
    uv = root / "bin" / "uv"
    uv.write_text(UV_STANDIN)
    uv.chmod(0o755)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m rlvr.envserver.side_venv")
    parser.add_argument("--venv", default=".venv-envserver")
    args, requirements = parser.parse_known_args(argv)
    print(ensure_side_venv(args.venv, requirements))


if __name__ == "__main__":
    main()
