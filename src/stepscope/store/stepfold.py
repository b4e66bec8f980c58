"""How the writer puts steps into the run database: many rows per statement, folded as they go.

Two costs dominated the writer's share of a step, and both are avoided here:

- Binding. The ``sqlite3`` module binds ``int``, ``float`` and ``str`` in C, but first asks an
  adaptation protocol about any other type, and for ``None`` and ``bool`` that asking raises and
  clears two ``AttributeError`` s: ~0.7 µs each, against ~0.04 µs for a float. A step row holds
  one ``bool`` (warm-up) and usually one ``None`` (no loss), which cost more than the insert
  itself. So the warm-up flag goes in as ``0``/``1`` (what SQLite stores for a bool anyway) and a
  missing loss as NaN, which SQLite stores as NULL (``sqlite3_bind_double`` turns a NaN into
  NULL: a NaN loss from the loop was already stored so). What lands in ``run.db`` is unchanged.
- Rolling up. A roll-up pass used to read its raw rows back with ~30 aggregates per row (sum,
  minimum, maximum of each part, per phase, warm-up flag and slice). The rows pass through
  here anyway, so :class:`StepFolder` keeps those aggregates per group as each batch goes in,
  with C-speed ``sum``/``min``/``max`` over columns sliced out of the batch's flat parameter
  list; a pass then reads back only its percentile sample (:func:`rollups.rollup_row`).

The folded groups stand for exactly the raw rows after the roll-up watermark, and a pass
takes the same rows the SQL pass would (:func:`rollups.roll_up_steps`: every row before the
newest step's slice). Whenever that cannot be vouched for (a step out of time order across
slices, a resumed run's leftover rows, a rowid gap), the pass is the SQL one and the groups are
rebuilt from the rows left.
"""

from __future__ import annotations

import itertools
import math
import operator
import sqlite3
from collections.abc import Sequence
from typing import Any

from stepscope.store import rollups
from stepscope.store.schema import STEP_COLS

ROWS_PER_INSERT = 128
_N = len(STEP_COLS)
_PHASE, _STEP, _T, _WALL, _IMAGES, _WARMUP, _LOSS = (STEP_COLS.index(c) for c in (
    "phase_id", "step", "t_start", "wall_s", "images", "warmup", "loss"))
# The split's parts in roll-up order (rollups.PARTS); comm_s may be NULL (read as 0).
_PARTS = tuple(STEP_COLS.index(f"{p}_s") for p in rollups.PARTS)
_NAN = float("nan")
_NULL_AS_NAN = {None: _NAN}
_INSERT_ONE = f"INSERT INTO steps VALUES ({','.join('?' * _N)})"
_INSERT_MANY = ("INSERT INTO steps VALUES "
                + ",".join([f"({','.join('?' * _N)})"] * ROWS_PER_INSERT))


def bindable(rows: Sequence[tuple[Any, ...]]) -> list[Any]:
    """The rows as one flat parameter list whose every value binds in C (see the module doc)."""
    flat = list(itertools.chain.from_iterable(rows))
    flat[_WARMUP::_N] = map(int, flat[_WARMUP::_N])
    loss = flat[_LOSS::_N]
    flat[_LOSS::_N] = map(_NULL_AS_NAN.get, loss, loss)
    return flat


def insert(con: sqlite3.Connection, flat: list[Any]) -> int:
    """Insert the flat rows; returns the first one's rowid (the rows get consecutive rowids:
    this connection is the table's only writer and each new rowid is the largest plus one)."""
    per = _N * ROWS_PER_INSERT
    # Many rows per statement: executemany steps the statement once per row, and at a trivial
    # loop's rate that per-row round trip was a third of the insert.
    full = len(flat) - len(flat) % per
    for i in range(0, full, per):
        con.execute(_INSERT_MANY, flat[i:i + per])
    if full < len(flat):
        con.executemany(_INSERT_ONE, zip(*[iter(flat[full:])] * _N, strict=True))
    last = con.execute("SELECT last_insert_rowid()").fetchone()[0]
    return int(last) - len(flat) // _N + 1


def _bucket(t: float, interval_s: float) -> int:
    """The slice holding ``t`` by the same float comparisons the SQL pass makes
    (``t >= b * w AND t < (b + 1) * w``), which a bare ``floor(t / w)`` can miss by one ulp."""
    b = math.floor(t / interval_s)
    if t < b * interval_s:
        return b - 1
    return b + 1 if t >= (b + 1) * interval_s else b


class _Group:
    """The aggregates of one (slice, phase, warm-up flag) group of not-yet-rolled raw steps."""

    __slots__ = ("first", "images", "last", "loss_n", "loss_sum", "n", "parts", "s_first",
                 "s_last", "t_end", "t_first")

    def __init__(self, first: int) -> None:
        self.first = self.last = first
        self.t_first = math.inf
        self.t_end = -math.inf
        self.s_first: int | float = math.inf
        self.s_last: int | float = -math.inf
        self.n = self.images = self.loss_n = 0
        self.loss_sum: float | None = None
        self.parts: list[Any] = [0, math.inf, -math.inf] * len(_PARTS)  # sum, min, max each


class StepFolder:
    """Roll-up aggregates of the raw steps after the watermark, kept as the writer inserts them.

    Examples:
        >>> import sqlite3
        >>> from stepscope.store import schema
        >>> con = sqlite3.connect(":memory:")
        >>> _ = con.executescript(schema.SCHEMA)
        >>> rollups.prepare_writer(con)
        >>> folder = StepFolder()
        >>> folder.resync(con)
        >>> folder.add(con, [(0, 0, 100.0, 0.5, 0.1, 0.0, 0.4, 0.0, 8, False, 0.0, None),
        ...                  (0, 1, 100.5, 0.25, 0.05, 0.0, 0.2, 0.0, 8, False, 0.0, 2.0)])
        >>> folder.roll_up(con, final=True, keep_raw=0)
        >>> con.execute("SELECT steps, wall_sum, wall_max, loss_sum, loss_n FROM step_rollups"
        ...             ).fetchall()
        [(2, 0.75, 0.5, 2.0, 1)]
        >>> con.execute("SELECT COUNT(*) FROM steps").fetchone()  # keep_raw=0: none left raw
        (0,)
    """

    def __init__(self, interval_s: float = rollups.STEP_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self.valid = False
        self.base = 0  # the roll-up watermark the groups continue from
        self.top = 0  # the newest rowid inserted
        self._newest_t = -math.inf
        self._last_bucket = -(2 ** 62)
        self._groups: dict[tuple[int, Any, Any], _Group] = {}

    def add(self, con: sqlite3.Connection, rows: Sequence[tuple[Any, ...]]) -> None:
        """Insert the rows and fold them into their groups."""
        flat = bindable(rows)
        first = insert(con, flat)
        self._fold_batch(flat, first)

    def resync(self, con: sqlite3.Connection) -> None:
        """Rebuild the groups from the raw rows after the watermark (writer start, SQL pass)."""
        self._groups = {}
        self._newest_t = -math.inf
        self._last_bucket = -(2 ** 62)
        self.base = int(rollups.meta(con, "steps_rolled_rowid"))
        self.top = int(con.execute("SELECT COALESCE(MAX(rowid), 0) FROM steps").fetchone()[0])
        rows = con.execute(f"SELECT rowid, {','.join(STEP_COLS)} FROM steps WHERE rowid > ? "
                           "ORDER BY rowid", (self.base,)).fetchall()
        self.valid = True
        if not rows:
            return
        if rows[-1][0] - rows[0][0] + 1 != len(rows) or rows[0][0] != self.base + 1:
            self.valid = False  # rowids with a gap: only the SQL pass reads them right
            return
        self.top = self.base
        self._fold_batch(bindable([r[1:] for r in rows]), rows[0][0])

    def _fold_batch(self, flat: list[Any], first: int) -> None:
        n = len(flat) // _N
        if not n:
            return
        if first != self.top + 1:
            self.valid = False
        self.top = first + n - 1
        if not self.valid:
            return
        w = self.interval_s
        t = flat[_T::_N]
        t_lo, t_hi = min(t), max(t)
        b_lo, b_hi = _bucket(t_lo, w), _bucket(t_hi, w)
        self._newest_t = max(self._newest_t, t_hi)
        phase, warm = flat[_PHASE::_N], flat[_WARMUP::_N]
        if b_lo == b_hi and b_lo >= self._last_bucket and phase.count(phase[0]) == n \
                and warm.count(warm[0]) == n:
            # The usual batch: one phase, one slice; every aggregate is a C call per column.
            self._fold(flat, 0, n, (b_lo, phase[0], warm[0]), first)
            self._last_bucket = b_lo
            return
        start, key = 0, None
        for i in range(n):
            k = (_bucket(t[i], w), phase[i], warm[i])
            if k[0] < self._last_bucket:
                # Out of time order across slices: the SQL pass's cut (the last row before the
                # newest slice) may then split a group, which only the SQL pass reproduces.
                self.valid = False
                return
            self._last_bucket = k[0]
            if k != key:
                if key is not None:
                    self._fold(flat, start, i, key, first)
                start, key = i, k
        assert key is not None
        self._fold(flat, start, n, key, first)

    def _fold(self, flat: list[Any], lo: int, hi: int, key: tuple[int, Any, Any],
              first: int) -> None:
        """Fold rows ``lo``..``hi - 1`` of ``flat`` (all of group ``key``) into its group."""
        g = self._groups.get(key)
        if g is None:
            g = self._groups[key] = _Group(first + lo)
        g.last = first + hi - 1
        a, z = lo * _N, hi * _N
        t, wall = flat[a + _T:z:_N], flat[a + _WALL:z:_N]
        g.t_first = min(g.t_first, min(t))
        g.t_end = max(g.t_end, max(map(operator.add, t, wall)))
        steps = flat[a + _STEP:z:_N]
        g.s_first, g.s_last = min(g.s_first, min(steps)), max(g.s_last, max(steps))
        g.n += hi - lo
        g.images += sum(flat[a + _IMAGES:z:_N])
        loss = flat[a + _LOSS:z:_N]
        if loss.count(_NAN) < len(loss):  # NULL losses were made this NaN object (bindable)
            # SUM and COUNT skip NULLs, and a NaN loss of the loop's own is stored as NULL too.
            vals = [v for v in loss if v == v]
            g.loss_sum = sum(vals, g.loss_sum or 0)
            g.loss_n += len(vals)
            if not g.loss_n:
                g.loss_sum = None
        parts = g.parts
        for i, c in enumerate(_PARTS):
            col = flat[a + c:z:_N]
            try:
                s, lo_v, hi_v = sum(col, parts[3 * i]), min(col), max(col)
            except TypeError:  # a NULL comm_s: the reader's COALESCE(comm_s, 0)
                col = [0 if v is None else v for v in col]
                s, lo_v, hi_v = sum(col, parts[3 * i]), min(col), max(col)
            parts[3 * i] = s
            if lo_v < parts[3 * i + 1]:
                parts[3 * i + 1] = lo_v
            if hi_v > parts[3 * i + 2]:
                parts[3 * i + 2] = hi_v

    def roll_up(self, con: sqlite3.Connection, *, final: bool, keep_raw: int) -> None:
        """One roll-up pass: the same rows and figures as :func:`rollups.roll_up_steps`."""
        rolled = int(rollups.meta(con, "steps_rolled_rowid"))
        if not self.valid or rolled != self.base:
            rollups.roll_up_steps(con, final=final, interval_s=self.interval_s, keep_raw=keep_raw)
            self.resync(con)
            return
        w = self.interval_s
        # Not final: every group before the newest step's slice (steps are in slice order here,
        # so those are exactly the rows before the SQL pass's cut).
        cut = math.floor(self._newest_t / w) if self._groups and not final else None
        done = [k for k in self._groups if cut is None or k[0] < cut]
        if done:
            upto = max(self._groups[k].last for k in done)
            done.sort(key=lambda k: (k[0], self._groups[k].first))
            rows = [(*self._row(con, k, self._groups.pop(k)), upto, 0) for k in done]
            con.executemany(f"INSERT INTO step_rollups VALUES ({','.join('?' * len(rows[0]))})",
                            rows)
            rollups.set_meta(con, "steps_rolled_rowid", float(upto))
            self.base = upto
        rollups.drop_old_raw_steps(con, max(self.top, rolled), keep_raw)

    def _row(self, con: sqlite3.Connection, key: tuple[int, Any, Any], g: _Group
             ) -> tuple[Any, ...]:
        b, phase_id, warmup = key
        w = self.interval_s
        head = (phase_id, warmup, b, g.t_first, g.t_end, g.s_first, g.s_last, g.n, g.images,
                g.loss_sum, g.loss_n, *g.parts)
        args = {"blo": g.first, "bhi": g.last, "p": phase_id, "u": warmup, "t0": b * w,
                "t1": (b + 1) * w, "first": g.first, "last": g.last}
        return rollups.rollup_row(con, head, args)
