"""A trunk trained from a later epoch on: transfer learning in two stages.

The Keras fine-tuning guide and torchvision's tutorial train a new head on a frozen pretrained
trunk, then unfreeze it (a second ``compile()`` and ``fit()``; ``requires_grad = True`` and a new
optimizer). From then on every step runs the backward pass through the trunk, computes its
gradients and updates its parameters: the epochs after the change are slower, and the memory
holds gradients and optimizer state for the whole network. watch counts the trainable
parameters at each ``fit()`` (Keras) or at each epoch's first optimizer step (PyTorch), fact
``model.trainable_by_fit``. This module finds the change (:func:`thawed`), scopes the frozen-trunk
advice to the epochs before it (:meth:`Thaw.until_words`), and answers why training slowed.
"""

from __future__ import annotations

from dataclasses import dataclass

from stepscope.analysis.budget import own_phases
from stepscope.analysis.contracts_summary import ModelFacts, PhaseRow, Summary
from stepscope.analysis.fmt import fmt_bytes, fmt_img_s, fmt_ms, fmt_ratio
from stepscope.analysis.vocab import KERAS, framework_of

THAWED_FRAC = 0.5  # under half the parameters trainable at the first reading: a frozen trunk
# A later reading that trains a tenth of the network or more, and four times the first reading's
# count: part of the trunk unfrozen (the tutorials' "unfreeze the top blocks"), not a bigger head.
PART_FRAC = 0.10
GROWTH = 4
SAME_PACE_RATIO = 1.10


@dataclass(frozen=True)
class Thaw:
    """The first epoch (``epoch``) from which the trunk trained, wholly or in part (a tenth of
    the parameters or more, four times the first reading's count), where the first reading
    (``first_epoch``) had it frozen (under half the parameters trainable)."""

    first_epoch: int
    before: int  # trainable parameters at the first reading
    epoch: int
    after: int
    params: int
    keras: bool

    def who(self) -> str:
        return "a later fit()" if self.keras else "the loop"

    def how(self) -> str:
        """The measurement, as the fact's source says it."""
        return ("model.trainable_weights at each fit" if self.keras else
                "requires_grad at each epoch's first optimizer step")

    def frozen_epochs(self) -> str:
        last = self.epoch - 1
        return f"epoch {last}" if last == self.first_epoch else f"epochs {self.first_epoch}–{last}"

    def trained_words(self) -> str:
        """"all M parameters" or "N of the M parameters", after the change."""
        return (f"all {self.params:,} parameters" if self.after == self.params else
                f"{self.after:,} of the {self.params:,} parameters")

    def until_words(self) -> str:
        """" (epochs 1–2: from epoch 3 a later fit() trained N of the M parameters, watch: …)"."""
        return (f" ({self.frozen_epochs()}: from epoch {self.epoch} {self.who()} trained "
                f"{self.trained_words()}, watch: {self.how()})")


def thawed(model: ModelFacts | None, keras: bool) -> Thaw | None:
    """The trunk's unfreezing, where the counts show one (None: frozen throughout, trained
    throughout, or counted once)."""
    if model is None:
        return None
    params, fits = model.get("params"), model.get("trainable_by_fit") or []
    if not params or len(fits) < 2 or fits[0][1] >= THAWED_FRAC * params:
        return None
    later = next(((e, n) for e, n in fits[1:]
                  if n >= PART_FRAC * params and n >= GROWTH * fits[0][1]), None)
    if later is None:
        return None
    return Thaw(fits[0][0], fits[0][1], later[0], later[1], params, keras)


def _train_rows(s: Summary) -> list[PhaseRow]:
    return [p for p in own_phases(s)
            if p["phase"] == "train" and p.get("compute_ms_per_image") is not None]


def _compute_ms(rows: list[PhaseRow]) -> float:
    """Compute per image over the rows, each phase's figure weighted by its images."""
    images = sum(p["images"] or 0 for p in rows)
    total = sum(float(p.get("compute_ms_per_image") or 0.0) * (p["images"] or 0) for p in rows)
    return total / images if images else 0.0


def answer(s: Summary) -> tuple[str, str] | None:
    """"Why training slowed from epoch 3", where the trunk was unfrozen and both stages'
    training phases were timed."""
    thaw = thawed(s.get("model"), framework_of(s) == KERAS)
    rows = _train_rows(s)
    before = [p for p in rows if p["epoch"] < thaw.epoch] if thaw else []
    after = [p for p in rows if thaw and p["epoch"] >= thaw.epoch]
    if thaw is None or not before or not after:
        return None
    c0, c1 = _compute_ms(before), _compute_ms(after)
    if not c0 or not c1:
        return None
    ratio = c1 / c0
    pace = (f"about as long ({fmt_ratio(ratio)})" if 1 / SAME_PACE_RATIO < ratio < SAME_PACE_RATIO
            else f"{fmt_ratio(ratio)} as long" if ratio > 1 else f"{fmt_ratio(1 / ratio)} faster")
    ips0 = sum(p["images"] for p in before) / sum(p["seconds"] for p in before)
    ips1 = sum(p["images"] for p in after) / sum(p["seconds"] for p in after)
    title = (f"Why training slowed from epoch {thaw.epoch}" if ratio >= SAME_PACE_RATIO
             else f"What changed at epoch {thaw.epoch}")
    text = (f"From epoch {thaw.epoch} {thaw.who()} trained {thaw.trained_words()}, where {thaw.frozen_epochs()} trained {thaw.before:,} "
            f"(the trunk frozen; watch: {thaw.how()}). Per image, its training computed "
            f"{fmt_ms(c1 / 1000)} against {fmt_ms(c0 / 1000)} before ({pace}); training ran at "
            f"{fmt_img_s(ips1)} against {fmt_img_s(ips0)} over the phases, warm-up steps "
            "included.")
    if ratio >= SAME_PACE_RATIO:
        text += (" Each step now runs the backward pass through the trunk, computes its "
                 "gradients and updates its parameters.")
    mem = {i["item"]: i for i in (s.get("memory") or {}).get("ledger") or []}
    reread = [f"{name} {fmt_bytes(mem[name]['bytes'])}" for name in ("gradients", "optimizer state")
              if name in mem and "trainable parameters changed" in mem[name]["how_measured"]]
    if reread:
        text += (f" The memory holds the whole network's {' and '.join(reread)}, read at epoch "
                 f"{thaw.epoch} (memory ledger).")
    return title, text
