"""Atomic writes: the old file stays whole until the new one is complete."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from stepscope.atomic import atomic_open, atomic_write_bytes, atomic_write_text

pytestmark = pytest.mark.light  # quick, no process, no thread: shares make test's interpreter


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    target = atomic_write_text(tmp_path / "summary.json", "old")
    with pytest.raises(RuntimeError), atomic_open(target, "w") as fh:
        fh.write("half of the new")
        raise RuntimeError("disk full")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]


def test_parents_are_made_and_files_readable_like_any_other(tmp_path: Path) -> None:
    path = atomic_write_bytes(tmp_path / "checkpoints" / "last.pt", b"\x00\x01", fsync=True)
    assert path.read_bytes() == b"\x00\x01"
    assert stat.S_IMODE(path.stat().st_mode) == 0o644  # not mkstemp's private 0600


def test_text_mode_only_whole_files(tmp_path: Path) -> None:
    with pytest.raises(ValueError), atomic_open(tmp_path / "x", "a"):
        pass
