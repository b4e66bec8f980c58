"""``steps_per_execution`` for a Keras training phase: how many batches a call, and the gain.

Keras runs its batch callbacks, its per-batch Python and one train-function call per batch;
``model.compile(steps_per_execution=N)`` runs N batches a call, so all of that is paid once per
N. Where watch timed TensorFlow's graph inside each step the gain comes from the measured
split (docs/keras.md has the formula and the reruns); elsewhere from the callbacks' share, as
a floor.
"""

from __future__ import annotations

import math

from stepscope.analysis.contracts_summary import KerasTrainCalls, PhaseAgg, Summary
from stepscope.analysis.evidence import holds
from stepscope.analysis.fmt import fmt_gain, fmt_ms, fmt_pct, fmt_ratio, ms_of
from stepscope.analysis.vocab import KERAS, framework_of

# steps_per_execution=N runs the batch callbacks once per N batches; N is chosen so they are left
# with ≤ 5 % of the new step, capped where a longer execution delays the progress bar too much.
SPE_RESIDUAL_FRAC = 0.05
SPE_MAX = 64


def _spe_n(o: float, now: int = 1) -> int:
    """N that leaves a per-call share ``o`` (of a call of ``now`` batches) ≤ 5 % of the new step:
    (1 − o)·N/now ≥ o / 0.05."""
    return max(2, min(SPE_MAX, math.ceil(now * o / (SPE_RESIDUAL_FRAC * max(1.0 - o, 0.01)))))


def keras_steps_per_execution(agg: PhaseAgg, summary: Summary | None
                              ) -> tuple[str, str, str] | None:
    """(fix, expected gain, evidence) for ``steps_per_execution`` on a Keras training phase whose
    per-call overhead is material; None otherwise. Where watch timed TensorFlow's graph on a CPU
    (claim ``keras_loop_overhead``) the phase's ``other`` is all the loop did outside the
    graph's work, priced from the graph; elsewhere it is the user's batch callbacks (claim
    ``keras_callback_overhead``), priced from the graph where it was timed, else a floor from the
    callbacks alone."""
    if summary is None or agg.get("phase") != "train" or framework_of(summary) != KERAS:
        return None
    calls = (summary.get("loader") or {}).get("train_calls")
    if calls is not None and holds(summary, "keras_loop_overhead"):
        # (claim keras_other_is_loop: what the phase's "other" is, here)
        return _spe_from_graph(calls, _callbacks_words(calls, summary),
                               _tensorboard_words(summary, calls))
    if not holds(summary, "keras_callback_overhead"):
        return None
    evidence = _callbacks_held(f"{ms_of(agg['other_ms_per_step'])} of every "
                               f"training step ({fmt_pct(agg['other_frac'])}, timed by watch)")
    if calls is not None and holds(summary, "keras_graph_timed"):
        return _spe_from_graph(calls, evidence, _tensorboard_words(summary, calls))
    o = agg["other_frac"] or 0.0
    n = _spe_n(o)
    gain = 1.0 / ((1.0 - o) + o / n)
    # A lower bound: the train function's per-call dispatch (a tf.function/jit call, Keras's
    # own per-batch bookkeeping) is divided by n as well, but without the graph timed apart
    # (JAX, torch) it sits inside the step's compute. On a tiny model it is most of the
    # compute, and the rerun gained 15-20× where this predicted ~4.5× (docs/keras.md).
    words = fmt_gain(gain) if gain > 10 else f"at least {fmt_gain(gain)}"
    return _spe_fix(n), (f"{words} (callbacks then run once per {n} batches; the per-call "
                         "dispatch inside the step is divided too, which a small model's step "
                         "is mostly made of)"), evidence


def _callbacks_words(calls: KerasTrainCalls, summary: Summary) -> str | None:
    """The user's batch callbacks' part of the per-call overhead, where watch timed them."""
    spent = calls.get("callbacks_s")
    if not spent or not (summary.get("loader") or {}).get("callbacks_timed"):
        return None
    named = callbacks_named(summary)
    return _callbacks_held(f"{fmt_ms(_per_call(calls, spent))} a call "
                           f"(timed by watch{'; ' + named[0] if named else ''})")


def callbacks_named(summary: Summary) -> tuple[str, float] | None:
    """("TensorBoard 98 %, CSVLogger 2 % of that time", seconds a call): the user's batch
    callbacks by class, where watch timed them one class at a time (claim
    ``keras_callbacks_named``), and what they held the loop per train-function call."""
    calls = (summary.get("loader") or {}).get("train_calls")
    if calls is None or not holds(summary, "keras_callbacks_named"):
        return None
    by = calls.get("callbacks_by") or {}
    total = sum(by.values())
    if total <= 0:
        return None
    top = sorted(by.items(), key=lambda kv: -kv[1])[:3]
    held = _per_call(calls, calls.get("callbacks_s"))
    return ", ".join(f"{name} {fmt_pct(v / total)}" for name, v in top) + " of that time", held


TENSORBOARD_FRAC = 0.5  # TensorBoard holds half the callbacks' time or more: its update_freq


def _tensorboard_words(summary: Summary, calls: KerasTrainCalls) -> str:
    """TensorBoard's own setting, where it held most of the callbacks' time. No gain is put on
    it: Keras 3's ``TensorBoard.on_train_batch_end`` builds a scalar per log each batch whatever
    ``update_freq`` is, so ``"epoch"`` took 182 of 350 us a batch off here (docs/keras.md);
    ``steps_per_execution`` divides all of it."""
    by = calls.get("callbacks_by") or {}
    total, tb = sum(by.values()), by.get("TensorBoard", 0.0)
    step, spent = _per_call(calls, calls["step_s"]), _per_call(calls, calls.get("callbacks_s"))
    if not holds(summary, "keras_callbacks_named") or total <= 0 or step <= 0 \
            or tb < TENSORBOARD_FRAC * total:
        return ""
    return (f"; TensorBoard's batch hooks held the loop {fmt_ms(spent * tb / total)} of the "
            f"{fmt_ms(step)} step (timed by watch): update_freq=\"epoch\" stops its per-batch "
            "summaries, though Keras still runs the hooks every batch, where "
            "steps_per_execution runs them once per call")


def _per_call(calls: KerasTrainCalls, total: float | None) -> float:
    """A time the fact sums over the steady calls, per call."""
    return float(total or 0.0) / max(1.0, float(calls["calls"]))


def _callbacks_held(how_long: str) -> str:
    return f"the script's own on_train_batch_begin/_end callbacks held the loop {how_long}"


def keras_val_spe_fix() -> str:
    """A Keras validation phase whose other is the loop's per-call Python (claim
    ``keras_other_is_loop``): ``evaluate`` reads ``steps_per_execution`` too. N is the training
    advice's, where one is given (the validation calls are not timed apart)."""
    return ("model.compile(..., steps_per_execution=N) runs N batches per call in validation "
            "too (evaluate reads it), so Keras's per-call work (its per-batch Python, the test "
            "function's dispatch and return) is paid once per N batches")


def _spe_fix(n: int, now: int = 1, callbacks: bool = True, instead: str = "") -> str:
    """The fix's words: the user's callbacks where they are part of what N divides; ``instead``:
    the callback's own fix, where one callback held the loop (``_tensorboard_words``)."""
    now_words = "" if now <= 1 else f" (now {now})"
    head = f"model.compile(..., steps_per_execution={n}){now_words} runs {n} batches per call, "
    if not callbacks:
        return head + (f"so Keras's per-call work (its per-batch Python, the train function's "
                       f"dispatch and return) is paid once per {n} batches")
    return head + (f"so the per-batch callbacks run once per {n} batches" + (
        instead or "; or make them async_safe / move their work to on_epoch_end"))


def _spe_from_graph(calls: KerasTrainCalls, evidence: str | None, instead: str = ""
                    ) -> tuple[str, str, str] | None:
    """Price N from one call's measured parts: the graph's work (median over calls, so a few
    descheduled calls do not count as work) and the data wait (on TensorFlow fetched inside the
    graph) repeat per batch; the rest of the step (the callbacks, Keras's per-batch Python, the
    tf.function dispatch and return) is paid once per call. With ``now`` batches a call today
    and N after, a batch costs (work + wait) / now + rest / N instead of step / now. Not
    modelled: a longer execution runs its batches back to back, so the graph's threads stay warm (its work falls)
    while a loader that filled its buffer during the callbacks now has to keep pace (the wait
    rises); docs/keras.md has both, measured."""
    now = max(1, int(calls.get("steps_per_execution") or 1))
    step, wait = _per_call(calls, calls["step_s"]), _per_call(calls, calls["wait_s"])
    repeat = min(float(calls["work_median_s"]) + wait, step)
    rest = step - repeat
    n = _spe_n(rest / step if step > 0 else 0.0, now)
    if n <= now:
        return None  # already runs as many batches a call as is worth it
    gain = (step / now) / (repeat / now + rest / n)
    per = f"per call ({now} batches)" if now > 1 else "per batch"
    measured = (f"{per}, TensorFlow's graph worked {fmt_ms(float(calls['work_median_s']))} "
                f"(median over calls) and waited {fmt_ms(wait)} for data, of a "
                f"{fmt_ms(step)} step: the other {fmt_ms(rest)} (callbacks, Keras's per-batch "
                "Python, the tf.function dispatch and return) is paid once per call (timed by "
                "watch around TensorFlow's function call, the graph's end clocked inside it)")
    callbacks = bool(calls.get("callbacks_s")) or not calls.get("other_is_loop")
    return (_spe_fix(n, now, callbacks, instead),
            f"~{fmt_ratio(gain)} faster (a batch would cost the graph's "
            f"{fmt_ms(repeat / now)} plus {fmt_ms(rest)} / {n} of per-call overhead)",
            f"{evidence}; {measured}" if evidence else measured)
