"""``stepscope watch`` on distributed jobs: torchrun, ``accelerate launch`` and Lightning DDP
(gloo on the CPU, two ranks), with planted stragglers and a rank killed mid-run.

Every job is a real script written the way its framework's docs write one
(tests/watch_scripts/), run under the real launcher through the CLI. Planted costs are 80 ms
per step against steps of a few ms, so the answers hold on a loaded 2-core machine.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

from stepscope.observe.watch_ranks import Rank, RankEnd, first_failure, parse_exit_code, rank_status
from stepscope.store.db import RunReader

# Its ranks are timed against each other on shared cores: make test runs it after the nice-10
# lane (scripts/run-tests).
pytestmark = pytest.mark.alone

SCRIPTS = Path(__file__).parent / "watch_scripts"
BIN = Path(sys.executable).parent
SLOW_S = "0.08"
ABORTED_TEARDOWN = "terminate called"


def _aborted_in_teardown(out: str) -> bool:
    """A rank ended in std::terminate: SIGABRT from torch's C++ after the script was done."""
    return ABORTED_TEARDOWN in out


def _teardown_lines(out: str) -> str:
    """What a rank said as it died in C++ (std::terminate, gloo's enforce), not cut by a tail."""
    return "\n".join(line for line in out.splitlines()
                     if "terminate called" in line or "what():" in line or "SIGABRT" in line)


def _warn_rerun(out: str) -> None:
    """Say that a job is run once more after such an abort: a warning, not a print, as pytest
    lists warnings in the summary of a run that passed."""
    warnings.warn(f"a rank aborted in torch's teardown; run again: {_teardown_lines(out)}",
                  stacklevel=3)


def _watch(tmp_path: Path, launcher: list[str], script: str, **env: str
           ) -> tuple[subprocess.CompletedProcess[str], Path, dict[str, Any]]:
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "stepscope", "watch", "--out", str(run), "--",
           *launcher, str(SCRIPTS / script)]
    full_env = {**os.environ, "PYTHONWARNINGS": "ignore", **env}
    for _ in range(2):
        res = subprocess.run(cmd, cwd=tmp_path, env=full_env, capture_output=True, text=True,
                             timeout=600)
        # A rehearsal's rank and a CI run's aborted in torch's C++ teardown after all their steps
        # (std::terminate, SIGABRT; the first said "without an active exception", the second's
        # message was cut off).
        # One way there was watch's (its comm hook owned the process group: see
        # test_the_comm_hooks_state_never_frees_the_process_group_on_its_own_thread); the
        # rest is not explained, and none of ~120 runs here showed it. What is asserted
        # is the job's record, not torch's exit: the run is made once more and says so.
        if not _aborted_in_teardown(res.stderr):
            break
        _warn_rerun(res.stderr)
        shutil.rmtree(run, ignore_errors=True)
    summary = json.loads((run / "summary.json").read_text())
    return res, run, summary


def _torchrun(tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess[str], Path,
                                                   dict[str, Any]]:
    return _watch(tmp_path, [str(BIN / "torchrun"), "--nproc-per-node", "2"],
                  "ddp_tutorial.py", **env)


def _assert_both_ranks_recorded(run: Path, s: dict[str, Any], res: Any) -> None:
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert (run / "run.db").is_file() and (run / "run.rank1.db").is_file()
    assert not (run / "run.rank2.db").exists()  # the launcher is no rank
    with RunReader(run, db_name="run.rank1.db") as r1:
        assert (r1.run().rank, r1.run().world_size) == (1, 2)
        assert [p.phase for p in r1.phases()] == ["train", "train"]
        assert r1.arrivals()
    rows = s["ranks"]
    assert [r["rank"] for r in rows] == [0, 1]
    for r in rows:
        assert r["steps_compared"] >= 10 and r["status"] == "completed"
        assert r["data_wait_frac"] is not None and r["compute_frac"] is not None
        assert r["comm_ms_per_step"] > 0 and r["allreduces_compared"] >= 10
    assert [p["phase"] for p in s["phases"]] == ["train", "train"]  # rank 0's, in run.db
    nodes = s["distributed"]["nodes"]
    assert [(n["host"], n["ranks"]) for n in nodes] == [(rows[0]["host"], [0, 1])]


def _straggler(s: dict[str, Any]) -> list[tuple[int, str | None, str | None]]:
    return [(r["rank"], r["cause"], r["recurrence"]) for r in s["ranks"] if r["straggler"]]


@pytest.mark.slow
def test_torchrun_balanced_job_both_ranks_no_straggler(tmp_path: Path) -> None:
    res, run, s = _torchrun(tmp_path, LOAD_S="0.03")
    _assert_both_ranks_recorded(run, s, res)
    assert _straggler(s) == [], [(r["rank"], r["straggler_evidence"]) for r in s["ranks"]]
    assert s["distributed"]["arrival"]["stragglers"] == []
    assert (run / "report.html").is_file()


@pytest.mark.slow
def test_torchrun_rank_slow_in_backward_only_is_named(tmp_path: Path) -> None:
    res, run, s = _torchrun(tmp_path, SLOW_BACKWARD_RANK="1", SLOW_BACKWARD_S=SLOW_S)
    _assert_both_ranks_recorded(run, s, res)
    assert _straggler(s) == [(1, "compute", "every step")]
    row = s["ranks"][1]
    assert row["straggler_by"] == "arrival" and row["arrived_last_frac"] >= 0.9
    assert row["late_ms_when_late"] > 50
    # Its own process barely used the CPU while slow: it waited (here: a sleep in backward).
    assert any("waited on something other than its own CPU work" in e
               for e in row["straggler_evidence"])
    assert s["distributed"]["verdict"] == "straggler-bound"


@pytest.mark.slow
def test_one_bad_stretch_is_told_from_every_step(tmp_path: Path) -> None:
    # Rank 1 is slow in backward for 12 of its 40 steps only.
    res, run, s = _torchrun(tmp_path, SLOW_BACKWARD_RANK="1", SLOW_BACKWARD_S=SLOW_S,
                            SLOW_BACKWARD_STEPS="15-26")
    _assert_both_ranks_recorded(run, s, res)
    assert [(r["rank"], r["recurrence"]) for r in s["ranks"] if r["straggler"]] == \
        [(1, "one stretch")]
    stretch = s["ranks"][1]["late_stretch"]
    assert 13 <= stretch["first_allreduce"] <= 16 and 25 <= stretch["last_allreduce"] <= 28
    assert any("late for one stretch" in e for e in s["ranks"][1]["straggler_evidence"])


@pytest.mark.slow
def test_torchrun_rank_slow_in_loading_is_named(tmp_path: Path) -> None:
    res, run, s = _torchrun(tmp_path, SLOW_LOAD_RANK="0", SLOW_LOAD_S=SLOW_S)
    _assert_both_ranks_recorded(run, s, res)
    assert _straggler(s) == [(0, "input", "every step")]
    assert s["ranks"][0]["data_wait_ms_per_step"] > 50
    assert "data wait" in s["distributed"]["verdict_text"]


@pytest.mark.slow
def test_rank_killed_mid_run_fails_the_watch_and_keeps_the_other(tmp_path: Path) -> None:
    res, run, s = _torchrun(tmp_path, KILL_RANK="1", KILL_STEP="5")
    assert res.returncode == 137, res.stderr[-3000:]  # the killed rank's status: 128 + SIGKILL
    assert s["run"]["status"] == "failed"
    by_rank = {r["rank"]: r for r in s["ranks"]}
    assert (by_rank[1]["status"], by_rank[1]["exit_code"]) == ("failed", 137)
    assert by_rank[0]["status"] in ("interrupted", "failed")  # taken down after rank 1
    assert by_rank[0]["steps_compared"] > 0  # rank 0's records kept
    failed = [f for f in s["findings"] if f["id"] == "rank1-failed"]
    assert failed and "signal 9" in failed[0]["evidence"]
    with RunReader(run) as r0:
        assert len(r0.steps()) >= 20  # the first epoch and part of the second


@pytest.mark.slow
def test_accelerate_launch_records_both_ranks(tmp_path: Path) -> None:
    # --multi_gpu with no GPU: torchrun-style workers, Accelerator(cpu=True) joins over gloo.
    res, run, s = _watch(
        tmp_path, [str(BIN / "accelerate"), "launch", "--multi_gpu", "--num_processes", "2",
                   "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"],
        "accelerate_train.py")
    _assert_both_ranks_recorded(run, s, res)


@pytest.mark.slow
def test_lightning_ddp_records_both_ranks(tmp_path: Path) -> None:
    # The script is rank 0 itself; Lightning launches rank 1 as a copy of it and does not wait
    # for it at exit. Rank 1 planted to wind down 3 s after rank 0 ends (one CI run saw it still
    # tearing down 2 s later, and watch ended it: exit 143): the job still completed.
    res, run, s = _watch(tmp_path, [sys.executable], "lightning_ddp.py", RANK1_LINGER_S="3")
    _assert_both_ranks_recorded(run, s, res)
    with RunReader(run) as r0:
        mains = {p.pid for p in r0.processes() if p.role == "main"}
        assert r0.facts()["dist.pid"].value in mains


# -- exit bookkeeping ---------------------------------------------------------------------------
def _stat(state: str, exit_code: int) -> str:
    fields = [state] + ["0"] * 48 + [str(exit_code)]
    return "123 (python (x)) " + " ".join(fields)


def test_exit_code_of_a_zombie() -> None:
    assert parse_exit_code(_stat("Z", 9)) == 137  # killed by SIGKILL
    assert parse_exit_code(_stat("Z", 3 << 8)) == 3  # exit(3)
    assert parse_exit_code(_stat("S", 0)) is None  # still running


def _rank(k: int, t: float | None, code: int | None, orderly: bool) -> Rank:
    return Rank(rank=k, world_size=2, local_rank=k, host="h", pid=100 + k, backend="gloo",
                writer=None, sink=None, end=RankEnd(t=t, exit_code=code, orderly=orderly))  # type: ignore[arg-type]


def test_the_first_rank_to_end_abnormally_failed_the_others_were_stopped() -> None:
    ranks = [_rank(0, 12.0, 143, False), _rank(1, 10.0, 137, False), _rank(2, 13.0, 0, True)]
    failed = first_failure(ranks)
    assert failed is ranks[1]
    assert [rank_status(r, failed) for r in ranks] == ["interrupted", "failed", "completed"]
    assert first_failure([_rank(0, 1.0, 0, True)]) is None


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run_nodes(make_cmds: Callable[[], list[list[str]]], cwd: Path, env: dict[str, str]
               ) -> list[tuple[int, str]]:
    """Start one watched command per node at once (``make_cmds`` gives them afresh for every
    try: new port, empty run directories); their exit codes and outputs.

    Should a rank abort in torch's teardown (see ``_watch``), its node's agent fails at once and
    the other node's agent would wait out torchrun's 300 s exit barrier for it: that node is
    killed with its processes and all is run once more, saying so (a warning).
    """
    for attempt in range(2):
        cmds = make_cmds()
        logs = [cwd / f"node{k}.out" for k in range(len(cmds))]
        procs = []
        for cmd, log in zip(cmds, logs, strict=True):
            with log.open("w") as f:
                procs.append(subprocess.Popen(cmd, cwd=cwd, env=env, stdout=f,
                                              stderr=subprocess.STDOUT))
        deadline = time.monotonic() + 600
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            if any(p.returncode not in (None, 0) and _aborted_in_teardown(log.read_text())
                   for p, log in zip(procs, logs, strict=True)):
                break
            time.sleep(0.2)
        for p in procs:  # an agent blocked in the barrier's store wait does not see SIGINT
            if p.poll() is None:
                for child in psutil.Process(p.pid).children(recursive=True):
                    child.kill()
                p.kill()
        codes = [p.wait() for p in procs]
        outs = [log.read_text() for log in logs]
        aborted = [o for c, o in zip(codes, outs, strict=True) if c != 0 and _aborted_in_teardown(o)]
        if not aborted or attempt:
            return list(zip(codes, outs, strict=True))
        _warn_rerun(aborted[0])
    raise AssertionError("unreachable")


@pytest.mark.slow
def test_two_nodes_without_a_shared_directory_reach_rank_0(tmp_path: Path) -> None:
    # Two "nodes" on loopback, each under its own watch with its own run directory: rank 1's
    # store reaches rank 0's directory through the process group, and the report groups by node.
    runs = [tmp_path / f"node{node}" for node in (0, 1)]

    def cmds() -> list[list[str]]:
        port = _free_port()
        for run in runs:
            shutil.rmtree(run, ignore_errors=True)
        return [[sys.executable, "-m", "stepscope", "watch", "--out", str(run), "--",
                 str(BIN / "torchrun"), "--nnodes", "2", "--node-rank", str(node),
                 "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-id", "i14",
                 "--rdzv-endpoint", f"127.0.0.1:{port}", str(SCRIPTS / "ddp_tutorial.py")]
                for node, run in enumerate(runs)]

    ended = _run_nodes(cmds, tmp_path, {**os.environ, "EPOCHS": "1"})
    assert [code for code, _ in ended] == [0, 0], "\n".join(
        _teardown_lines(out) + "\n" + out[-3000:] for _, out in ended)
    # The rendezvous numbers the nodes as they arrive: find the node that got rank 0.
    def ranks_seen(run: Path) -> list[int]:
        with RunReader(run) as r:
            return list(r.facts()["watch.ranks"].value)

    assert sorted(ranks_seen(runs[0]) + ranks_seen(runs[1])) == [0, 1]
    home = next(r for r in runs if ranks_seen(r) == [0])
    assert (home / "run.rank1.db").is_file()  # sent by rank 1 at the group's teardown
    s = json.loads((home / "summary.json").read_text())
    assert [r["rank"] for r in s["ranks"]] == [0, 1]
    assert [len(n["ranks"]) for n in s["distributed"]["nodes"]] == [1, 1]
    assert {n["node_rank"] for n in s["distributed"]["nodes"]} == {0, 1}
    assert all(r["steps_compared"] > 0 for r in s["ranks"])
    # The other node's own report does not take its launcher for rank 0.
    other = json.loads((runs[runs.index(home) - 1] / "summary.json").read_text())
    assert [r["rank"] for r in other.get("ranks") or []] in ([], [1])


LAST_OWNER = """
import time, torch, torch.distributed as dist
from stepscope.observe.inject.stepscope_watch_dist import ArrivalTimer

dist.init_process_group("gloo")
group = dist.new_group([0, 1])
t = torch.ones(4)
if dist.get_rank() == 1:
    time.sleep(1.0)  # rank 0's all-reduce completes only now, on its gloo worker thread
    dist.all_reduce(t, group=group)
else:
    state = [ArrivalTimer(None, group)]  # what watch's DDP comm hook holds

    def bucket_done(fut):  # as watch's callback: the last reference to its state goes here
        state.clear()
        return fut.value()

    work = dist.all_reduce(t, group=group, async_op=True)
    reduced = work.get_future().then(bucket_done)
    dist.destroy_process_group(group)  # the script is done with the group and lets go of it
    del group, work
    reduced.wait()
dist.barrier()
dist.destroy_process_group()
print("ended in order")
"""


def test_the_comm_hooks_state_never_frees_the_process_group_on_its_own_thread(
        tmp_path: Path) -> None:
    # Planted: the script has destroyed the group and let go of it while a bucket's callback is
    # still to run on the group's gloo worker thread, which then drops the hook's state. Were
    # the state an owner of the group, ~ProcessGroupGloo would join its own thread there:
    # std::terminate ("Resource deadlock avoided"), SIGABRT after the job's last step.
    script = tmp_path / "last_owner.py"
    script.write_text(LAST_OWNER)
    res = subprocess.run([str(BIN / "torchrun"), "--nproc-per-node", "2", str(script)],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONWARNINGS": "ignore"})
    out = res.stdout + res.stderr
    assert res.returncode == 0 and "terminate called" not in out, out[-3000:]
    assert out.count("ended in order") == 2


def test_finishing_the_hub_leaves_no_thread_behind(tmp_path: Path) -> None:
    # watch runs in-process in the CLI and in notebooks: its listener must not outlive it.
    import threading

    from stepscope.observe.watch_ranks import RankHub
    from stepscope.store.db import RunWriter
    from stepscope.store.records import RunInfo

    writer = RunWriter(tmp_path, RunInfo(name="hub", command="test", kind="watch"))
    hub = RankHub(tmp_path, writer, lambda *a: None, RunInfo(name="hub", command="test"), 1.0)
    hub.start()
    hub.finish(0.0, drain_s=1.0)
    writer.close()
    left = [t.name for t in threading.enumerate() if t.name.startswith("stepscope-rank")]
    assert left == []
