"""Steps and phases from what a hand-written loop does (plain PyTorch under ``stepscope watch``).

The PyTorch hooks report events; this module, standard library only, turns them into steps and
phases (DESIGN.md: "a phase is what the loop does", never ``model.train()/eval()`` alone):

- an iterator was created, asked for a batch, delivered one, or ran out (``StopIteration``);
- the loop body did what a step does: a module forward, a backward, an optimizer step;
- a tensor was copied to the device.

Rules, each for a loop shape seen in real scripts:

- A step begins when an iterator asks for a batch after the body ran, or when one that already
  delivered in this step asks again. Any other iterator asked before the body runs *joins* the
  step, and its time is data wait too: ``zip(labelled, unlabelled)``, an unlabelled batch fetched
  at the top of the body, or ``next(iter(loader))`` probed before the loop (it joins the first
  step, a warm-up step). Each ``__next__`` is timed on its own.
- A step with an optimizer step or a backward is training; one without is validation. So frozen
  BatchNorm (``.eval()`` inside a training model), gradient accumulation (backward only) and a
  validation loop run under ``enable_grad`` are all classified by what they do.
- Epochs come from the training iterator: a training step led by an iterator that has not yet
  fed this epoch's training steps starts a new epoch. Zipped and re-created secondary iterators
  feed the epoch without starting one; validation never starts one.
- A step whose batch was dropped, because ``zip`` stopped on the shorter loader, is discarded;
  the same loader re-created at once (``except StopIteration: it = iter(loader)``) keeps it.
- A step during which ``torch.compile`` compiled a graph (dynamo's counter moved) is warm-up,
  wherever it falls: a recompile for a ragged last batch is no steady-state compute.
- ``STEPSCOPE_WATCH_PHASE_HINT`` (``stepscope watch --phase-hint``): ``mode`` decides the phase
  by module mode and ``grad`` by grad mode, for loops whose optimizer is invisible to torch's
  hooks; ``stepscope.phase_hint("val")`` forces a phase around a block of the script.

Splits (frame as ``stepscope train``): ``data_wait_s`` is the time in ``__next__`` calls (the
leading one from the step's start, which for a fresh iterator includes creating it and starting
its workers); ``compute_s`` runs from the last batch's arrival to the end of the last optimizer
step or backward (validation: to the step's end), minus copies; ``other_s`` is the rest.
On CUDA (once the program has initialised it) the parts come from CUDA events recorded at the
request, the batch's arrival, the end of the optimizer step or backward and each copy, resolved
lazily with ``query()``: ``data_wait_s`` is then the time the GPU's stream had nothing queued
while the loop waited for data, not the CPU's wait (queued kernels overlap it).
"""

from __future__ import annotations

import os
import sys
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stepscope.observe.inject.stepscope_watch_recorder import PhaseState, Recorder

HINT_VAR = "STEPSCOPE_WATCH_PHASE_HINT"
HINTS = ("auto", "mode", "grad")
ACTIVE: LoopTracker | None = None  # the process's tracker, for stepscope.phase_hint


class IterState:
    """One live iterator: ``loader`` is the id of the loader it came from (re-creations of the
    same loader share it); ``token`` is what epochs are counted by."""

    __slots__ = ("create_s", "created_t", "delivered", "loader", "persistent", "phase", "token",
                 "workers")

    def __init__(self, loader: int, created_t: float, create_s: float,
                 workers: int | None, persistent: bool | None = None) -> None:
        self.loader, self.created_t, self.create_s, self.workers = loader, created_t, create_s, workers
        self.persistent = persistent  # DataLoader(persistent_workers=...); None: not known
        self.token = object()
        self.delivered = 0
        self.phase: PhaseState | None = None


class LoopStep:
    """The step being assembled from iterator and body events."""

    __slots__ = ("asking", "body", "comm_s", "copies", "ev_batch", "ev_req", "ev_work", "forced",
                 "images",
                 "lead", "members", "mode_kind", "stopped_loader", "t_batch", "t_start",
                 "t_work", "trained", "transfer_at_work_s", "transfer_s", "wait_s")

    def __init__(self, lead: IterState, t_start: float) -> None:
        self.lead, self.t_start = lead, t_start
        self.members: list[IterState] = []
        self.wait_s = self.transfer_s = self.transfer_at_work_s = 0.0
        self.comm_s = 0.0  # gradient all-reduce in flight (DDP, stepscope_watch_dist)
        self.t_batch: float | None = None
        self.t_work: float | None = None
        self.asking: tuple[IterState, float] | None = None
        self.body = self.trained = False
        self.images = 0
        self.stopped_loader: int | None = None
        self.forced: str | None = None
        self.mode_kind = "train"
        self.ev_req: Any = None
        self.ev_batch: Any = None
        self.ev_work: Any = None
        self.copies: list[tuple[Any, Any]] = []


class LoopTracker:
    """Assembles steps and phases from loop events and sends them through ``rec``.

    Args:
        rec: the process's recorder (phases, messages, periodic readings).
        events: returns a new CUDA timing event, or None while CUDA is not in use.
        mode_kind: the phase by the hint's rule (``mode``/``grad``), asked at batch arrival.
        hint: ``auto`` (by what the loop does), ``mode`` or ``grad``.
        compiles: how many graphs ``torch.compile`` has compiled so far (:func:`dynamo_compiles`).
    """

    def __init__(self, rec: Recorder, *, events: Callable[[], Any] = lambda: None,
                 mode_kind: Callable[[str], str] = lambda hint: "train",
                 hint: str | None = None, compiles: Callable[[], int] = lambda: 0) -> None:
        self.rec = rec
        self.compiles = compiles
        self.compiled = 0  # compiles() at the last step's end
        self.events = events
        self.mode_kind = mode_kind
        self.hint = hint if hint in HINTS else "auto"
        self.forced: str | None = None
        self.cur: LoopStep | None = None
        self.last_end = float("-inf")
        self.train_phase: PhaseState | None = None
        self.val_phase: PhaseState | None = None
        self.epoch_tokens: set[object] = set()
        self.pending: deque[tuple[list[Any], Any, LoopStep, Any]] = deque()
        # Set by the torch hooks: wraps a loader class's own __iter__ so its iterator is timed.
        self.wrap_iter: Callable[[Callable[..., Any]], Callable[..., Any]] | None = None

    # -- iterator events --------------------------------------------------------------------------
    def next_begin(self, it: IterState, t: float) -> None:
        s = self.cur
        if s is not None and s.stopped_loader is not None and not s.body \
                and it.loader != s.stopped_loader:
            s = self.cur = None  # zip stopped on the shorter loader: the lead's batch was dropped
        if s is None or s.body:
            ev = self.events()
            if s is not None:
                self._close(s, t, ev)
            fresh = it.delivered == 0 and it.created_t >= self.last_end
            s = self.cur = LoopStep(it, it.created_t if fresh else t)
            s.ev_req = ev
        elif it in s.members:  # asked again before any body ran: a skipped batch, still waited
            s.lead, s.members = it, []
        s.asking = (it, t)

    def next_end(self, it: IterState, t: float, images: int) -> None:
        s = self.cur
        if s is None or s.asking is None:
            return
        asked_t = s.asking[1]
        s.asking = None
        if it is s.lead and not s.members:
            # Everything since the step began was loader time (a skipped batch included).
            s.wait_s = t - s.t_start
            s.images = images
        else:
            s.wait_s += t - asked_t
            if it.delivered == 0 and s.t_batch is not None and it.created_t >= s.t_batch:
                s.wait_s += it.create_s  # re-created mid-step: starting its workers is waiting too
        s.stopped_loader = None
        it.delivered += 1
        s.members.append(it)
        s.t_batch = t
        s.forced = self.forced
        s.mode_kind = self.mode_kind(self.hint)
        s.ev_batch = self.events()

    def next_stop(self, it: IterState, t: float) -> None:
        s = self.cur
        if s is None:
            return
        asked_t = s.asking[1] if s.asking is not None else t
        s.asking = None
        if not s.members:  # the loop's own iterator ran out: its loop ends here
            self.cur = None
            if it.phase is not None:
                self.end_phase(it.phase, asked_t)
            return
        s.wait_s += t - asked_t
        s.stopped_loader = it.loader

    # -- body events --------------------------------------------------------------------------------
    def body(self, kind: str, t: float) -> None:
        """``forward``, ``backward`` or ``optimizer`` ran in the loop body at ``t`` (its end)."""
        s = self.cur
        if s is None or s.t_batch is None or s.asking is not None:
            return
        s.body = True
        if kind != "forward":
            s.trained = True
            s.t_work = t
            s.transfer_at_work_s = s.transfer_s
            s.ev_work = self.events()

    def wants_body(self) -> bool:
        """True while the current step has a batch but no body yet (the forward hook is armed)."""
        s = self.cur
        return s is not None and s.t_batch is not None and not s.body and s.asking is None

    def in_step(self) -> bool:
        s = self.cur
        return s is not None and s.t_batch is not None and s.asking is None

    def add_comm(self, dt: float) -> None:
        """All-reduce time of the open step (called on the process group's thread)."""
        s = self.cur
        if s is not None:
            s.comm_s += dt

    def transfer(self, dt: float, events: tuple[Any, Any] | None) -> None:
        s = self.cur
        if s is None or s.t_batch is None or s.asking is not None:
            return  # a copy inside a loader's __next__ is part of its wait
        s.body = True
        s.transfer_s += dt
        if events is not None:
            s.copies.append(events)

    # -- phases -------------------------------------------------------------------------------------
    def _kind(self, s: LoopStep) -> str:
        if s.forced is not None:
            return s.forced
        if self.hint != "auto":
            return s.mode_kind
        return "train" if s.trained else "val"

    def _phase_for(self, s: LoopStep, kind: str) -> PhaseState:
        rec, tokens = self.rec, {m.token for m in s.members}
        if kind == "val":
            if self.val_phase is None or self.val_phase.ended:
                self.val_phase = rec.begin_phase("val", s.lead.workers, s.t_start,
                                                 persistent=s.lead.persistent)
            return self.val_phase
        if self.val_phase is not None and not self.val_phase.ended:
            self.end_phase(self.val_phase, s.t_start)  # training resumed after a validation
        if self.train_phase is None or s.lead.token not in self.epoch_tokens:
            self.epoch_tokens = tokens
            self.train_phase = rec.begin_phase("train", s.lead.workers, s.t_start,
                                               persistent=s.lead.persistent)
        elif self.train_phase.ended:
            self.epoch_tokens |= tokens
            self.train_phase = rec.begin_phase("train", s.lead.workers, s.t_start,
                                               same_epoch=True, persistent=s.lead.persistent)
        else:
            self.epoch_tokens |= tokens
        return self.train_phase

    def end_phase(self, ph: PhaseState, t: float) -> None:
        self.resolve(block=True)
        self.rec.end_phase(ph, t)

    # -- steps ---------------------------------------------------------------------------------------
    def _close(self, s: LoopStep, t: float, ev_end: Any) -> None:
        self.last_end = t
        ph = self._phase_for(s, self._kind(s))
        for m in s.members:
            m.phase = ph
        wall = max(t - s.t_start, 0.0)
        wait = min(max(s.wait_s, 0.0), wall)
        t_batch = s.t_batch if s.t_batch is not None else s.t_start
        if s.trained and s.t_work is not None:
            compute = max(s.t_work - t_batch - s.transfer_at_work_s, 0.0)
        else:
            compute = max(wall - wait - s.transfer_s, 0.0)
        transfer = min(s.transfer_s, wall - wait)
        compute = min(compute, wall - wait - transfer)
        other = max(wall - wait - transfer - compute, 0.0)
        comm = min(s.comm_s, compute)  # taken out of compute, as `stepscope train` does
        index = ph.steps
        ph.steps += 1
        ph.images += s.images
        # A step during which torch.compile compiled (the first call, a recompile for a ragged
        # last batch or a new grad mode) is warm-up wherever it falls: its seconds of compiling
        # are no steady-state compute.
        compiled, self.compiled = self.compiled, self.compiles()
        warm = index < ph.warm or compiled != self.compiled
        msg = ["S", ph.seq, index, self.rec.unix(s.t_start), wall, wait, transfer, compute - comm,
               other, s.images, warm, comm]
        if s.ev_req is not None and s.ev_batch is not None and ev_end is not None:
            self.pending.append((msg, ev_end, s, ph))
            self.resolve(block=False)
        else:
            self.rec.send(msg)
        self.rec.tick(t)

    def resolve(self, block: bool) -> None:
        """Send steps whose CUDA events completed (``block``: wait for all, at a phase's end)."""
        while self.pending:
            msg, ev_end, s, _ = self.pending[0]
            if not block and not ev_end.query():
                return
            self.pending.popleft()
            if block:
                _sync(ev_end)
            self.rec.send(gpu_split(msg, s, ev_end))

    def flush(self, t: float) -> None:
        """At exit: close the open step and every open phase."""
        s, self.cur = self.cur, None
        if s is not None and s.body:  # a batch nobody used (zip stopped) is no step
            self._close(s, t, self.events())
        self.resolve(block=True)
        for ph in (self.val_phase, self.train_phase):
            if ph is not None and not ph.ended:
                self.rec.end_phase(ph, t)


def dynamo_compiles() -> int:
    """Graphs ``torch.compile`` (dynamo) has compiled in this process, first compiles and
    recompiles alike; 0 while dynamo is not loaded (a dict lookup: cheap enough per step)."""
    utils = sys.modules.get("torch._dynamo.utils")
    try:
        return int(utils.counters["stats"]["unique_graphs"]) if utils is not None else 0
    except (AttributeError, KeyError, TypeError, ValueError):  # another torch's layout
        return 0


def gpu_split(msg: list[Any], s: LoopStep, ev_end: Any) -> list[Any]:
    """The step's parts from its CUDA events, fitted into the CPU's wall time (module doc).

    ``elapsed_time`` between two events is the GPU stream's time between reaching them: from the
    request to the batch's arrival it is the time the stream sat idle waiting for that batch
    (zero when queued work still ran), which is the data wait that matters on a GPU.
    """
    def span(a: Any, b: Any) -> float:
        return max(float(a.elapsed_time(b)) / 1000.0, 0.0)

    wall = float(msg[4])
    wait = min(span(s.ev_req, s.ev_batch), wall)
    copy = min(sum(span(a, b) for a, b in s.copies), wall - wait)
    work_end = s.ev_work if s.trained and s.ev_work is not None else ev_end
    compute = min(max(span(s.ev_batch, work_end) - copy, 0.0), wall - wait - copy)
    other = max(wall - wait - copy - compute, 0.0)
    comm = min(float(msg[11]), compute) if len(msg) > 11 else 0.0
    return [*msg[:5], wait, copy, compute - comm, other, *msg[9:11], comm]


def _sync(event: Any) -> None:
    sync = getattr(event, "synchronize", None)
    if sync is not None:
        sync()


def hint_from_env() -> str:
    value = os.environ.pop(HINT_VAR, "auto")
    return value if value in HINTS else "auto"
