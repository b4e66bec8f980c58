"""Why validation differs from training: both kinds' rates and per-image figures, and the
measured reasons (augmentation, the forward pass alone, another input, a warm-up)."""

from __future__ import annotations

from typing import Literal

from stepscope.analysis.contracts_summary import PhaseAgg, Summary
from stepscope.analysis.epoch_one import COLD_MIN_BYTES
from stepscope.analysis.evidence import claim, holds
from stepscope.analysis.fmt import fmt_bytes, fmt_img_s, fmt_pct, fmt_ratio, fmt_s, ms_of
from stepscope.analysis.vocab import KERAS, differing_inputs, framework_of

SAME_SPEED_RATIO = 1.10  # validation within 10 % of training's img/s: "about as fast"


def train_vs_val(s: Summary) -> tuple[str, str] | None:
    bp = s.get("by_phase") or {}
    tr, va = bp.get("train"), bp.get("val")
    tr_ips = tr["images_per_s"] if tr else None
    va_ips = va["images_per_s"] if va else None
    if not tr or not va or not tr_ips or not va_ips:
        return None
    ratio = va_ips / tr_ips
    faster = ratio >= 1.0
    alike = 1.0 / SAME_SPEED_RATIO < ratio < SAME_SPEED_RATIO
    pace = f"about as fast: {fmt_ratio(ratio)} its rate" if alike else \
        f"{fmt_ratio(ratio if faster else 1 / ratio)} {'faster' if faster else 'slower'}"
    text = (f"Validation ran at {fmt_img_s(va['images_per_s'])} against {fmt_img_s(tr['images_per_s'])} in "
            f"training ({pace}). "
            f"Per image, the loop waited {ms_of(tr['data_wait_ms_per_image'])} for data in training "
            f"and {ms_of(va['data_wait_ms_per_image'])} in validation, and computed "
            f"{ms_of(tr['compute_ms_per_image'])} against {ms_of(va['compute_ms_per_image'])}.")
    lt, lv = tr.get("loader_cpu_ms_per_image"), va.get("loader_cpu_ms_per_image")
    if lt is not None and lv is not None:
        text += (f" The loader spent {ms_of(lt)} of CPU per training image and {ms_of(lv)} per "
                 "validation image.")
    reasons = []
    # The loader's own CPU per image is the direct evidence; the data wait is only a proxy.
    cheaper = lv < lt if lt is not None and lv is not None else _less(va, tr, "data_wait_ms_per_image")
    if cheaper and holds(s, "augmented"):
        reasons.append("validation images are not augmented"
                       + claim(s, "decoded_val", " (they are still decoded, resized and "
                               "normalised on the CPU)"))
    if _less(va, tr, "compute_ms_per_image"):
        layers = ((s.get("model") or {}).get("augment_layers") or []) \
            if framework_of(s) == KERAS else []
        reasons.append("validation runs the forward pass only: no backward, no optimizer step"
                       + (f", and without the model's augmentation layers ({', '.join(layers)}: "
                          "Keras runs them in training only, watch: the model's layers)"
                          if layers else ""))
    inputs = differing_inputs(s.get("loader"))
    if inputs is not None:  # watch: the inputs given to Model.fit, as recorded
        text += (f" Validation reads another input than training: {inputs[1]}, where training "
                 f"reads {inputs[0]} (watch: the inputs given to Model.fit).")
    if reasons and faster and not alike:
        text += " Validation is faster because " + " and ".join(reasons) + "."
    elif not faster and not alike and inputs is None and (warm := _warm_up_words(s, tr, va)):
        text += warm
    elif not faster and not alike and inputs is None:
        # only what was measured: the per-image figures above, the validation phases' disk reads
        slower = [w for w, more in (("it waited longer for data", _less(tr, va, "data_wait_ms_per_image")),
                                    ("it computed longer", _less(tr, va, "compute_ms_per_image")))
                  if more]
        read = sum(p.get("disk_read_bytes") or 0 for p in s.get("phases") or [] if p["phase"] == "val")
        if slower:
            text += " Validation is slower here: per image, " + " and ".join(slower)
            text += (f"; its phases read {fmt_bytes(read)} from disk." if read >= COLD_MIN_BYTES
                     else ".")
    if va.get("verdict"):
        text += f" Validation itself was {va['verdict']} ({fmt_pct(va['data_wait_frac'])} data wait)."
    return "Why validation differs from training", text


def _warm_up_words(s: Summary, tr: PhaseAgg, va: PhaseAgg) -> str:
    """Validation slower over its phases while its steady steps take as long an image as
    training's (within ``SAME_SPEED_RATIO``): its warm-up steps (a test function traced or
    compiled, a loader starting) are the difference, where they take a larger share."""
    st, sv = tr.get("step_ms_per_image"), va.get("step_ms_per_image")
    if not st or not sv or not 1.0 / SAME_SPEED_RATIO < sv / st < SAME_SPEED_RATIO:
        return ""
    warm = {k: sum(p.get("warmup_s") or 0.0 for p in s.get("phases") or [] if p["phase"] == k)
            for k in ("train", "val")}
    if not va["seconds"] or not tr["seconds"] \
            or warm["val"] / va["seconds"] <= warm["train"] / tr["seconds"]:
        return ""
    return (f" Its steady steps took {ms_of(sv)} an image against {ms_of(st)} in training: "
            f"validation is slower over its phases because its warm-up steps took "
            f"{fmt_s(warm['val'])} of its {fmt_s(va['seconds'])} (each loop's first steps: a "
            "step function traced or compiled, the loader starting), against "
            f"{fmt_s(warm['train'])} of {fmt_s(tr['seconds'])} in training.")


def _less(a: PhaseAgg, b: PhaseAgg,
          key: Literal["data_wait_ms_per_image", "compute_ms_per_image"]) -> bool:
    x, y = a[key], b[key]
    return x is not None and y is not None and x < y
