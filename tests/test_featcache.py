"""The frozen trunk's feature cache: its key, its batches, and what it does to a real run."""

from __future__ import annotations

import csv
import dataclasses
import os
import statistics
from pathlib import Path

import pytest
import torch

from stepscope.store.db import RunReader
from stepscope.train.config import TrainConfig, resolve_config
from stepscope.train.data import Batch
from stepscope.train.featcache import (
    FeatureBatches,
    FeatureCache,
    cache_key,
    cacheable_phases,
    create_feature_cache,
    disabled_reason,
)
from stepscope.train.loop import train
from stepscope.train.models import TransferModel, create_model
from tests.conftest import data_flags

pytestmark = pytest.mark.untimed  # asserts no time: make test runs it in the second lane


CPU = torch.device("cpu")


def _files(tmp_path: Path, n: int = 3) -> list[Path]:
    files = []
    for i in range(n):
        f = tmp_path / f"img{i}.jpg"
        f.write_bytes(b"x" * (10 + i))
        files.append(f)
    return files


def _cfg(**kw: object) -> TrainConfig:
    return dataclasses.replace(TrainConfig(folder="d"), **kw)  # type: ignore[arg-type]


def test_key_changes_with_whatever_changes_features(tmp_path: Path) -> None:
    files = _files(tmp_path)
    base = cache_key(_cfg(), bf16=False, device=CPU, files=files)
    assert cache_key(_cfg(), bf16=False, device=CPU, files=files) == base
    others = [
        cache_key(_cfg(img_size=224), bf16=False, device=CPU, files=files),
        cache_key(_cfg(model="resnet18"), bf16=False, device=CPU, files=files),
        cache_key(_cfg(weights="none"), bf16=False, device=CPU, files=files),
        cache_key(_cfg(), bf16=True, device=CPU, files=files),
        cache_key(_cfg(channels_last=False), bf16=False, device=CPU, files=files),
        cache_key(_cfg(aug_backend="keras"), bf16=False, device=CPU, files=files),
        cache_key(_cfg(), bf16=False, device=CPU, files=files[:2]),
    ]
    assert len({base, *others}) == len(others) + 1
    # Random initialisation: the seed decides the weights, so it decides the features.
    assert (cache_key(_cfg(weights="none", seed=1), bf16=False, device=CPU, files=files)
            != cache_key(_cfg(weights="none"), bf16=False, device=CPU, files=files))
    files[0].write_bytes(b"y" * 99)  # new size
    assert cache_key(_cfg(), bf16=False, device=CPU, files=files) != base
    grown = cache_key(_cfg(), bf16=False, device=CPU, files=files)
    st = files[1].stat()
    os.utime(files[1], ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # touched: new mtime
    assert cache_key(_cfg(), bf16=False, device=CPU, files=files) != grown


def test_which_phases_may_be_cached() -> None:
    assert cacheable_phases(_cfg(augment="seed")) == {"val"}
    assert cacheable_phases(_cfg(augment="none")) == {"train", "val"}
    assert cacheable_phases(_cfg(unfreeze=2)) == frozenset()
    assert "unfreeze" in disabled_reason(_cfg(unfreeze=2))
    assert cacheable_phases(_cfg(feature_cache=False)) == frozenset()
    assert "no-feature-cache" in disabled_reason(_cfg(feature_cache=False))
    assert disabled_reason(_cfg()) == ""


def test_feature_batches_cover_everything_once() -> None:
    feats = torch.arange(10, dtype=torch.float32).view(10, 1)
    labels = torch.arange(10)
    fixed = FeatureBatches(feats, labels, batch_size=4, shuffle=False)
    assert len(fixed) == 3
    assert [b.labels.tolist() for b in fixed] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    shuffled = list(FeatureBatches(feats, labels, batch_size=4, shuffle=True,
                                   generator=torch.Generator().manual_seed(0)))
    seen = torch.cat([b.labels for b in shuffled])
    assert sorted(seen.tolist()) == list(range(10)) and seen.tolist() != list(range(10))
    assert all(torch.equal(b.images[:, 0].long(), b.labels) for b in shuffled)  # pairs kept


@pytest.fixture(scope="module")
def tiny_model() -> TransferModel:
    return create_model("efficientnet_lite0", weights="none").eval()


def _image_batches(n: int, seed: int = 0) -> list[Batch]:
    g = torch.Generator().manual_seed(seed)
    return [Batch(torch.randint(0, 256, (4, 3, 64, 64), dtype=torch.uint8, generator=g),
                  torch.randint(0, 2, (4,), generator=g), []) for _ in range(n)]


def _run(batches: object, forward: object) -> list[torch.Tensor]:
    out = []
    with torch.no_grad():
        for x, y, _bad in batches:  # type: ignore[attr-defined]
            if len(y):
                out.append(forward(x))  # type: ignore[operator]
    return out


def test_second_pass_runs_the_head_on_the_first_pass_features(tiny_model: TransferModel) -> None:
    key = ["k1"]
    cache = FeatureCache(frozenset({"val"}), lambda: key[0], batch_size=4, seed=0)
    loader = _image_batches(3)
    empty = Batch(torch.empty((0, 3, 0, 0), dtype=torch.uint8), torch.empty(0, dtype=torch.long),
                  ["bad.jpg"])
    batches, forward = cache.source("val", [*loader[:1], empty, *loader[1:]], tiny_model, epoch=1)
    assert forward is tiny_model and len(batches) == 4
    full = torch.cat(_run(batches, forward))
    assert not cache.has("val")  # committed only once the next phase begins
    batches, forward = cache.source("val", loader, tiny_model, epoch=2)
    assert cache.has("val") and isinstance(batches, FeatureBatches) and len(batches) == 3
    cached = torch.cat(_run(batches, forward))
    assert torch.allclose(cached, full, atol=1e-6)
    assert cache.bytes == 12 * (tiny_model.head.in_features * 4 + 8)
    key[0] = "k2"  # a file changed: the next pass recomputes
    batches, forward = cache.source("val", loader, tiny_model, epoch=3)
    assert forward is tiny_model and not cache.has("val")


def test_an_interrupted_or_oversized_pass_is_not_kept(tiny_model: TransferModel) -> None:
    cache = FeatureCache(frozenset({"val"}), lambda: "k", batch_size=4, seed=0)
    batches, forward = cache.source("val", _image_batches(3), tiny_model, epoch=1)
    with torch.no_grad():
        for x, _y, _bad in batches:
            forward(x)
            break  # max_steps
    cache.source("train", [], tiny_model, epoch=1)
    assert not cache.has("val")
    small = FeatureCache(frozenset({"val"}), lambda: "k", batch_size=4, seed=0, max_bytes=100)
    _run(*small.source("val", _image_batches(2), tiny_model, epoch=1))
    small.source("train", [], tiny_model, epoch=1)
    assert not small.has("val")


def test_phases_outside_the_cache_pass_through(tiny_model: TransferModel) -> None:
    cache = create_feature_cache(_cfg(augment="seed"), bf16=False, device=CPU, files=[])
    loader = _image_batches(1)
    assert cache.source("train", loader, tiny_model, epoch=1) == (loader, tiny_model)


def _metrics(run: Path) -> list[dict[str, str]]:
    return list(csv.DictReader((run / "metrics.csv").open()))


def test_a_run_with_the_cache_matches_one_without(synth80: Path, tmp_path: Path) -> None:
    flags = {**data_flags(synth80), "img_size": 64, "epochs": 2, "weights": "none",
             "augment": "seed", "precision": "fp32", "threads": 1}  # see test_fastpath.THREADS
    on = train(resolve_config({**flags, "out": str(tmp_path / "on")})).run_dir
    off = train(resolve_config({**flags, "out": str(tmp_path / "off"),
                                "feature_cache": False})).run_dir
    for a, b in zip(_metrics(on), _metrics(off), strict=True):
        for k in ("train_loss", "val_loss", "val_accuracy"):
            assert float(a[k]) == pytest.approx(float(b[k]), abs=1e-5), k
    reader = RunReader(on)
    phases = {(p.epoch, p.phase): p for p in reader.phases()}
    val2 = phases[(2, "val")]
    assert val2.steps == phases[(1, "val")].steps and val2.images == phases[(1, "val")].images
    steps = reader.steps(val2.phase_id)
    # cached features are already on the device: a step's copy is ~50 us. The median, not the
    # sum: one step the low-priority lane's scheduler parks mid-copy is not a copy
    assert statistics.median(s.transfer_s for s in steps) < 0.001
    used = reader.facts()["featcache.used"].value
    assert {"epoch": 2, "phase": "val", "how": "cached", "images": val2.images} in used["uses"]
    assert any(n.source == "featcache" for n in reader.notes())
    off_used = RunReader(off).facts()["featcache.used"].value
    assert off_used["enabled"] is False and "no-feature-cache" in off_used["why"]


def test_without_augmentation_later_epochs_train_the_head_only(synth80: Path,
                                                              tmp_path: Path) -> None:
    run = train(resolve_config({**data_flags(synth80), "img_size": 64, "epochs": 3,
                                "weights": "none", "augment": "none", "threads": 1,
                                "out": str(tmp_path / "run")})).run_dir
    reader = RunReader(run)
    uses = reader.facts()["featcache.used"].value["uses"]
    assert [(u["epoch"], u["phase"], u["how"]) for u in uses] == [
        (1, "train", "recorded"), (1, "val", "recorded"), (2, "train", "cached"),
        (2, "val", "cached"), (3, "train", "cached"), (3, "val", "cached")]
    rows = _metrics(run)
    assert float(rows[2]["train_loss"]) < float(rows[0]["train_loss"])  # the head still learns
    train_phases = [p for p in reader.phases() if p.phase == "train"]
    assert len({p.images for p in train_phases}) == 1


def test_summary_marks_phases_served_from_the_cache() -> None:
    from stepscope.analysis.summary import _mark_cached_phases
    from stepscope.render.terminal import phase_verdict
    from stepscope.store.records import Fact

    phases = [{"epoch": 1, "phase": "val", "verdict": "compute-bound", "input_cause": None},
              {"epoch": 2, "phase": "val", "verdict": "input-bound", "input_cause": "cpu"}]
    uses = [{"epoch": 1, "phase": "val", "how": "recorded"}, {"epoch": 2, "phase": "val", "how": "cached"}]
    _mark_cached_phases(phases, {"featcache.used": Fact("featcache.used", {"uses": uses})})
    assert "feature_cache" not in phases[0] and phases[1]["feature_cache"] is True
    assert [phase_verdict(p) for p in phases] == ["compute-bound", "cached features"]
