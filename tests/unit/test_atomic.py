"""Atomic writes: a crash mid-write leaves the old state (or nothing), never half a file."""

import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from rlvr.atomic import atomic_directory, atomic_write_text, made_once
from rlvr.trainer.checkpoint import save_checkpoint


def test_directory_appears_only_when_complete(tmp_path):
    target = tmp_path / "model"
    with atomic_directory(target) as tmp:
        (tmp / "weights").write_text("w")
        assert not target.exists()
    assert (target / "weights").read_text() == "w"
    assert [p.name for p in tmp_path.iterdir()] == ["model"]


def test_interrupted_directory_leaves_nothing(tmp_path):
    target = tmp_path / "model"
    with pytest.raises(RuntimeError), atomic_directory(target) as tmp:
        (tmp / "weights").write_text("half")
        raise RuntimeError("killed")
    assert list(tmp_path.iterdir()) == []


def test_replace_swaps_an_existing_directory(tmp_path):
    target = tmp_path / "merged"
    for version in ("old", "new"):
        with atomic_directory(target, replace=True) as tmp:
            (tmp / "v").write_text(version)
    assert (target / "v").read_text() == "new"


def _make_once(target: Path, makers: Path) -> None:
    """Make `target` unless it exists, slowly, noting each process that made it."""
    import time

    with made_once(target):
        if not target.exists():
            with atomic_directory(target) as tmp:
                time.sleep(0.5)
                (tmp / "weights").write_text("w")
            with open(makers, "a") as out:
                out.write(f"{os.getpid()}\n")


def test_processes_that_make_the_same_directory_take_turns(tmp_path):
    """Three processes started at once on a fresh cache: one makes it, the others wait and
    find it made (without the lock, the later renames fail on the existing directory)."""
    import multiprocessing

    target, makers = tmp_path / "models" / "converted", tmp_path / "makers.txt"
    processes = [
        multiprocessing.get_context("fork").Process(target=_make_once, args=(target, makers))
        for _ in range(3)
    ]
    for process in processes:
        process.start()
    for process in processes:
        process.join(60)
    assert [process.exitcode for process in processes] == [0, 0, 0]
    assert len(makers.read_text().splitlines()) == 1
    assert (target / "weights").read_text() == "w"


def test_interrupted_file_write_keeps_the_old_text(tmp_path, monkeypatch):
    path = tmp_path / "state.json"
    atomic_write_text(path, "old")

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr("rlvr.atomic.os.replace", broken_replace)
    with pytest.raises(OSError):
        atomic_write_text(path, "new")
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]


def test_everything_is_on_disk_before_the_rename(tmp_path, monkeypatch):
    """Without fsync a power loss can keep a rename but lose the data it points to: every file
    and directory of the new tree is fsynced before the rename, the parent after it. A
    checkpoint is published the same way."""
    events: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(src, dst):
        events.append(("replace", str(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    target = tmp_path / "model"
    with atomic_directory(target) as tmp:
        (tmp / "sub").mkdir()
        (tmp / "sub" / "weights").write_text("w")
        (tmp / "config").write_text("c")
    renamed = events.index(("replace", str(target)))
    before = {path.replace(str(tmp), str(target)) for _, path in events[:renamed]}
    assert before == {
        str(target),
        str(target / "sub"),
        str(target / "sub" / "weights"),
        str(target / "config"),
    }
    assert events[renamed + 1 :] == [("fsync", str(tmp_path))]

    events.clear()
    atomic_write_text(tmp_path / "state.json", "{}")
    assert [kind for kind, _ in events] == ["fsync", "replace", "fsync"]
    assert events[-1] == ("fsync", str(tmp_path))

    events.clear()
    accelerator = SimpleNamespace(
        is_main_process=True,
        wait_for_everyone=lambda: None,
        save_state=lambda d: (Path(d) / "model.safetensors").write_bytes(b"w"),
    )
    final = save_checkpoint(accelerator, tmp_path / "run", {"step": 3}, keep_last=2)
    renamed = events.index(("replace", str(final)))
    synced = {Path(path).name for kind, path in events[:renamed] if kind == "fsync"}
    assert {"model.safetensors", "trainer_state.json", ".tmp-step_000003"} <= synced
    assert events[renamed + 1] == ("fsync", str(final.parent))
