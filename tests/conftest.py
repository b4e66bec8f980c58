"""Shared fixtures: small synthetic datasets made once per test session (real JPEGs on disk)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import settings

from stepscope.train.synth import synth_dataset

# No property test asserts time, and the light and untimed modules run at the lowest priority
# beside timed ones (scripts/run-tests): Hypothesis's default 200 ms deadline an example fails a
# right answer whenever the scheduler parks one.
settings.register_profile("stepscope", deadline=None)
settings.load_profile("stepscope")

# How long a test in that lane waits on work that returns as soon as it is done (the store's
# writer thread draining a flush or close, a CLI's start, a server's first answer): a hang guard,
# not a bound. Starved behind the timed lane the work can wait tens of seconds for a core, and a
# flush or close given up on returns silently with rows unwritten (the daemon writer's), which
# exact counts read straight after then miss.
LANE2_WAIT_S = 300.0


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


def evict_or_skip(files: list[Path]) -> None:
    """Evict ``files`` from the page cache (a cold-cache scenario's plant), or skip the test
    where the plant cannot happen: a tmpfs (no disk to read from) or pages another process pins."""
    from stepscope.observe.disk import block_device_for
    from stepscope.observe.pagecache import evict, resident_bytes

    if block_device_for(files[0]) is None:
        pytest.skip(f"{files[0].parent} is on no block device (tmpfs?): nothing is read from disk")
    evict(files, sync=True)
    left = sum(resident_bytes(f)[0] for f in files)
    if left > 0.05 * sum(f.stat().st_size for f in files):
        pytest.skip(f"eviction left {left} bytes resident (pages pinned by another process)")


def data_flags(d: Path) -> dict[str, str]:
    return {"csv": str(d / "train.csv"), "val_csv": str(d / "valid.csv"), "images": str(d / "images")}


@pytest.fixture(scope="module", autouse=True)
def _light_modules_leave_nothing_running(request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    """Modules marked ``light`` share one interpreter in ``make test`` (the rest get their own,
    so that one module's leftover children, threads or cache state cannot change what a later
    module measures). A light module must therefore start no process and leave no thread."""
    if request.node.get_closest_marker("light") is None:
        yield
        return
    import threading

    import psutil

    threads = set(threading.enumerate())
    yield
    children = psutil.Process().children(recursive=True)
    new_threads = [t.name for t in threading.enumerate() if t not in threads and t.is_alive()]
    assert not children and not new_threads, (
        f"a light module left {len(children)} processes and threads {new_threads}: "
        "drop its `pytestmark = pytest.mark.light`")


def report_size_bench() -> ModuleType:
    """bench/report_size.py: it writes realistic synthetic runs through the real store writer."""
    return bench_module("report_size")


def bench_module(name: str) -> ModuleType:
    """``bench/NAME.py`` as a module (the benches are scripts, not a package)."""
    path = Path(__file__).resolve().parents[1] / "bench" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
