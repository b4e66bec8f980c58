"""The input finding's fix, priced from the phase's capacities (``analysis/capacity.py``).

The fix follows the input cause and the run's own vocabulary (``DataLoader(num_workers=...)``
for a PyTorch loop, ``--workers`` for ``stepscope train``); its expected gain is the capacity
model's prediction with the figures it rests on, never a fixed rule. Without stage timing
(older runs) the finding keeps its split-based estimate.
"""

from __future__ import annotations

from stepscope.analysis.causes import receiving_was_the_wait
from stepscope.analysis.contracts_summary import LoaderRow, PhaseAgg, PredictionRow
from stepscope.analysis.fmt import fmt_ratio
from stepscope.analysis.vocab import PYTORCH, TABLE, Vocab

STAGE_WORDS = {"read": "reading the file", "decode": "decoding",
               "transform": "transforming/augmenting",
               "item": "the dataset's own per-item code (outside read, decode and transforms)"}
# What makes the costliest stage cheaper (None: the stages were not told apart).
STAGE_REMEDY = {
    "read": "keep the files in RAM or on local storage, or store smaller pre-resized files",
    "decode": "store smaller pre-resized files, decode JPEGs at reduced size (PIL's "
              "Image.draft), or cache the decoded resized images",
    "transform": "cheaper augmentation, augment on the GPU, or cache the decoded resized images "
                 "and augment those",
    "item": "profile __getitem__ and make its own work cheaper, or cache what it computes",
    None: "cheaper augmentation, augment on the GPU, cache decoded resized images",
}


# The same remedies in a Keras script's own terms: its PyDataset's __getitem__ does the work.
KERAS_STAGE_REMEDY = {
    "read": "keep the files in RAM or on local storage, or store them smaller, pre-resized to "
            "the model's input",
    "decode": "store the images pre-resized to the model's input (a small JPEG decodes fast; "
              "PIL's Image.draft decodes a large one at reduced size), or decode and resize them "
              "once into an array that __getitem__ indexes",
    "transform": "where the transforms are a resize, store the images pre-resized or resize "
                 "them once into an array that __getitem__ indexes; where they are random "
                 "augmentation, Keras preprocessing layers (RandomRotation, RandomZoom, "
                 "RandomFlip) run it as compiled ops inside the model",
    "item": "profile __getitem__'s own code and make it cheaper, or compute what it makes once",
}
STAGE_TIMED = ("timed in the loader's workers: PIL's and OpenCV's file opening, decoding, "
               "resizing and transforms; the rest of __getitem__ is its own code")


def keras_stage_fix(agg: PhaseAgg) -> tuple[str, str] | None:
    """A Keras ``PyDataset`` whose loading CPU is the limit (no more workers would help): its
    stages per image as its workers timed them, the costliest one's remedy in Keras's terms,
    and the capacity model's gain were that stage free. None without stage timing."""
    loader = agg.get("loader")
    if not loader:
        return None
    ms = _item_stage_ms(loader)
    if not ms:
        return None
    order = sorted(ms, key=ms.__getitem__, reverse=True)
    name = {k: STAGE_WORDS[k].split(" (")[0] for k in order}  # without the item's gloss
    parts = ", ".join(f"{name[k]} {ms[k]:.2f} ms" for k in order)
    top = order[0]
    fix = (f"the CPU preparing batches is the limit; per image, {parts} ({STAGE_TIMED}). "
           f"{name[top].capitalize()} costs the most: {KERAS_STAGE_REMEDY[top]}")
    sure = _sureness(agg)
    gains = [(k, p) for k in order[:2] if (p := _pred(agg, f"{k} stage free")) is not None]
    if not gains:
        return fix, f"no prediction: the stages' capacity was not modelled; {sure}"
    said = "; ".join(f"~{fmt_ratio(p['speedup'])} faster were {name[k]} free ({p['basis']})"
                     for k, p in gains)
    return fix, f"at most {said}; {sure}"


def _pred(agg: PhaseAgg, prefix: str) -> PredictionRow | None:
    return next((p for p in agg.get("predictions") or [] if p["change"].startswith(prefix)), None)


def _gain(p: PredictionRow, sure: str) -> str:
    return (f"{p['change']}: predicted ~{fmt_ratio(p['speedup'])} faster "
            f"({p['images_per_s']:.0f} img/s; {p['basis']}); {sure}")


def _sureness(agg: PhaseAgg) -> str:
    if agg.get("verdict_weak"):
        return "tentative (few steps or near a threshold)"
    return "a model from this run's stage timing: measure it with `stepscope compare`"


def _workers_words(agg: PhaseAgg, n: int, words: Vocab) -> str:
    if agg.get("run_kind") == "train":
        return f"rerun `stepscope train` with --workers {n}"
    return words.workers_change.format(n=n)


def capacity_fix(agg: PhaseAgg, words: Vocab = TABLE[PYTORCH]) -> tuple[str, str] | None:
    """(fix, expected gain) from the capacities, or None when the run has no stage timing;
    ``words``: the loop's framework's (a Hugging Face Trainer's loader is TrainingArguments')."""
    cap, loader = agg.get("capacity"), agg.get("loader")
    cause = agg.get("input_cause")
    if not cap or not loader or cause is None:
        return None
    sure = _sureness(agg)
    evidence = " ".join(agg.get("input_evidence") or [])
    persistent = _pred(agg, "persistent_workers")
    if cause == "workers" and persistent is not None and "non-persistent" in evidence:
        return (f"keep the workers alive between phases: {words.persistent_change} "
                "(they are started again at every epoch and validation today)",
                _gain(persistent, sure))
    more = _pred(agg, "num_workers")
    if cause == "workers" and more is not None:
        return (f"{_workers_words(agg, int(more['workers']), words)} (from {loader['workers']}): the "
                "job has spare cores and the loaders cannot keep up", _gain(more, sure))
    if cause == "main-process" and receiving_was_the_wait(agg.get("input_evidence")):
        return ("not more workers (they are idle): the training process itself is slow to take "
                "each batch; if other processes share its cores give it more CPU, otherwise "
                "send fewer, larger tensors per batch", f"no capacity prediction; {sure}")
    if cause == "main-process":
        return words.main_process_fix, _cheapest(agg, "collate", sure)
    if cause == "cpu":
        stage = _costliest_stage(loader)
        costly = STAGE_WORDS.get(stage or "", "loading")
        return (f"the cores this job can get ({cap.get('obtainable_cores') or 0:.1f} of its "
                f"{cap.get('job_cores') or '?'}) are taken; more workers would not help. Make "
                f"each image cheaper: {costly} costs the most per image "
                f"({STAGE_REMEDY.get(stage, STAGE_REMEDY[None])})",
                _cheapest(agg, stage or "transform", sure))
    if cause == "storage":
        return ("the loaders wait on the disk: keep the dataset in RAM or on faster local "
                "storage (once cached, epoch 2 reads from the page cache if it fits), or store "
                "smaller pre-resized files", f"storage binds at "
                f"{cap.get('storage_images_per_s') or 0:.0f} img/s; {sure}")
    return None


def _item_stage_ms(loader: LoaderRow) -> dict[str, float]:
    """The per-item stages a loader timed (ms an image), those that took any time."""
    return {k: v for k, v in (loader.get("stage_ms_per_image") or {}).items()
            if k in STAGE_WORDS and v}


def _costliest_stage(loader: LoaderRow) -> str | None:
    ms = _item_stage_ms(loader)
    return max(ms, key=ms.__getitem__) if ms else None


def _cheapest(agg: PhaseAgg, stage: str, sure: str) -> str:
    p = _pred(agg, f"{stage} stage free")
    if p is None:
        return f"no prediction: the {stage} stage was not timed; {sure}"
    return f"at most ~{fmt_ratio(p['speedup'])} faster if {stage} cost nothing ({p['basis']}); {sure}"
