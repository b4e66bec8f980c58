"""A loader process forked while another thread holds one of the watched process's locks.

The lock stays held in the child, where the thread that held it does not exist: Keras's
``PyDataset(use_multiprocessing=True)`` forks its pool from a thread while the loop's thread
works, and a pool worker hung in ``board()`` about one run in six (torch backend, 2 workers).
Each lock a forked child may take is renewed in it.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from stepscope.observe.inject import stepscope_watch_keras_stages as kstages
from stepscope.observe.inject import stepscope_watch_recorder as recorder
from stepscope.observe.inject import stepscope_watch_stages as wstages


def _fork_while_held(lock: Callable[[], threading.Lock], use: Callable[[], object]) -> int:
    """Hold ``lock()`` on a thread, fork, and in the child call ``use()``: the child's exit
    status (0: done; -1: still blocked after 60 s, killed: a guard against the hang
    it tests for, which a passing child leaves at once)."""
    held, release = threading.Event(), threading.Event()

    def holder() -> None:
        with lock():
            held.set()
            release.wait()

    t = threading.Thread(target=holder)
    t.start()
    held.wait()
    pid = os.fork()
    if pid == 0:  # the child: the holder thread is not here
        try:
            use()
        finally:
            os._exit(0)
    release.set()
    t.join()
    deadline = time.monotonic() + 60.0
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.02)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return -1


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # fork with threads: on purpose
def test_a_forked_worker_makes_its_board(tmp_path: Path) -> None:
    wstages.set_folder(str(tmp_path))
    try:
        assert _fork_while_held(lambda: wstages._board_lock, wstages.board) == 0
    finally:
        wstages.set_folder(None)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_a_forked_worker_counts_its_image_data_generator_stages() -> None:
    stages = kstages.LoaderStages()
    assert _fork_while_held(lambda: stages.lock, lambda: stages.add("load", 0.01, 1)) == 0


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_a_forked_worker_may_send_on_the_channel() -> None:
    read_fd, write_fd = os.pipe()
    channel = recorder.Channel(write_fd)
    try:
        assert _fork_while_held(lambda: channel._lock,
                                lambda: channel.send(["N", "x"], urgent=True)) == 0
    finally:
        os.close(read_fd)
        os.close(write_fd)
