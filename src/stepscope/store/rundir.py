"""The layout of a run directory: the one place that spells its file names.

Every layer that reads or writes a file of a run asks a :class:`RunDir` for its path, so a
file can be renamed (or a new one added) here and nowhere else::

    runs/<name>/
      run.db              SQLite store of everything recorded (rank 0 of a distributed run)
      run.rank<k>.db      the store of rank k > 0 of a distributed run
      config.yaml         the resolved configuration (trainer runs)
      summary.json        the analysis
      report.html         self-contained report
      trace.json          Chrome/Perfetto trace (``stepscope report --trace``)
      metrics.csv         one row per epoch (trainer runs)
      checkpoints/        best.pt, last.pt (trainer runs)
      .stages/<pid>/      loader stage counters while a run records (scratch, removed at close)

Examples:
    >>> rd = RunDir(Path("runs/demo"))
    >>> rd.db.name, rd.rank_db(2).name, rd.best_checkpoint.as_posix()
    ('run.db', 'run.rank2.db', 'runs/demo/checkpoints/best.pt')
    >>> parse_rank_db_name("run.rank12.db"), parse_rank_db_name("run.db")
    (12, 0)
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

DB_NAME = "run.db"
CONFIG_NAME = "config.yaml"
SUMMARY_NAME = "summary.json"
REPORT_NAME = "report.html"
TRACE_NAME = "trace.json"
METRICS_NAME = "metrics.csv"
CHECKPOINTS_NAME = "checkpoints"
BEST_CHECKPOINT_NAME = "best.pt"
LAST_CHECKPOINT_NAME = "last.pt"
STAGES_NAME = ".stages"

_RANK_DB_GLOB = "run.rank*.db"
_RANK_DB_RE = re.compile(r"run\.rank(\d+)\.db")


def rank_db_name(rank: int) -> str:
    """The store a rank writes: ``run.db`` for rank 0, ``run.rank<k>.db`` for the others."""
    return DB_NAME if rank == 0 else f"run.rank{rank}.db"


def parse_rank_db_name(name: str) -> int | None:
    """The rank whose store is called ``name``, or None when it is no rank store."""
    if name == DB_NAME:
        return 0
    m = _RANK_DB_RE.fullmatch(name)
    return int(m.group(1)) if m else None


@dataclass(frozen=True)
class RunDir:
    """Paths of every file of one run directory (nothing is created or read here)."""

    path: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", Path(self.path))

    @property
    def db(self) -> Path:
        return self.path / DB_NAME

    def rank_db(self, rank: int) -> Path:
        return self.path / rank_db_name(rank)

    @property
    def stages(self) -> Path:
        """Scratch folder of the loader stage counters (``observe/stages.py``)."""
        return self.path / STAGES_NAME

    @property
    def config(self) -> Path:
        return self.path / CONFIG_NAME

    @property
    def summary(self) -> Path:
        return self.path / SUMMARY_NAME

    @property
    def report(self) -> Path:
        return self.path / REPORT_NAME

    @property
    def trace(self) -> Path:
        return self.path / TRACE_NAME

    @property
    def metrics_csv(self) -> Path:
        return self.path / METRICS_NAME

    @property
    def checkpoints(self) -> Path:
        return self.path / CHECKPOINTS_NAME

    @property
    def best_checkpoint(self) -> Path:
        return self.checkpoints / BEST_CHECKPOINT_NAME

    @property
    def last_checkpoint(self) -> Path:
        return self.checkpoints / LAST_CHECKPOINT_NAME

    def has_store(self) -> bool:
        """True when this directory holds a run database (rank 0's)."""
        return self.db.is_file()

    def has_training_state(self) -> bool:
        """True when a trainer already wrote here (a store or checkpoints): a new run would mix in."""
        return self.db.exists() or self.checkpoints.exists()

    def rank_db_names(self) -> list[str]:
        """Store names of the ranks other than 0 present here (``run.rank<k>.db``), by rank."""
        found = [(parse_rank_db_name(p.name), p.name) for p in self.path.glob(_RANK_DB_GLOB)]
        return [name for rank, name in sorted((r, n) for r, n in found if r is not None and r > 0)]

    def ranks(self) -> list[int]:
        """Ranks whose stores are present here (0 included when ``run.db`` is)."""
        others = [parse_rank_db_name(n) for n in self.rank_db_names()]
        return ([0] if self.has_store() else []) + [r for r in others if r is not None]


__all__ = [
    "DB_NAME",
    "REPORT_NAME",
    "SUMMARY_NAME",
    "RunDir",
    "parse_rank_db_name",
    "rank_db_name",
]
