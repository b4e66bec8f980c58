"""Every gated sentence both ways: printed with the measurement it rests on, absent without
(analysis/evidence.py). Hand-made summaries: only the keys each sentence reads."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from stepscope.analysis import epoch_one, evidence
from stepscope.analysis.contracts_summary import PhaseAgg, Summary
from stepscope.analysis.explain import (
    cold_vs_warm,
    gpu_pattern,
    headline,
    ram_inference,
    train_vs_val,
    val_inference,
)
from stepscope.analysis.findings import build_findings, input_finding
from tests.contract_check import assert_conforms

pytestmark = pytest.mark.light  # quick, no process, no thread: shares make test's interpreter


_SPLIT = {"step_ms_per_step": 100.0, "data_wait_ms_per_step": 60.0, "transfer_ms_per_step": 0.0,
          "compute_ms_per_step": 35.0, "other_ms_per_step": 5.0}


def _agg(kind: str, **kw: Any) -> dict[str, Any]:
    base = {"phase": kind, "verdict": "input-bound", "data_wait_frac": 0.6, "transfer_frac": 0.0,
            "compute_frac": 0.35, "other_frac": 0.05, "input_cause": "cpu", "input_evidence": [],
            "images_per_s": 80.0 if kind == "train" else 200.0, "workers": 2,
            "data_wait_ms_per_image": 8.0 if kind == "train" else 2.0,
            "compute_ms_per_image": 4.0 if kind == "train" else 1.0,
            "loader_cpu_ms_per_image": 8.0 if kind == "train" else 2.0,
            "cpu_util_pct": 97.0, **_SPLIT}
    out = {**base, **kw}
    assert_conforms(out, PhaseAgg, partial=True)  # a slice of what the analysis emits
    return out


def _summary(**measured: Any) -> dict[str, Any]:
    """A summary with every measurement the gated sentences need (drop keys to remove one)."""
    s: dict[str, Any] = {
        "run": {"augment": "seed", "augmented": True, "kind": "train"},
        "dataset": {"files": 25_000, "bytes": 600_000_000},
        "by_phase": {"train": _agg("train", decode_ms_per_image=3.0, gpu_util_pct=30.0),
                     "val": _agg("val", decode_ms_per_image=3.0, gpu_util_pct=70.0)},
        "epochs": [{"epoch": 1, "disk_read_bytes": 10_000_000, "rchar_bytes": 600_000_000},
                   {"epoch": 2, "disk_read_bytes": 1_000_000, "rchar_bytes": 600_000_000}],
        "phases": [{"epoch": 1, "phase": "train", "dataset_resident_frac_start": 0.9},
                   {"epoch": 2, "phase": "train", "dataset_resident_frac_start": 1.0}],
    }
    s.update(measured)
    assert_conforms(s, Summary, partial=True)
    return s


def _without(s: dict[str, Any], path: str) -> dict[str, Any]:
    out = copy.deepcopy(s)
    node = out
    *parents, last = path.split(".")
    for p in parents:
        node = node[p]
    node.pop(last)
    return out


def _text(fn: Any, s: dict[str, Any]) -> str:
    got = fn(s)
    return "" if got is None else got[1]


def test_page_cache_claim_needs_dataset_files() -> None:
    s = _summary()
    assert "already in the kernel's page cache" in _text(cold_vs_warm, s)
    # An in-memory dataset: no files, so no disk or page-cache story at all.
    assert cold_vs_warm(_without(s, "dataset.files")) is None


def test_ram_inference_needs_files_and_redecode_needs_decoding() -> None:
    cold = _summary(phases=[{"epoch": 1, "phase": "train", "dataset_resident_frac_start": 0.0},
                            {"epoch": 2, "phase": "train", "dataset_resident_frac_start": 1.0}],
                    epochs=[{"epoch": 1, "disk_read_bytes": 590_000_000, "rchar_bytes": 600_000_000},
                            {"epoch": 2, "disk_read_bytes": 1_000_000, "rchar_bytes": 600_000_000}])
    assert "re-reads and re-decodes" in _text(ram_inference, cold)
    assert "re-decodes" not in _text(ram_inference, _without(cold, "by_phase.train.decode_ms_per_image"))
    assert ram_inference(_without(cold, "dataset.files")) is None


def test_decoding_claims_need_a_timed_decode_stage() -> None:
    s = _summary()
    assert "still decoded, resized and normalised" in _text(train_vs_val, s)
    assert "still decoded" in _text(val_inference, s)
    no_decode = _without(s, "by_phase.val.decode_ms_per_image")
    assert "decoded" not in _text(train_vs_val, no_decode)
    assert "decoded" not in _text(val_inference, no_decode)
    tiny = _summary()
    tiny["by_phase"]["val"]["decode_ms_per_image"] = 0.001  # below the floor: nothing decoded
    assert "decoded" not in _text(val_inference, tiny)


def test_validation_from_arrays_in_memory_is_right_not_half_right() -> None:
    """A Keras fit on NumPy arrays (validation_split): validation read 8 B of files for 1,920
    images, 1.5 us of loading a validation image against 17 us the image took; nothing decoded.
    The seed's 'straight to the GPU' holds there; "Half right" needs a cost worth naming."""
    arrays = _summary(phases=[{"epoch": 1, "phase": "train", "rchar_bytes": 40_000,
                               "images": 17_280},
                              {"epoch": 1, "phase": "val", "rchar_bytes": 8, "images": 1920}])
    arrays["by_phase"]["val"] = _agg("val", workers=0, loader_cpu_ms_per_image=None,
                                     data_wait_ms_per_image=0.0015, step_ms_per_image=0.0166)
    text = _text(val_inference, arrays)
    assert text.startswith("Right for this run: validation read 8 B of files for its 1,920 "
                           "images"), text
    assert "Half" not in text and "9 % of the" in text and "no decode was timed" in text
    # each measurement it rests on, taken away, brings back the old answer
    assert "Half right" in _text(val_inference, _without(arrays, "by_phase.val.step_ms_per_image"))
    unread = _summary(phases=[{"epoch": 1, "phase": "val", "images": 1920}])
    unread["by_phase"]["val"] = arrays["by_phase"]["val"]
    assert "Half right" in _text(val_inference, unread)  # files read: not measured
    # files read (a 1 kB image each), a timed decode, or loading worth a quarter of the time
    files = _summary(phases=[{"epoch": 1, "phase": "val", "rchar_bytes": 1920 * 1000,
                              "images": 1920}])
    files["by_phase"]["val"] = arrays["by_phase"]["val"]
    assert "Half right" in _text(val_inference, files)
    decoded = _summary(phases=arrays["phases"])
    decoded["by_phase"]["val"] = {**arrays["by_phase"]["val"], "decode_ms_per_image": 3.0}
    assert "Half right" in _text(val_inference, decoded)
    slow = _summary(phases=arrays["phases"])
    slow["by_phase"]["val"] = {**arrays["by_phase"]["val"], "data_wait_ms_per_image": 0.005}
    assert "Half right" in _text(val_inference, slow)


def test_headline_names_decoding_and_augmenting_only_as_measured() -> None:
    s = _summary()
    assert "(decoding and augmenting the images)" in _text(headline, s)
    s_watch = _without(_without(s, "run.augmented"), "by_phase.train.decode_ms_per_image")
    text = _text(headline, s_watch)
    assert "the CPU preparing batches could not keep up" in text
    assert "decod" not in text and "augment" not in text


def test_augmentation_claims_need_a_known_augmentation() -> None:
    s = _summary()
    assert "not augmented" in _text(train_vs_val, s)
    watched = _without(s, "run.augmented")  # a watched script: augmentation unknown
    assert "augment" not in _text(train_vs_val, watched)
    assert "only the augmentation is skipped" in _text(val_inference, s)
    assert "That is part of why validation is faster" in _text(val_inference, s)
    assert "augmentation" not in _text(val_inference, watched)
    # without the skipped augmentation measured, "that" would point at nothing: a Keras fit on
    # arrays validates faster because it runs the forward pass alone
    assert "That is" not in _text(val_inference, watched)
    assert "Validation is faster for what it computes" in _text(val_inference, watched)


def test_gpu_idle_claim_needs_a_measured_gpu() -> None:
    s = _summary()
    assert "the GPU idles while it waits" in _text(gpu_pattern, s)
    assert gpu_pattern(_without(s, "by_phase.train.gpu_util_pct")) is None
    no_gpu = _without(_without(s, "by_phase.train.gpu_util_pct"), "by_phase.val.gpu_util_pct")
    for fn in (headline, train_vs_val, cold_vs_warm, val_inference):
        assert "GPU" not in _text(fn, no_gpu)


def test_scipy_figures_only_for_the_seed_augmentation() -> None:
    s = _summary()
    agg = _agg("train", cpu_util_pct=97.0)
    seed = input_finding(agg, cores=1, summary=s)
    assert seed is not None and "SciPy" in seed["fix"]
    script = input_finding(agg, cores=1, summary=_without(s, "run.augment"))
    assert script is not None and "SciPy" not in script["fix"] and "1,400" not in script["fix"]
    assert "decode once" not in input_finding(
        agg, cores=1, summary=_without(_without(s, "run.augment"),
                                       "by_phase.train.decode_ms_per_image"))["fix"]


def test_every_claim_is_used_where_sentences_are_made() -> None:
    src = Path(evidence.__file__).parent
    code = "".join((src / f).read_text() for f in ("explain.py", "findings.py", "epoch_one.py", "keras_loader.py",
                                                      "keras_spe.py"))
    for claim_id in evidence.CLAIMS:
        used = f'"{claim_id}"' in code
        used = used or (claim_id.startswith("decoded_") and 'f"decoded_{' in code)
        assert used, claim_id
        assert evidence.rests_on(claim_id)


def test_steps_per_execution_needs_timed_keras_callbacks() -> None:
    """Keras's steps_per_execution advice rests on the callbacks' measured share of the step."""
    train = _agg("train", verdict="overhead-bound", data_wait_frac=0.02, compute_frac=0.1,
                 other_frac=0.88, other_ms_per_step=30.0, step_ms_per_step=34.0)
    s = _summary(loader={"framework": "keras", "callbacks_timed": True},
                 by_phase={"train": train})
    found = {f["id"]: f for f in build_findings(s)}
    fix = found["overhead_bound_train"]["fix"]
    assert "steps_per_execution=" in fix
    # 88 % callbacks: N = 64 (the cap) leaves 0.12 + 0.88/64 of the step, ~7.5x faster.
    assert "steps_per_execution=64" in fix
    assert "7.5×" in found["overhead_bound_train"]["expected_gain"]
    # Not timed (another framework's hook, an older watch): no steps_per_execution sentence.
    for untimed in (_without(s, "loader.callbacks_timed"),
                    _summary(loader={"framework": "keras"}, by_phase={"train": train})):
        text = str(build_findings(untimed))
        assert "steps_per_execution" not in text
    # Material but not the bound: a finding of its own, with the gain from the share.
    mild = _agg("train", verdict="compute-bound", data_wait_frac=0.02, compute_frac=0.78,
                other_frac=0.2, other_ms_per_step=20.0)
    s2 = _summary(loader={"framework": "keras", "callbacks_timed": True},
                  by_phase={"train": mild})
    f = next(f for f in build_findings(s2) if f["id"] == "keras_callback_overhead_train")
    assert "steps_per_execution=5" in f["fix"]
    # Below the floor (10 %): nothing.
    low = _agg("train", verdict="compute-bound", other_frac=0.05)
    s3 = _summary(loader={"framework": "keras", "callbacks_timed": True},
                  by_phase={"train": low})
    assert "steps_per_execution" not in str(build_findings(s3))


def test_steps_per_execution_priced_from_the_timed_graph() -> None:
    """With TensorFlow's graph timed apart from the step (loop.keras_train_calls), the gain is
    the measured split: per batch the graph's warm work and data wait repeat, the rest of the
    step is paid once per call. Without that measurement, the callbacks-only floor."""
    train = _agg("train", verdict="overhead-bound", data_wait_frac=0.02, compute_frac=0.1,
                 other_frac=0.75, other_ms_per_step=30.0, step_ms_per_step=40.0)
    calls = {"calls": 100, "steps_per_execution": 1, "step_s": 4.0, "graph_s": 0.4,
             "wait_s": 0.1, "work_median_s": 0.002, "work_p10_s": 0.0015}
    s = _summary(loader={"framework": "keras", "callbacks_timed": True, "train_calls": calls},
                 by_phase={"train": train})
    f = {f["id"]: f for f in build_findings(s)}["overhead_bound_train"]
    # a 40 ms step; 2 ms work (median) + 1 ms wait repeat per batch; N = 64 (the cap) divides the
    # other 37 ms: 40 / (3 + 37/64) = 11.2x
    assert "steps_per_execution=64" in f["fix"]
    assert f["expected_gain"].startswith("~11× faster")
    assert "TensorFlow's graph worked 2.0 ms" in f["evidence"]
    assert "timed by watch around TensorFlow's function call" in f["evidence"]
    # Already 4 batches a call (now 49 ms a call): raise it, priced per batch.
    four = {**calls, "steps_per_execution": 4, "step_s": 4.9, "wait_s": 0.4,
            "work_median_s": 0.008}
    s4 = _summary(loader={"framework": "keras", "callbacks_timed": True, "train_calls": four},
                  by_phase={"train": train})
    f4 = {f["id"]: f for f in build_findings(s4)}["overhead_bound_train"]
    assert "steps_per_execution=64) (now 4)" in f4["fix"]  # 12.25 / (3 + 37/64) ms = 3.4x
    assert f4["expected_gain"].startswith("~3.4× faster")
    # Already at the cap: nothing more to gain from it; the callbacks' own fix stays.
    at_cap = {**calls, "steps_per_execution": 64}
    s64 = _summary(loader={"framework": "keras", "callbacks_timed": True, "train_calls": at_cap},
                   by_phase={"train": train})
    assert "steps_per_execution" not in str(build_findings(s64))
    # Without the graph timed (JAX, torch, an older watch) or over too few calls: the floor.
    for untimed in (_without(s, "loader.train_calls"),
                    _summary(loader={"framework": "keras", "callbacks_timed": True,
                                     "train_calls": {**calls, "calls": 3}},
                             by_phase={"train": train})):
        g = {f["id"]: f for f in build_findings(untimed)}["overhead_bound_train"]
        assert "steps_per_execution=" in g["fix"]
        assert g["expected_gain"].startswith("at least")
        assert "graph" not in g["evidence"]


def test_keras_loop_overhead_without_callbacks_is_told_steps_per_execution() -> None:
    """On a CPU the step's other is the loop's own Python outside TensorFlow's graph
    (train_calls.other_is_loop): material, it is priced from the graph and told in words that
    blame no callback of the script's (it has none); validation's is told evaluate reads the
    same setting. Without other_is_loop the other is the callbacks', as before."""
    train = _agg("train", verdict="overhead-bound", data_wait_frac=0.15, compute_frac=0.3,
                 other_frac=0.55, other_ms_per_step=0.55, step_ms_per_step=1.0)
    val = _agg("val", verdict="overhead-bound", data_wait_frac=0.1, compute_frac=0.5,
               other_frac=0.4, other_ms_per_step=0.4, step_ms_per_step=1.0)
    calls = {"calls": 800, "steps_per_execution": 1, "step_s": 0.8, "graph_s": 0.2,
             "wait_s": 0.1, "callbacks_s": 0.0, "other_is_loop": True,
             "work_median_s": 0.0001, "work_p10_s": 0.00001}
    s = _summary(loader={"framework": "keras", "callbacks_timed": None, "train_calls": calls},
                 by_phase={"train": train, "val": val})
    found = {f["id"]: f for f in build_findings(s)}
    f = found["overhead_bound_train"]
    assert "steps_per_execution=" in f["fix"] and "so Keras's per-call work" in f["fix"]
    assert "async_safe" not in f["fix"] and "callbacks held" not in f["evidence"]
    assert "TensorFlow's graph worked 0.1 ms" in f["evidence"]
    assert "in validation too (evaluate reads it)" in found["overhead_bound_val"]["fix"]
    assert "(Keras's per-batch Python and callbacks, the train function's dispatch and return: " \
           "the step outside TensorFlow's graph, timed by watch)" in _text(headline, s)
    # the same split where the other is the callbacks' alone (a GPU, an older watch): no advice
    # without the callbacks timed, and validation gets the generic words
    old = _summary(loader={"framework": "keras", "callbacks_timed": None,
                           "train_calls": {**calls, "other_is_loop": False}},
                   by_phase={"train": train, "val": val})
    text = str(build_findings(old))
    assert "steps_per_execution" not in text
    assert "(logging, metrics, syncs)" in _text(headline, old)


def test_the_callback_that_held_the_loop_is_named_only_where_timed_by_class() -> None:
    """TensorBoard writing every batch's logs: each callback's hooks timed by class
    (train_calls.callbacks_by) name it in the headline and bring its own fix; without that
    measurement neither appears, and the generic callback advice stays."""
    train = _agg("train", verdict="overhead-bound", data_wait_frac=0.1, compute_frac=0.25,
                 other_frac=0.65, other_ms_per_step=1.0, step_ms_per_step=1.6)
    calls = {"calls": 500, "steps_per_execution": 1, "step_s": 0.8, "graph_s": 0.1,
             "wait_s": 0.05, "callbacks_s": 0.3, "other_is_loop": True,
             "work_median_s": 0.0001, "work_p10_s": 0.00001,
             "callbacks_by": {"TensorBoard": 0.29, "CSVLogger": 0.01}}
    s = _summary(loader={"framework": "keras", "callbacks_timed": True, "train_calls": calls},
                 by_phase={"train": train})
    head = _text(headline, s)
    assert "The script's batch callbacks held the loop 0.6 ms a step: TensorBoard 97 %, " \
           "CSVLogger 3 % of that time" in head, head
    fix = next(f for f in build_findings(s) if f["id"] == "overhead_bound_train")["fix"]
    assert "TensorBoard's batch hooks held the loop 0.6 ms of the 1.6 ms step (timed by " \
           'watch): update_freq="epoch"' in fix and "async_safe" not in fix
    bare = _without(s, "loader.train_calls.callbacks_by")
    assert "TensorBoard" not in _text(headline, bare)
    fix = next(f for f in build_findings(bare) if f["id"] == "overhead_bound_train")["fix"]
    assert "TensorBoard" not in fix and "async_safe" in fix


def test_cache_after_the_decode_rests_on_the_maps_ops_and_no_cache() -> None:
    """A tf.data pipeline whose map decodes images (watch read the op), nothing cached: the
    fix is a .cache() after the decode, sized from one image's bytes; without the decode read,
    or with a cache, it is not told."""
    loader = {"framework": "keras", "kind": "tf.data", "workers": 2, "parallel_calls": 2,
              "prefetch": True, "cache": False, "decodes": True, "image_bytes": 110_592}
    train = _agg("train", images=3200, phases=2)
    s = _summary(loader=loader, by_phase={"train": train})
    fix = next(f for f in build_findings(s) if f["id"] == "input_bound_train")
    assert ".cache() right after the decode map" in fix["fix"], fix
    assert "~177 MB for the 1,600 images of an epoch" in fix["fix"], fix
    # a set over half the RAM the run left available: a cache file on a local disk
    big = _summary(loader=loader, by_phase={"train": train},
                   host={"mem_available_min_bytes": 300e6})
    fix = next(f for f in build_findings(big) if f["id"] == "input_bound_train")
    assert "more than half the 300 MB of RAM this host had available: .cache(filename) on a " \
           "local disk right after the decode map" in fix["fix"], fix
    for gone in (_without(s, "loader.decodes"), _summary(loader={**loader, "cache": True},
                                                         by_phase={"train": train})):
        fix = next(f for f in build_findings(gone) if f["id"] == "input_bound_train")
        assert "right after the decode map" not in fix["fix"], fix


def test_tf_distribute_sentence_needs_the_recorded_strategy() -> None:
    s = _summary(loader={"framework": "keras", "distribute_strategy": "MirroredStrategy",
                         "distribute_replicas": 2})
    assert "under tf.distribute MirroredStrategy with 2 replicas in sync" in _text(headline, s)
    assert "tf.distribute" not in _text(headline, _without(s, "loader.distribute_strategy"))


def _first_epoch_only(**kw: Any) -> dict[str, Any]:
    """Epoch 1 input-bound (95 % wait), epochs 2 and 3 compute-bound, from a tf.data pipeline
    with a .cache() (drop ``loader.cache`` to remove that measurement)."""
    def phase(epoch: int, verdict: str, wait: float, seconds: float) -> dict[str, Any]:
        return {"epoch": epoch, "phase": "train", "verdict": verdict, "data_wait_frac": wait,
                "seconds": seconds}
    s = _summary(phases=[phase(1, "input-bound", 0.95, 4.0), phase(2, "compute-bound", 0.04, 0.1),
                         phase(3, "compute-bound", 0.1, 0.1)],
                 loader={"framework": "keras", "kind": "tf.data", "cache": True}, **kw)
    s["by_phase"]["train"]["input_cause"] = "workers"
    return s


def test_only_epoch_one_waited_names_the_cache_as_measured() -> None:
    s = _first_epoch_only()
    text = _text(epoch_one.answer, s)
    assert text.startswith("Epoch 1 was input-bound: 95 % of its steps' time waited for data; "
                           "epochs 2–3 were compute-bound (4–10 % data wait). Its wait took "
                           "3.8 s of the 4.2 s spent training.")
    assert "The tf.data pipeline caches (.cache()" in text
    assert "Only epoch 1 waited: epochs 2–3 were compute-bound" in _text(headline, s)
    found = input_finding(s["by_phase"]["train"], cores=2, summary=s)
    assert found is not None
    assert found["expected_gain"].endswith(", in epoch 1 only: later epochs read the cache")
    # without the pipeline's cache read, the cache is not named: the figures stay, the cause
    # is said to be unmeasured (the page cache is not it: epoch 1 read 10 MB of 600 MB)
    bare = _without(s, "loader.cache")
    text = _text(epoch_one.answer, bare)
    assert "cache" not in text.replace("no cache in the input", "")
    assert "What changed after it was not measured" in text
    assert input_finding(bare["by_phase"]["train"], cores=2, summary=bare)["expected_gain"] \
        .endswith(", in epoch 1 only")


def test_only_epoch_one_waited_names_a_page_cache_it_measured() -> None:
    s = _without(_first_epoch_only(epochs=[
        {"epoch": 1, "disk_read_bytes": 590_000_000, "rchar_bytes": 600_000_000},
        {"epoch": 2, "disk_read_bytes": 1_000_000, "rchar_bytes": 600_000_000},
        {"epoch": 3, "disk_read_bytes": 1_000_000, "rchar_bytes": 600_000_000}]), "loader.cache")
    for p, resid in zip(s["phases"], (0.0, 1.0, 1.0), strict=True):
        p["dataset_resident_frac_start"] = resid
    assert "Epoch 1 read 590 MB of the dataset from disk; later epochs found its files in the " \
        "kernel's page cache." in _text(epoch_one.answer, s)
    assert "page cache" not in _text(epoch_one.answer, _without(s, "dataset.files"))


def test_no_first_epoch_answer_when_later_epochs_wait_too() -> None:
    s = _first_epoch_only()
    s["phases"][2]["verdict"] = "input-bound"
    assert epoch_one.answer(s) is None
    assert "Only epoch" not in _text(headline, s)
    assert "epoch 1 only" not in input_finding(s["by_phase"]["train"], cores=2,
                                               summary=s)["expected_gain"]
    one = _first_epoch_only()
    one["phases"] = one["phases"][:1]  # a single epoch: nothing to set it against
    assert epoch_one.answer(one) is None


def test_only_epoch_one_waited_names_the_trainers_feature_cache() -> None:
    s = _without(_first_epoch_only(), "loader.cache")
    for p in s["phases"][1:]:
        p["feature_cache"] = True  # summary._mark_cached_phases, from fact featcache.used
    assert "Later epochs ran from the trainer's feature cache" in _text(epoch_one.answer, s)
    assert input_finding(s["by_phase"]["train"], cores=2, summary=s)["expected_gain"] \
        .endswith(", in epoch 1 only: later epochs read the feature cache")


def test_system_only_reads_say_what_each_byte_counter_counts() -> None:
    """A script that failed before its loop, from a dropped page cache: the import's mapped
    libraries came from disk (read_bytes: 1.2 GB) while read calls took 59 MB (rchar), so "of
    it from disk" would be a subset larger than its whole."""
    from stepscope.analysis.explain import _system_only

    s: Any = {"system": {"cpu_util_pct": 52.0, "cpu_util_max_pct": 100.0,
                         "tree_rchar_bytes": 59e6, "tree_read_bytes": 1.2e9}}
    text = _system_only(s)
    assert "of it from disk" not in text and "59 MB through read calls and 1.2 GB from disk" \
        in text, text
    s["system"]["tree_read_bytes"] = 20e6
    assert "read 59 MB of files, 20 MB of it from disk" in _system_only(s)
