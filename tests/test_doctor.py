"""stepscope doctor: the report on this machine (train.doctor), the verdicts (analysis.doctor,
pure, on hand-made reports), the terminal view (render.doctor), and the prediction checked
against real short training runs in two opposite cases."""

from __future__ import annotations

import copy
import io
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
import torch
from rich.console import Console

from stepscope.analysis.doctor import bottleneck, cache_prediction, caveats, prediction
from stepscope.analysis.fmt import fmt_rate
from stepscope.errors import DataError, ModelError
from stepscope.observe.machine import parse_cpuinfo
from stepscope.render.doctor import doctor_view
from stepscope.reports import DoctorReport
from stepscope.train.doctor import list_images, run_doctor
from stepscope.train.synth import synth_dataset
from tests.contract_check import assert_conforms

TINY_MODEL = "mobilenetv2_050"


# --------------------------------------------------------------------------- run_doctor


@pytest.fixture(scope="module")
def synth_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("doctor-data")
    synth_dataset(out, images=12, seed=0)
    return out


@pytest.fixture(scope="module")
def report(synth_dir: Path) -> dict[str, Any]:
    lines: list[str] = []
    result = run_doctor(data=synth_dir, model=TINY_MODEL, img_size=64, batch_size=4,
                        budget_s=1.0, progress=lines.append, threads=1)
    assert lines and all(isinstance(line, str) for line in lines)
    return result


def test_report_is_json_and_matches_this_machine(report: dict[str, Any]) -> None:
    json.dumps(report)  # --json prints it as it is
    assert_conforms(report, DoctorReport)  # the contract analysis/ and render/ read it by
    cpu = report["cpu"]
    assert cpu["affinity_cores"] == len(os.sched_getaffinity(0))
    flags = parse_cpuinfo(Path("/proc/cpuinfo").read_text())[1]
    assert cpu["bf16_native"] == bool(flags & {"avx512_bf16", "amx_bf16"})
    assert cpu["isa"]["avx2"] == ("avx2" in flags)
    assert report["memory"]["total_bytes"] > 0


def test_report_gpu_section(report: dict[str, Any]) -> None:
    gpu = report["gpu"]
    assert gpu["torch_cuda_available"] == torch.cuda.is_available()
    if not torch.cuda.is_available():  # this machine: no GPU, NVML says why
        assert gpu["devices"] == [] and gpu["torch_device_count"] == 0
        assert report["training"]["device"] == "cpu"
    if not gpu["nvml"]:
        assert gpu["reason"]


def test_report_storage_and_capabilities(report: dict[str, Any], synth_dir: Path) -> None:
    storage = report["storage"]
    assert storage["files"] == 12
    assert storage["dataset_bytes"] == sum(p.stat().st_size for p in list_images(synth_dir))
    assert storage["read"]["files"] > 0 and storage["read"]["mb_per_s"] > 0
    assert 0.0 <= storage["resident_frac"] <= 1.0
    for cap in report["capabilities"]:
        assert isinstance(cap["available"], bool) and cap["reason"]


def test_report_ceilings(report: dict[str, Any]) -> None:
    ceil = report["ceilings"]
    assert ceil["decode"]["threads"] == 1 and ceil["decode"]["images_per_s"] > 0
    assert "seed augment" in ceil["decode_augment"]["name"]
    assert ceil["forward_fp32"]["threads"] == 1
    assert (ceil["forward_bf16"] is not None) == report["training"]["bf16_pays"]
    assert report["training"]["precision"] == ("bf16" if report["training"]["bf16_pays"] else "fp32")


def test_doctor_without_data_synthesises_jpegs() -> None:
    r = run_doctor(data=None, model=TINY_MODEL, img_size=64, batch_size=4, budget_s=0.5,
                   augment="none", threads=1)
    assert r["storage"] is None and r["ceilings"]["decode_augment"] is None
    assert r["ceilings"]["decode"]["images_per_s"] > 0
    assert prediction(r).startswith("The ")


def test_doctor_rejects_bad_inputs(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="not a folder"):
        run_doctor(data=tmp_path / "nope")
    with pytest.raises(DataError, match="no image files"):
        run_doctor(data=tmp_path)
    with pytest.raises(ModelError):
        run_doctor(data=None, model="efficientnet_lite9")


def test_view_renders_this_machine(report: dict[str, Any]) -> None:
    out = io.StringIO()
    Console(file=out, width=120, color_system=None).print(doctor_view(report))
    text = out.getvalue()
    for heading in ("CPU and memory", "GPU", "Storage", "What stepscope can measure here",
                    "Ceilings (measured)", "Prediction:", "Page cache:"):
        assert heading in text
    assert prediction(report)[:40] in " ".join(text.split())


# --------------------------------------------------------------------------- pure verdicts


def _ceiling(rate: float, threads: int = 1, lo: float | None = None) -> dict[str, Any]:
    return {"name": "x", "images_per_s": rate, "min_images_per_s": lo or rate * 0.9,
            "max_images_per_s": rate * 1.1, "batches": 5, "batch_size": 8, "seconds": 1.0,
            "warmup_s": 0.1, "threads": threads, "includes": ""}


def _report(*, device: str = "cpu", cores: int = 2, fp32: float = 8.5, bf16: float | None = 23.5,
            decode: float = 3000.0, augment: float | None = 1400.0, storage: bool = False,
            ) -> dict[str, Any]:
    return {
        "cpu": {"usable_cores": cores, "load_avg_1m": 0.1, "bf16_native": True},
        "memory": {"total_bytes": 24e9, "available_bytes": 20e9, "cgroup_limit_bytes": None},
        "gpu": {"nvml": False, "devices": [], "torch_cuda_available": device == "cuda"},
        "storage": {"dataset_bytes": 545e6, "resident_frac": 0.0} if storage else None,
        "training": {"device": device, "threads": cores if device == "cpu" else None,
                     "precision": "bf16" if bf16 else "fp32"},
        "ceilings": {
            "decode": _ceiling(decode), "decode_augment": augment and _ceiling(augment),
            "forward_fp32": _ceiling(fp32, cores), "forward_bf16": bf16 and _ceiling(bf16, cores),
        },
    }


def test_prediction_model_bound_on_cpu() -> None:
    r = _report()
    assert prediction(r) == (
        "The model will be the bottleneck: the trunk runs at 8.5 img/s on 2 CPU thread(s) "
        "(bf16, which training uses: 23.5) while one core decodes and augments 1,400 img/s; "
        "loading in the main process (--workers 0) costs it under a quarter of a core "
        "(expect about 23.3 img/s).")
    b = bottleneck(r)
    # 23.3 img/s from a loader doing 1,400 img/s a core: 1.7 % of a core, inline (--workers auto)
    assert b.side == "model" and b.trunk_precision == "bf16" and b.workers == 0
    assert b.expected_images_per_s == pytest.approx(2 / (2 / 23.5 + 1 / 1400))


def test_prediction_input_bound_on_cpu() -> None:
    # a tiny trunk (1,000 img/s on 2 threads) against the Keras-style augmentation (130 img/s)
    r = _report(fp32=1000.0, bf16=None, augment=130.0)
    b = bottleneck(r)
    assert b.side == "input" and b.trunk_precision == "fp32"
    expected = 2 / (2 / 1000 + 1 / 130)
    assert b.expected_images_per_s == pytest.approx(expected)
    # 1.6 cores of loading wanted, but never more workers than the cores less the main
    # process's (policy.max_workers: the same cap as the trainer's --workers auto)
    assert b.workers == 1
    text = prediction(r)
    assert text.startswith("The input pipeline will be the bottleneck: one core decodes and "
                           "augments 130 img/s while the trunk runs at 1,000 img/s")
    assert "decoding takes 79 % of the CPU time" in text and fmt_rate(expected) in text


def test_cores_decide_on_cpu() -> None:
    # per core the trunk does 200/4 = 50 img/s and the loader 60: the loader's share is smaller
    assert bottleneck(_report(cores=4, fp32=200.0, bf16=None, augment=60.0)).side == "model"
    assert bottleneck(_report(cores=4, fp32=280.0, bf16=None, augment=60.0)).side == "input"


def test_augmentation_is_what_counts() -> None:
    fast_decode_only = _report(fp32=500.0, bf16=None, decode=1200.0, augment=None)
    assert bottleneck(fast_decode_only).side == "model"
    assert "decodes 1,200 img/s" in prediction(fast_decode_only)
    assert bottleneck(_report(fp32=500.0, bf16=None, decode=1200.0, augment=200.0)).side == "input"


def test_prediction_on_a_gpu() -> None:
    # a big GPU eats 3,000 img/s; 15 spare cores at 130 img/s each deliver 1,950
    starved = _report(device="cuda", cores=16, fp32=1500.0, bf16=3000.0, augment=130.0)
    b = bottleneck(starved)
    assert b.side == "input" and b.loader_cores == 15 and b.workers == 15
    text = prediction(starved)
    assert "the 15 core(s) left for the loader deliver about 1,950 img/s" in text
    assert "the GPU will wait about 35 % of each step" in text
    fed = _report(device="cuda", cores=16, fp32=1500.0, bf16=3000.0, augment=1400.0)
    assert bottleneck(fed).side == "model" and bottleneck(fed).workers == 3
    assert "3 workers are enough" in prediction(fed)


def test_prediction_needs_ceilings() -> None:
    r = _report()
    r["ceilings"]["forward_fp32"] = None
    with pytest.raises(ValueError):
        bottleneck(r)


def test_cache_prediction() -> None:
    assert cache_prediction(_report()) is None
    r = _report(storage=True)
    fits = cache_prediction(r)
    assert fits is not None and "fits in available memory (20 GB)" in fits
    assert "the disk goes quiet" in fits and "0 % of it is in the page cache now" in fits
    r["storage"]["dataset_bytes"] = 15e9
    tight = cache_prediction(r)
    assert tight is not None and "takes 75 % of available memory" in tight
    r["storage"]["dataset_bytes"] = 40e9
    big = cache_prediction(r)
    assert big is not None and "reads about 50 % of it (20 GB) from disk again" in big
    r["memory"]["cgroup_limit_bytes"] = 10e9
    limited = cache_prediction(r)
    assert limited is not None and "(10 GB)" in limited


def test_caveats() -> None:
    assert caveats(_report()) == []
    r = _report()
    r["cpu"]["load_avg_1m"] = 5.0
    r["ceilings"]["forward_fp32"] = _ceiling(30.0, 2, lo=5.0)
    r["cpu"]["bf16_native"] = False
    notes = caveats(r)
    assert any("busy (load 5.0 on 2 cores)" in n for n in notes)
    assert any("forward_fp32: batches ranged 5.0–33.0" in n for n in notes)
    assert any("no native bf16" in n for n in notes)


def test_view_of_a_gpu_report() -> None:
    r = _report(device="cuda", cores=16, fp32=1500.0, bf16=3000.0, augment=130.0)
    r["cpu"].update(model_name="EPYC", logical_cpus=32, affinity_cores=16, quota_cores=16.0,
                    isa={"avx2": True})
    r["memory"]["cgroup_limit_bytes"] = 64e9
    r["gpu"] = {"nvml": True, "reason": "NVML reports 1 GPU(s)", "driver_version": "550.54",
                "cuda_driver_version": "12.4", "torch_cuda_available": True,
                "torch_device_count": 1,
                "devices": [{"index": 0, "name": "NVIDIA H200", "memory_total_bytes": 141e9,
                             "compute_capability": "9.0", "pcie_gen": 5, "pcie_width": 16,
                             "pcie_max_gen": 5, "pcie_max_width": 16}]}
    r["training"]["bf16_pays"] = True
    r["capabilities"] = [{"name": "nvml", "available": True, "reason": "NVML reports 1 GPU(s)"}]
    out = io.StringIO()
    Console(file=out, width=140, color_system=None).print(doctor_view(r))
    text = out.getvalue()
    assert "NVIDIA H200, 141 GB, compute capability 9.0, PCIe gen 5 x16" in text
    assert "yes, 1 device(s)" in text and "cgroup limit 64 GB" in text
    assert "Storage" not in text


# --------------------------------------------------------------------------- agreement with training


def _write_dataset(root: Path, *, images: int, side_px: tuple[int, int]) -> dict[str, str]:
    """JPEG photos of ``side_px`` (w, h) in the seed's CSV layout; returns the train config keys."""
    (root / "images").mkdir(parents=True)
    rng = np.random.default_rng(0)
    rows = []
    for i in range(images):
        label = ("cat", "dog")[i % 2]
        img = cv2.GaussianBlur(rng.integers(0, 256, (side_px[1], side_px[0], 3), dtype=np.uint8),
                               (0, 0), 3)
        cv2.imwrite(str(root / "images" / f"{label}.{i}.jpg"), img, [cv2.IMWRITE_JPEG_QUALITY, 90])
        rows.append(f"{label}.{i}.jpg,{label}")
    n_val = max(2, images // 5)
    (root / "train.csv").write_text("Photo,Class\n" + "\n".join(rows[n_val:]) + "\n")
    (root / "valid.csv").write_text("Photo,Class\n" + "\n".join(rows[:n_val]) + "\n")
    return {"csv": str(root / "train.csv"), "val_csv": str(root / "valid.csv"),
            "images": str(root / "images")}


def _training_verdict(run_dir: Path) -> tuple[str, float, float]:
    """``("input"|"model", data_wait_s, compute_s)`` over the train phase's recorded steps
    (warm-up steps left out when enough steps remain)."""
    from stepscope.store.db import RunReader

    with RunReader(run_dir) as reader:
        train_ids = {p.phase_id for p in reader.phases() if p.phase == "train"}
        steps = [s for s in reader.steps() if s.phase_id in train_ids]
    steady = [s for s in steps if not s.warmup] or steps
    wait = sum(s.data_wait_s for s in steady)
    compute = sum(s.compute_s for s in steady)
    return ("input" if wait > compute else "model"), wait, compute


def _agree(data: dict[str, str], root: Path, *, model: str, img_size: int, augment: str,
           backend: str) -> tuple[str, str, str]:
    from stepscope.train.config import resolve_config
    from stepscope.train.loop import train

    # One trunk thread on both sides: the verdict then compares like with like, and a single
    # thread is not thrown off by the other processes on a shared 2-core machine the way a
    # two-thread OpenMP team is (it waits at every barrier for its descheduled twin).
    report = run_doctor(data=Path(data["images"]), model=model, img_size=img_size, batch_size=4,
                        budget_s=3.0, augment=augment, aug_backend=backend,  # type: ignore[arg-type]
                        threads=1)
    cfg = resolve_config({**data, "model": model, "img_size": img_size, "augment": augment,
                          "aug_backend": backend, "workers": "0", "weights": "none",
                          "batch_size": 4, "epochs": 1, "max_steps": 8, "threads": 1,
                          "precision": report["training"]["precision"], "feature_cache": False,
                          "out": str(root / "run")})
    result = train(cfg)
    side, wait, compute = _training_verdict(result.run_dir)
    return bottleneck(report).side, side, f"{prediction(report)} | training: data wait " \
        f"{wait:.2f} s, compute {compute:.2f} s"


def test_prediction_agrees_with_training_tiny_model_on_big_photos() -> None:
    """A tiny trunk at 96 px behind Keras-style augmentation of 1600x1200 photos: input-bound."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        data = _write_dataset(root / "data", images=40, side_px=(1600, 1200))
        predicted, trained, why = _agree(data, root, model=TINY_MODEL, img_size=96,
                                         augment="seed", backend="keras")
    assert predicted == "input", why
    assert trained == "input", why
    print(why)


def test_prediction_agrees_with_training_large_model() -> None:
    """EfficientNet-Lite0 at 299 px on Dogs-vs-Cats-sized JPEGs, no augmentation: model-bound."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        s = synth_dataset(root / "data", images=40, seed=0)
        data = {"csv": str(s.train_csv), "val_csv": str(s.val_csv), "images": str(s.images_dir)}
        predicted, trained, why = _agree(data, root, model="efficientnet_lite0", img_size=299,
                                         augment="none", backend="fused")
    assert predicted == "model", why
    assert trained == "model", why
    print(why)


def test_report_is_not_mutated_by_verdicts() -> None:
    r = _report(storage=True)
    before = copy.deepcopy(r)
    prediction(r), cache_prediction(r), caveats(r), bottleneck(r)
    assert r == before
