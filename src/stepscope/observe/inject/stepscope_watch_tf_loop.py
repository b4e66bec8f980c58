"""A hand-written TensorFlow loop under ``stepscope watch``: steps and phases from what it does.

The Keras guide's "training loop from scratch" iterates a ``tf.data`` dataset in Python and
calls a ``tf.function`` train step on each batch (``tf.GradientTape``, ``apply_gradients``), with
no ``fit`` and so no Keras callbacks. Its events feed the same ``LoopTracker`` as a PyTorch loop
(``stepscope_watch_loop``: a step begins where the loop asks for a batch after its body ran):

- the loop asks for a batch: ``OwnedIterator.__next__`` run eagerly (the time in it is the data
  wait; ``StopIteration`` ends the iterator), each iterator timed from its creation;
- the body: a ``tf.function`` called eagerly (``AtomicFunction.call_flat``) ends a ``forward``,
  or an ``optimizer`` event when its graph computed gradients (``GradientTape.gradient`` was
  traced into it: a train step); an eager ``GradientTape.gradient`` is a ``backward``; an eager
  call of a Keras model is a ``forward``. So a step that computed gradients is training, one
  that did not is validation, and each ``for batch in dataset`` over a training set is an epoch.

A loop that passes its iterator into the ``tf.function`` (TensorFlow's custom-training guides:
``train_step(iterator)`` calls ``next(iterator)`` in the graph, often several times in a
``tf.range`` loop) fetches its batches where Python cannot see them: the graph clock does
(``stepscope_watch_keras_clock``: its fetches clocked in the graph, its end traced in after the
function's Python), and each call of such a function is one step, its wait and images read from
the clock's ring once it has been read (every ``POLL_S``), so such steps are sent late, in order.
The iterator passed in (its resource handle among the call's first inputs) is the step's input:
a new ``iter(dataset)`` is a new epoch, as in an eager loop.

Inside Keras's ``fit``/``evaluate``/``predict`` (``rec.framework_depth > 0``) none of this
applies: Keras's callbacks time those steps.

Standard library only at import: this runs inside the user's interpreter.
"""

from __future__ import annotations

import time
import weakref
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stepscope.observe.inject.stepscope_watch_keras_clock import GraphClock, mark_graphs
    from stepscope.observe.inject.stepscope_watch_loop import LoopTracker
    from stepscope.observe.inject.stepscope_watch_recorder import Recorder
else:
    try:  # in the watched interpreter a top-level module (see sitecustomize)
        from stepscope_watch_keras_clock import mark_graphs
    except ImportError:  # imported from the package (tests, type checks)
        from stepscope.observe.inject.stepscope_watch_keras_clock import mark_graphs

_STATE = "_stepscope_iter"
_TRAINS = "_stepscope_trains"  # set on a FuncGraph that computed gradients while traced
# the process's tracker and its test of "a hand-written loop's eager body", for install_keras
_ACTIVE: list[tuple[LoopTracker, Callable[[], bool]]] = []
_TF: list[Any] = []  # the tensorflow module, once imported
HANDLES_KEPT = 16  # iterators whose resource handles name their IterState (the latest ones)
ARGS_SEARCHED = 16  # a call's first inputs are the caller's; captured variables follow


class _Keras:
    """From the Keras hooks (``install_keras``): the memory ledger's readers; the largest Keras
    model the loop's body called (a model calls its inner models first: the largest is the
    outer one) and the optimizer it applied."""

    ledger: Callable[[Any, Any], None] | None = None
    mark: Callable[[str], None] | None = None
    model: Any = None
    optimizer: Any = None


_KERAS = _Keras()


def install(tf: Any, rec: Recorder, count_images: Callable[[Any], int], loop_module: Any,
            input_files: Callable[[Any], list[str]],
            workers_of: Callable[[Any], int | None],
            describe: Callable[[Any, str], None],
            gil: tuple[Callable[[], float], Callable[[], float]],
            clock: GraphClock) -> LoopTracker:
    """Patch TensorFlow so that ``rec`` sees a hand-written loop's steps; returns the tracker.
    ``input_files(dataset)`` names the files a pipeline reads, ``workers_of(dataset)`` its
    parallelism, and ``describe(dataset, phase)`` records it as a phase's input, once
    (``stepscope_watch_keras_data``); ``gil``: the loop thread's off-CPU clock and the loading
    threads' busy clock (``stepscope_watch_keras_steps.gil_clocks``).

    Python run by tf.data's threads (a ``numpy_function``/``py_function`` map) holds the GIL,
    and tf.data prefetches on its own: an eager loop body then waits for the GIL, not in
    ``next()`` (a loader burning 80 ms a batch in Python read 1 % data wait from ``next()``
    alone). So, as for Keras (``stepscope_watch_keras_steps``), the loop thread's time off its
    CPU outside ``next()`` is data wait too, up to the loading threads' busy time in the step.
    ``clock``: the process's graph clock, for a step whose batch is fetched in its graph."""
    off_cpu, loader_busy = gil
    from tensorflow.python.data.ops import iterator_ops
    from tensorflow.python.eager import backprop
    from tensorflow.python.eager.polymorphic_function import atomic_function

    datasets: dict[int, Any] = {}  # what each iterator's ``loader`` id is, to describe it

    class TfLoopTracker(loop_module.LoopTracker):
        # The GIL clocks at the last step's end (the loop's first step has none: not counted;
        # a step of a fresh iterator also holds the time since, where the loading was busy).
        gil0: tuple[float, float] | None = None
        # the open step's tf.function calls: the loop's thread is off its CPU in them while
        # TensorFlow's threads compute, which is no wait for the GIL
        graph_s = 0.0
        eager = False  # the open step computed gradients eagerly (no tf.function around them)
        eager_train_steps = 0
        cur: Any  # the base's open step (its class is the watched interpreter's module's)

        def __init__(self, recorder: Recorder) -> None:
            super().__init__(recorder)
            # calls that fetched in their graph, awaiting the clock's read: (step, wall start,
            # wall end)
            self.graph_steps: deque[tuple[Any, float, float]] = deque()
            self.graph_leads: dict[int, Any] = {}  # a function's input, no iterator passed in
            # iterators made eagerly, the latest HANDLES_KEPT, by their resource handle's id:
            # (the iterator, weakly: a handle kept alive keeps its pipeline's threads; its state)
            self.handles: dict[int, tuple[Any, Any]] = {}
            # the last such call's input (its token), end, and the GIL clocks then
            self.graph_end: tuple[object, float, tuple[float, float]] | None = None

        def register(self, iterator: Any, state: Any) -> None:
            handle = getattr(iterator, "_iterator_resource", None)
            if handle is None:
                return
            self.handles[id(handle)] = (weakref.ref(iterator), state)
            while len(self.handles) > HANDLES_KEPT:
                del self.handles[next(iter(self.handles))]

        def lead_of(self, graph: Any, args: tuple[Any, ...], t: float) -> Any:
            """The input of a call that fetched in its graph: the iterator passed in, else one
            of the function's own (an iterator it captured: no epochs seen)."""
            for a in args[:ARGS_SEARCHED]:
                found = self.handles.get(id(a))
                if found is not None:
                    it = found[0]()
                    if it is not None and getattr(it, "_iterator_resource", None) is a:
                        return found[1]
            lead = self.graph_leads.get(id(graph))
            if lead is None:
                lead = self.graph_leads[id(graph)] = loop_module.IterState(id(graph), t, 0.0, None)
            return lead

        @staticmethod
        def gil_now() -> tuple[float, float]:
            return off_cpu(), loader_busy()

        def graph_step(self, lead: Any, trains: bool, t: tuple[float, float],
                       wall: tuple[float, float], gil: tuple[float, float]) -> None:
            """A call whose graph fetched its batch ran from ``t[0]`` to ``t[1]`` (``wall``: the
            same on ``time.time()``, the clock's; ``gil``: the GIL clocks as it began): one
            step, settled once the clock is read."""
            s = self.cur
            if s is not None:  # an eager step open: it ends where this call begins
                self.cur = None
                if s.body:
                    self._close(s, t[0], None)
            step = loop_module.LoopStep(lead, t[0])
            # After the last such call on the same input, with no eager step between, the loop's
            # Python between the two calls is this step's. tf.data prefetches on its own (an
            # injected prefetch), so a map's Python runs then too, and holds the GIL the loop's
            # thread needs back after each call: its time off its CPU there, up to the loading's
            # busy time, is data wait (a loop whose Python took 0.1 ms read 35 ms gaps).
            end = self.graph_end
            if s is None and end is not None and end[0] is lead.token:
                step.t_start = end[1]
                step.wait_s = max(min(gil[0] - end[2][0], gil[1] - end[2][1], t[0] - end[1]),
                                  0.0)
            self.graph_end = (lead.token, t[1], self.gil_now())
            step.t_work, step.trained, step.body = t[1], trains, True
            step.t_batch = t[0]  # the call's start: the batch arrives its wait after it
            step.members = [lead]
            self.graph_steps.append((step, *wall))
            self.settle(block=False)

        def settle(self, block: bool) -> None:
            """Close the calls whose fetches the clock has read (``block``: read it now)."""
            if not self.graph_steps:
                return
            if not clock.poll(None if block else len(self.graph_steps)):
                return
            while self.graph_steps:
                s, w0, w1 = self.graph_steps[0]
                got = clock.between(w0, w1)
                if got is None:
                    return
                self.graph_steps.popleft()
                waited, images = got[1:3]
                end = s.t_work
                # the wait is the graph's for its fetches; the loop's Python between calls is
                # the step's other time, not loading
                waited = min(waited, end - s.t_batch)
                s.wait_s += waited
                s.t_batch += waited
                s.images = max(images, 0)
                s.lead.delivered += 1
                kind = self._kind(s)
                if kind == "val" and self.train_phase is not None \
                        and not self.train_phase.ended:
                    self.end_phase(self.train_phase, s.t_start)
                if not s.trained:
                    s.t_work = None
                self.gil0 = None  # no GIL clock across a graph step
                self._close(s, end, None)
                self.gil0 = None

        def next_begin(self, it: Any, t: float) -> None:
            self.settle(block=True)
            self.graph_end = None
            super().next_begin(it, t)

        def _close(self, s: Any, t: float, ev_end: Any) -> None:
            now = (off_cpu(), loader_busy())
            if self.gil0 is not None:
                slept = now[0] - self.gil0[0] - s.wait_s - self.graph_s
                s.wait_s += max(min(slept, now[1] - self.gil0[1]), 0.0)
            self.gil0, self.graph_s = now, 0.0
            self.eager_train_steps += bool(s.trained and self.eager)
            self.eager = False
            super()._close(s, t, ev_end)
            if s.trained and _KERAS.mark is not None:
                _KERAS.mark("first_step")
            ds = datasets.pop(s.lead.loader, None)  # its first step names its phase
            if ds is not None:
                describe(ds, self._kind(s))

        def end_phase(self, ph: Any, t: float) -> None:
            super().end_phase(ph, t)
            # the optimizer's state exists once a training phase ran: the Keras ledger, once
            if ph.phase == "train" and _KERAS.model is not None and _KERAS.ledger is not None:
                _KERAS.ledger(_KERAS.model, _KERAS.optimizer)

        def flush(self, t: float) -> None:
            self.settle(block=True)
            super().flush(t)
            if self.eager_train_steps:
                rec.fact("loop.tf_eager_train_steps", self.eager_train_steps,
                         "watch: training steps of a hand-written loop whose gradients were "
                         "computed eagerly (GradientTape.gradient outside any tf.function)")

    # By what the loop does (``--phase-hint`` names torch's module and grad modes).
    loop = TfLoopTracker(rec)
    rec.at_exit_hooks.append(loop.flush)
    executing_eagerly = tf.executing_eagerly

    def watching() -> bool:
        return rec.framework_depth == 0 and rec.owner() and executing_eagerly()

    _ACTIVE.append((loop, watching))
    _TF.append(tf)

    _patch_iterator(iterator_ops.OwnedIterator, rec, loop, count_images, loop_module.IterState,
                    watching, input_files, workers_of, datasets)
    _patch_calls(atomic_function.AtomicFunction, rec, loop, watching,
                 lambda dt: setattr(loop, "graph_s", loop.graph_s + dt), clock.FETCHES)
    _patch_gradient(backprop.GradientTape, tf, rec, loop, watching,
                    lambda: setattr(loop, "eager", True))
    return loop


def _patch_iterator(cls: Any, rec: Recorder, loop: Any, count_images: Callable[[Any], int],
                    iter_state: Any, watching: Callable[[], bool],
                    input_files: Callable[[Any], list[str]],
                    workers_of: Callable[[Any], int | None], datasets: dict[int, Any]) -> None:
    init, nxt = cls.__init__, cls.__next__
    described: set[int] = set()

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        t0 = rec.clock()
        init(self, *args, **kwargs)
        if not watching():
            return
        ds = getattr(self, "_dataset", None)
        try:  # naming the files (sampled from the first step on) and the parallelism: a nicety
            rec.dataset_files(ds, input_files)
            workers = workers_of(ds)
        except Exception:
            workers = None
        if id(ds) not in described:
            described.add(id(ds))
            datasets[id(ds)] = ds
        if _KERAS.mark is not None:
            _KERAS.mark("fit")  # the loop's memory from here on is its own (once)
        state = iter_state(id(ds), t0, rec.clock() - t0, workers)
        object.__setattr__(self, _STATE, state)
        loop.register(self, state)  # passed into a tf.function, its handle names it

    def __next__(self: Any) -> Any:
        state = getattr(self, _STATE, None)
        if state is None or not watching():
            return nxt(self)
        loop.next_begin(state, rec.clock())
        try:
            batch = nxt(self)
        except StopIteration:
            loop.next_stop(state, rec.clock())
            raise
        loop.next_end(state, rec.clock(), count_images(batch))
        return batch

    cls.__init__, cls.__next__ = __init__, __next__


def _patch_calls(cls: Any, rec: Recorder, loop: Any, watching: Callable[[], bool],
                 graph_ran: Callable[[float], None], fetches_attr: str) -> None:
    """A ``tf.function`` called eagerly in the loop's body: its end is the body's, a train step's
    (gradients traced into its graph) an ``optimizer`` event; ``graph_ran(seconds)`` its time.
    A function whose graph fetched its own batch (``fetches_attr`` set on it) is a step."""
    call_flat = cls.call_flat

    def timed_call_flat(self: Any, *args: Any) -> Any:
        graph = getattr(self, "_cached_graph", None)
        fetches = getattr(graph, fetches_attr, False) and not rec.framework_depth
        if not fetches and not loop.in_step():  # inside fit, between steps: no clock read
            return call_flat(self, *args)
        gil = loop.gil_now() if fetches else None
        t0, w0 = rec.clock(), time.time()
        out = call_flat(self, *args)
        if watching():
            t1, w1 = rec.clock(), time.time()
            trains = getattr(graph, _TRAINS, False)
            if gil is not None:
                loop.graph_step(loop.lead_of(graph, args, t0), trains, (t0, t1), (w0, w1), gil)
            else:
                graph_ran(t1 - t0)
                loop.body("optimizer" if trains else "forward", t1)
        return out

    cls.call_flat = timed_call_flat


def _patch_gradient(cls: Any, tf: Any, rec: Recorder, loop: LoopTracker,
                    watching: Callable[[], bool], eager: Callable[[], None]) -> None:
    """``GradientTape.gradient``: traced, it marks the function's graphs (and those it is traced
    inside) as computing gradients; run eagerly in the loop's body, it is a ``backward``."""
    gradient = cls.gradient

    def marked_gradient(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = gradient(self, *args, **kwargs)
        if not _mark_trains(tf) and loop.in_step() and watching():
            loop.body("backward", rec.clock())
            eager()
        return out

    cls.gradient = marked_gradient


def _mark_trains(tf: Any) -> bool:
    """Inside a function being traced: mark its graph, and those it is traced inside, as a
    train step's; False when run eagerly."""
    if not tf.inside_function():
        return False
    mark_graphs(tf.compat.v1.get_default_graph(), _TRAINS)
    return True


def install_keras(model_cls: Any, optimizer_classes: list[Any],
                  ledger: Callable[[Any, Any], None] | None = None,
                  mark: Callable[[str], None] | None = None) -> None:
    """An eager call of a Keras model in a hand-written loop's body is its forward (a loop that
    validates with ``model(x)`` and no ``tf.function``); an optimizer's ``apply_gradients`` run
    eagerly is its optimizer step, and traced it marks the graph as a train step's. ``ledger``
    reads a model's weights and its optimizer's state once a training phase ends; ``mark`` notes
    the RSS at a moment (``stepscope_watch_keras``)."""
    call = model_cls.__call__
    _KERAS.ledger, _KERAS.mark = ledger, mark
    for cls in optimizer_classes:
        _patch_apply(cls)

    def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = call(self, *args, **kwargs)
        if _ACTIVE:
            loop, watching = _ACTIVE[0]
            if loop.in_step() or _traced_by_loop(loop):  # in the loop's body, or its step
                _keep_largest(self)
            if loop.wants_body() and watching():  # not while a tf.function traces it
                loop.body("forward", loop.rec.clock())
        return out

    model_cls.__call__ = __call__


def _traced_by_loop(loop: Any) -> bool:
    """A function is being traced outside Keras's own loops: a hand-written loop's step, traced
    before the call that would open it (an iterator passed in)."""
    return loop.rec.framework_depth == 0 and bool(_TF) and _TF[0].inside_function()


def _keep_largest(model: Any) -> None:
    kept = _KERAS.model
    if kept is model:
        return
    try:
        if kept is None or len(model.weights) > len(kept.weights):
            _KERAS.model = model
    except Exception:  # a model that cannot list its weights yet: not the ledger's
        pass


def _patch_apply(cls: Any) -> None:
    apply = cls.apply_gradients

    def apply_gradients(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = apply(self, *args, **kwargs)
        if _ACTIVE:
            loop, watching = _ACTIVE[0]
            if loop.in_step() or _traced_by_loop(loop):
                _KERAS.optimizer = self  # the loop's, for the ledger
            # traced: a train step's graph; eager, in the loop's body: its optimizer step
            if not _mark_trains(_TF[0]) and loop.in_step() and watching():
                loop.body("optimizer", loop.rec.clock())
        return out

    cls.apply_gradients = apply_gradients
