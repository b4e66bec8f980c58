"""Epoch 1 against the epochs after it: a first epoch that waited for data where the later ones
did not, and why, where the run measured why.

A pipeline that caches (tf.data's ``.cache()``, the kernel's page cache for files read again)
pays for loading once: epoch 1 runs the work before the cache and fills it, later epochs read
from it. Over all epochs a short run is still input-bound (epoch 1 is most of its time), but
"95 % of every step" is then epoch 1's figure, and a fix for the loading speeds epoch 1 alone.
So the answer names the epochs apart, and the input finding says whose steps its gain is for.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from stepscope.analysis.budget import own_phases
from stepscope.analysis.contracts_summary import EpochRow, PhaseRow, Summary
from stepscope.analysis.evidence import claim, holds
from stepscope.analysis.fmt import fmt_bytes, fmt_pct, fmt_s, fmt_time
from stepscope.analysis.thaw import thawed
from stepscope.analysis.vocab import KERAS, framework_of

COLD_READ_FRAC = 0.3  # epoch 1 is "cold" when ≥ 30 % of what it read came from disk
COLD_MIN_BYTES = 16_000_000


def epoch_was_cold(s: Summary, epoch: EpochRow) -> bool:
    """Did this epoch read the dataset from disk (a cold page cache)?

    Residency at the epoch's start decides when measured; else physical reads against the
    dataset's size; else against what the epoch read, ignoring a few MB (shared libraries paged
    in by new workers count as physical reads but are not dataset files).
    """
    resid = next((p.get("dataset_resident_frac_start") for p in s.get("phases") or []
                  if p["epoch"] == epoch["epoch"]), None)
    if resid is not None:
        return bool(resid < 0.5)
    disk = epoch.get("disk_read_bytes") or 0
    ds = (s.get("dataset") or {}).get("bytes")
    if ds:
        return bool(disk >= COLD_READ_FRAC * ds)
    return bool(disk >= max(COLD_MIN_BYTES, COLD_READ_FRAC * (epoch.get("rchar_bytes") or 0)))


@dataclass(frozen=True)
class FirstEpochOnly:
    """The run's first train phase was input-bound and none after it was."""

    first: PhaseRow
    later: list[PhaseRow]

    def later_words(self) -> str:
        """"epochs 2–3 were compute-bound (4–10 % data wait)"."""
        epochs = [p["epoch"] for p in self.later]
        which = f"epoch {epochs[0]}" if len(epochs) == 1 else f"epochs {epochs[0]}–{epochs[-1]}"
        verdicts = list(dict.fromkeys(str(p["verdict"]) for p in self.later))
        waits = sorted(p["data_wait_frac"] or 0.0 for p in self.later)
        wait = fmt_pct(waits[0]) if fmt_pct(waits[0]) == fmt_pct(waits[-1]) \
            else f"{fmt_pct(waits[0]).removesuffix(' %')}–{fmt_pct(waits[-1])}"
        return f"{which} {'was' if len(epochs) == 1 else 'were'} {' or '.join(verdicts)} " \
               f"({wait} data wait)"


def first_epoch_only(s: Summary) -> FirstEpochOnly | None:
    """The first train phase input-bound and every later one not (two train phases or more,
    each with a verdict), else None."""
    rows = [p for p in s.get("phases") or [] if p["phase"] == "train" and p.get("verdict")]
    if len(rows) < 2 or rows[0]["verdict"] != "input-bound" \
            or any(p["verdict"] == "input-bound" for p in rows[1:]):
        return None
    return FirstEpochOnly(rows[0], rows[1:])


KEPT_READ_FRAC = 0.1  # a later epoch reading under 10 % of epoch 1's bytes kept its data


def kept_in_process(first: EpochRow | PhaseRow, later: Sequence[EpochRow | PhaseRow]) -> bool:
    """Every later epoch (or phase) read (``rchar``: reads through any cache) under
    ``KEPT_READ_FRAC`` of what the first read: the program, not the kernel, kept the data."""
    read = first.get("rchar_bytes") or 0
    return read > 0 and bool(later) and all(
        e.get("rchar_bytes") is not None and (e["rchar_bytes"] or 0) <= KEPT_READ_FRAC * read
        for e in later)


def training_kept(s: Summary) -> bool:
    """The training phases after the first read under ``KEPT_READ_FRAC`` of what the first
    training phase read, which read files: a pipeline that caches its training input while its
    validation reads its files again (each epoch's ``rchar`` then holds validation's alone)."""
    rows = [p for p in own_phases(s) if p["phase"] == "train"]
    return bool(rows) and kept_in_process(rows[0], rows[1:])


def kept_how(s: Summary) -> str:
    """How the program kept it, where the run measured how."""
    later = [p for p in own_phases(s) if p["epoch"] > 1 and p["phase"] == "train"]
    if later and all(p.get("feature_cache") for p in later):
        return (" (the trainer's feature cache: the frozen trunk's features, computed once, "
                "fact featcache.used)")
    return claim(s, "tf_data_cache", " (the tf.data pipeline caches: .cache(), as watch read the "
                 "pipeline given to Model.fit, keeps its batches in the training process)")


def _disk_warmed(s: Summary) -> EpochRow | None:
    """Epoch 1's row when it read the dataset's files from disk and no later epoch did."""
    epochs = [e for e in s.get("epochs") or [] if e.get("disk_read_bytes") is not None]
    if len(epochs) < 2 or not holds(s, "dataset_files") or not epoch_was_cold(s, epochs[0]):
        return None
    return None if any(epoch_was_cold(s, e) for e in epochs[1:]) else epochs[0]


def _later_reads(s: Summary, cold: EpochRow) -> str:
    """What the epochs after a cold first one read: the files again from the page cache, or
    none (the program kept them)."""
    later = [e for e in s.get("epochs") or [] if e["epoch"] > cold["epoch"]]
    if kept_in_process(cold, later):
        return "later epochs read no files: the program kept what it had read" + kept_how(s)
    return "later epochs found its files in the kernel's page cache"


def _why(s: Summary, found: FirstEpochOnly) -> tuple[str, str]:
    """Why only epoch 1 waited, as far as the run measured it: (a sentence, what later epochs
    read), or ("", "") when it did not."""
    if all(p.get("feature_cache") for p in found.later):
        return (" Later epochs ran from the trainer's feature cache (the frozen trunk's features, "
                "computed once: fact featcache.used), which reads no images.", "the feature cache")
    n = found.first["epoch"]
    cached = claim(s, "tf_data_cache", " The tf.data pipeline caches (.cache(), as watch read "
                   f"the pipeline given to Model.fit): epoch {n} ran everything before the "
                   "cache and filled it, and later epochs read their batches from it, so only "
                   f"epoch {n} pays for that loading.")
    if cached:
        return cached, "the cache"
    cold = _disk_warmed(s)
    if cold is not None:
        later = [e for e in s.get("epochs") or [] if e["epoch"] > cold["epoch"]]
        return (f" Epoch {cold['epoch']} read {fmt_bytes(cold['disk_read_bytes'])} of the "
                f"dataset from disk; {_later_reads(s, cold)}.",
                "what the program kept" if kept_in_process(cold, later) else "the page cache")
    return "", ""


def answer(s: Summary) -> tuple[str, str] | None:
    """"Why only epoch 1 waited for data": the two figures, what epoch 1's wait cost, and why
    where measured."""
    found = first_epoch_only(s)
    if found is None:
        return None
    first = found.first
    waited = first["seconds"] * (first["data_wait_frac"] or 0.0)
    train_s = sum(p["seconds"] for p in [first, *found.later])
    text = (f"Epoch {first['epoch']} was input-bound: {fmt_pct(first['data_wait_frac'])} of its "
            f"steps' time waited for data; {found.later_words()}. Its wait took "
            f"{fmt_s(waited)} of the {fmt_s(train_s)} spent training.")
    why = _why(s, found)[0]
    return f"Why only epoch {first['epoch']} waited for data", text + (
        why or " What changed after it was not measured (no cache in the input watch read, "
        "no cold reads from disk).")


def gain_scope(s: Summary) -> str:
    """Whose steps an input fix's gain is for, where only epoch 1 waited: ", in epoch 1 (later
    epochs read the cache"; "" otherwise."""
    found = first_epoch_only(s)
    if found is None:
        return ""
    read = _why(s, found)[1]
    return f", in epoch {found.first['epoch']} only" + (f": later epochs read {read}" if read else "")


SLOWER_RATIO = 0.8  # epoch 1 under 80 % of the later epochs' median img/s: worth an answer


def slower_answer(s: Summary) -> tuple[str, str] | None:
    """"Why epoch 1 was slower", where it ran under ``SLOWER_RATIO`` of the later training
    phases' median pace and did not wait for data (that is :func:`answer`'s): how much longer it
    took than at their pace, against the seconds its warm-up steps took over steady ones, its
    steady steps against theirs, and its reads from disk where measured."""
    rows = [p for p in own_phases(s) if p["phase"] == "train" and p.get("images_per_s")]
    # Epochs after the trunk was unfrozen train another network (thaw.answer's): epoch 1 is
    # held against the epochs that trained what it trained.
    thaw = thawed(s.get("model"), framework_of(s) == KERAS)
    if thaw is not None:
        rows = [p for p in rows if p["epoch"] < thaw.epoch]
    if len(rows) < 2 or first_epoch_only(s) is not None:
        return None
    first, later = rows[0], rows[1:]
    rates = sorted(float(p["images_per_s"] or 0.0) for p in later)
    pace = statistics.median(rates)
    if not pace or float(first["images_per_s"] or 0.0) > SLOWER_RATIO * pace:
        return None
    n = first["epoch"]
    lost = first["seconds"] - first["images"] / pace
    span = (f"{rates[0]:,.0f} img/s" if len(rates) == 1 else
            f"{rates[0]:,.0f}–{rates[-1]:,.0f} img/s")
    epochs = (f"epoch {later[0]['epoch']}" if len(later) == 1 else
              f"epochs {later[0]['epoch']}–{later[-1]['epoch']}")
    text = (f"Epoch {n} ran at {first['images_per_s']:,.0f} img/s against {span} in {epochs}: "
            f"{fmt_s(lost)} longer than at " + ("that pace." if len(rates) == 1 else
                                                "their median pace."))
    steps, warm_s = first.get("warmup_steps") or 0, first.get("warmup_s") or 0.0
    step_s = (first.get("step_ms_per_step") or 0.0) / 1000
    extra = warm_s - steps * step_s
    if steps and extra > 0:
        text += (f" Its {steps} warm-up steps took {fmt_s(warm_s)} where a steady step took "
                 f"{fmt_time(step_s)}: "
                 f"{fmt_s(extra)} more, each loop's first steps (a step function traced or "
                 "compiled, loaders starting)" + (", most of the difference." if extra >= 0.5 * lost
                                                 else "."))
    steady = [float(p["step_ms_per_image"] or 0.0) for p in later if p.get("step_ms_per_image")]
    if first.get("step_ms_per_image") and steady and extra < 0.5 * lost:
        text += (f" Its steady steps took {first['step_ms_per_image']:.1f} ms an image against "
                 f"{statistics.median(steady):.1f} ms later.")
    cold = _disk_warmed(s)
    if cold is not None and cold["epoch"] == n:
        text += (f" It read {fmt_bytes(cold['disk_read_bytes'])} of the dataset from disk; "
                 f"{_later_reads(s, cold)}.")
    return f"Why epoch {n} was slower", text
