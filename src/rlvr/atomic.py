"""Writing files and directories so that readers never see half of one: everything is written
beside the target under a hidden temporary name and renamed into place once complete, with the
files and directory fsynced before the rename and the parent after it (otherwise a power loss
can keep the rename but lose the data: an empty `trainer_state.json` in a valid-looking
checkpoint).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def fsync_path(path: str | Path) -> None:
    """Flush one file's or directory's data and metadata to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: str | Path) -> None:
    """fsync every file and directory under `root` (itself included), deepest first, so a
    directory entry is flushed only after what it names."""
    for directory, _, files in os.walk(root, topdown=False):
        for name in files:
            path = os.path.join(directory, name)
            if not os.path.islink(path):
                fsync_path(path)
        fsync_path(directory)


def publish_directory(tmp: str | Path, target: str | Path) -> None:
    """Rename the complete directory `tmp` to `target` durably: its contents are on disk
    before the rename, and the rename is on disk when this returns."""
    fsync_tree(tmp)
    os.replace(tmp, target)
    fsync_path(Path(target).parent)


@contextmanager
def atomic_directory(target: str | Path, replace: bool = False) -> Iterator[Path]:
    """Yield an empty temporary directory that becomes `target` on success (durably). With
    `replace` an existing `target` is removed first; otherwise the rename fails if it exists
    (two writers must not silently overwrite each other)."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{target.name}-", dir=target.parent))
    try:
        yield tmp
        if replace and target.exists():
            shutil.rmtree(target)
        publish_directory(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write via a temporary file in the same directory, fsync it and rename it into place
    (the directory fsynced after the rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_path(path.parent)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | Path, text: str) -> None:
    """`atomic_write_bytes` of `text` in UTF-8."""
    atomic_write_bytes(path, text.encode("utf-8"))


@contextmanager
def made_once(target: str | Path) -> Iterator[None]:
    """Hold an exclusive lock beside `target` (`.NAME.lock`) for the block: processes that make
    the same thing once on a fresh machine (a model conversion, a merged adapter, a venv) take
    turns, and the later ones find it made, instead of racing to publish it."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name.lstrip('.')}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
