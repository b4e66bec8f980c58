"""Faults survived: a full disk, a read-only run directory, signals during a checkpoint write,
readers while the run writes. Each names what happened in one line and loses nothing written.
A rank whose batch is unreadable: tests/test_faults_ranks.py (its bounds are times)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from stepscope.store.db import RunReader, RunWriter
from stepscope.store.records import PhaseRecord, RunInfo, StepRecord
from stepscope.train import checkpoint
from tests.conftest import LANE2_WAIT_S, data_flags

# Outcomes, not times: whole files, one line, a readable run.db. The one bound (a flush that
# must not hang) is read against the flush's own timeout: this lane runs at SCHED_IDLE, where
# the store's writer thread can wait seconds for a core, so the timeouts are long (a flush
# answered returns at once) and a hang reads as the whole timeout, twice the bound.
pytestmark = pytest.mark.untimed


def _cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "stepscope", *args], capture_output=True,
                          text=True, timeout=timeout)


def _mount_tmpfs(where: Path, options: str) -> Iterator[Path]:
    where.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root and mount rights): {r.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    yield from _mount_tmpfs(tmp_path / "disk", "size=4m")


@pytest.fixture
def read_only_disk(tmp_path: Path) -> Iterator[Path]:
    yield from _mount_tmpfs(tmp_path / "ro", "size=1m,ro")


def _train_flags(d: Path, out: Path) -> list[str]:
    f = data_flags(d)
    return ["train", "--csv", f["csv"], "--val-csv", f["val_csv"], "--images", f["images"],
            "--weights", "none", "--img-size", "64", "--epochs", "3", "--max-steps", "2",
            "--model", "test_efficientnet", "--workers", "0", "--no-feature-cache",
            "--out", str(out)]


@pytest.mark.slow
def test_disk_filling_up_stops_training_in_one_line(synth80: Path, small_disk: Path) -> None:
    """The rule (docs/faults.md): the first checkpoint or metrics write that finds the disk
    full stops training with one line naming the disk; a run.db write that fails stops
    recording only. Every file already written stays whole and run.db stays readable."""
    filler = small_disk / "filler"
    # Leave ~700 KB: enough to start (config, run.db), not for two 440 KB checkpoints.
    free = os.statvfs(small_disk).f_bavail * os.statvfs(small_disk).f_frsize
    filler.write_bytes(b"\0" * max(0, free - 700_000))
    run = small_disk / "run"
    r = _cli(*_train_flags(synth80, run))
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr and "OSError" not in r.stderr
    text = " ".join(r.stderr.split())  # the console wraps at its width
    assert text.count("stepscope: error") == 1, r.stderr
    assert "is full (No space left on device)" in text, r.stderr
    with RunReader(run) as reader:  # readable, with what was committed before
        assert reader.run().name == "run"
        reader.phases()
    ckpts = run / "checkpoints"
    leftovers = [p.name for p in ckpts.iterdir()] if ckpts.exists() else []
    assert not [n for n in leftovers if n.endswith(".tmp")], leftovers
    for name in ("best.pt", "last.pt"):
        if (ckpts / name).exists():  # whole, and its digest agrees
            assert "model" in checkpoint.load_checkpoint(ckpts / name)


def test_read_only_run_directory_is_refused_before_training(synth80: Path,
                                                             read_only_disk: Path) -> None:
    t0 = time.monotonic()
    r = _cli(*_train_flags(synth80, read_only_disk / "run"))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    text = " ".join(r.stderr.split())  # the console wraps at its width
    assert "cannot write to the run directory" in text and "Read-only file system" in text
    assert text.count("stepscope: error") == 1
    assert "epoch" not in r.stdout.lower()  # refused before any training
    print(f"refused in {time.monotonic() - t0:.1f} s")


_WRITER = textwrap.dedent("""
    import signal, sys, torch
    from pathlib import Path
    # Ctrl-C as in a terminal: a process started in the background by a non-interactive shell
    # (a CI runner) inherits SIGINT ignored, and Python then installs no KeyboardInterrupt
    # handler, so the deferred signal would be ignored again, as that process asked.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    from stepscope.train import checkpoint
    from stepscope.train.loop import stop_on_sigterm
    stop_on_sigterm()
    path = Path(sys.argv[1])
    state = {"model": {"w": torch.randn(16_000_000)}}  # 64 MB: a write (fsync included) spans the 0.3 s wait
    checkpoint.save_checkpoint({"model": {"w": torch.zeros(4)}}, path)  # the previous one
    print("writing", flush=True)
    try:
        while True:
            checkpoint.save_checkpoint(state, path)
    except KeyboardInterrupt:  # SIGINT, and SIGTERM through stop_on_sigterm
        sys.exit(130)
""")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_during_a_checkpoint_write_leaves_no_half_file(tmp_path: Path, sig: int) -> None:
    path = tmp_path / "checkpoints" / "last.pt"
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(path)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "writing"
    time.sleep(0.3)  # inside torch.save of the big state
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert "Traceback" not in err, err
    names = sorted(p.name for p in path.parent.iterdir())
    assert names == ["last.pt", "last.pt.sha256"], names  # no temporary left behind
    state = checkpoint.load_checkpoint(path)  # the old one or the new one, whole
    assert state["model"]["w"].numel() in (4, 16_000_000)


def test_top_and_report_read_while_the_run_writes(tmp_path: Path) -> None:
    run = tmp_path / "live"
    writer = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import time
        from pathlib import Path
        from stepscope.store.db import RunWriter
        from stepscope.store.records import PhaseRecord, RunInfo, StepRecord
        w = RunWriter(Path({str(run)!r}), RunInfo(name="live", command="x"), commit_every_s=0.05)
        t0 = time.time()
        w.put_phase(PhaseRecord(0, 1, "train", t0))
        print("ready", flush=True)
        for i in range(4000):
            w.add_step(StepRecord(0, i, t0 + i * 0.002, 0.002, 0.001, 0.0, 0.001, 0.0, 8))
            time.sleep(0.002)
        w.put_phase(PhaseRecord(0, 1, "train", t0, time.time(), 4000, 32000))
        w.close(timeout_s={LANE2_WAIT_S})  # a daemon writer: a close given up on loses rows
    """)], stdout=subprocess.PIPE, text=True)
    assert writer.stdout is not None and writer.stdout.readline().strip() == "ready"
    time.sleep(1.0)
    report = _cli("report", str(run))
    top = _cli("top", str(run), "--once")
    # >= 8 s of 2 ms sleeps, each wake-up at SCHED_IDLE behind the timed lane: a hang guard only
    assert writer.wait(timeout=LANE2_WAIT_S) == 0
    assert report.returncode == 0, report.stderr
    assert top.returncode == 0, top.stderr
    assert "locked" not in report.stderr + top.stderr
    with RunReader(run) as r:
        assert r.run().status == "completed" and r.aggregates.step_count() == 4000


def test_a_failed_store_write_stops_recording_not_the_loop(tmp_path: Path) -> None:
    w = RunWriter(tmp_path, RunInfo(name="r", command="x"), commit_every_s=0.01)
    w.put_phase(PhaseRecord(0, 1, "train", 0.0))
    w.flush()

    def broken(*_: object, **__: object) -> None:
        raise OSError(28, "No space left on device")

    w._apply = broken  # type: ignore[method-assign]
    w.add_step(StepRecord(0, 0, 0.0, 1.0, 0.5, 0.0, 0.5, 0.0, 8))
    w.flush(timeout_s=120)  # returns once answered; the writer thread may wait for a core
    assert w.error is not None and "No space left on device" in w.error
    t0 = time.monotonic()
    w.flush(timeout_s=120)  # answered at once, never a hang (a hang would read the whole 120 s)
    w.close()
    assert time.monotonic() - t0 < 60
    with RunReader(tmp_path) as r:
        assert [p.phase_id for p in r.phases()] == [0]  # what was committed before stays
