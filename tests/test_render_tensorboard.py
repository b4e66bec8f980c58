"""TensorBoard export: written from a hand-made run, read back with TensorBoard's own reader and
served by a real ``tensorboard`` process on a loopback port."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import types
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from stepscope.finish import finish_run
from stepscope.store.records import Sample
from tests.analysis_runs import T0, PhaseSpec, RunSpec, make_run
from tests.conftest import LANE2_WAIT_S

pytest.importorskip("tensorboard")
# TensorBoard's file reader imports TensorFlow when it is installed, unless this module exists;
# TensorFlow must not be imported into the pytest process, which also runs the torch tests.
sys.modules.setdefault("tensorboard.compat.notf", types.ModuleType("tensorboard.compat.notf"))
from tensorboard.backend.event_processing.event_accumulator import (  # noqa: E402
    EventAccumulator,
)

pytestmark = pytest.mark.untimed  # asserts no time: make test runs it in the second lane


def _extra_samples() -> list[Sample]:
    out = []
    for i in range(20):
        t = T0 + 0.5 * i
        out += [Sample(t, "tree", "read_rate_bytes_per_s", 40e6),
                Sample(t, "tree", "cache_read_rate_bytes_per_s", 10e6),
                Sample(t, "tree", "cpu_util_pct", 150.0),
                Sample(t, "pagecache", "dataset_resident_frac", 0.05 * i)]
    return out


@pytest.fixture(scope="module")
def input_bound_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two epochs whose train steps wait 150 ms of 205 for data (input-bound), val compute-bound."""
    run = tmp_path_factory.mktemp("tbrun")
    phases = [PhaseSpec(epoch=e, phase=ph, steps=20, data_wait_s=0.15 if ph == "train" else 0.002,
                        compute_s=0.05, read_bytes=30_000_000, rchar_bytes=50_000_000)
              for e in (1, 2) for ph in ("train", "val")]
    make_run(run, RunSpec(phases=phases, extra_samples=_extra_samples()))
    return run


def _load(tb: Path) -> EventAccumulator:
    acc = EventAccumulator(str(tb), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def test_event_files_read_back(input_bound_run: Path, tmp_path: Path) -> None:
    tb = tmp_path / "tb"
    done = finish_run(input_bound_run, tensorboard=tb)
    acc = _load(tb)
    scalars = set(acc.Tags()["scalars"])
    for tag in ("step_train/data_wait_ms", "step_train/copy_ms", "step_train/compute_ms",
                "step_train/images_per_s", "step_val/compute_ms",
                "phase_train/data_wait_share", "phase_train/compute_share",
                "phase_train/disk_read_MB", "phase_train/cache_read_MB",
                "system/host_cpu_util_pct", "system/job_cpu_util_pct",
                "disk/physical_read_MB_per_s", "disk/cached_read_MB_per_s",
                "dataset/resident_pct", "memory/job_rss_GB"):
        assert tag in scalars, tag
    waits = acc.Scalars("step_train/data_wait_ms")
    assert len(waits) == 40  # 20 train steps per epoch, numbered on across epochs
    assert [e.step for e in waits] == list(range(40))
    assert all(abs(e.value - 150.0) < 0.01 for e in waits)
    rate = acc.Scalars("step_train/images_per_s")[5].value
    assert abs(rate - 8 / 0.205) < 0.05  # 8 images in a 205 ms step
    share = acc.Scalars("phase_train/data_wait_share")
    assert [e.step for e in share] == [1, 2]  # x is the epoch
    assert share[0].value == pytest.approx(done.summary["phases"][0]["data_wait_frac"], rel=1e-6)
    assert acc.Scalars("phase_train/disk_read_MB")[0].value == pytest.approx(30.0)
    assert acc.Scalars("disk/physical_read_MB_per_s")[0].value == pytest.approx(40.0)
    texts = set(acc.Tags()["tensors"])
    assert {"run/summary", "verdicts/phases", "findings/all", "explanation/answers"} <= texts
    verdicts = acc.Tensors("verdicts/phases")[0].tensor_proto.string_val[0].decode()
    assert "input-bound" in verdicts and "compute-bound" in verdicts
    words = acc.Tensors("explanation/answers")[0].tensor_proto.string_val[0].decode()
    assert done.answers[0].title in words


def test_missing_series_are_missing_tags(tmp_path: Path) -> None:
    """No GPU and no residency sampled: no GPU or residency tags, rather than zeros."""
    run = make_run(tmp_path / "run", RunSpec(phases=[PhaseSpec(epoch=1, resident_start=None,
                                                               resident_end=None)]))
    tb = tmp_path / "tb"
    finish_run(run, tensorboard=tb)
    scalars = set(_load(tb).Tags()["scalars"])
    assert not any("gpu" in t for t in scalars)
    assert "dataset/resident_pct" not in scalars
    assert "phase_train/dataset_resident_pct_end" not in scalars
    assert "phase_train/gpu_util_pct" not in scalars


def test_cli_report_writes_tensorboard(input_bound_run: Path, tmp_path: Path) -> None:
    tb = tmp_path / "cli-tb"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src")}
    proc = subprocess.run([sys.executable, "-m", "stepscope", "report", str(input_bound_run),
                           "--tensorboard", str(tb)], capture_output=True, text=True, env=env,
                          timeout=LANE2_WAIT_S)
    assert proc.returncode == 0, proc.stderr
    assert "tensorboard" in proc.stderr
    assert "step_train/data_wait_ms" in _load(tb).Tags()["scalars"]


def test_no_tensorflow_in_this_process() -> None:
    """Writing and reading event files here must not have imported TensorFlow."""
    assert not any(m == "tensorflow" or m.startswith("tensorflow.") for m in sys.modules)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get_json(url: str) -> object:
    with urllib.request.urlopen(url, timeout=5) as resp:  # loopback only, bounded
        return json.loads(resp.read())


@pytest.mark.slow
def test_tensorboard_serves_the_scalars(input_bound_run: Path, tmp_path: Path) -> None:
    tb = tmp_path / "served"
    finish_run(input_bound_run, tensorboard=tb / "run1")
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tensorboard.main", "--logdir", str(tb), "--host", "127.0.0.1",
         "--port", str(port), "--load_fast", "false", "--reload_interval", "1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    try:
        data: object = None
        query = urllib.parse.urlencode({"run": "run1", "tag": "step_train/data_wait_ms"})
        deadline = time.monotonic() + LANE2_WAIT_S
        while time.monotonic() < deadline:
            try:
                data = _get_json(f"{base}/data/plugin/scalars/scalars?{query}")
                if isinstance(data, list) and len(data) == 40:
                    break
            except (OSError, ValueError):
                pass  # not listening yet, or not loaded yet
            assert proc.poll() is None, "tensorboard exited"
            time.sleep(1.0)
        assert isinstance(data, list) and len(data) == 40, data
        _wall, step, value = data[3]
        assert step == 3 and value == pytest.approx(150.0, abs=0.01)
        tags = _get_json(f"{base}/data/plugin/scalars/tags")
        assert isinstance(tags, dict) and "phase_train/data_wait_share" in tags["run1"]
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_watch_writes_tensorboard_at_the_end(tmp_path: Path) -> None:
    """`watch --tensorboard`: a script without a training loop still gets the system series
    and the words (which say that no steps were seen)."""
    script = Path(__file__).parent / "watch_scripts" / "plain_python.py"
    tb = tmp_path / "tb"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src")}
    proc = subprocess.run([sys.executable, "-m", "stepscope", "watch", "--out",
                           str(tmp_path / "run"), "--interval", "0.2", "--tensorboard", str(tb),
                           "--", sys.executable, str(script), str(script)],
                          capture_output=True, text=True, env=env, timeout=LANE2_WAIT_S)
    assert proc.returncode == 0, proc.stderr
    acc = _load(tb)
    assert "system/host_cpu_util_pct" in acc.Tags()["scalars"]
    assert not any(t.startswith("step_") for t in acc.Tags()["scalars"])
    words = acc.Tensors("explanation/answers")[0].tensor_proto.string_val[0].decode()
    assert "No training steps were recorded" in words


def test_live_follows_the_database_without_duplicates(tmp_path: Path) -> None:
    """Steps and samples appear in the event file while the run is written, each once; the end
    adds the per-phase figures and the words to the same file."""
    from stepscope.store.db import RunWriter
    from stepscope.store.records import PhaseRecord, RunInfo, StepRecord
    from stepscope.tblive import LiveTensorBoard

    run, tb = tmp_path / "run", tmp_path / "tb"
    t0 = time.time() - 5.0
    w = RunWriter(run, RunInfo(name="live", command="pytest", started=t0))
    w.put_phase(PhaseRecord(phase_id=0, epoch=1, phase="train", started=t0))
    live = LiveTensorBoard(run, tb, poll_s=3600).start()  # polled by hand below

    def add(first: int, n: int, t: float) -> None:
        for i in range(first, first + n):
            w.add_step(StepRecord(phase_id=0, step=i, t_start=t0 + i * 0.2, wall_s=0.2,
                                  data_wait_s=0.15, transfer_s=0.0, compute_s=0.05, other_s=0.0,
                                  images=8))
            w.add_samples([Sample(t + (i - first) * 0.2, "host", "cpu_util_pct", 50.0)])
        w.flush(timeout_s=LANE2_WAIT_S)  # the poll below reads what the flush committed

    add(0, 10, t0)  # samples in seconds 0 and 1 of the run
    live.poll(settle_s=0.0)
    assert len(_load(tb).Scalars("step_train/data_wait_ms")) == 10  # there before the end
    assert len(_load(tb).Scalars("system/host_cpu_util_pct")) == 2
    add(10, 15, t0 + 5.0)  # samples in seconds 5, 6 and 7 (taken "now", committed later)
    live.poll(settle_s=0.0)
    live.poll(settle_s=0.0)  # nothing new: nothing written twice
    w.close("completed", timeout_s=LANE2_WAIT_S)
    done = finish_run(run, live=live)
    assert done.tensorboard == tb
    assert len(list(tb.glob("events.out.tfevents.*"))) == 1
    acc = _load(tb)
    waits = acc.Scalars("step_train/data_wait_ms")
    assert [e.step for e in waits] == list(range(25))
    cpu = acc.Scalars("system/host_cpu_util_pct")
    assert len({e.step for e in cpu}) == len(cpu) == 5  # 25 samples 0.2 s apart: 5 seconds
    assert acc.Scalars("phase_train/data_wait_share")[0].step == 1
    assert "explanation/answers" in acc.Tags()["tensors"]
