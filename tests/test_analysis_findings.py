"""Findings: evidence, fix and a gain computed from the measured split."""

from __future__ import annotations

from typing import Any, cast

import pytest

from stepscope.analysis.contracts_summary import PhaseAgg
from stepscope.analysis.findings import (
    build_findings,
    input_finding,
    speedup_without,
    tf_eager_finding,
)
from tests.contract_check import assert_conforms

pytestmark = pytest.mark.light  # quick, no process, no thread: shares make test's interpreter


def _agg(**kw: Any) -> PhaseAgg:
    """A by_phase entry holding the figures these findings read (checked against PhaseAgg)."""
    base: dict[str, Any] = {
        "phase": "train", "verdict": "input-bound", "input_cause": "workers",
        "input_evidence": ["1 workers, not saturated"], "workers": 0,
        "data_wait_frac": 0.62, "transfer_frac": 0.01, "compute_frac": 0.35, "other_frac": 0.02,
        "step_ms_per_step": 250.0, "data_wait_ms_per_step": 155.0, "transfer_ms_per_step": 2.5,
        "compute_ms_per_step": 87.5, "other_ms_per_step": 5.0, "cpu_util_pct": 50.0,
        "gpu_util_pct": None, "images_per_s": 32.0,
    }
    base.update(kw)
    assert_conforms(base, PhaseAgg, partial=True)
    return cast(PhaseAgg, base)


def test_speedup_from_the_split() -> None:
    assert speedup_without(0.5) == pytest.approx(2.0)
    assert speedup_without(0.62, 0.10) == pytest.approx(0.9 / 0.38)


def test_input_finding_gives_evidence_fix_and_the_issue_example_gain() -> None:
    f = input_finding(_agg(), cores=2)
    assert f is not None and f["severity"] == "high"
    assert "62 %" in f["evidence"] and "250 ms" in f["evidence"]
    assert "workers 0 → 2" in f["fix"]
    assert f["expected_gain"].startswith("workers 0 → 2: data wait 62 % → ≤ 10 %, ~2.4× faster")
    assert "stepscope tune" in f["measure"]
    # tune tries settings of stepscope train: a watched script or a Monitor loop is rerun
    for kind in ("watch", "monitor"):
        found = input_finding(_agg(), cores=2, summary={"run": {"kind": kind}})
        assert found is not None and "tune" not in found["measure"]
        assert "rerun with the change and `stepscope compare`" in found["measure"]


def test_cpu_cause_with_busy_cores_suggests_cheaper_augmentation() -> None:
    f = input_finding(_agg(input_cause="cpu", workers=2, cpu_util_pct=97.0), cores=2)
    assert f is not None and "augmentation" in f["fix"] and "raise DataLoader workers" not in f["fix"]


def test_moderate_wait_in_a_compute_bound_phase_is_a_low_finding() -> None:
    f = input_finding(_agg(verdict="compute-bound", data_wait_frac=0.08), cores=2)
    assert f is not None and f["severity"] == "low"
    assert input_finding(_agg(verdict="compute-bound", data_wait_frac=0.01), cores=2) is None


def test_gpu_utilisation_finding_says_what_nvml_means() -> None:
    s = {"by_phase": {"train": _agg(gpu_util_pct=30.0), "val": _agg(phase="val", gpu_util_pct=70.0)}}
    ids = {f["id"]: f for f in build_findings(s)}
    assert "at least one kernel was running" in ids["gpu_util_low"]["evidence"]
    high = build_findings({"by_phase": {"train": _agg(verdict="compute-bound",
                                                      data_wait_frac=0.01, gpu_util_pct=97.0)}})
    assert any(f["id"] == "gpu_util_high" for f in high)


def test_other_verdicts_get_their_own_fixes() -> None:
    t = build_findings({"by_phase": {"train": _agg(verdict="transfer-bound", data_wait_frac=0.0,
                                                   transfer_frac=0.3)}})
    assert t[0]["id"] == "transfer_bound_train" and "pin_memory" in t[0]["fix"]
    o = build_findings({"by_phase": {"train": _agg(verdict="overhead-bound", data_wait_frac=0.0,
                                                   other_frac=0.3)}})
    assert o[0]["id"] == "overhead_bound_train" and ".item()" in o[0]["fix"]


def test_findings_are_sorted_by_severity_and_keep_the_contract_keys() -> None:
    s = {"by_phase": {"train": _agg()}, "phases": [],
         "dataset": {"bytes": 20e9}, "host": {"mem_available_min_bytes": 8e9, "cores": 2}}
    fs = build_findings(s)
    order = ["high", "medium", "low", "info"]
    assert [order.index(f["severity"]) for f in fs] == sorted(order.index(f["severity"]) for f in fs)
    assert {"dataset_exceeds_ram", "no_steps"} <= {f["id"] for f in fs}
    for f in fs:
        assert {"id", "severity", "title", "evidence", "fix", "expected_gain"} <= set(f)


def test_gain_is_capped_and_weak_verdicts_are_low() -> None:
    f = input_finding(_agg(input_cause="cpu", workers=2, cpu_util_pct=97.0, data_wait_frac=0.99,
                           verdict_weak=True,
                           verdict_note="insufficient steps: 8 steady-state steps"), cores=2)
    assert f is not None and "over 10× faster" in f["expected_gain"]
    assert f["severity"] == "low" and "tentative" in f["title"]


@pytest.mark.parametrize(("workers", "wait", "cores", "gain"), [
    (0, 0.99, 2, "~2.0×"),  # the main process's loading over 2 workers
    (1, 0.98, 2, "~2.0×"),  # one loading thread to two: batches at most twice as often
    (2, 0.98, 8, "~2.0×"),  # 2 → 4
    (0, 0.62, 2, "~2.4×"),  # the wait left at 10 % binds first (the issue's example)
])
def test_more_workers_promise_no_more_than_their_count(workers: int, wait: float, cores: int,
                                                        gain: str) -> None:
    f = input_finding(_agg(workers=workers, data_wait_frac=wait), cores=cores)
    assert f is not None and f"{gain} faster" in f["expected_gain"], f["expected_gain"]


def test_compute_bound_fix_leaves_out_what_the_run_already_used() -> None:
    from stepscope.analysis.findings import _compute_fix

    fix, gain = _compute_fix({"precision": "bf16", "channels_last": True})
    assert fix.startswith("already uses bf16 autocast and channels_last") and gain is None
    fix, gain = _compute_fix({"precision": "fp32", "channels_last": False})
    assert "bf16 autocast and channels_last" in fix and gain


def test_frozen_trunk_advice_names_the_epochs_a_later_fit_thawed() -> None:
    """The fine-tuning guide: a first fit with the base frozen (1,281 of 411,489 parameters
    train), a second from epoch 3 with it unfrozen. The frozen-trunk advice is epochs 1–2's."""
    from stepscope.analysis.findings import _compute_fix

    summary: Any = {"loader": {"framework": "keras", "keras_backend": "tensorflow",
                               "augments": True}}
    model: Any = {"params": 411_489, "trainable_params": 1_281,
                  "trainable_by_fit": [[1, 1_281], [3, 397_409]]}
    fix, _ = _compute_fix(model, summary)
    assert "with the trunk frozen" in fix
    assert fix.endswith("(epochs 1–2: from epoch 3 a later fit() trained 397,409 of the 411,489 "
                        "parameters, watch: model.trainable_weights at each fit)")
    # every fit frozen, or one fit only: the advice as it was, with no epochs named
    for fits in ([[1, 1_281], [3, 1_281]], None):
        fix, _ = _compute_fix({**model, "trainable_by_fit": fits}, summary)
        assert "with the trunk frozen" in fix and "epoch" not in fix


def test_gil_bound_keras_threads_are_told_to_use_processes_only_when_measured() -> None:
    summary: Any = {"loader": {"framework": "keras", "kind": "PyDataset", "class": "Batches",
                               "workers": 2, "multiprocessing": False}}
    pred = {"change": "use_multiprocessing=True", "images_per_s": 150.0, "speedup": 2.5,
            "basis": "2 processes at 10.0 ms of CPU per image"}
    measured = _agg(workers=2, loader={"threads_gil_bound": True, "processes_prediction": pred})
    f = input_finding(measured, cores=2, summary=summary)
    assert f is not None
    assert "construct the Batches with workers=2, use_multiprocessing=True (now 2 threads)" \
        in f["fix"]
    assert f["expected_gain"].startswith("use_multiprocessing=True: predicted 2.5× faster")
    # Without the per-thread measurement the GIL is never named, nor processes advised for it.
    for row in ({"threads_gil_bound": None, "processes_prediction": None},
                {"threads_gil_bound": True, "processes_prediction": None}):
        f = input_finding(_agg(workers=2, loader=row), cores=2, summary=summary)
        assert f is not None and "GIL" not in f["fix"] + f["expected_gain"]


def test_tf_data_python_that_holds_the_gil_is_not_told_parallel_calls_alone() -> None:
    """A tf.data map whose Python held the GIL in most of the probe's samples: more parallel
    calls would run it one at a time (a rerun read 1.00x), so the fix moves it into TensorFlow
    ops; under the threshold, or unmeasured, the parallel calls are the fix, as before."""
    def finding(held: float | None) -> Any:
        summary: Any = {"loader": {"framework": "keras", "kind": "tf.data", "workers": 1,
                                   "parallel_calls": 1, "prefetch": False, "cache": False,
                                   "python_gil_held_frac": held}}
        return input_finding(_agg(workers=1, data_wait_frac=0.91), cores=2, summary=summary)

    f = finding(0.91)
    assert "2 parallel calls make batches at most 2.0× as fast" in f["expected_gain"]
    assert "move the map's Python (numpy_function/py_function), which holds the GIL" in f["fix"]
    assert "map(..., num_parallel_calls" not in f["fix"]
    assert f["expected_gain"].startswith("the map's Python out of the GIL, 2 parallel calls:")
    for held in (0.1, None):
        f = finding(held)
        assert "GIL" not in f["fix"] + f["expected_gain"], f["fix"]
        assert "map(..., num_parallel_calls=tf.data.AUTOTUNE) (now 1)" in f["fix"]
        assert f["expected_gain"].startswith("workers 1 → 2")


def test_a_serial_map_is_named_and_a_cpu_only_gain_is_bounded_by_idle_cores() -> None:
    """A tf.data map tf.data runs one call at a time (watch: loader.serial_map) is what the fix
    names. With no GPU the model computes on the loading cores: the gain is bounded by the
    job's idle CPU, said as a bound; on a GPU, or with the job's CPU
    unmeasured, the bound and its words are gone."""
    def finding(device: str, busy: float | None) -> Any:
        summary: Any = {"run": {"device": device},
                        "loader": {"framework": "keras", "kind": "tf.data", "workers": 1,
                                   "parallel_calls": 2, "prefetch": True, "cache": False,
                                   "serial_map": "draws random numbers (augmentation)"}}
        return input_finding(_agg(workers=1, data_wait_frac=0.37, job_cpu_pct=busy), cores=2,
                             summary=summary)

    f = finding("cpu", 83.0)
    assert ("give the map that draws random numbers (augmentation) "
            "num_parallel_calls=tf.data.AUTOTUNE") in f["fix"]
    assert "map(..., num_parallel_calls=tf.data.AUTOTUNE) (now" not in f["fix"]
    assert f["expected_gain"].startswith("workers 1 → 2: data wait 37 % → ≥ 24 %, at most "
                                         "1.20× faster")
    assert "the job used 83 % of its cores, with the model on them too" in f["expected_gain"]
    for device, busy in (("cuda:0", 83.0), ("cpu", None), ("cpu", 40.0)):
        f = finding(device, busy)
        assert "at most" not in f["expected_gain"].split("(")[0], (device, busy)
        assert "of its cores" not in f["expected_gain"]


def test_eager_train_step_finding_rests_on_watchs_count() -> None:
    agg = _agg(verdict="compute-bound", data_wait_frac=0.02)
    s: Any = {"loader": {"tf_eager_train_steps": 48}}
    f = tf_eager_finding(agg, s)
    assert f is not None and "@tf.function" in f["fix"] and "48 training steps" in f["evidence"]
    assert tf_eager_finding(agg, {"loader": {"tf_eager_train_steps": None}}) is None  # type: ignore[typeddict-item]
    assert tf_eager_finding(_agg(), s) is None  # input-bound: the input is the limit


def test_torch_feature_cache_advice_follows_the_trainable_parameters_read() -> None:
    """A PyTorch run: the feature cache is advised for a trunk measured frozen (scoped to the
    epochs before the loop trained it), left out where every parameter trained, and kept
    conditional where nothing was counted."""
    from stepscope.analysis.findings import _compute_fix

    model: Any = {"params": 11_177_538, "trainable_params": 1_026,
                  "trainable_by_fit": [[1, 1_026], [3, 11_177_538]]}
    fix, _ = _compute_fix(model)
    assert fix.endswith("or with the trunk frozen (1,026 of 11,177,538 parameters trainable) "
                        "precompute its features once (epochs 1–2: from epoch 3 the loop trained all "
                        "11,177,538 parameters, watch: requires_grad at each "
                        "epoch's first optimizer step)"), fix
    fix, _ = _compute_fix({**model, "trainable_params": 11_177_538, "trainable_by_fit": None})
    assert "frozen" not in fix and "features" not in fix
    fix, _ = _compute_fix({**model, "trainable_params": None, "trainable_by_fit": None})
    assert fix.endswith("or for a frozen trunk precompute its features once")


def test_a_hugging_face_trainer_is_advised_in_training_arguments() -> None:
    """loop.framework "transformers" (watch saw Trainer.train, or stepscope.hf.Callback): the
    Trainer builds its DataLoaders, precision and checkpoints from TrainingArguments, so its
    fixes name those; without that fact the same run is advised in torch's words."""
    from stepscope.analysis.findings import _compute_fix, checkpoint_findings

    hf: Any = {"loader": {"framework": "transformers"}, "run": {"seconds": 10.0},
               "checkpoints": {"writes": 2, "total_s": 2.0, "max_s": 1.1}}
    f = input_finding(_agg(), cores=2, summary=hf)
    assert f is not None
    assert f["fix"].startswith("raise TrainingArguments(dataloader_num_workers=0 → 2) (and "
                               "dataloader_prefetch_factor)"), f["fix"]
    assert "TrainingArguments(save_strategy=" in checkpoint_findings(hf)[0]["fix"]
    assert _compute_fix({"precision": None}, hf)[0].startswith("TrainingArguments(bf16=True)")
    # the main process collating (workers=0): the Trainer's argument moves its data_collator
    busy = _agg(input_cause="main-process", input_evidence=["collate 40 ms a batch"],
                capacity={"job_cores": 2}, loader={"workers": 0})
    f = input_finding(busy, cores=2, summary=hf)
    assert f is not None and f["fix"].startswith(
        "the training process does the loader's per-batch work itself: "
        "TrainingArguments(dataloader_num_workers=N)"), f["fix"]
    assert "num_workers ≥" not in f["fix"] and "collate_fn" not in f["fix"]
    torch: Any = {**hf, "loader": {"framework": None}}
    f = input_finding(busy, cores=2, summary=torch)
    assert f is not None and "(num_workers ≥ 1 runs collate_fn there)" in f["fix"], f["fix"]
    f = input_finding(_agg(), cores=2, summary=torch)
    assert f is not None and f["fix"].startswith("raise DataLoader workers 0 → 2")
    assert "TrainingArguments" not in checkpoint_findings(torch)[0]["fix"]
    assert "TrainingArguments" not in _compute_fix({"precision": None}, torch)[0]


def test_a_phase_that_took_a_sliver_of_the_run_is_information() -> None:
    """Validation input-bound at 49 % wait, but 0.02 s of a 16 s run (a Trainer's six eval
    steps): its finding stays, as information, and says what the run could gain at most. The
    same phase at a third of the run keeps its severity and says nothing of the kind."""
    from stepscope.analysis.findings import build_findings

    val = _agg(phase="val", seconds=0.0225)
    summary: Any = {"by_phase": {"val": val}, "run": {"seconds": 15.7}, "host": {"cores": 2}}
    f = next(f for f in build_findings(summary) if f["id"] == "input_bound_val")
    assert f["severity"] == "info"
    assert f["evidence"].endswith("validation took 22 ms of the run's 16 s (0.1 %): a fix saves "
                                  "the run at most that"), f["evidence"]
    summary["by_phase"]["val"] = _agg(phase="val", seconds=5.0)
    f = next(f for f in build_findings(summary) if f["id"] == "input_bound_val")
    assert f["severity"] == "high" and "of the run" not in f["evidence"]


def test_a_model_that_augments_itself_is_told_its_trunk_sees_new_images() -> None:
    """Keras, trunk frozen, the model's own RandomFlip/RandomRotation (watch read them): the
    compute advice names them instead of the conditional 'augment less'; without the fact the
    advice is as before; and validation's lighter compute names them only where they were read."""
    from stepscope.analysis.explain import train_vs_val
    from stepscope.analysis.findings import _compute_fix

    summary: Any = {"loader": {"framework": "keras", "keras_backend": "tensorflow",
                               "augments": None}}
    model: Any = {"params": 2_259_265, "trainable_params": 1_281,
                  "augment_layers": ["RandomFlip", "RandomRotation"]}
    fix, _ = _compute_fix(model, summary)
    assert ("the model augments each training step (RandomFlip, RandomRotation, watch: the "
            "model's layers), so the frozen trunk sees new images every epoch") in fix, fix
    fix, _ = _compute_fix({**model, "augment_layers": []}, summary)
    assert "with the trunk frozen, augment less" in fix and "RandomFlip" not in fix
    phase = {"images_per_s": 100.0, "data_wait_ms_per_image": 0.1, "verdict": "compute-bound",
             "data_wait_frac": 0.01}
    s: Any = {**summary, "model": model,
              "by_phase": {"train": {**phase, "compute_ms_per_image": 9.0},
                           "val": {**phase, "images_per_s": 300.0, "compute_ms_per_image": 3.0}}}
    got = train_vs_val(s)
    assert got is not None and "without the model's augmentation layers (RandomFlip" in got[1]
    got = train_vs_val({**s, "model": {**model, "augment_layers": None}})
    assert got is not None and "augmentation layers" not in got[1]


def test_compute_bound_fix_offers_what_the_run_has_not_tried_in_its_frameworks_words() -> None:
    """bf16 already on (a Lightning Trainer(precision="bf16-mixed"), read at its first layer)
    leaves channels_last to offer; an fp32 Lightning run is told Lightning's argument."""
    from stepscope.analysis.findings import _compute_fix

    lightning: Any = {"loader": {"framework": "lightning"}}
    fix, gain = _compute_fix({"precision": "bf16", "channels_last": False}, lightning)
    assert fix.startswith("already uses bf16 autocast: channels_last, a larger batch") \
        and gain is None, fix
    fix, gain = _compute_fix({"precision": "fp32", "channels_last": False}, lightning)
    assert fix.startswith('Trainer(precision="bf16-mixed") and channels_last, a larger batch') \
        and gain, fix
    fix, _ = _compute_fix({"precision": "fp32", "channels_last": True})
    assert fix.startswith("already uses channels_last: bf16 autocast, a larger batch"), fix


def test_a_keras_pydataset_at_its_cores_gets_its_stages_in_the_fix() -> None:
    """A PyDataset decoding and resizing JPEGs with PIL in 2 worker processes on 2 cores: its
    workers timed each stage, so the fix names them per image, the costliest first, with its
    remedy in Keras's terms and the capacity model's gain; without stage timing the generic
    advice stays, and no stage figure is said."""
    summary: Any = {"loader": {"framework": "keras", "kind": "PyDataset", "class": "Files",
                               "workers": 2, "multiprocessing": True}}
    stages = {"item": 0.21, "read": 0.08, "decode": 0.68, "transform": 0.97, "collate": 0.0,
              "pin": 0.0}
    preds = [{"change": "transform stage free", "images_per_s": 1733.0, "speedup": 2.03,
              "basis": "transform 1.0 ms of 1.9 ms per image in a loader"},
             {"change": "decode stage free", "images_per_s": 1380.0, "speedup": 1.62,
              "basis": "decode 0.7 ms of 1.9 ms per image in a loader"}]
    staged = _agg(workers=2, input_cause="cpu", data_wait_frac=0.84, predictions=preds,
                  loader={"stage_ms_per_image": stages})
    f = input_finding(staged, cores=2, summary=summary)
    assert f is not None
    assert ("per image, transforming/augmenting 0.97 ms, decoding 0.68 ms, the dataset's own "
            "per-item code 0.21 ms, reading the file 0.08 ms (timed in the loader's workers") \
        in f["fix"], f["fix"]
    assert "resize them once into an array that __getitem__ indexes" in f["fix"]
    assert f["expected_gain"].startswith("at most ~2.0× faster were transforming/augmenting "
                                         "free (transform 1.0 ms of 1.9 ms"), f["expected_gain"]
    bare = input_finding(_agg(workers=2, input_cause="cpu", data_wait_frac=0.84), cores=2,
                         summary=summary)
    assert bare is not None and "per image," not in bare["fix"] and "ms" not in bare["fix"]
    assert "make each batch cheaper" in bare["fix"]


def test_a_gil_held_map_already_at_autotune_is_still_told_to_leave_the_gil() -> None:
    """The same Python map at num_parallel_calls=AUTOTUNE (2 calls on 2 cores): no call can be
    added, yet the calls ran one at a time (the GIL held in 96 % of the samples); the fix
    moves the Python into TensorFlow ops, priced at the calls it has, where it read the generic
    'make each batch cheaper' before. Unmeasured, the GIL is not named."""
    def finding(held: float | None) -> Any:
        summary: Any = {"loader": {"framework": "keras", "kind": "tf.data", "workers": 2,
                                   "parallel_calls": 2, "prefetch": True, "cache": False,
                                   "python_gil_held_frac": held}}
        return input_finding(_agg(workers=2, data_wait_frac=0.98), cores=2, summary=summary)

    f = finding(0.96)
    assert "move the map's Python (numpy_function/py_function), which holds the GIL" in f["fix"]
    assert "num_parallel_calls" not in f["fix"]
    assert f["expected_gain"].startswith("the map's Python out of the GIL, 2 parallel calls:")
    assert "2 parallel calls make batches at most 2.0× as fast" in f["expected_gain"]
    assert "GIL" not in finding(None)["fix"] + finding(None)["expected_gain"]


def test_keras_worker_processes_idle_while_the_loop_waited_are_told_threads() -> None:
    """A PyDataset's worker processes busy a few per cent of the phase while the loop waited
    (cause ``main-process``, from their own busy time): taking each batch from them is the
    wait, so threads where __getitem__ is cheap, or fewer bytes a batch; never PyTorch's
    collate/pin-memory advice."""
    summary: Any = {"loader": {"framework": "keras", "kind": "PyDataset", "class": "Files",
                               "workers": 2, "multiprocessing": True}}
    idle = _agg(workers=2, input_cause="main-process", data_wait_frac=0.63,
                input_evidence=["2 workers busy 0.1 % of the phase and able to supply 4,630,992 "
                                "img/s against 4,081 consumed, yet the loop waited"])
    f = input_finding(idle, cores=2, summary=summary)
    assert f is not None
    assert "construct the Files with use_multiprocessing=False (workers=2 threads)" in f["fix"]
    assert "keras.layers.Rescaling(1 / 255)" in f["fix"]
    assert f["expected_gain"].startswith("worker threads, not processes: data wait 63 %")
    for word in ("collate", "pin", "DataLoader"):
        assert word not in f["fix"], word
