"""The report's input-pipeline charts: where an image's loading time goes (a stage waterfall per
phase), the stage capacities beside what the model consumes, and a throughput chart that stays
readable when one phase is served from a cache.

Every chart draws only what ``summary.json`` holds (``loader``, ``capacity``, ``images_per_s``
of each phase); a phase without stage timing is left out and the section says so.
"""

from __future__ import annotations

import statistics

from stepscope.analysis.contracts_summary import PhaseRow, Summary
from stepscope.analysis.fmt import fmt_num
from stepscope.render.svg import PALETTE, Bar, bar_chart, esc, legend

STAGE_COLORS = {"read": PALETTE[0], "decode": PALETTE[1], "transform": PALETTE[2],
                "item": PALETTE[4], "collate": PALETTE[3], "pin": PALETTE[5]}
STAGE_LABELS = {"read": "read file", "decode": "decode", "transform": "transform/augment",
                "item": "dataset's own code", "collate": "collate", "pin": "pin memory"}
CAPACITY_COLORS = {"consume": PALETTE[3], "loader": PALETTE[0], "cpu": PALETTE[2],
                   "storage": PALETTE[1]}
CAPACITY_LABELS = {"consume": "model consumes", "loader": "loaders supply",
                   "cpu": "job's cores can run", "storage": "storage supplies"}
# A phase this many times faster than the median of the others (a cached validation pass) is
# drawn clipped, its real value written on it, so the other bars keep their height.
OUTLIER_FACTOR = 5.0
IMAGES_PER_S_DEFINITION = (
    "Images per second of a phase = the images its steps took ÷ the phase's wall-clock seconds "
    "(from its first request for a batch to the end of its last step, warm-up included). The "
    "header's figures use the same definition over all phases of a kind.")


def _how(text: str) -> str:
    return f'<p class="how">{esc(text)}</p>'


def _label(p: PhaseRow) -> str:
    return f"{p.get('epoch')} {p.get('phase')}"


def stage_waterfall(summary: Summary) -> str:
    """Stacked ms per image of each loader stage, one bar per phase."""
    groups: list[tuple[str, list[Bar]]] = []
    for p in summary.get("phases") or []:
        loader = p.get("loader")
        ms = (loader.get("stage_ms_per_image") if loader else None) or {}
        if not any(ms.values()):
            continue
        groups.append((_label(p), [Bar(STAGE_LABELS[k], float(ms.get(k) or 0.0), c,
                                       f"{float(ms.get(k) or 0.0):.2f} ms")
                                   for k, c in STAGE_COLORS.items()]))
    if not groups:
        return _how("No loader stage timing in this run (recorded by stepscope ≥ this version "
                    "through train, the Monitor API or watch).")
    return (bar_chart(groups, unit="ms", y_label="loader ms per image", stacked=True)
            + legend([(STAGE_LABELS[k], c, "box") for k, c in STAGE_COLORS.items()])
            + _how("Where one image's loading time goes, per phase: time inside each hooked "
                   "stage (exclusive: a decode inside a transform counts as decode), measured "
                   "in whichever process loaded it (loading workers or the training process)."))


def capacity_chart(summary: Summary) -> str:
    """Side-by-side capacities (img/s) per phase; the binding one is named under the chart."""
    groups: list[tuple[str, list[Bar]]] = []
    binding: list[str] = []
    for p in summary.get("phases") or []:
        cap = p.get("capacity")
        if not cap:
            continue
        rates = {"consume": cap.get("consume_images_per_s"),
                 "loader": cap.get("loader_images_per_s"),
                 "cpu": cap.get("cpu_images_per_s"), "storage": cap.get("storage_images_per_s")}
        groups.append((_label(p), [Bar(CAPACITY_LABELS[k], float(v), CAPACITY_COLORS[k],
                                       f"{fmt_num(v)} img/s")
                                   for k, v in rates.items() if v is not None]))
        binding.append(f"{_label(p)}: {cap.get('binding')}")
    if not groups:
        return ""
    return (bar_chart(groups, unit="img/s", y_label="capacity, images per second",
                      stacked=False)
            + legend([(CAPACITY_LABELS[k], c, "box") for k, c in CAPACITY_COLORS.items()])
            + _how("Each stage's capacity beside what the model consumes (steady steps, data "
                   "always ready). The lowest binds: " + "; ".join(binding) + ". The job's "
                   "cores are those it may use (affinity, cgroup quota), not the host's."))


def throughput_chart(summary: Summary, colors: dict[str, str]) -> str:
    """Images/s per epoch and phase, a cache-served outlier clipped and marked."""
    rows = [p for p in summary.get("phases") or [] if p.get("images_per_s") is not None]
    if not rows:
        return ""
    rates = [float(p["images_per_s"] or 0.0) for p in rows]  # not None: filtered above
    typical = statistics.median(rates)
    cap = OUTLIER_FACTOR * typical if typical > 0 else None
    epochs: dict[int, list[Bar]] = {}
    clipped = []
    for p, v in zip(rows, rates, strict=True):
        phase = str(p["phase"])
        note = f"{fmt_num(v)} img/s"
        if cap is not None and v > cap and len(rows) > 2:
            clipped.append(f"epoch {p['epoch']} {phase} ({fmt_num(v)} img/s"
                           + (", feature cache" if p.get("feature_cache") else "") + ")")
            note, v = f"{fmt_num(v)} img/s, off scale", cap
        epochs.setdefault(int(p["epoch"]), []).append(Bar(phase, v, colors.get(phase, PALETTE[4]),
                                                          note))
    groups = [(f"epoch {e}", bars) for e, bars in sorted(epochs.items())]
    out = (bar_chart(groups, unit="img/s", y_label="images per second", stacked=False)
           + legend([("train", colors["train"], "box"), ("validation", colors["val"], "box")]))
    if clipped:
        out += _how(f"Clipped at {OUTLIER_FACTOR:g}× the median phase so the others stay "
                    "readable: " + "; ".join(clipped) + ".")
    return out + _how(IMAGES_PER_S_DEFINITION)


def input_section_parts(summary: Summary) -> list[str]:
    """The input-pipeline parts of the report (empty strings dropped by the caller)."""
    return ["<h3>Where an image's loading time goes</h3>", stage_waterfall(summary),
            "<h3>Capacities: what binds</h3>", capacity_chart(summary)]
