"""``stepscope export RUN --csv DIR``: the run's tables as CSV files, for pandas and spreadsheets.

- ``steps.csv``: one row per step, with its phase's epoch and kind (and the rank in a
  distributed run): the times (seconds) each step spent waiting for data, copying, computing,
  communicating and in the rest, its images, whether it was a warm-up step, its loss.
- ``phases.csv``: one row per epoch x phase, with the process tree's read counters and the
  dataset's page-cache residency at its start and end.
- ``samples.csv``: every sampled value in long format (``t, source, metric, value``), as stored;
  ``pandas.pivot_table(index="t", columns=["source", "metric"])`` makes it wide.

Times are Unix seconds. Rows are streamed from the database, so a long run costs no memory.
"""

from __future__ import annotations

import csv
import sqlite3
from collections.abc import Iterator
from dataclasses import asdict, fields
from pathlib import Path

from stepscope.errors import StepscopeError
from stepscope.store.db import RunReader
from stepscope.store.records import PhaseRecord, StepRecord
from stepscope.store.rundir import RunDir

STEPS_CSV = "steps.csv"
PHASES_CSV = "phases.csv"
SAMPLES_CSV = "samples.csv"
STEP_COLUMNS = ["rank", "epoch", "phase", *[f.name for f in fields(StepRecord)]]
PHASE_COLUMNS = [f.name for f in fields(PhaseRecord)]
SAMPLE_COLUMNS = ["rank", "t", "source", "metric", "value"]


def _iter_samples(reader: RunReader) -> Iterator[tuple[float, str, str, float]]:
    con: sqlite3.Connection = reader._con  # read-only connection owned by the reader
    yield from con.execute("SELECT t, source, metric, value FROM samples ORDER BY t")


def export_csv(run_dir: Path, out_dir: Path) -> list[Path]:
    """Write ``steps.csv``, ``phases.csv`` and ``samples.csv`` of every rank's store.

    Args:
        run_dir: the run directory.
        out_dir: where the CSV files go (created; existing files of these names are replaced).

    Returns:
        The files written.

    Examples:
        >>> export_csv(Path("runs/mine"), Path("runs/mine/csv"))
        [PosixPath('runs/mine/csv/steps.csv'), ...]
    """
    rd = RunDir(Path(run_dir))
    if not rd.has_store():
        raise StepscopeError(f"no run database in {run_dir}: expected a run directory made by "
                             "`stepscope train`, `watch` or a stepscope callback (it holds run.db)")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / STEPS_CSV, out_dir / PHASES_CSV, out_dir / SAMPLES_CSV]
    with paths[0].open("w", newline="") as fs, paths[1].open("w", newline="") as fp, \
            paths[2].open("w", newline="") as fm:
        steps, phases, samples = csv.writer(fs), csv.writer(fp), csv.writer(fm)
        steps.writerow(STEP_COLUMNS)
        phases.writerow(PHASE_COLUMNS)
        samples.writerow(SAMPLE_COLUMNS)
        for rank in rd.ranks():
            with RunReader(rd.path, db_name=rd.rank_db(rank).name) as reader:
                known = {p.phase_id: p for p in reader.phases()}
                for p in known.values():
                    phases.writerow([asdict(p)[c] for c in PHASE_COLUMNS])
                for s in reader.iter_steps():
                    ph = known.get(s.phase_id)
                    row = asdict(s)
                    steps.writerow([rank, ph.epoch if ph else "", ph.phase if ph else "",
                                    *[row[c] for c in STEP_COLUMNS[3:]]])
                for t, source, metric, value in _iter_samples(reader):
                    samples.writerow([rank, t, source, metric, value])
    return paths
