"""A run as a Chrome Trace Event file, to open in Perfetto (ui.perfetto.dev) or chrome://tracing.

Layout: the main process holds two tracks, ``phases`` (one event per epoch x phase) and
``steps`` (one event per step with its data wait, copy, compute and other parts nested inside,
in the order they happen). Each DataLoader worker and child process gets its own process track
with its sampled CPU and memory as counters; machine-wide samples (CPU, disk, page cache, GPU,
memory) are counters on a ``machine`` process. Timestamps are microseconds since the run began.

Bounded like the HTML report: counters come from the bucketed timeline, and past
``max_steps`` steps consecutive steps are merged into spans (their parts summed and laid end
to end), which the trace's metadata says.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TypedDict

from stepscope.analysis.timeline import StepSpan, Timeline
from stepscope.atomic import atomic_open


class _EventCore(TypedDict):
    ph: str  # M metadata, X complete, C counter
    name: str
    pid: int
    tid: int


class TraceEvent(_EventCore, total=False):
    """One Chrome Trace Event (the format's own keys; metadata events have no ts)."""

    cat: str
    ts: float  # microseconds since the run began
    dur: float
    args: dict[str, str | int | float | bool]


MACHINE_PID = 0
TID_PHASES, TID_STEPS = 1, 2
# A trace stays openable: steps kept one by one up to this many, buckets per counter series.
MAX_STEPS = 10_000
MAX_POINTS = 1000


def _us(tl: Timeline, t: float) -> float:
    return round((t - tl.t0) * 1e6, 1)


def _meta(pid: int, name: str, tid: int | None = None) -> TraceEvent:
    if tid is None:
        return {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}}
    return {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}}


def _main_pid(tl: Timeline) -> int:
    main = [p.pid for p in tl.processes if p.role == "main"]
    return main[0] if main else 1


def _phase_events(tl: Timeline, pid: int) -> list[TraceEvent]:
    return [{"ph": "X", "name": f"epoch {p.epoch} {p.phase}", "cat": "phase", "pid": pid,
             "tid": TID_PHASES, "ts": _us(tl, p.started), "dur": round((p.ended - p.started) * 1e6, 1),
             "args": {"epoch": p.epoch, "phase": p.phase}} for p in tl.phases]


def _span_events(tl: Timeline, span: StepSpan, pid: int, phase_of: dict[int, str]
                 ) -> list[TraceEvent]:
    """A step (or merged steps) and its parts as nested complete events."""
    ts = _us(tl, span.t_start)
    dur = max(0.0, round((span.t_end - span.t_start) * 1e6, 1))
    name = (f"step {span.first_step}" if span.count == 1
            else f"steps {span.first_step}–{span.last_step} ({span.count})")
    parts = [("data wait", span.data_wait_s), ("copy", span.transfer_s),
             ("compute", span.compute_s), ("other", span.other_s)]
    total_us = sum(v for _, v in parts) * 1e6
    # Merged spans can have gaps (a checkpoint between steps); parts never outgrow the parent.
    scale = min(1.0, dur / total_us) if total_us > 0 else 0.0
    out: list[TraceEvent] = [{"ph": "X", "name": name, "cat": "step", "pid": pid, "tid": TID_STEPS, "ts": ts,
            "dur": dur, "args": {"phase": phase_of.get(span.phase_id, "?"), "steps": span.count,
                                 "images": span.images, "warmup": span.warmup,
                                 **{f"{k.replace(' ', '_')}_s": v for k, v in parts}}}]
    at = ts
    for part, seconds in parts:
        d = round(seconds * 1e6 * scale, 1)
        if d > 0:
            out.append({"ph": "X", "name": part, "cat": "step-part", "pid": pid,
                        "tid": TID_STEPS, "ts": round(at, 1), "dur": d})
        at += d
    return out


def _counter_pid(source: str, known: set[int]) -> int:
    if source.startswith("proc:"):
        try:
            pid = int(source[5:])
        except ValueError:
            return MACHINE_PID
        return pid if pid in known else MACHINE_PID
    return MACHINE_PID


def _counter_events(tl: Timeline) -> list[TraceEvent]:
    known = {p.pid for p in tl.processes}
    out: list[TraceEvent] = []
    for (source, metric), s in sorted(tl.series.items()):
        pid = _counter_pid(source, known)
        name = metric if pid != MACHINE_PID else f"{source} {metric}"
        for t, v in zip(s.t, s.mean, strict=True):
            if not math.isfinite(v):
                continue
            out.append({"ph": "C", "name": name, "pid": pid, "tid": 0, "ts": _us(tl, t),
                        "args": {metric: round(v, 4)}})
    return out


def trace_events(tl: Timeline) -> list[TraceEvent]:
    """All trace events of a timeline: metadata, phases, steps with parts, counters."""
    pid = _main_pid(tl)
    events = [_meta(MACHINE_PID, "machine (sampled)"),
              _meta(pid, f"main (pid {pid})"), _meta(pid, "phases", TID_PHASES),
              _meta(pid, "steps", TID_STEPS)]
    events += [_meta(p.pid, f"{p.role}: {p.name} (pid {p.pid})") for p in tl.processes
               if p.pid != pid]
    events += _phase_events(tl, pid)
    phase_of = {p.phase_id: f"epoch {p.epoch} {p.phase}" for p in tl.phases}
    for span in tl.step_spans:
        events += _span_events(tl, span, pid, phase_of)
    events += _counter_events(tl)
    return events


def write_trace(path: Path, tl: Timeline) -> Path:
    """Write a Chrome Trace Event JSON file for a run's timeline.

    Args:
        path: where to write (e.g. ``RunDir(run_dir).trace``).
        tl: the run's timeline; for a bounded trace load it with ``max_step_spans=MAX_STEPS``
            and ``max_points=MAX_POINTS`` (render/ does not read stores: the CLI loads it).

    Returns:
        ``path``.

    Examples:
        >>> with RunReader(run_dir) as r:  # doctest: +SKIP
        ...     tl = load_timeline(r, max_points=MAX_POINTS, max_step_spans=MAX_STEPS)
        >>> write_trace(RunDir(run_dir).trace, tl)  # doctest: +SKIP
    """
    doc = {
        "traceEvents": trace_events(tl),
        "displayTimeUnit": "ms",
        "otherData": {
            "producer": "stepscope", "run": tl.run_name, "status": tl.status,
            "t0_unix_s": tl.t0, "counter_bucket_s": tl.bucket_s,
            "steps_merged": tl.spans_aggregated,
            "note": ("consecutive steps are merged into spans; a span's parts are sums laid end "
                     "to end" if tl.spans_aggregated else "every step is its own event")
            + "; counters are per-bucket means",
        },
    }
    path = Path(path)
    with atomic_open(path, "w") as fh:
        json.dump(doc, fh, separators=(",", ":"), allow_nan=False)
    return path
