"""Atomic writes: a crash mid-write leaves the old state (or nothing), never half a file."""

import pytest

from rlvr.atomic import atomic_directory, atomic_write_text


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
