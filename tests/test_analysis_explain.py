"""explain(): numbered plain-words answers, headline first, numbers inline."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from stepscope.analysis.explain import Answer, explain
from stepscope.analysis.summary import write_summary
from stepscope.store.db import RunWriter
from stepscope.store.records import RunInfo, Sample
from tests.analysis_runs import CPU_FACTS, T0, PhaseSpec, RunSpec, make_run

pytestmark = pytest.mark.light  # quick, no process, no thread: shares make test's interpreter


def _seed_like(tmp_path: Path, **run_kw: Any) -> list[Answer]:
    """Two epochs shaped like the seed: CPU-bound augmentation, cold then warm cache."""
    gpu = run_kw.pop("gpu", None)
    spec = RunSpec([
        PhaseSpec(1, "train", data_wait_s=0.18, compute_s=0.065, worker_cpu_pct=97,
                  host_cpu_pct=95, read_bytes=440_000_000, rchar_bytes=445_000_000,
                  resident_start=0.0, resident_end=0.8, disk_busy_pct=22, gpu_util_pct=gpu and 30),
        PhaseSpec(1, "val", steps=25, data_wait_s=0.03, compute_s=0.02, worker_cpu_pct=90,
                  host_cpu_pct=99, read_bytes=110_000_000, rchar_bytes=111_000_000,
                  resident_start=0.8, disk_busy_pct=45, gpu_util_pct=gpu and 70, checkpoint_s=1.5),
        PhaseSpec(2, "train", data_wait_s=0.18, compute_s=0.065, worker_cpu_pct=97,
                  host_cpu_pct=95, rchar_bytes=445_000_000, gpu_util_pct=gpu and 30),
        PhaseSpec(2, "val", steps=25, data_wait_s=0.03, compute_s=0.02, worker_cpu_pct=90,
                  host_cpu_pct=99, rchar_bytes=111_000_000, gpu_util_pct=gpu and 70,
                  checkpoint_s=1.4),
    ], facts=dict(CPU_FACTS, **run_kw.pop("facts", {})),
        config=run_kw.pop("config", {"augment": "seed"}), **run_kw)
    make_run(tmp_path, spec)
    return explain(write_summary(tmp_path))


def _by_title(answers: list[Answer], word: str) -> Answer:
    return next(a for a in answers if word in a.title)


def test_answers_are_numbered_and_start_with_the_headline(tmp_path: Path) -> None:
    answers = _seed_like(tmp_path)
    assert [a.number for a in answers] == list(range(1, len(answers) + 1))
    head = answers[0]
    assert head.title == "Training was input-bound"
    assert head.text.startswith("Training was input-bound: 72 % of every step waited for data; "
                                "the CPU preparing batches")
    assert "2 DataLoader workers at 97 %, 97 % of a core" in head.text
    assert "A step took 250 ms: 180 ms waiting for data" in head.text


def test_train_vs_val_is_explained_with_per_image_numbers(tmp_path: Path) -> None:
    a = _by_title(_seed_like(tmp_path), "validation differs")
    assert "Validation ran at 145 img/s against 32.0 img/s in training (4.5× faster)" in a.text
    assert "waited 22 ms for data in training and 3.8 ms in validation" in a.text
    assert "not augmented" in a.text and "no backward" in a.text


def test_cold_then_warm_epoch_is_explained_with_bytes_and_residency(tmp_path: Path) -> None:
    a = _by_title(_seed_like(tmp_path), "disk")
    assert a.text.startswith("Epoch 1 read 550 MB from disk and 556 MB in all")
    assert "epoch 2 read 0 B from disk and 556 MB in all (dataset 100 % resident" in a.text
    assert "page cache served them from memory" in a.text
    assert "validation read from disk at" in a.text


def test_cpu_pattern_names_validation_and_checkpoint(tmp_path: Path) -> None:
    a = _by_title(_seed_like(tmp_path), "CPU")
    assert "95 % of 2 cores during training and 99 % during validation" in a.text
    assert "Checkpoints were written 2 times, 1.4 s each on average" in a.text
    assert "end of each epoch the busiest part" in a.text


def test_seed_inferences_supported_and_contradicted(tmp_path: Path) -> None:
    answers = _seed_like(tmp_path)
    ram = _by_title(answers, "in RAM")
    assert ram.text.startswith("Right about RAM, wrong about whose")
    assert "would not read the files again" in ram.text
    val = _by_title(answers, "straight to the GPU")
    assert val.text.startswith("Half right: the loader still spent 12 ms of CPU per validation image")


def test_gpu_run_with_tf_pool_answers_vram_and_utilisation(tmp_path: Path) -> None:
    answers = _seed_like(tmp_path, gpu=True, device="cuda:0", gpu_proc_used_bytes=6.5e9,
                         gpu_total_bytes=8e9,
                         facts={"mem.framework": "tensorflow", "model.file_bytes": 549_000_000,
                                "mem.cuda_context_bytes": 300_000_000})
    util = _by_title(answers, "GPU utilisation")
    assert "30 % utilised in training and 70 % in validation" in util.text
    assert "at least one kernel was running" in util.text
    vram = _by_title(answers, "same GPU memory")
    assert vram.text.startswith("549 MB model, 6.5 GB used.")
    assert "TF_FORCE_GPU_ALLOW_GROWTH=true" in vram.text
    mem = _by_title(answers, "memory went")
    assert "preallocated pool 6.2 GB" in mem.text
    titles = [a.title for a in answers]
    assert titles.index("Where the memory went") > titles.index("Why the disk was busy, then idle")


def test_memory_answer_on_cpu_lists_the_ledger(tmp_path: Path) -> None:
    mem = _by_title(_seed_like(tmp_path), "memory went")
    assert mem.text.startswith("Process memory (training RSS + workers' USS) at its peak: 1.6 GB")
    assert "weights 14 MB" in mem.text and "unattributed" in mem.text


def test_compute_bound_headline(tmp_path: Path) -> None:
    make_run(tmp_path, RunSpec([PhaseSpec(1, data_wait_s=0.005, compute_s=0.3)]))
    head = explain(write_summary(tmp_path))[0]
    assert head.title == "Training was compute-bound"
    assert "of every step was the model's own work" in head.text


def test_no_steps_gives_a_system_level_headline(tmp_path: Path) -> None:
    w = RunWriter(tmp_path, RunInfo(name="w", command="python x.py", kind="watch", started=T0,
                                    pid=4242), clock=lambda: T0 + 5)
    w.add_samples([Sample(T0 + i, "host", "cpu_util_pct", 50.0) for i in range(5)])
    w.close("completed")
    answers = explain(write_summary(tmp_path))
    assert answers[0].title == "No training steps were recorded"
    assert "host CPU averaged 50 %" in answers[0].text


def test_an_already_cached_dataset_is_not_called_cold(tmp_path: Path) -> None:
    make_run(tmp_path, RunSpec([PhaseSpec(1, read_bytes=0, rchar_bytes=500_000_000),
                                PhaseSpec(2, read_bytes=0, rchar_bytes=500_000_000)],
                               facts=dict(CPU_FACTS)))
    answers = explain(write_summary(tmp_path))
    disk = _by_title(answers, "disk")
    assert disk.title == "Why the disk stayed idle"
    assert not any("in RAM" in a.title for a in answers)


def test_page_ins_beside_a_resident_dataset_are_not_its_reads(tmp_path: Path) -> None:
    """The process read 120 MB from the disk in epoch 1 (a first step's libraries, a mapped
    file) while the dataset stayed resident at each phase's start and end: those reads are
    not the dataset's, and the sentence that says so rests on the residency at both ends."""
    specs = [PhaseSpec(1, read_bytes=120_000_000, rchar_bytes=500_000_000),
             PhaseSpec(2, read_bytes=0, rchar_bytes=500_000_000)]
    make_run(tmp_path / "a", RunSpec(specs, facts=dict(CPU_FACTS)))
    disk = _by_title(explain(write_summary(tmp_path / "a")), "disk")
    assert disk.title == "Why the disk stayed idle"
    assert "none of those physical reads were its files" in disk.text
    assert "physical reads were 22 %" not in disk.text
    # without the residency at the phase's end the sentence goes (the share of the dataset stays)
    specs[0] = PhaseSpec(1, read_bytes=120_000_000, rchar_bytes=500_000_000, resident_end=None)
    make_run(tmp_path / "b", RunSpec(specs, facts=dict(CPU_FACTS)))
    disk = _by_title(explain(write_summary(tmp_path / "b")), "disk")
    assert "none of those physical reads" not in disk.text
    assert "physical reads were 22 % of it" in disk.text


def _tv(augment: str, lt: float, lv: float, loader: dict[str, Any] | None = None) -> str:
    from stepscope.analysis.explain import train_vs_val

    phase = {"images_per_s": 10.0, "data_wait_ms_per_image": 5.0, "compute_ms_per_image": 50.0,
             "verdict": "compute-bound", "data_wait_frac": 0.05}
    s = {"run": {"augment": augment, "augmented": augment != "none"},
         "by_phase": {"train": {**phase, "loader_cpu_ms_per_image": lt},
                      "val": {**phase, "images_per_s": 20.0, "data_wait_ms_per_image": 1.0,
                              "compute_ms_per_image": 20.0, "loader_cpu_ms_per_image": lv}},
         "loader": loader}
    out = train_vs_val(s)
    assert out is not None
    return out[1]


def test_not_augmented_reason_needs_augmentation_and_cheaper_loading() -> None:
    assert "not augmented" in _tv("seed", lt=8.0, lv=2.0)
    assert "not augmented" not in _tv("none", lt=8.0, lv=2.0)  # nothing was augmented
    assert "not augmented" not in _tv("seed", lt=0.7, lv=2.6)  # the loader's CPU contradicts it
    assert "no backward" in _tv("none", lt=8.0, lv=2.0)


def test_validation_on_another_input_is_named_with_what_watch_recorded() -> None:
    val = {"kind": "PyDataset", "class": "Batches", "workers": 1, "multiprocessing": False}
    loader = {"framework": "keras", "kind": "tf.data", "parallel_calls": 2, "prefetch": True,
              "val": val}
    said = ("Validation reads another input than training: a PyDataset (Batches) with 1 worker "
            "thread, where training reads a tf.data pipeline with 2 parallel calls and prefetch")
    assert said in _tv("none", 8.0, 2.0, loader)
    assert "reads another input" not in _tv("none", 8.0, 2.0, {**loader, "val": None})
    assert "reads another input" not in _tv("none", 8.0, 2.0)


def _tv2(val_ips: float, val_wait: float, val_compute: float,
         val_disk: int | None = None) -> str:
    from stepscope.analysis.explain import train_vs_val

    train = {"images_per_s": 100.0, "data_wait_ms_per_image": 1.0, "compute_ms_per_image": 9.0,
             "verdict": "compute-bound", "data_wait_frac": 0.1}
    val = {**train, "images_per_s": val_ips, "data_wait_ms_per_image": val_wait,
           "compute_ms_per_image": val_compute}
    s = {"run": {}, "by_phase": {"train": train, "val": val},
         "phases": [{"phase": "val", "epoch": 1, "disk_read_bytes": val_disk}]}
    out = train_vs_val(s)
    assert out is not None
    return out[1]


def test_slower_validation_is_explained_only_by_what_was_measured() -> None:
    text = _tv2(50.0, 10.0, 9.0)
    assert "2.0× slower" in text and "Validation is slower here: per image, it waited longer " \
        "for data." in text
    assert "cold files" not in text and "from disk" not in text  # no disk read measured
    assert "its phases read 40 MB from disk" in _tv2(50.0, 10.0, 9.0, val_disk=40_000_000)
    alike = _tv2(97.0, 1.0, 9.3)  # 3 % apart: neither faster nor slower
    assert "about as fast" in alike and "slower here" not in alike


def test_a_run_that_failed_says_where_and_what_its_figures_cover(tmp_path: Path) -> None:
    """A command that exited with code 1 in epoch 2: the headline says so, with the steps the
    figures cover; a completed run says nothing of the kind."""
    specs = [PhaseSpec(1, data_wait_s=0.005, compute_s=0.3), PhaseSpec(2, data_wait_s=0.005,
                                                                       compute_s=0.3)]
    make_run(tmp_path / "failed", RunSpec(specs, status="failed", exit_code=1))
    s = write_summary(tmp_path / "failed")
    head = explain(s)[0].text
    steps = sum(p["steps"] for p in s["phases"])
    assert (f"The command exited with code 1 in epoch 2's train phase (run status: failed): "
            f"these figures cover the {steps:,} steps it ran.") in head, head
    assert "raising" not in head  # no exception recorded: none named
    s["run"]["exception"] = {"type": "RuntimeError", "message": "the logging sink is gone",
                             "file": "/home/u/train.py", "line": 12}
    head = explain(s)[0].text
    assert ("(run status: failed), raising RuntimeError: the logging sink is gone at "
            "train.py:12 (the uncaught exception, watch's sys.excepthook): these figures cover "
            f"the {steps:,} steps it ran.") in head, head
    make_run(tmp_path / "done", RunSpec(specs))
    assert "The command" not in explain(write_summary(tmp_path / "done"))[0].text
