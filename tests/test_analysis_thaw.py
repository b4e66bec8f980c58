"""The trunk unfrozen at a later epoch (analysis/thaw.py): found from the trainable-parameter
counts watch records, answered with the stages' figures, each part gone without its
measurement."""

from __future__ import annotations

from typing import Any

from stepscope.analysis.thaw import answer, thawed

PARAMS = 11_177_538


def _phase(epoch: int, compute_ms: float, images: int = 192, seconds: float = 1.0) -> Any:
    return {"epoch": epoch, "phase": "train", "rank": None, "images": images,
            "seconds": seconds, "compute_ms_per_image": compute_ms}


def _summary(fits: Any = ((1, 1_026), (3, PARAMS)), framework: str | None = None,
             ledger: Any = None) -> Any:
    return {"model": {"params": PARAMS, "trainable_params": 1_026,
                      "trainable_by_fit": [list(f) for f in fits] if fits else None},
            "loader": {"framework": framework},
            "phases": [_phase(1, 2.0, seconds=0.4), _phase(2, 2.0, seconds=0.4),
                       _phase(3, 8.6, seconds=1.6), _phase(4, 8.6, seconds=1.6),
                       {**_phase(3, 1.8), "phase": "val"}],
            "memory": {"ledger": ledger or []}}


def test_the_answer_names_the_stages_and_their_measured_pace() -> None:
    ledger = [{"item": "gradients", "bytes": 44_710_152, "how_measured": "watch: .grad of "
               "trainable parameters at epoch 3's optimizer step, where the trainable parameters "
               "changed (the largest reading)"},
              {"item": "optimizer state", "bytes": 89_420_552, "how_measured": "watch: optimizer "
               "state tensors after the first optimizer step"}]
    got = answer(_summary(ledger=ledger))
    assert got is not None
    title, text = got
    assert title == "Why training slowed from epoch 3"
    assert text.startswith("From epoch 3 the loop trained all 11,177,538 parameters, where "
                           "epochs 1–2 trained 1,026 (the trunk frozen; watch: requires_grad at "
                           "each epoch's first optimizer step). Per image, its training computed "
                           "8.6 ms against 2.0 ms before (4.3× as long); training ran at 120 "
                           "img/s against 480 img/s over the phases, warm-up steps included."), text
    # only the item read again after the change is named (the optimizer state here was not)
    assert "gradients 45 MB, read at epoch 3 (memory ledger)" in text
    assert "optimizer state" not in text


def test_no_answer_without_the_counts_or_a_change() -> None:
    assert answer(_summary(fits=None)) is None
    assert answer(_summary(fits=((1, 1_026),))) is None  # counted once
    assert answer(_summary(fits=((1, 1_026), (3, 2_000)))) is None  # a bigger head, frozen
    assert answer(_summary(fits=((1, PARAMS), (3, PARAMS)))) is None  # trained throughout
    assert "memory" not in answer(_summary())[1]  # type: ignore[index]


def test_keras_says_fit_and_its_measurement() -> None:
    summary = _summary(fits=((1, 1_281), (3, 397_409)), framework="keras")
    summary["model"]["params"] = 411_489
    thaw = thawed(summary["model"], keras=True)
    assert thaw is not None and thaw.until_words() == (
        " (epochs 1–2: from epoch 3 a later fit() trained 397,409 of the 411,489 parameters, "
        "watch: model.trainable_weights at each fit)")
    got = answer(summary)
    assert got is not None and "a later fit() trained 397,409" in got[1]


def test_a_trunk_unfrozen_in_part_is_a_thaw() -> None:
    """The tutorials' other way: unfreeze the top blocks only (resnet18's layer4: 8,393,728 of
    its 11,177,538 parameters; here its last block, 4,720,640, and the head's 1,026). The
    answer says how many trained; a head that grew (2,000) is not a thaw."""
    part = 4_720_640 + 1_026
    got = answer(_summary(fits=((1, 1_026), (3, part))))
    assert got is not None and got[1].startswith(
        f"From epoch 3 the loop trained {part:,} of the 11,177,538 parameters, where epochs 1–2 "
        "trained 1,026"), got
    thaw = thawed(_summary(fits=((1, 1_026), (3, part)))["model"], keras=False)
    assert thaw is not None and thaw.until_words().startswith(
        f" (epochs 1–2: from epoch 3 the loop trained {part:,} of the 11,177,538 parameters")
