"""The run directory's layout: names made and parsed back by the same module."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stepscope.store.rundir import RunDir, parse_rank_db_name, rank_db_name

pytestmark = pytest.mark.light  # quick, no process, no thread: shares make test's interpreter


def test_every_file_of_a_run_directory(tmp_path: Path) -> None:
    rd = RunDir(tmp_path)
    names = [rd.db, rd.config, rd.summary, rd.report, rd.trace, rd.metrics_csv,
             rd.best_checkpoint, rd.last_checkpoint]
    assert [p.relative_to(tmp_path).as_posix() for p in names] == [
        "run.db", "config.yaml", "summary.json", "report.html", "trace.json", "metrics.csv",
        "checkpoints/best.pt", "checkpoints/last.pt"]


@given(st.integers(min_value=0, max_value=100_000))
def test_rank_store_names_parse_back(rank: int) -> None:
    assert parse_rank_db_name(rank_db_name(rank)) == rank


def test_foreign_names_are_no_rank_store() -> None:
    for name in ("run.rank.db", "run.rankx.db", "run.rank1.db-wal", "summary.json", "xrun.db"):
        assert parse_rank_db_name(name) is None


def test_rank_stores_found_in_rank_order(tmp_path: Path) -> None:
    rd = RunDir(tmp_path)
    assert not rd.has_store() and rd.ranks() == []
    for k in (0, 10, 2, 1):
        rd.rank_db(k).write_bytes(b"")
    (tmp_path / "run.rank3.db-wal").write_bytes(b"")  # SQLite's side files are no stores
    assert rd.rank_db_names() == ["run.rank1.db", "run.rank2.db", "run.rank10.db"]
    assert rd.ranks() == [0, 1, 2, 10]


def test_training_state_is_a_store_or_checkpoints(tmp_path: Path) -> None:
    rd = RunDir(tmp_path)
    assert not rd.has_training_state()
    rd.checkpoints.mkdir()
    assert rd.has_training_state()
