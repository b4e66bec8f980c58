"""The graph TensorFlow runs inside each Keras step, timed: ``Context.call_function`` wrapped
with a clock pair (``time_graph_calls``), and the steady training steps' wall, graph and
data-wait times summed over the run (``TrainCalls``, fact ``loop.keras_train_calls``), which
price ``steps_per_execution`` (``stepscope.analysis.keras_spe``).

Standard library only: this runs inside the user's interpreter.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol, TypedDict


class _Steps(Protocol):
    """What the timer needs of ``KerasSteps`` (which imports this module)."""

    train_calls: TrainCalls | None
    graph_is_work_probe: Callable[[], bool] | None

    def graph_ran(self, t0: float, t1: float, cpu: float = 0.0) -> None: ...

MAX_CALL_SAMPLES = 20_000  # per-call graph times kept for the median (160 KB at most)


class TrainCallsFact(TypedDict, total=False):
    """Fact ``loop.keras_train_calls`` (docs/records.md)."""

    calls: int
    steps_per_execution: int
    step_s: float
    graph_s: float
    wait_s: float
    callbacks_s: float
    other_is_loop: bool
    work_median_s: float
    work_p10_s: float
    callbacks_by: dict[str, float]  # KerasSteps adds it where the script has batch callbacks


class TrainCalls:
    """Steady training steps' wall, graph and data-wait times, over the run (fact
    ``loop.keras_train_calls``)."""

    def __init__(self) -> None:
        self.calls = 0
        self.step_s = 0.0
        self.graph_s = 0.0
        self.wait_s = 0.0
        self.callbacks_s = 0.0  # the user's batch callbacks on the loop's thread
        self.batches = 1
        # per call, the graph's time less the data wait in it (the first MAX_CALL_SAMPLES)
        self.work: list[float] = []

    def add(self, wall: float, graph: float, wait: float, batches: int,
            callbacks: float = 0.0) -> None:
        self.calls += 1
        self.step_s += wall
        self.graph_s += graph
        self.wait_s += wait
        self.callbacks_s += callbacks
        self.batches = batches
        if len(self.work) < MAX_CALL_SAMPLES:
            self.work.append(max(graph - wait, 0.0))

    def fact(self, other_is_loop: bool) -> TrainCallsFact | None:
        """The fact; ``other_is_loop``: the steps' other_s is the loop thread's CPU outside the
        graph calls (``KerasSteps.graph_is_work``), not the callbacks alone."""
        if not self.work:
            return None
        ys = sorted(self.work)
        return {"calls": self.calls, "steps_per_execution": self.batches,
                "step_s": round(self.step_s, 6), "graph_s": round(self.graph_s, 6),
                "wait_s": round(self.wait_s, 6), "callbacks_s": round(self.callbacks_s, 6),
                "other_is_loop": other_is_loop,
                "work_median_s": round(_quantile(ys, 0.5), 7),
                "work_p10_s": round(_quantile(ys, 0.1), 7)}


def _quantile(ys: list[float], q: float) -> float:
    """The ``q`` quantile of sorted ``ys`` (nearest rank)."""
    return ys[min(len(ys) - 1, int(q * len(ys)))]


def time_graph_calls(steps: _Steps) -> None:
    """Time every graph TensorFlow runs for a ``tf.function`` call (``Context.call_function``,
    the eager entry of ``AtomicFunction.call_flat``): the wall clock and the calling thread's
    CPU clock read before and after, and a method call, a few microseconds per train-function
    call. Eager single ops (``execute.execute`` from Python)
    do not pass here: they stay in the step's per-call overhead, where Keras's own
    ``Optional.has_value``/``get_value`` after each call belong."""
    from tensorflow.python.eager import context

    cls = context.Context
    inner = cls.call_function
    if getattr(inner, "_stepscope", False):
        return
    ran, cpu = steps.graph_ran, time.thread_time

    def call_function(self: Any, *args: Any, **kwargs: Any) -> Any:
        # the wall clock: the graph's end is clocked by tf.timestamp, on the same clock
        t0, c0 = time.time(), cpu()
        try:
            return inner(self, *args, **kwargs)
        finally:
            ran(t0, time.time(), cpu() - c0)

    call_function._stepscope = True  # type: ignore[attr-defined]
    cls.call_function = call_function
    steps.train_calls = TrainCalls()
    # whether the graph's time is the step's work: asked at the first phase (``_cpu_only``)
    import tensorflow as tf

    steps.graph_is_work_probe = lambda: _cpu_only(tf)


def _cpu_only(tf: Any) -> bool:
    """TensorFlow sees no GPU: its graph calls return once their work is done. Asked at the
    first phase, not at ``import keras``: listing the devices loads the CUDA driver, after
    which a script's own ``CUDA_VISIBLE_DEVICES`` would come too late."""
    try:
        return not tf.config.list_physical_devices("GPU")
    except Exception:  # unknown: keep the loop's time in compute, as on a GPU
        return False
