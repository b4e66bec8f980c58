"""Does ``stepscope watch`` change a job's share of a contended CPU? Its session, measured.

``watch`` starts the command in a session of its own (``start_new_session``), so that Ctrl-C and
the final cleanup reach every process the command starts. Where the kernel's autogroup is on
(``/proc/sys/kernel/sched_autogroup_enabled``, the default of most distributions), the
scheduler shares a CPU between sessions first and between a session's threads second. So a job
that competes for its cores with other work started from the same session (the same shell) gets
one session's share under ``watch``, and one thread's share without it.

A fixed CPU-bound job (a pure-Python loop, one thread) runs on one core beside ``--hogs`` busy
loops pinned to the same core and started from this bench's session, four ways in turn each
round: in this session, in a session of its own (``setsid``), under ``stepscope watch``, and
alone (no loops). Its wall time against its CPU time is the share of the core it got.

Usage:
    PYTHONPATH=src .venv/bin/python bench/watch_session_share.py [--rounds 3] [--hogs 3]

The last line is one JSON object: the median share of the core each way, and autogroup's
setting.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

JOB = """
import time
t, c = time.perf_counter(), time.process_time()
x = 0
for i in range(20_000_000):
    x += i
print("SHARE", (time.process_time() - c) / (time.perf_counter() - t))
"""


def _share(cmd: list[str], new_session: bool = False) -> float:
    out = subprocess.run(cmd, capture_output=True, text=True, check=True,
                         start_new_session=new_session).stdout
    return float(next(line for line in out.splitlines() if line.startswith("SHARE")).split()[1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--hogs", type=int, default=3, help="busy loops on the job's core")
    ap.add_argument("--core", type=int, default=0)
    args = ap.parse_args()

    autogroup = Path("/proc/sys/kernel/sched_autogroup_enabled")
    setting = autogroup.read_text().strip() if autogroup.exists() else "absent"
    pin = ["taskset", "-c", str(args.core)]
    with tempfile.TemporaryDirectory() as tmp:
        job = Path(tmp) / "job.py"
        job.write_text(JOB)
        plain = [*pin, sys.executable, str(job)]
        ways: dict[str, list[float]] = {"same session": [], "own session": [], "under watch": [],
                                        "alone": []}
        for r in range(args.rounds):
            hogs = [subprocess.Popen([*pin, sys.executable, "-c", "while True: pass"])
                    for _ in range(args.hogs)]
            try:
                ways["same session"].append(_share(plain))
                ways["own session"].append(_share(plain, new_session=True))
                run = Path(tmp) / f"run{r}"
                ways["under watch"].append(_share(
                    [*pin, sys.executable, "-m", "stepscope", "watch", "--out", str(run), "--",
                     sys.executable, str(job)]))
            finally:
                for h in hogs:
                    h.kill()
                    h.wait()
            ways["alone"].append(_share(plain))
            print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.2f}" for k, v in ways.items()),
                  flush=True)
    med = {k: round(statistics.median(v), 3) for k, v in ways.items()}
    print(f"autogroup {setting}; the job's share of its core beside {args.hogs} busy loops "
          f"(median of {args.rounds}): " + ", ".join(f"{k} {v:.2f}" for k, v in med.items()))
    print(json.dumps({"figure": "watch_session_share", "autogroup": setting, "hogs": args.hogs,
                      "rounds": args.rounds, "share": med,
                      "spread": {k: [round(min(v), 3), round(max(v), 3)]
                                 for k, v in ways.items()}}))


if __name__ == "__main__":
    main()
