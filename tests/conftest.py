"""Shared fixtures: small synthetic datasets made once per test session (real JPEGs on disk)."""

from __future__ import annotations

from pathlib import Path

import pytest

from stepscope.train.synth import synth_dataset


@pytest.fixture(scope="session")
def synth400(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """400 Dogs-vs-Cats-like JPEGs (320 train / 80 val) in the seed's CSV layout."""
    out = tmp_path_factory.mktemp("synth400")
    synth_dataset(out, images=400, seed=0)
    return out


@pytest.fixture(scope="session")
def synth80(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """80 images, for runs that only need to go through the motions."""
    out = tmp_path_factory.mktemp("synth80")
    synth_dataset(out, images=80, seed=1)
    return out


def data_flags(d: Path) -> dict[str, str]:
    return {"csv": str(d / "train.csv"), "val_csv": str(d / "valid.csv"), "images": str(d / "images")}
