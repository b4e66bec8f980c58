"""``stepscope watch`` on real scripts stepscope did not write (tests/watch_scripts/), plus the
child-side recorder and import hooks on their own."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import types
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from stepscope.errors import StepscopeError
from stepscope.observe import watch as watch_mod
from stepscope.observe.inject import stepscope_watch_imports as imports
from stepscope.observe.inject import stepscope_watch_recorder as recorder
from stepscope.observe.watch import (
    NO_STEPS_NOTE,
    child_env,
    choose_framework,
    exit_status,
    watch,
)
from stepscope.store.db import RunReader

SCRIPTS = Path(__file__).parent / "watch_scripts"
PY = sys.executable


def _image_folder(root: Path, train_per_class: int = 24, val_per_class: int = 8) -> Path:
    rng = np.random.default_rng(0)
    for split, n in (("train", train_per_class), ("val", val_per_class)):
        for cls in ("cat", "dog"):
            d = root / split / cls
            d.mkdir(parents=True)
            for i in range(n):
                pixels = rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(d / f"{cls}.{i}.jpg", quality=90)
    return root


def _phase_table(reader: RunReader) -> list[tuple[int, str, int, int]]:
    return [(p.epoch, p.phase, p.steps, p.images) for p in reader.phases()]


def _assert_split_adds_up(reader: RunReader) -> None:
    for s in reader.steps():
        parts = s.data_wait_s + s.transfer_s + s.compute_s + s.other_s
        assert parts == pytest.approx(s.wall_s, rel=1e-6, abs=1e-9)
        assert min(s.data_wait_s, s.transfer_s, s.compute_s, s.other_s) >= 0.0


# -- whole scripts ----------------------------------------------------------------------------
def test_pytorch_imagefolder_script(tmp_path: Path) -> None:
    data = _image_folder(tmp_path / "data")
    run = tmp_path / "run"
    cmd = [PY, str(SCRIPTS / "imagefolder_train.py"), str(data)]
    result = watch(cmd, run, interval_s=0.1)
    assert (result.exit_code, result.status) == (0, "completed")
    r = RunReader(run)
    info = r.run()
    assert (info.kind, info.status, info.exit_code) == ("watch", "completed", 0)
    assert "imagefolder_train.py" in info.command
    assert _phase_table(r) == [(1, "train", 6, 48), (1, "val", 2, 16),
                               (2, "train", 6, 48), (2, "val", 2, 16)]
    assert all(p.workers == 2 and p.ended is not None for p in r.phases())
    steps = r.steps()
    assert len(steps) == 16
    _assert_split_adds_up(r)
    train_ids = {p.phase_id for p in r.phases() if p.phase == "train"}
    train_steps = [s for s in steps if s.phase_id in train_ids]
    # Compute ends at optimizer.step(); the print and the timing after it are "other".
    assert all(s.compute_s > 0 for s in steps)
    assert sum(s.other_s for s in train_steps) > 0
    # The first step of each phase waits for the workers to start and deliver.
    firsts = [s for s in steps if s.step == 0]
    assert all(s.data_wait_s > 0.005 for s in firsts)
    assert [(s.phase_id, s.step) for s in steps if s.warmup] == [
        (0, 0), (0, 1), (0, 2), (1, 0), (1, 1)]
    procs = r.processes()
    main = [p for p in procs if p.role == "main"]
    workers = [p for p in procs if p.role == "worker"]
    assert len(main) == 1 and len(workers) >= 2
    assert all(w.ppid == main[0].pid for w in workers)
    facts = {k: f.value for k, f in r.facts().items()}
    assert facts["mem.framework"] == "torch"
    assert facts["dataset.files"] == 64
    assert facts["mem.weights_bytes"] > 0 and facts["mem.optimizer_bytes"] > 0  # SGD momentum
    assert r.series("dataset_resident_frac", source="pagecache")[0]
    assert r.series("cpu_util_pct", source="tree")[0]


def test_keras_fit_script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KERAS_BACKEND", "torch")
    run = tmp_path / "run"
    result = watch([PY, str(SCRIPTS / "keras_fit.py")], run, interval_s=0.2)
    assert (result.exit_code, result.status) == (0, "completed")
    r = RunReader(run)
    # 64 training samples in batches of 16; 24 validation samples: 16 + 8.
    assert _phase_table(r) == [(1, "train", 4, 64), (1, "val", 2, 24),
                               (2, "train", 4, 64), (2, "val", 2, 24)]
    _assert_split_adds_up(r)
    assert all(s.compute_s > 0 for s in r.steps())
    facts = {k: f.value for k, f in r.facts().items()}
    assert facts["mem.framework"] == "torch"
    assert facts["model.params"] == 16 * 32 + 32 + 32 * 2 + 2
    assert facts["mem.weights_bytes"] == 4 * facts["model.params"]


def test_exit_code_is_returned_and_run_failed(tmp_path: Path) -> None:
    result = watch([PY, str(SCRIPTS / "exit_three.py")], tmp_path, interval_s=0.2)
    assert (result.exit_code, result.status) == (3, "failed")
    info = RunReader(tmp_path).run()
    assert (info.status, info.exit_code) == ("failed", 3)


def test_sigkilled_script_is_interrupted_and_keeps_steps(tmp_path: Path) -> None:
    result = watch([PY, str(SCRIPTS / "sigkill_self.py")], tmp_path, interval_s=0.2)
    assert (result.exit_code, result.status) == (128 + signal.SIGKILL, "interrupted")
    r = RunReader(tmp_path)
    assert r.run().status == "interrupted"
    phases = r.phases()
    assert (phases[0].epoch, phases[0].phase, phases[0].steps) == (1, "train", 4)
    assert len(r.steps(phases[0].phase_id)) == 4
    assert all(p.ended is not None for p in phases)  # the killed phase is closed by the parent
    assert any("SIGKILL" in n.text for n in r.notes())


def test_users_own_sitecustomize_keeps_working(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(SCRIPTS / "own_site"))
    result = watch([PY, str(SCRIPTS / "check_own_site.py")], tmp_path, interval_s=0.2)
    assert result.exit_code == 0  # 5 if either sitecustomize was lost


def test_script_without_framework_gets_samples_and_note(tmp_path: Path) -> None:
    payload = tmp_path / "payload.bin"
    payload.write_bytes(os.urandom(256 * 1024))
    run = tmp_path / "run"
    result = watch([PY, str(SCRIPTS / "plain_python.py"), str(payload)], run, interval_s=0.1)
    assert result.status == "completed"
    r = RunReader(run)
    assert r.steps() == [] and r.phases() == []
    t, cpu = r.series("cpu_util_pct", source="tree")
    # ~1 s of the script at 0.1 s: ~10 samples idle; a loaded sampler skips the ticks it
    # overran, so a series of a few is what the plant decides
    assert len(t) >= 3 and max(cpu) > 20
    assert r.series("rchar_bytes", source="tree")[1][-1] > 256 * 1024
    assert any(n.text.startswith(NO_STEPS_NOTE) for n in r.notes())
    assert [p.role for p in r.processes()] == ["main"]
    assert "mem.framework" not in r.facts()


def test_sigint_is_forwarded_and_nothing_is_left_running(tmp_path: Path) -> None:
    pid_file = tmp_path / "grandchild.pid"
    # The script takes Ctrl-C as in a terminal: a suite started in the background by a
    # non-interactive shell hands its children SIGINT ignored, and they would sleep it out.
    code = ("import signal, subprocess, sys, time\n"
            "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
            "p = subprocess.Popen(['sleep', '60'])\n"
            f"open({str(pid_file)!r}, 'w').write(str(p.pid))\n"
            "time.sleep(60)\n")

    def interrupt_soon(pid: int) -> None:
        def fire() -> None:
            # Until the pid is written, not the file made (open() creates it before write()),
            # and up to 60 s: a starved host can take seconds to start the watched interpreter,
            # and a SIGINT sent before the grandchild exists leaves no pid to check.
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not (
                    pid_file.exists() and pid_file.read_text().strip()):
                time.sleep(0.05)
            os.kill(os.getpid(), signal.SIGINT)

        threading.Thread(target=fire, daemon=True).start()

    result = watch([PY, "-c", code], tmp_path / "run", interval_s=0.2, on_start=interrupt_soon)
    assert result.status == "interrupted"
    assert RunReader(tmp_path / "run").run().status == "interrupted"
    assert not _alive(int(pid_file.read_text()))


def _alive(pid: int) -> bool:
    """Running and not a zombie (an orphan waits for init to reap it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def test_no_preallocate_sets_env_fact_and_note(tmp_path: Path) -> None:
    code = ("import os, sys\n"
            "ok = os.environ.get('TF_FORCE_GPU_ALLOW_GROWTH') == 'true' and "
            "os.environ.get('XLA_PYTHON_CLIENT_PREALLOCATE') == 'false'\n"
            "sys.exit(0 if ok else 4)\n")
    result = watch([PY, "-c", code], tmp_path, interval_s=0.2, no_preallocate=True)
    assert result.exit_code == 0
    r = RunReader(tmp_path)
    assert r.facts()["watch.no_preallocate"].value is True
    assert any("TF_FORCE_GPU_ALLOW_GROWTH" in n.text for n in r.notes())


def test_missing_command_is_a_user_error(tmp_path: Path) -> None:
    with pytest.raises(StepscopeError, match="command not found"):
        watch(["no-such-command-xyz"], tmp_path)
    with pytest.raises(StepscopeError, match="needs a command"):
        watch([], tmp_path)


# -- pieces -----------------------------------------------------------------------------------
def test_exit_status() -> None:
    assert exit_status(0, None) == ("completed", 0)
    assert exit_status(3, None) == ("failed", 3)
    assert exit_status(-signal.SIGKILL, None) == ("interrupted", 137)
    assert exit_status(0, signal.SIGINT) == ("interrupted", 0)


def test_child_env_keeps_original_pythonpath() -> None:
    env = child_env({"PYTHONPATH": "/a:/b", "X": "1"}, 7, no_preallocate=False)
    assert env["PYTHONPATH"] == f"{watch_mod.INJECT_DIR}{os.pathsep}/a:/b"
    assert json.loads(env["STEPSCOPE_WATCH_PYTHONPATH"]) == "/a:/b"
    assert env["STEPSCOPE_WATCH_FD"] == "7" and env["X"] == "1"
    assert "TF_FORCE_GPU_ALLOW_GROWTH" not in env
    bare = child_env({}, 7, no_preallocate=True)
    assert json.loads(bare["STEPSCOPE_WATCH_PYTHONPATH"]) is None
    assert bare["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"


def test_choose_framework() -> None:
    assert choose_framework(["torch", "keras"], "torch") == "torch"
    assert choose_framework(["keras", "jax"], "jax") == "jax"
    assert choose_framework(["tensorflow"], None) == "tensorflow"
    assert choose_framework([], None) is None


class _Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _recorder() -> tuple[recorder.Recorder, _Clock, int]:
    read_fd, write_fd = os.pipe()
    clock = _Clock()
    return recorder.Recorder(recorder.Channel(write_fd, clock=clock), clock=clock), clock, read_fd


def _messages(rec: recorder.Recorder, read_fd: int) -> list[list[object]]:
    rec.channel.flush()
    os.close(rec.channel._fd)
    with os.fdopen(read_fd, "rb") as f:
        return [json.loads(line) for line in f]


def test_recorder_split_and_epochs() -> None:
    rec, clock, read_fd = _recorder()
    val0 = rec.begin_phase("val", None, clock.t)  # a sanity-check val before training: epoch 0
    rec.end_phase(val0, clock.t)
    train = rec.begin_phase("train", 2, clock.t)
    clock.t += 0.1
    rec.begin_step(train, 100.0, clock.t, 8)  # waited 0.1 s
    rec.add_transfer(0.02)
    clock.t += 0.5
    rec.optimizer_stepped(clock.t)  # compute: 0.5 - 0.02 transfer
    clock.t += 0.2  # logging after the optimizer step
    rec.end_step(clock.t)
    val = rec.begin_phase("val", 2, clock.t)
    rec.begin_step(val, clock.t, clock.t + 0.05, 4)
    rec.optimizer_stepped(clock.t + 0.06)  # ignored in val: compute is all after the batch
    clock.t += 0.3
    rec.at_exit()
    msgs = _messages(rec, read_fd)
    phases = [m for m in msgs if m[0] == "P"]
    assert [(m[2], m[3]) for m in phases] == [(0, "val"), (1, "train"), (1, "val")]
    steps = [m for m in msgs if m[0] == "S"]
    _, _, _, _, wall, wait, transfer, compute, other, images, warm, comm = steps[0]
    assert (wall, wait, transfer, compute, other, images, warm, comm) == pytest.approx(
        (0.8, 0.1, 0.02, 0.48, 0.2, 8, True, 0.0))
    _, _, _, _, wall, wait, transfer, compute, other, images, _, _ = steps[1]
    assert (wall, wait, compute, other) == pytest.approx((0.3, 0.05, 0.25, 0.0))
    ends = [m for m in msgs if m[0] == "E"]
    assert [(m[1], m[3], m[4]) for m in ends] == [(0, 0, 0), (1, 1, 8), (2, 1, 4)]


def test_recorder_new_train_phase_closes_abandoned_ones() -> None:
    rec, clock, read_fd = _recorder()
    rec.begin_phase("train", None, clock.t)
    rec.begin_phase("val", None, clock.t)  # nested validation: train stays open
    assert [p.phase for p in rec.open_phases] == ["train", "val"]
    rec.begin_phase("train", None, clock.t)  # the next epoch: both earlier phases end
    assert [(p.epoch, p.phase) for p in rec.open_phases] == [(2, "train")]
    _messages(rec, read_fd)


def test_find_dataset_files_through_subset(tmp_path: Path) -> None:
    files = []
    for i in range(3):
        f = tmp_path / f"{i}.jpg"
        f.write_bytes(b"x")
        files.append(str(f))
    folder = types.SimpleNamespace(samples=[(f, 0) for f in files])
    subset = types.SimpleNamespace(dataset=folder)
    concat = types.SimpleNamespace(datasets=[subset, folder])
    assert recorder.find_dataset_files(subset) == files
    assert recorder.find_dataset_files(concat) == files + files
    assert recorder.find_dataset_files(types.SimpleNamespace(samples=[("nope", 0)])) == []


def test_post_import_hook_runs_once_after_import(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "stepscope_test_hooked_mod.py").write_text("VALUE = 41\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen: list[int] = []

    def hook(module: types.ModuleType) -> None:
        seen.append(module.VALUE)
        module.VALUE += 1

    finder = imports.PostImportFinder({"stepscope_test_hooked_mod": hook}, on_error=print)
    finder.install()
    try:
        import stepscope_test_hooked_mod as mod  # type: ignore[import-not-found]

        assert mod.VALUE == 42 and seen == [41]
        assert "exec_module" not in vars(mod.__loader__)  # the real loader, unwrapped again
    finally:
        sys.meta_path.remove(finder)
        sys.modules.pop("stepscope_test_hooked_mod", None)


def test_a_script_that_fails_mid_epoch_is_told_as_such(tmp_path: Path) -> None:
    """Planted: a PyTorch loop whose dataset raises on its 6th batch of epoch 2 (a table row it
    cannot read), inside the DataLoader's ``__next__`` that watch times. watch exits with the
    script's code; the traceback is Python's without watch's frames (it says how many went);
    the explanation's first answer says where it stopped, what it raised and where, and that
    its figures cover the 21 steps that ran (16 of epoch 1, 5 of epoch 2)."""
    import subprocess

    script = tmp_path / "fails.py"
    script.write_text(
        "import torch\n"
        "from torch.utils.data import DataLoader, Dataset\n"
        "class Rows(Dataset):\n"
        "    epoch, x, y = 0, torch.randn(256, 8), torch.randint(0, 2, (256,))\n"
        "    def __len__(self): return 256\n"
        "    def __getitem__(self, i):\n"
        "        if self.epoch == 1 and i == 80:\n"
        "            raise RuntimeError(f'row {i} of the table is unreadable')\n"
        "        return self.x[i], self.y[i]\n"
        "data, model = Rows(), torch.nn.Linear(8, 2)\n"
        "opt = torch.optim.SGD(model.parameters(), 0.1)\n"
        "for epoch in range(3):\n"
        "    data.epoch = epoch\n"
        "    for x, y in DataLoader(data, batch_size=16):\n"
        "        loss = torch.nn.functional.cross_entropy(model(x), y)\n"
        "        opt.zero_grad(); loss.backward(); opt.step()\n")
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1] / "src"))
    proc = subprocess.run([PY, "-m", "stepscope", "watch", "--out", str(tmp_path / "run"),
                           "--interval", "0.2", "--", PY, str(script)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "RuntimeError: row 80 of the table is unreadable" in proc.stderr, proc.stderr[-3000:]
    assert "stepscope_watch_" not in proc.stderr and "fails.py\", line 8" in proc.stderr
    assert "of its hooks, which only passed the call on, left out of this traceback" \
        in proc.stderr, proc.stderr[-3000:]
    printed = " ".join(proc.stdout.split())
    assert ("The command exited with code 1 in epoch 2's train phase (run status: failed), "
            "raising RuntimeError: row 80 of the table is unreadable at fails.py:8 (the uncaught "
            "exception, watch's sys.excepthook): these figures cover the 21 steps it ran."
            ) in printed, printed[-3000:]
