"""Scenarios with known answers: real training runs, each built so one thing limits it.

Every scenario trains for real (``train(resolve_config(...))`` on synthetic JPEGs), analyses the
recorded run (``write_summary``) and checks the verdict a practitioner would reach by reasoning
about the set-up. Each prints its verdict and key numbers (run ``pytest -s`` to see them).

1. Inline loading with a core to spare: tiny model, Keras-style augmentation inline
   (``workers=0``) on one of two cores: cause ``workers``.
2. Compute-bound: a large trunk at 299 px, no augmentation, a worker preparing batches ahead.
3. Storage-bound: the dataset evicted from the page cache and reads throttled to 1 MB/s with a
   blkio cgroup; epoch 2 finds the files in the page cache and is no longer storage-bound.
4. Too few workers: slow augmentation in one worker on a machine with a core to spare.
5. Train vs validation: validation images are not augmented, so they cost less to load.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from stepscope.analysis.explain import explain
from stepscope.analysis.summary import write_summary
from stepscope.observe.blkio import BlkioThrottle, blkio_available
from stepscope.observe.disk import block_device_for
from stepscope.observe.pagecache import evict
from stepscope.train.config import resolve_config
from stepscope.train.loop import train
from stepscope.train.setup import usable_cores
from tests.conftest import data_flags

# Its scenarios plant a job whose loaders and model fill both cores, and the cause turns on how
# near the job ran to them (a CI rehearsal: 309 img/s of a 377 img/s ceiling, 'workers'): make
# test runs it after the low-priority lane (scripts/run-tests), whose processes fill the gaps.
pytestmark = pytest.mark.alone

# timm's smallest EfficientNet (0.1 M parameters): a training step on 8 images at 64 px costs
# ~10-15 ms on one core, so what the input pipeline costs decides the step.
SMALL_MODEL = "test_efficientnet"
LARGE_MODEL = "efficientnet_lite0"
THROTTLE_BYTES_PER_S = 1_000_000
# One torch thread for the small model: with two, every parallel region waits at its barrier for
# a thread the OS has descheduled whenever other work shares the two cores, and a 5 ms step
# becomes 0.1-2 s, i.e. the scenario would measure the neighbours, not the input pipeline.
SMALL_THREADS = 1
BLKIO_OK, BLKIO_WHY = blkio_available()


def _run(name: str, data_dir: Path, tmp_path: Path, **flags: Any) -> dict[str, Any]:
    """Train ``flags`` on ``data_dir``, analyse it and print the figures the verdict rests on.

    The feature cache is off: with it a frozen trunk's later passes read cached features and
    skip the input pipeline these scenarios are about.
    """
    base: dict[str, Any] = {**data_flags(data_dir), "weights": "none", "epochs": 1,
                            "out": str(tmp_path / name), "interval_s": 0.25,
                            "feature_cache": False}
    result = train(resolve_config({**base, **flags}))
    assert result.status == "completed"
    summary = write_summary(result.run_dir)
    _print_figures(name, summary)
    return summary


def _fmt(v: Any, spec: str = ".2f") -> str:
    return "-" if v is None else format(v, spec)


def _print_figures(name: str, s: dict[str, Any]) -> None:
    print(f"\n== scenario {name}")
    for p in s["phases"]:
        print(f"  epoch {p['epoch']} {p['phase']:5s} {p['verdict']:14s} "
              f"cause={p['input_cause']} weak={p['verdict_weak']} steps={p['steady_steps']} "
              f"img/s={_fmt(p['images_per_s'], '.1f')} wait={_fmt(p['data_wait_frac'])} "
              f"compute={_fmt(p['compute_frac'])} "
              f"wait_ms/img={_fmt(p['data_wait_ms_per_image'], '.1f')} "
              f"disk={p['disk_read_bytes']} rchar={p['rchar_bytes']} "
              f"resident={_fmt(p['dataset_resident_frac_start'])}->"
              f"{_fmt(p['dataset_resident_frac_end'])} host_cpu={_fmt(p['cpu_util_pct'], '.0f')} "
              f"main_cpu={_fmt(p['main_cpu_pct'], '.0f')} workers={p['workers']} "
              f"worker_cpu={[round(c) for c in p['worker_cpu_pct']]} "
              f"psi_io={_fmt(p['psi_io_some_pct'], '.0f')} "
              f"disk_wait={_fmt(p['disk_wait_frac'])}")
        if p["input_evidence"]:
            print(f"    evidence: {p['input_evidence']}")
    for kind, agg in s["by_phase"].items():
        print(f"  {kind}: {agg['verdict']} cause={agg['input_cause']} "
              f"wait={_fmt(agg['data_wait_frac'])} "
              f"wait_ms/img={_fmt(agg['data_wait_ms_per_image'], '.1f')} "
              f"loader_cpu_ms/img={_fmt(agg['loader_cpu_ms_per_image'], '.1f')}")
    for f in s["findings"]:
        print(f"  finding [{f['severity']}] {f['title']} -> fix: {f['fix']}")


def _phase(s: dict[str, Any], nth: int, phase: str) -> dict[str, Any]:
    """The ``phase`` row of the run's ``nth`` epoch (0 = first, whatever the numbering)."""
    epochs = sorted({p["epoch"] for p in s["phases"]})
    return next(p for p in s["phases"] if p["epoch"] == epochs[nth] and p["phase"] == phase)


# ~25 steps per training phase: 22 steady-state steps past warm-up, a firm verdict (20 needed).
FIRM_STEPS = 25
OWN_SECOND_CORE_PCT = 140.0  # the training process on more than 1.4 cores: no core left idle


def test_inline_cpu_loading_with_a_core_to_spare_wants_workers(synth400: Path,
                                                               tmp_path: Path) -> None:
    # Decoding a 400 px JPEG and the Keras-style step-by-step augmentation cost ~5 ms an image
    # (~40 ms a batch); the tiny trunk's step ~15 ms on one thread. With workers=0 the loading
    # runs in the training process between steps, while the job's second core idles: moving
    # the loading into a worker overlaps it with the model (cause ``workers``, not ``cpu``).
    if usable_cores() < 2:
        pytest.skip("needs 2 cores: the point is the core the training process leaves idle")
    s = _run("cpu", synth400, tmp_path, model=SMALL_MODEL, img_size=64, augment="seed",
             aug_backend="keras", workers="0", threads=SMALL_THREADS, max_steps=FIRM_STEPS)
    tr = s["by_phase"]["train"]
    assert tr["verdict"] == "input-bound"
    assert tr["data_wait_frac"] >= 0.5
    fix = next(f["fix"] for f in s["findings"] if f["id"] == "input_bound_train")
    if tr["input_cause"] == "cpu":
        # only with proof the spare core was not spare: the host's other processes denied it,
        # or the training process itself ran on more than 1.4 cores (it read 1.26-1.56 here,
        # at this commit and the last stop's alike: the plant's one thread is not all it runs;
        # a CI rehearsal read 1.56 and `cpu`, "the phase ran at 548 img/s" of "at most 624")
        train_rows = [p for p in s["phases"] if p["phase"] == "train"]
        took_both = all((p["main_cpu_pct"] or 0.0) >= OWN_SECOND_CORE_PCT for p in train_rows)
        assert took_both or any("other processes left it" in line
                                for line in tr["input_evidence"]), tr["input_evidence"]
        assert "--workers" not in fix
    else:
        assert tr["input_cause"] == "workers", tr["input_evidence"]
        assert "--workers" in fix


@pytest.mark.slow  # ~20 s: a 299 px trunk on two cores
def test_compute_bound_large_trunk_high_resolution(synth80: Path, tmp_path: Path) -> None:
    # EfficientNet-Lite0 at 299 px: ~0.4 GFLOP per image forward, hundreds of ms per batch on
    # two cores. Loading without augmentation is a decode and one resize (~3 ms an image),
    # done ahead by a worker. Few steps (each is slow): the verdict is flagged weak.
    s = _run("compute", synth80, tmp_path, model=LARGE_MODEL, img_size=299, augment="none",
             workers="1", max_steps=8, val_every=2)  # val_every > epochs: no validation
    tr = s["by_phase"]["train"]
    assert tr["verdict"] == "compute-bound"
    assert tr["compute_frac"] >= 0.8
    assert tr["data_wait_frac"] < 0.1


def _throttle_or_skip(path: Path) -> None:
    if not BLKIO_OK:
        pytest.skip(f"blkio throttling unusable: {BLKIO_WHY}")
    if block_device_for(path) is None:
        pytest.skip(f"{path} is on no block device (tmpfs?): reads cannot be throttled")


@pytest.mark.root
def test_storage_bound_cold_throttled_epoch_then_warm(synth80: Path, tmp_path: Path) -> None:
    _throttle_or_skip(synth80)
    files = sorted((synth80 / "images").iterdir())
    size = sum(f.stat().st_size for f in files)
    # 2.7 MB at 1 MB/s: ~2.7 s of reading in epoch 1 against ~0.1 s of compute
    assert size >= 2 * THROTTLE_BYTES_PER_S
    evict(files, sync=True)
    with BlkioThrottle(synth80, THROTTLE_BYTES_PER_S) as throttle:
        # DataLoader workers are forked at each phase's first batch and inherit the group.
        throttle.add_pid(os.getpid())
        s = _run("storage", synth80, tmp_path, model=SMALL_MODEL, img_size=64, augment="none",
                 workers="1", threads=SMALL_THREADS, epochs=2)
    e1, e2 = _phase(s, 0, "train"), _phase(s, 1, "train")
    assert (e1["dataset_resident_frac_start"] or 0.0) < 0.1
    assert e1["disk_read_bytes"] >= 0.5 * e1["rchar_bytes"]
    assert e1["verdict"] == "input-bound"
    assert e1["input_cause"] == "storage", e1["input_evidence"]
    assert (e2["dataset_resident_frac_start"] or 0.0) > 0.9
    assert e2["input_cause"] != "storage"
    assert e2["images_per_s"] > 2 * e1["images_per_s"]


def test_too_few_workers_for_slow_augmentation(synth400: Path, tmp_path: Path) -> None:
    """One worker, ~5 ms of decoding and Keras-style augmentation per image, two cores.

    With a core to spare the cause is ``workers`` and the fix more workers; only when the
    host's other processes are proven to leave the job less than that core (the evidence says
    how much) is ``cpu`` and "cheaper augmentation" the right advice.
    """
    if usable_cores() < 2:
        pytest.skip("needs 2 cores: one worker must leave a core to spare")
    s = _run("workers", synth400, tmp_path, model=SMALL_MODEL, img_size=64, augment="seed",
             aug_backend="keras", workers="1", threads=SMALL_THREADS, max_steps=FIRM_STEPS)
    tr = s["by_phase"]["train"]
    assert tr["verdict"] == "input-bound"
    assert tr["input_cause"] in ("workers", "cpu")
    fix = next(f["fix"] for f in s["findings"] if f["id"] == "input_bound_train")
    print(f"  train fix: {fix}")
    if tr["input_cause"] == "workers":
        assert "--workers" in fix and "(from 1)" in fix
    else:  # cpu only when the host was proven to deny the job its spare core
        assert any("other processes left it" in line for line in tr["input_evidence"])
        assert "--workers" not in fix


def test_validation_loads_faster_than_training(synth400: Path, tmp_path: Path) -> None:
    s = _run("trainval", synth400, tmp_path, model=SMALL_MODEL, img_size=128, augment="seed",
             aug_backend="keras", workers="0", threads=SMALL_THREADS, max_steps=FIRM_STEPS)
    tr, va = s["by_phase"]["train"], s["by_phase"]["val"]
    assert va["data_wait_ms_per_image"] < 0.8 * tr["data_wait_ms_per_image"]
    answers = {a.title: a.text for a in explain(s)}
    why = answers["Why validation differs from training"]
    print(f"  explain: {why}")
    assert "not augmented" in why


@pytest.mark.slow  # ~60 s: 25 steps of Keras-style augmentation on two loaded cores
def test_cores_saturated_by_augmentation_with_as_many_workers_as_cores(synth400: Path,
                                                                       tmp_path: Path) -> None:
    """Two workers augmenting Keras-style (~3-4 ms of CPU an image) on a two-core job, the trunk
    on the same cores: the job's cores are the limit, and the advice must not be more workers.

    32 images a batch: the small trunk's step is mostly fixed cost, so at 8 the model consumed
    ~441 img/s against the two loaders' ~411, and the planted wait sat on the 20 % line (19-32 %
    here; a CI rehearsal read 19 %, compute-bound). At 32 the model takes ~0.9 ms of CPU an
    image to the loaders' ~3.5, and the wait read 38-43 % (6 runs, 2026-12-03). The train list
    is the 320 images three times over, for the 25 steps a firm verdict needs.
    """
    cores = usable_cores()
    train_csv = tmp_path / "train_x3.csv"
    header, *rows = (synth400 / "train.csv").read_text().splitlines()
    train_csv.write_text("\n".join([header, *rows * 3]) + "\n")
    s = _run("saturated", synth400, tmp_path, model=SMALL_MODEL, img_size=64, augment="seed",
             aug_backend="keras", workers=str(cores), threads=SMALL_THREADS,
             max_steps=FIRM_STEPS, batch_size=32, csv=str(train_csv))
    tr = s["by_phase"]["train"]
    assert tr["verdict"] == "input-bound"
    assert tr["input_cause"] == "cpu", tr["input_evidence"]
    fix = next(f["fix"] for f in s["findings"] if f["id"] == "input_bound_train")
    assert "--workers" not in fix and "more workers would not help" in fix
