"""stepscope predict: an answer per image (class and probability, or that file's error)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from stepscope.errors import ModelError
from stepscope.train import checkpoint, models
from stepscope.train.predict import predict
from stepscope.train.synth import encode_jpeg

pytestmark = pytest.mark.untimed  # asserts no time: make test runs it in the second lane


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkpoint as `stepscope train` writes it (tiny model, random head)."""
    model = models.create_model("test_efficientnet", weights="none", num_classes=2)
    path = tmp_path_factory.mktemp("ckpt") / "best.pt"
    checkpoint.save_checkpoint({"model": model.state_dict(), "classes": ["cat", "dog"],
                                "config": {"model": "test_efficientnet", "img_size": 64}}, path)
    return path


@pytest.fixture
def images(tmp_path: Path) -> list[Path]:
    a, b = tmp_path / "a.jpg", tmp_path / "b.jpg"
    for i, p in enumerate((a, b)):
        p.write_bytes(encode_jpeg(np.random.default_rng(i).integers(0, 256, (40, 50, 3),
                                                                    dtype=np.uint8)))
    empty = tmp_path / "empty.jpg"
    empty.write_bytes(b"")
    bomb = tmp_path / "bomb.png"
    Image.new("1", (12_000, 12_000)).save(bomb)
    return [a, empty, tmp_path / "missing.jpg", bomb, b]


def test_every_image_gets_an_answer(ckpt: Path, images: list[Path]) -> None:
    out = predict(ckpt, images)
    assert [p.path for p in out] == images
    good = [p for p in out if p.error is None]
    assert [p.path.name for p in good] == ["a.jpg", "b.jpg"]
    assert all(p.label in ("cat", "dog") and 0.5 <= (p.probability or 0) <= 1 for p in good)
    errors = {p.path.name: p.error or "" for p in out if p.error is not None}
    assert "not found" in errors["missing.jpg"]
    assert "cannot decode" in errors["empty.jpg"] and "BytesIO" not in errors["empty.jpg"]
    assert "MP limit" in errors["bomb.png"]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "stepscope", *args], capture_output=True,
                          text=True, timeout=300)


def test_cli_prints_each_answer_and_exits_1_if_any_failed(ckpt: Path, images: list[Path]) -> None:
    r = _cli("predict", str(ckpt), *map(str, images))
    assert r.returncode == 1 and "Traceback" not in r.stderr
    lines = r.stdout.strip().splitlines()
    assert [ln.split("\t")[0] for ln in lines] == [str(images[0]), str(images[4])]
    assert f"{images[1]}\terror: cannot decode" in r.stderr
    assert "3 of 5 image(s) could not be classified" in r.stderr
    assert "BytesIO" not in r.stderr + r.stdout and "DecompressionBombWarning" not in r.stderr


def test_cli_json(ckpt: Path, images: list[Path]) -> None:
    r = _cli("predict", "--json", str(ckpt), *map(str, images))
    assert r.returncode == 1
    doc = json.loads(r.stdout)
    assert [d["path"] for d in doc] == [str(p) for p in images]
    assert doc[0]["label"] in ("cat", "dog") and doc[0]["error"] is None
    assert doc[1]["label"] is None and doc[1]["error"]
    ok = _cli("predict", "--json", str(ckpt), str(images[0]))
    assert ok.returncode == 0 and json.loads(ok.stdout)[0]["probability"] >= 0.5


def test_a_tampered_checkpoint_is_refused_and_never_run(ckpt: Path, tmp_path: Path) -> None:
    import pickle

    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            import os

            return (os.system, (f"touch {marker}",))

    evil = tmp_path / "evil.pt"
    evil.write_bytes(pickle.dumps({"model": Evil()}, protocol=2))
    with pytest.raises(ModelError, match=r"refused: it holds Python objects other than tensors"):
        predict(evil, [])
    assert not marker.exists()
    # Bytes changed inside the weights (the zip still opens): the recorded digest catches it.
    garbled = tmp_path / "garbled.pt"
    raw = bytearray(ckpt.read_bytes())
    raw[len(raw) // 2: len(raw) // 2 + 64] = b"\xff" * 64
    garbled.write_bytes(bytes(raw))
    (tmp_path / "garbled.pt.sha256").write_text((ckpt.parent / "best.pt.sha256").read_text())
    with pytest.raises(ModelError, match=r"refused: its SHA-256 .* differs") as err:
        predict(garbled, [])
    assert len(str(err.value).splitlines()) == 1
    r = _cli("predict", str(evil), str(tmp_path / "x.jpg"))
    assert r.returncode == 2 and "Traceback" not in r.stderr and not marker.exists()
    text = " ".join(r.stderr.split())  # the console wraps at its width
    assert text.count("stepscope: error") == 1 and "posix.system" in text
    assert "weights_only" not in text
