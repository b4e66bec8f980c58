"""The run database's schema and how a connection to it is opened, shared by the one writer
(``RunWriter``) and every reader (``RunReader``, ``compact_run``)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from stepscope.store import rollups

SCHEMA_VERSION = 1

SCHEMA = """
CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    name TEXT, command TEXT, device TEXT, kind TEXT, status TEXT,
    started REAL, ended REAL, heartbeat REAL, pid INTEGER, rank INTEGER, world_size INTEGER,
    exit_code INTEGER, config_json TEXT
);
CREATE TABLE IF NOT EXISTS phases (
    phase_id INTEGER PRIMARY KEY, epoch INTEGER, phase TEXT, started REAL, ended REAL,
    steps INTEGER, images INTEGER, resident_frac_start REAL, resident_frac_end REAL,
    read_bytes_start INTEGER, read_bytes_end INTEGER, rchar_start INTEGER, rchar_end INTEGER,
    workers INTEGER, rank INTEGER
);
CREATE TABLE IF NOT EXISTS steps (
    phase_id INTEGER, step INTEGER, t_start REAL, wall_s REAL, data_wait_s REAL,
    transfer_s REAL, compute_s REAL, other_s REAL, images INTEGER, warmup INTEGER,
    comm_s REAL, loss REAL
);
CREATE TABLE IF NOT EXISTS samples (t REAL, source TEXT, metric TEXT, value REAL);
CREATE INDEX IF NOT EXISTS samples_metric ON samples (metric, source, t);
CREATE TABLE IF NOT EXISTS processes (
    pid INTEGER PRIMARY KEY, ppid INTEGER, role TEXT, name TEXT, first_t REAL, last_t REAL
);
CREATE TABLE IF NOT EXISTS arrivals (
    seq INTEGER PRIMARY KEY, t_arrive REAL, wait_s REAL, comm_s REAL, buckets INTEGER
);
CREATE TABLE IF NOT EXISTS notes (t REAL, source TEXT, text TEXT);
CREATE TABLE IF NOT EXISTS facts (key TEXT PRIMARY KEY, value_json TEXT, how_measured TEXT);
""" + rollups.ROLLUP_SCHEMA

PHASE_COLS = ["phase_id", "epoch", "phase", "started", "ended", "steps", "images", "resident_frac_start", "resident_frac_end", "read_bytes_start", "read_bytes_end", "rchar_start", "rchar_end", "workers", "rank"]
STEP_COLS = ["phase_id", "step", "t_start", "wall_s", "data_wait_s", "transfer_s", "compute_s", "other_s", "images", "warmup", "comm_s", "loss"]


def connect(path: Path) -> sqlite3.Connection:
    con = sqlite3.connect(str(path), timeout=10.0, check_same_thread=False)
    con.execute("PRAGMA journal_mode=WAL")
    # NORMAL is durable across a process kill (only an OS crash can lose the last commit).
    con.execute("PRAGMA synchronous=NORMAL")
    # A checkpointed WAL is cut back to this size instead of keeping its high-water mark.
    con.execute("PRAGMA journal_size_limit=4194304")
    return con
