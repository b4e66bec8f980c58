"""Loader stage counters: exclusive nesting, per-process boards, phase deltas."""

from __future__ import annotations

import os
import pickle
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from stepscope.observe import stages


@pytest.fixture()
def board_dir(tmp_path: Path) -> Iterator[Path]:
    stages.set_folder(str(tmp_path))
    yield tmp_path
    stages.set_folder(None)


def _mine(folder: Path) -> stages.ProcessStages:
    return stages.read_boards(folder)[os.getpid()]


def test_nested_stages_are_exclusive(board_dir: Path) -> None:
    t0 = time.perf_counter()
    with stages.Stage("transform"):
        time.sleep(0.02)
        with stages.Stage("decode"):
            time.sleep(0.05)
    outer = time.perf_counter() - t0
    b = _mine(board_dir)
    assert b.stage_s["decode"] >= 0.045 and b.stage_s["transform"] >= 0.015  # sleeps end late
    # The transform's own time excludes the decode nested inside it: the two add up to the
    # wall time around both. Counted in, the decode would be there twice, at least 0.045 s
    # over it, whatever a loaded host's late wake-ups added to either sleep.
    assert b.stage_s["transform"] + b.stage_s["decode"] <= outer + 0.005, (b.stage_s, outer)
    assert b.stage_calls["decode"] == 1 and b.stage_calls["transform"] == 1


def test_batch_timer_counts_items_and_splits_blocked_from_cpu(board_dir: Path) -> None:
    with stages.BatchTimer(items=4), stages.Stage("read", nbytes=1000):
        time.sleep(0.05)  # asleep: off-CPU and not runnable, like a disk read
    b = _mine(board_dir)
    assert b.items == 4 and b.batches == 1 and b.read_bytes == 1000
    assert b.fetch_s >= 0.05
    assert b.fetch_cpu_s < 0.5 * b.fetch_s
    assert b.stage_s["item"] < 0.01  # all of it was inside the read stage


def test_timed_wrapper_is_idempotent_and_keeps_the_result(board_dir: Path) -> None:
    f = stages.timed("decode", lambda x: x + 1)
    assert stages.timed("decode", f) is f
    assert f(1) == 2
    assert _mine(board_dir).stage_calls["decode"] == 1


def test_no_folder_no_counting() -> None:
    stages.set_folder(None)
    with stages.Stage("read", nbytes=10):
        pass  # nothing to write to; must not fail


def test_probe_reports_the_phase_delta_and_waits(board_dir: Path) -> None:
    with stages.BatchTimer(items=2):
        pass
    probe = stages.LoaderProbe(board_dir, os.getpid())
    probe.begin()
    with stages.BatchTimer(items=8):
        time.sleep(0.01)
    probe.waited(0.3, 0.01)
    probe.waited(0.0001, 0.0)
    out = probe.end(workers=0, persistent=False)
    assert out["items"] == 8 and out["batches"] == 1  # the earlier batch is not this phase's
    assert out["waits"] == 2 and out["not_ready_steps"] == 1
    assert out["first_wait_s"] == 0.3 and out["stages_measured"]
    assert out["main"]["items"] == 8


def test_a_forked_child_gets_its_own_board(board_dir: Path) -> None:
    with stages.Stage("read"):
        pass
    pid = os.fork()
    if pid == 0:  # the child: count one decode in its own file, then leave at once
        with stages.Stage("decode"):
            pass
        os._exit(0)
    os.waitpid(pid, 0)
    boards = stages.read_boards(board_dir)
    assert boards[pid].stage_calls["decode"] == 1 and boards[pid].stage_calls["read"] == 0
    assert boards[os.getpid()].stage_calls["decode"] == 0


_CALLS: list[int] = []


def _user_init(worker_id: int) -> None:
    _CALLS.append(worker_id)


class _Ctx:
    def __init__(self, method: str) -> None:
        self.method = method

    def get_start_method(self) -> str:
        return self.method


class _Loader:
    def __init__(self, method: str) -> None:
        self.multiprocessing_context = _Ctx(method)
        self.worker_init_fn = _user_init


def test_spawned_workers_get_a_picklable_init_that_installs_the_hooks(
        board_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from stepscope.observe.inject import stepscope_watch_stage_hooks as impl

    # Stand-in hooks: this process's real torch/PIL must stay unpatched.
    hooked: list[str] = []
    monkeypatch.setattr(impl, "library_hooks", lambda: {"os": lambda m: hooked.append(m.__name__)})

    seen: list[object] = []
    start = impl._hooking_spawned_workers(lambda it, loader: seen.append(loader.worker_init_fn))
    for method in ("spawn", "forkserver", "fork"):
        loader = _Loader(method)
        start(object(), loader)
        assert loader.worker_init_fn is _user_init  # the user's loader is left as it was
    spawn, forkserver, fork = seen
    assert isinstance(spawn, impl.WorkerHooks) and isinstance(forkserver, impl.WorkerHooks)
    assert fork is _user_init  # a forked worker inherits the hooks already
    # What a spawned worker receives: pickled by name, then called with its id.
    hooks = pickle.loads(pickle.dumps(spawn))
    finders = list(sys.meta_path)
    try:
        hooks(3)
    finally:
        sys.meta_path[:] = finders  # it hooks later imports too: not in this test process
    assert _CALLS[-1] == 3
    assert hooked == ["os"]  # an imported library is hooked before the user's init runs


def test_loading_threads_get_a_row_each_in_the_phase(board_dir: Path) -> None:
    """A Keras PyDataset(workers=2) thread pool: each thread's batches come back as its own
    ``workers`` row (wall, CPU, run queue) and in the phase's totals."""
    import threading

    from stepscope.observe.inject import stepscope_watch_stages as ws

    def work() -> None:
        for _ in range(2):
            with ws.ThreadTimer(items=8):
                end = time.thread_time() + 0.02  # Python holding the GIL
                while time.thread_time() < end:
                    pass

    phases = ws.WatchPhases()
    with ws.ThreadTimer(items=8):  # before the phase: not its work
        pass
    phases.begin(0)
    pool = [threading.Thread(target=work, name=f"loader-{i}") for i in range(2)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    out = phases.end(0, 2)
    assert out is not None and out["worker_threads"] is True
    rows = [w for w in out["workers"] if "tid" in w]
    assert sorted(w["thread"] for w in rows) == ["loader-0", "loader-1"]
    for w in rows:
        assert w["batches"] == 2 and w["items"] == 16 and w["pid"] == os.getpid()
        assert w["busy_s"] >= w["cpu_s"] >= 0.03  # 2 × 20 ms of CPU, longer by the wall
    assert out["items"] == 32 and out["batches"] == 4
    assert out["fetch_s"] == pytest.approx(sum(w["busy_s"] for w in rows))


def test_no_folder_no_thread_rows() -> None:
    from stepscope.observe.inject import stepscope_watch_stages as ws

    stages.set_folder(None)
    before = ws.read_threads()
    with ws.ThreadTimer(items=1):
        pass  # not watched: nothing recorded, nothing fails
    assert ws.read_threads() == before


HOOKED_CALLS = 3  # each loader script runs its hooked pipeline so many times (its argv[2])

PIL_LOADER = """
import io, sys, time
CALLS = int(sys.argv[2])
import numpy as np
from PIL import Image
from stepscope.observe import stages
from stepscope.observe.inject import stepscope_watch_stage_hooks as hooks

stages.set_folder(sys.argv[1])
buf = io.BytesIO()
rng = np.random.default_rng(0)
Image.fromarray(rng.integers(0, 255, (1024, 1024, 3), dtype=np.uint8)).save(buf, "JPEG")
data = buf.getvalue()
big = Image.open(io.BytesIO(data)).convert("RGB")  # the first open imports PIL's plugins: not decode
decode = resize = float("inf")
for _ in range(3):  # the least of three: one timing on a loaded host reads a scheduler's pause
    t0 = time.thread_time()
    Image.open(io.BytesIO(data)).convert("RGB")
    decode = min(decode, time.thread_time() - t0)
    t0 = time.thread_time()
    big.resize((64, 64), Image.Resampling.LANCZOS)
    resize = min(resize, time.thread_time() - t0)
import PIL.ImageFile
for name, install in hooks.library_hooks().items():
    if name in sys.modules:
        install(sys.modules[name])
for _ in range(CALLS):  # as torchvision's pil_loader and a dataset's own resize write it
    img = Image.open(io.BytesIO(data)).convert("RGB").resize((64, 64), Image.Resampling.LANCZOS)
print(decode, resize)
"""


def test_pil_decode_and_resize_are_their_stages(tmp_path: Path) -> None:
    """A JPEG opened, converted and resized as a dataset's __getitem__ writes it: the pixels
    are decoded in ImageFile.load (an override of Image.load, which decodes nothing) and the
    resize is a transform; each stage holds at least most of that work timed alone."""
    import subprocess

    src = str(Path(__file__).resolve().parents[1] / "src")
    out = subprocess.run([sys.executable, "-c", PIL_LOADER, str(tmp_path), str(HOOKED_CALLS)],
                         check=True,
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": src}).stdout
    decode, resize = map(float, out.split())
    (board,) = stages.read_boards(tmp_path).values()
    assert board.stage_calls["transform"] == HOOKED_CALLS  # open and load count decode
    assert board.stage_s["decode"] / HOOKED_CALLS >= 0.6 * decode, (board.stage_s, decode)
    assert board.stage_s["transform"] / HOOKED_CALLS >= 0.6 * resize, (board.stage_s, resize)


CV2_LOADER = """
import sys, time
CALLS = int(sys.argv[2])
import cv2
import numpy as np
from stepscope.observe import stages
from stepscope.observe.inject import stepscope_watch_stage_hooks as hooks

stages.set_folder(sys.argv[1])
rng = np.random.default_rng(0)
ok, jpeg = cv2.imencode(".jpg", rng.integers(0, 255, (1024, 1024, 3), dtype=np.uint8))
buf = np.frombuffer(jpeg.tobytes(), np.uint8)
big = cv2.imdecode(buf, cv2.IMREAD_COLOR)
warp = float("inf")
for _ in range(5):  # the least of five: one timing on a loaded host reads a scheduler's pause
    t0 = time.thread_time()
    cv2.warpAffine(big, np.float32([[0.9, 0.1, 3], [-0.1, 0.9, 5]]), (512, 512))
    warp = min(warp, time.thread_time() - t0)
hooks.install_cv2(cv2)
for _ in range(CALLS):  # a dataset's __getitem__ as an OpenCV pipeline (and Albumentations) writes it
    img = cv2.cvtColor(cv2.imdecode(buf, cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)
    img = cv2.warpAffine(img, np.float32([[0.9, 0.1, 3], [-0.1, 0.9, 5]]), (512, 512))
print(warp)
"""


def test_opencv_transforms_are_the_transform_stage(tmp_path: Path) -> None:
    """An OpenCV pipeline (decode, colour conversion, an affine warp): the warp and the
    conversion are transforms, holding at least most of the warp's time measured alone."""
    import subprocess

    src = str(Path(__file__).resolve().parents[1] / "src")
    out = subprocess.run([sys.executable, "-c", CV2_LOADER, str(tmp_path), str(HOOKED_CALLS)],
                         check=True,
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": src}).stdout
    warp = float(out)
    (board,) = stages.read_boards(tmp_path).values()
    # each call: cvtColor and warpAffine are transforms
    assert board.stage_calls["decode"] == HOOKED_CALLS
    assert board.stage_calls["transform"] == 2 * HOOKED_CALLS
    assert board.stage_s["transform"] / HOOKED_CALLS >= 0.6 * warp, (board.stage_s, warp)
