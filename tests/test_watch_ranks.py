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
from pathlib import Path
from typing import Any

import pytest

from stepscope.observe.watch_ranks import Rank, RankEnd, first_failure, parse_exit_code, rank_status
from stepscope.store.db import RunReader

# Its ranks are timed against each other on shared cores: make test runs it after the nice-10
# lane (scripts/run-tests).
pytestmark = pytest.mark.alone

SCRIPTS = Path(__file__).parent / "watch_scripts"
BIN = Path(sys.executable).parent
SLOW_S = "0.08"
ABORTED_TEARDOWN = "terminate called without an active exception"


def _watch(tmp_path: Path, launcher: list[str], script: str, **env: str
           ) -> tuple[subprocess.CompletedProcess[str], Path, dict[str, Any]]:
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "stepscope", "watch", "--out", str(run), "--",
           *launcher, str(SCRIPTS / script)]
    full_env = {**os.environ, "PYTHONWARNINGS": "ignore", **env}
    for _ in range(2):
        res = subprocess.run(cmd, cwd=tmp_path, env=full_env, capture_output=True, text=True,
                             timeout=600)
        # One rehearsal's rank aborted in the C++ teardown after all 40 of its steps
        # (std::terminate on a joinable thread, SIGABRT; gloo's exit has such races, e.g.
        # pytorch#190489). Not seen again in 76 runs here (36 watched, 40 bare), so not shown to
        # be watch's: the run is made once more and says so, since what is asserted is the
        # job's record, not torch's exit. (The abort itself is reported right: "rank 1 failed
        # first: killed by signal 6".)
        if ABORTED_TEARDOWN not in res.stderr:
            break
        print(f"a rank aborted in torch's teardown; run again: {res.stderr[-500:]}")
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


@pytest.mark.slow
def test_two_nodes_without_a_shared_directory_reach_rank_0(tmp_path: Path) -> None:
    # Two "nodes" on loopback, each under its own watch with its own run directory: rank 1's
    # store reaches rank 0's directory through the process group, and the report groups by node.
    port = _free_port()
    procs, runs = [], []
    for node in (0, 1):
        run = tmp_path / f"node{node}"
        runs.append(run)
        cmd = [sys.executable, "-m", "stepscope", "watch", "--out", str(run), "--",
               str(BIN / "torchrun"), "--nnodes", "2", "--node-rank", str(node),
               "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-id", "i14",
               "--rdzv-endpoint", f"127.0.0.1:{port}", str(SCRIPTS / "ddp_tutorial.py")]
        procs.append(subprocess.Popen(cmd, cwd=tmp_path, env={**os.environ, "EPOCHS": "1"},
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
    outs = [p.communicate(timeout=600)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs[0][-3000:] + outs[1][-3000:]
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
