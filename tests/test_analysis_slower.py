"""Why epoch 1 was slower (analysis/epoch_one.slower_answer): against the later epochs' pace,
what its warm-up steps took over steady ones, its steady steps, its reads from disk; each part
only where measured. Hand-made summaries with only the keys it reads."""

from __future__ import annotations

from typing import Any

import pytest

from stepscope.analysis.epoch_one import slower_answer

pytestmark = pytest.mark.light


def _train(epoch: int, seconds: float, *, warm: int = 0, warm_s: float = 0.0,
           step_ms: float = 80.0, per_image: float = 2.5, verdict: str = "compute-bound"
           ) -> dict[str, Any]:
    return {"phase": "train", "epoch": epoch, "rank": None, "images": 480, "seconds": seconds,
            "images_per_s": 480 / seconds, "warmup_steps": warm, "warmup_s": warm_s,
            "step_ms_per_step": step_ms, "step_ms_per_image": per_image, "verdict": verdict,
            "data_wait_frac": 0.01}


def test_warm_up_steps_that_explain_a_slow_first_epoch_are_named() -> None:
    """The Keras guide's epoch 1: 4.8 s where later epochs took 1.6-2.0 s, 3.8 s of it its
    three warm-up steps (tracing) against 85 ms steady steps."""
    s: Any = {"phases": [_train(1, 4.8, warm=3, warm_s=3.8, step_ms=85.0),
                         _train(2, 1.6), _train(3, 2.0)]}
    got = slower_answer(s)
    assert got is not None
    title, text = got
    assert title == "Why epoch 1 was slower"
    assert text.startswith("Epoch 1 ran at 100 img/s against 240–300 img/s in epochs 2–3: 3.0 s "
                           "longer than at their median pace. Its 3 warm-up steps took 3.8 s "
                           "where a steady step took 85 ms: 3.5 s more"), text
    assert text.endswith("most of the difference."), text
    assert "disk" not in text and "steady steps took" not in text


def test_without_warm_up_the_steady_steps_are_compared() -> None:
    s: Any = {"phases": [_train(1, 4.0, per_image=8.3), _train(2, 2.0), _train(3, 2.0)]}
    got = slower_answer(s)
    assert got is not None and "warm-up" not in got[1]
    assert got[1].endswith("Its steady steps took 8.3 ms an image against 2.5 ms later.")


def test_no_answer_where_epoch_one_kept_pace_or_only_it_waited_for_data() -> None:
    assert slower_answer({"phases": [_train(1, 2.2), _train(2, 2.0)]}) is None  # type: ignore[typeddict-item]
    assert slower_answer({"phases": [_train(1, 4.0)]}) is None  # type: ignore[typeddict-item]
    waited: Any = {"phases": [_train(1, 4.0, verdict="input-bound"), _train(2, 2.0)]}
    assert slower_answer(waited) is None  # "Why only epoch 1 waited for data" answers it


def test_epochs_after_the_trunk_was_unfrozen_are_not_the_pace() -> None:
    """Keras's transfer-learning guide: two fits, the trunk unfrozen for the second (a later
    fit trained 397,409 of 411,489 parameters from epoch 3). Epoch 1 is held against epoch 2,
    the epoch that trained what it trained, not against the fine-tuning's slower epochs."""
    model = {"params": 411_489, "trainable_by_fit": [[1, 1_281], [3, 397_409]]}
    s: Any = {"phases": [_train(1, 3.8, warm=3, warm_s=2.6, step_ms=36.0), _train(2, 0.45),
                         _train(3, 18.0), _train(4, 2.0)], "model": model}
    got = slower_answer(s)
    assert got is not None
    assert got[1].startswith("Epoch 1 ran at 126 img/s against 1,067 img/s in epoch 2: 3.3 s "
                             "longer than at that pace."), got[1]
    # the same epochs with the trunk frozen throughout: every later epoch is the pace
    s["model"] = {"params": 411_489, "trainable_by_fit": [[1, 1_281], [3, 1_281]]}
    got = slower_answer(s)
    assert got is not None and "in epochs 2–4" in got[1], got


def test_validation_slower_only_by_its_warm_up_is_told_so() -> None:
    """The seed's script: validation 4.2 img/s against 5.3 over the phases, while its steady
    steps take as long an image as training's (100 vs 99 ms): its warm-up steps (the test
    function traced in epoch 1) took 4.6 s of its 5.8 s. That is the answer, not 'it waited
    longer for data' (3.9 ms against 1.9 of ~100 ms an image)."""
    from stepscope.analysis.explain import train_vs_val

    def agg(phase: str, ips: float, secs: float, wait: float, comp: float, step: float
            ) -> dict[str, Any]:
        return {"phase": phase, "images_per_s": ips, "seconds": secs, "data_wait_ms_per_image":
                wait, "compute_ms_per_image": comp, "step_ms_per_image": step,
                "loader_cpu_ms_per_image": None, "verdict": "compute-bound",
                "data_wait_frac": wait / step}

    s: Any = {"by_phase": {"train": agg("train", 5.3, 18.0, 1.9, 97.0, 99.0),
                           "val": agg("val", 4.2, 5.8, 3.9, 96.0, 100.2)},
              "phases": [{"phase": "train", "warmup_s": 11.0}, {"phase": "val", "warmup_s": 4.6}]}
    got = train_vs_val(s)
    assert got is not None
    assert "Its steady steps took 100 ms an image against 99 ms in training: validation is " \
           "slower over its phases because its warm-up steps took 4.6 s of its 5.8 s" in got[1], got
    assert "waited longer" not in got[1]
    # steady steps that differ: the per-image reasons, as before
    s["by_phase"]["val"] = agg("val", 4.2, 5.8, 30.0, 96.0, 130.0)
    got = train_vs_val(s)
    assert got is not None and "warm-up" not in got[1] and "it waited longer for data" in got[1]
