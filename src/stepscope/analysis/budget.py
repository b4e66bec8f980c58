"""Where a run's wall time went, from its start to its end: before the first phase, in the
training and validation phases (and their warm-up steps), between and after them, with the
checkpoint writes measured there.

Step figures speak of steps; a run also spends time where no step runs: the interpreter, the
framework's import and the model's building before the first batch, the first steps of each new
step function (traced, compiled), checkpoints written after validation. A practitioner who times
the whole run and sees only steps cannot make the numbers add up; this answer does.
"""

from __future__ import annotations

from stepscope.analysis.contracts_summary import PhaseAgg, PhaseRow, RunHeader, Summary
from stepscope.analysis.fmt import fmt_count, fmt_s
from stepscope.analysis.spans import covered_s

SHOWN_MIN_S = 0.05  # parts shorter than this are left out of the sentence


def checkpoints_in_overhead(agg: PhaseAgg) -> tuple[float, float] | None:
    """(seconds of checkpoint writes inside the phases' steps, their loop overhead in seconds)
    where the writes are most of that overhead (Keras's ModelCheckpoint(save_freq=N batches));
    None otherwise."""
    inside, seconds = agg.get("checkpoint_in_phase_s") or 0.0, agg.get("seconds") or 0.0
    other_s = (agg["other_frac"] or 0.0) * seconds
    return (inside, other_s) if seconds > 0 and inside > 0 and inside >= 0.5 * other_s else None


def own_phases(s: Summary) -> list[PhaseRow]:
    """This run's (this rank's) phases, in the summary's order (the phases' own)."""
    rank = (s.get("run") or {}).get("rank")
    return [p for p in s.get("phases") or [] if rank is None or p.get("rank") in (None, rank)]


def _union(rows: list[PhaseRow]) -> float:
    """Seconds covered by the phases' spans (Lightning's validation runs inside a training
    phase that stays open: its time is counted once)."""
    if not rows:
        return 0.0
    return covered_s(min(p["started"] for p in rows), max(p["ended"] for p in rows),
                     [(p["started"], p["ended"]) for p in rows])


def _kind(rows: list[PhaseRow], kind: str, seconds: float) -> tuple[str, str] | None:
    """("4.1 s in 3 training phases", "1.7 s of the training"), the second "" under
    ``SHOWN_MIN_S`` of warm-up; None without such phases. ``seconds``: the kind's own time."""
    mine = [p for p in rows if p["phase"] == kind]
    if not mine:
        return None
    word = "training" if kind == "train" else "validation"
    warm_s = sum(p.get("warmup_s") or 0.0 for p in mine)
    return (f"{fmt_s(seconds)} in {fmt_count(len(mine), word + ' phase')}",
            f"{fmt_s(warm_s)} of the {word}" if warm_s >= SHOWN_MIN_S else "")


def _before_words(run: RunHeader, first: float) -> str:
    """The time before the first phase, split where watch saw the framework's import finish:
    the last such import before the phase (Keras imports its backend inside its own)."""
    started = run["started"]
    done = [(t, name) for name, t in (run.get("imports_done") or {}).items()
            if started <= t <= first]
    if not done:
        return "the interpreter, imports, building the model and its input: not split further"
    t, name = max(done)
    return (f"{fmt_s(t - started)} until `import {name}` finished, as watch's import hook "
            f"timed it: the interpreter and the imports up to it; {fmt_s(first - t)} after it: "
            "the script's other imports, building the model and its input")


def answer(s: Summary) -> tuple[str, str] | None:
    """"Where the run's time went", or None without a run length or any phase."""
    run = s.get("run") or {}
    started, seconds = run.get("started"), run.get("seconds")
    rows = sorted(own_phases(s), key=lambda p: p["started"])
    if started is None or not seconds or not rows:
        return None
    first, last = rows[0]["started"], max(p["ended"] for p in rows)
    before = max(0.0, first - started)
    after = max(0.0, started + seconds - last)
    covered = _union(rows)
    between = max(0.0, (last - first) - covered)
    val_s = _union([p for p in rows if p["phase"] == "val"])
    train_s = covered - val_s  # a validation inside an open training phase is validation's
    parts = [f"{fmt_s(before)} before the first phase began ({_before_words(run, first)})"] \
        if before >= SHOWN_MIN_S else []
    kinds = [k for k in (_kind(rows, "train", train_s), _kind(rows, "val", val_s)) if k]
    if kinds:
        parts.append(" and ".join(k[0] for k in kinds))
    outside = between + after
    if outside >= SHOWN_MIN_S:
        text = f"{fmt_s(outside)} between the phases and after the last"
        ck = s.get("checkpoints") or {}
        written = ck.get("between_phases_s") or 0.0
        if ck.get("writes") and written >= SHOWN_MIN_S:
            text += f", {fmt_s(min(written, outside))} of it writing checkpoints"
        parts.append(text)
    text = f"The run took {fmt_s(seconds)}: " + "; ".join(parts) + "."
    warm = [k[1] for k in kinds if k[1]]
    if warm:
        text += (" Warm-up steps took " + " and ".join(warm) + " (each loop's first steps, "
                 "which the steady figures leave out: where a step function is traced or "
                 "compiled and loaders start).")
    return "Where the run's time went", text
