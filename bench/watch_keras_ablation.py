"""Where does ``stepscope watch``'s cost on a Keras/TensorFlow script go? An ablation.

Runs ``watch_keras_overhead.py``'s small CNN bare, watched, and watched with parts of the
Keras/TensorFlow instrumentation left out, rotating the order every round so host drift hits
all arms alike. The parts are left out in a temporary copy of ``src/`` (switches read from the
``ABL`` environment variable are patched into the copy; the product has no such switch):

- ``end``: each step's graph-end clock (``_ends_clocked`` returns the step function as is, and
  ``clock_function_ends``, the fallback that clocks any traced function that fetched, is not
  installed: until 2026-12-06 it was, so an ``end`` arm before then still clocked the end);
- ``fetch``: the fetch clock on ``tf.data`` iterators (``clock_fetches`` not installed);
- ``calls``: the graph-call timer (``time_graph_calls`` not installed);
- ``keras``: every Keras hook (the ``keras`` import hook returns at once): what is left is the
  watching parent, the injected ``sitecustomize`` and the framework-neutral hooks, among them
  the ``tensorflow`` import hook's process clock for hand-written loops, which clocks Keras's
  fetches and (``clock_function_ends``) its train function's end too: this arm keeps both graph
  clocks (``keras,end,fetch`` takes them out as well);
- ``pool``: PyDataset worker timing; ``gil``: the loop thread's GIL clocks;
- ``record``: the loop's step windows (``KerasSteps.batch_begin`` returns at once: no step is
  closed, settled or sent; the phases still are);
- ``nice``: not a part left out but watch's parent (its threads and its autogroup) run at
  nice 19 from the child's start, so that it takes a core the job's threads want only when
  neither wants it;
- ``control``: not an ablation but a second bare run in the same rotation, so each round shows
  how far two bare runs read apart beside what watching costs.
- ``src=PATH``: not an ablation but the whole watch from another source tree (its ``src/``,
  e.g. of a ``git worktree add /tmp/old HEAD~1``), its parent a Python process of its own:
  two commits side by side in one rotation. ``src=`` with this checkout's ``src/`` is that
  arm's control (the parent out of this process).

A patch whose anchor text is gone (the code moved on) stops the bench with the anchor named.

Usage:
    .venv/bin/python bench/watch_keras_ablation.py [--rounds 6] [--input pydataset|tfdata]
        [--backend tensorflow|jax|torch]
        [--arms control end end,fetch,calls keras pool,gil nice record src=/tmp/old/src]
        [--epochs 4] [--cpus 1] [--image-px 64]
    .venv/bin/python bench/watch_keras_ablation.py --pool RUN1.log RUN2.log [...]

The bare arm's throughput is printed each round: on a host whose bare runs swing by more than a
few per cent, a single round says nothing. With ``control`` among the arms, each arm is also
set against both bare runs of each round, pooled over the rounds two ways: the mean log ratio
(±2 standard errors) and the median with its distribution-free 95 % interval, which a minority
of rounds caught in one of the host's slow phases does not move; both for each run's best
epoch and for its fast epochs' median. Last, every arm's fast epochs (those at or over
``SLOW_PHASE`` of the bench's fastest) pooled over all rounds, against the bare runs', with a
95 % interval from resampling whole rounds: the figure that uses every fast epoch, where the
per-round ones lose a round whenever one of its runs was slowed whole. ``--cpus 1`` confines
every run, and watch's parent, to one core: TensorFlow then runs one intra-op thread, so only
that core's slow phases hit a run, and the parent's sampling competes with the training for it
(the cost a job pays when it has no core to spare). Each arm's median step over its fast
epochs is split into its graph calls (the script times ``Context.call_function``; the graph
clocks' ops are in there) and the rest (the Keras loop's Python, watch's hooks). Each arm's
training-process CPU per image and its loop thread's CPU a training step (``time.thread_time``
in the script's epoch callbacks, which Keras calls on the loop's thread; each run's leanest
epoch after the first) are set against bare's: the direct cost, on the thread that paces a
Keras step to ~±15 us a step, where a whole run reads ±1 %. ``--steps 1200 --epochs 2`` makes
that epoch long. The last line is one JSON object, with every arm's epochs (img/s) for a second
look.

``--pool`` runs nothing: it pools earlier runs (each one's saved output, made with ``control``
among the arms and the same input, epochs, cores and image side). On this host the same code
read 0.965 (±2 SE 0.949-0.980) in one run and 0.983-0.986 in two others an hour or two later:
the host's state between runs moves the figure about as much as one run's interval, which so
overstates what is known. Pooled two ways, on each round's best epochs: every round of every
run as if independent (±2 SE: what one long run would claim), and over the runs (each run's
mean; a Student-t 95 % interval from how far the runs' means lie apart, k-1 degrees of freedom:
the host's state between runs counted as the noise it is). Beside it the control against the
first bare run, the same two ways: how far two bare runs read apart, the null.
And each round's fast epochs (its ``fast epochs`` figure), rounds pooled (±2 SE): a round
slowed whole leaves that figure, where it drags its best epoch.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
INJECT = Path("stepscope/observe/inject")

# (file under src/, anchor text, replacement): each inserts one ABL switch.
PATCHES = [
    (INJECT / "stepscope_watch_keras_backends.py",
     '    """``fn``, a step\'s function traced into a graph, with the end of its work clocked."""\n',
     '    """``fn``, a step\'s function traced into a graph, with the end of its work clocked."""\n'
     '    import os\n    if "end" in os.environ.get("ABL", ""):\n        return fn\n'),
    (INJECT / "stepscope_watch_keras_clock.py",
     "        clock_fetches(tf, clock, now)\n",
     '        import os\n        if "fetch" not in os.environ.get("ABL", ""):\n'
     "            clock_fetches(tf, clock, now)\n"),
    # the fallback that clocks the end of any traced function that fetched (a hand-written
    # loop's, and Keras's train function where _ends_clocked did not): ``end`` takes it out too
    (INJECT / "stepscope_watch_keras_clock.py",
     "        clock_function_ends(tf, func_graph, clock)\n",
     '        if "end" not in os.environ.get("ABL", ""):\n'
     "            clock_function_ends(tf, func_graph, clock)\n"),
    (INJECT / "stepscope_watch_keras_backends.py",
     "    time_graph_calls(steps)\n    _time_epoch_end(steps)\n    # Each step",
     '    import os\n    if "calls" not in os.environ.get("ABL", ""):\n'
     "        time_graph_calls(steps)\n    _time_epoch_end(steps)\n    # Each step"),
    (INJECT / "sitecustomize.py",
     '    def keras_hook(module: object) -> None:\n        imported("keras")\n',
     '    def keras_hook(module: object) -> None:\n        imported("keras")\n'
     '        if "keras" in os.environ.get("ABL", ""):\n            return\n'),
    (INJECT / "stepscope_watch_keras.py",
     '    _time_pool_workers(rec, "keras.src.trainers.data_adapters.py_dataset_adapter", '
     "count_images)\n",
     '    import os\n    if "pool" not in os.environ.get("ABL", ""):\n'
     '        _time_pool_workers(rec, "keras.src.trainers.data_adapters.py_dataset_adapter", '
     "count_images)\n"),
    (INJECT / "stepscope_watch_keras.py",
     "    if not (in_process or (kind == \"tf.data\" and py_funcs_made())):\n",
     "    import os\n    if \"gil\" in os.environ.get(\"ABL\", \"\") or not (in_process or (\n"
     "            kind == \"tf.data\" and py_funcs_made())):\n"),
    (Path("stepscope/observe/watch.py"),
     "        os.close(write_fd)  # only the child (and its forks) may hold the write end\n",
     "        os.close(write_fd)  # only the child (and its forks) may hold the write end\n"
     '    if "nice" in os.environ.get("ABL", ""):\n'
     "        os.setpriority(os.PRIO_PROCESS, 0, 19)\n"
     '        with open("/proc/self/autogroup", "w") as f:\n'
     '            f.write("19")\n'),
    (INJECT / "stepscope_watch_keras_steps.py",
     'KERAS_STAGES_SEQ = "keras_stages.seq."',
     '_ABL_RECORD = "record" in __import__("os").environ.get("ABL", "")\n'
     'KERAS_STAGES_SEQ = "keras_stages.seq."'),
    (INJECT / "stepscope_watch_keras_steps.py",
     "    def batch_begin(self, batch: int) -> None:\n",
     "    def batch_begin(self, batch: int) -> None:\n        if _ABL_RECORD:\n            return\n"),
]


def patched_src(dest: Path) -> Path:
    """A copy of ``src/`` with the ABL switches in; SystemExit naming a vanished anchor."""
    src = dest / "src"
    shutil.copytree(ROOT / "src", src, ignore=shutil.ignore_patterns("__pycache__"))
    for rel, anchor, new in PATCHES:
        path = src / rel
        text = path.read_text()
        if text.count(anchor) != 1:
            raise SystemExit(f"{rel}: the ablation's anchor is gone or not unique: {anchor!r}")
        path.write_text(text.replace(anchor, new))
    return src


def _median_interval(xs: list[float]) -> tuple[float, float]:
    """The 95 % distribution-free interval of the median: the order statistics k and n+1-k for
    the largest k with P(Binomial(n, 1/2) < k) <= 2.5 %; the whole range when n < 6."""
    s, n = sorted(xs), len(xs)
    k = 0
    while sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n <= 0.025:
        k += 1
    return (s[k - 1], s[n - k]) if k > 0 else (s[0], s[-1])


# An epoch under this share of its round's fastest ran in one of the slowed phases below.
SLOW_PHASE = 0.75


def _arm_name(arm: str, control: str = "control") -> str:
    """How an arm is named in the output: the watch, the control, what it leaves out."""
    if arm == "nice":
        return "parent at nice 19"
    if _niced(arm):  # combined, as "nice,end"
        return "parent at nice 19, without " + ",".join(p for p in arm.split(",") if p != "nice")
    if arm.startswith("src="):
        return f"watch from {arm[4:]}"
    return {"": "watch", "control": control}.get(arm, f"without {arm}")


def _against_bare_run(label: str, series: dict[str, list[float]],
                      arms: list[str]) -> dict[str, float]:
    """Each arm's figure over the bare run of its round: the median (and range) printed under
    ``label``, and the medians by arm name."""
    out: dict[str, float] = {}
    for a in arms[1:]:
        ratios = [x / b for x, b in zip(series[a], series["bare"], strict=True)]
        name = _arm_name(a, "control (bare)")
        print(f"{name}: {label} median {statistics.median(ratios):.3f} "
              f"({min(ratios):.3f}-{max(ratios):.3f})")
        out[name] = round(statistics.median(ratios), 4)
    return out


def _niced(arm: str) -> bool:
    """Whether ``arm`` runs watch's parent (this process) at nice 19: the ABL switches are read
    by substring, as in ``nice,end``; a ``src=`` arm's parent is a process of its own."""
    return "nice" in arm and not arm.startswith("src=")


def _fast(img_s: float, top: float) -> bool:
    """An epoch at or over ``SLOW_PHASE`` of ``top`` (the round's or the bench's fastest)."""
    return img_s >= SLOW_PHASE * top


def _fast_medians(epochs: dict[str, list[float]]) -> dict[str, float | None]:
    """Each arm's median epoch among its round's fast ones (None: every epoch slowed).

    Runs here have phases, seconds to a minute long, at about half speed, bare and watched
    alike: an epoch caught in one reads ~0.5 of the others, and a run may be caught whole. On
    the tf.data CNN the time is lost outside the graph calls, on the Keras loop's Python side
    (2026-12-04, 20 slowed epochs of 80: a step's graph calls 3.6-4.2 ms in fast and slowed
    epochs alike, the rest 0.63-0.78 ms in fast ones and 3.9-4.8 ms in slowed ones; the split
    below prints it for every run); a pure Python loop pinned to one
    core shows half-speed phases too; the cause is not found. Watching costs a few per cent,
    far from half, so an epoch under ``SLOW_PHASE`` of the round's fastest is not watching's,
    in any arm, and is left out."""
    top = max(max(v) for v in epochs.values())
    return {a: statistics.median(fast) if (fast := [e for e in v if _fast(e, top)])
            else None for a, v in epochs.items()}


def _mean_half(logs: list[float], se: float = 2.0) -> tuple[float, float]:
    """The mean of log ratios and ``se`` standard errors of it, the values taken as independent."""
    mean = statistics.mean(logs)
    return mean, se * statistics.stdev(logs) / math.sqrt(len(logs)) if len(logs) > 1 else math.inf


def _vs_both(x: float, bare: float, control: float) -> float:
    """log(an arm's figure ÷ the geometric mean of its round's two bare runs)."""
    return math.log(x / math.sqrt(bare * control))


def _against_bare(key: str, how: str, xs: list[float | None], bare: list[float | None],
                  control: list[float | None]) -> dict[str, object]:
    """One arm against both bare runs of each round (their geometric mean), pooled two ways:
    the mean log ratio with ±2 standard errors, and the median with its distribution-free 95 %
    interval, which a minority of rounds caught in a slowed phase does not move. Rounds with a
    run that has no figure are left out, and counted."""
    logs = [_vs_both(x, b, c) for x, b, c in zip(xs, bare, control, strict=True)
            if x is not None and b is not None and c is not None]
    if not logs:
        print(f"{key} / both bare runs ({how}): no round with a figure for all three")
        return {}
    mean, half = _mean_half(logs)
    med = statistics.median(logs)
    lo, hi = _median_interval(logs)
    print(f"{key} / both bare runs ({how}): mean {math.exp(mean):.3f} "
          f"(±2 SE {math.exp(mean - half):.3f}-{math.exp(mean + half):.3f}); "
          f"median {math.exp(med):.3f} (95 % {math.exp(lo):.3f}-{math.exp(hi):.3f}); "
          f"under them in {sum(x < 0 for x in logs)} of {len(logs)} rounds"
          + (f" ({len(xs) - len(logs)} left out)" if len(logs) < len(xs) else ""))
    name = f"{key} / bare runs" + ("" if how == "best epoch" else f", {how}")
    return {name: round(math.exp(mean), 4),
            f"{name}, 2 SE": [round(math.exp(mean - half), 4), round(math.exp(mean + half), 4)],
            f"{name}, median": round(math.exp(med), 4),
            f"{name}, median 95 %": [round(math.exp(lo), 4), round(math.exp(hi), 4)],
            f"{name}, rounds": [round(math.exp(x), 4) for x in logs]}


def _fast_epochs(runs: list[dict[str, Any]], top: float) -> list[float]:
    """A run's epochs (img/s) at or over ``SLOW_PHASE`` of ``top``, the fastest of the bench."""
    return [e for o in runs for e in o["epochs_img_s"] if _fast(e, top)]


def _pooled_fast(name: str, arm: list[list[float]], bare: list[list[float]]) -> dict[str, object]:
    """Median fast epoch of an arm ÷ that of the bare runs, every round's fast epochs pooled
    (a round need not have fast epochs in every arm), with a 95 % interval from resampling
    whole rounds: the epochs of one run are not independent."""
    a, b = [e for r in arm for e in r], [e for r in bare for e in r]
    if not a or not b:
        print(f"{name} / bare runs, pooled fast epochs: none to compare")
        return {}
    ratio = statistics.median(a) / statistics.median(b)
    rng, boot = random.Random(0), []
    for _ in range(2000):
        idx = [rng.randrange(len(arm)) for _ in arm]
        ra, rb = [e for i in idx for e in arm[i]], [e for i in idx for e in bare[i]]
        if ra and rb:
            boot.append(statistics.median(ra) / statistics.median(rb))
    boot.sort()
    lo, hi = boot[int(0.025 * len(boot))], boot[int(0.975 * len(boot)) - 1]
    print(f"{name} / bare runs, pooled fast epochs: {ratio:.3f} (95 % {lo:.3f}-{hi:.3f}; "
          f"{len(a)} epochs against {len(b)})")
    key = f"{name} / bare runs, pooled fast epochs"
    return {key: round(ratio, 4), f"{key}, 95 %": [round(lo, 4), round(hi, 4)],
            f"{key}, epochs": [len(a), len(b)]}


def _step_split(runs: list[dict[str, Any]], top: float,
                slowed: bool = False) -> tuple[float, float] | None:
    """Median µs a step in the graph calls and outside them (the Keras loop's Python, watch's
    hooks), over the runs' fast epochs (``slowed``: the others); None where there are none or
    the script did not time them (not TensorFlow)."""
    graph, outside = [], []
    for o in runs:
        for e, step, g in zip(o["epochs_img_s"], o.get("epochs_step_us", []),
                              o.get("epochs_graph_us", []), strict=False):
            if _fast(e, top) != slowed:
                graph.append(g)
                outside.append(step - g)
    return (statistics.median(graph), statistics.median(outside)) if graph else None


def _img_s(x: float | None) -> str:
    return "slowed" if x is None else f"{x:.0f}"


# ---------------------------------------------------------------- several runs pooled

# Student's t, 97.5th percentile, by degrees of freedom (over 30: 2.0, a little wide).
T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
        2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
        2.060, 2.056, 2.052, 2.048, 2.045, 2.042]
SETTINGS = ("backend", "input", "epochs", "cpus", "image_px")


def _t975(df: int) -> float:
    return T975[df - 1] if df <= len(T975) else 2.0


def _load(path: Path) -> dict[str, Any]:
    lines = [ln for ln in path.read_text().splitlines() if ln.startswith("{")]
    if not lines:
        sys.exit(f"{path}: no JSON line; pass what this bench printed (its last line is the JSON)")
    run: dict[str, Any] = json.loads(lines[-1])
    if run.get("figure") != "watch_keras_ablation" or "control" not in run.get("epochs_img_s", {}):
        sys.exit(f"{path}: not a watch_keras_ablation run with a control arm (--arms control)")
    if not run["epochs_img_s"]["control"]:
        sys.exit(f"{path}: a run of no rounds")
    run.setdefault("image_px", 32)  # runs before --image-px ran 32 px
    run.setdefault("backend", "tensorflow")  # and before --backend, on TensorFlow
    return run


def _round_logs(run: dict[str, Any]) -> tuple[list[float], list[float]]:
    """Per round: log(watch ÷ both bare runs) and log(control ÷ bare), on each run's best epoch."""
    e = run["epochs_img_s"]
    watch, null = [], []
    for w, b, c in zip(e["watch"], e["bare"], e["control"], strict=True):
        bw, bb, bc = max(w), max(b), max(c)
        watch.append(_vs_both(bw, bb, bc))
        null.append(math.log(bc / bb))
    return watch, null


def _ratios(mean: float, half: float) -> tuple[float, float, float]:
    """(mean, low, high) as ratios, from logs."""
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


def _rounds(logs: list[float]) -> tuple[float, float, float]:
    """±2 SE, rounds taken as independent."""
    return _ratios(*_mean_half(logs))


def _runs(means: list[float]) -> tuple[float, float, float]:
    """Over the runs' means (logs), Student-t 95 %."""
    return _ratios(*_mean_half(means, _t975(len(means) - 1)))


def _fmt(name: str, x: tuple[float, float, float]) -> str:
    return f"{name} {x[0]:.3f} ({x[1]:.3f}-{x[2]:.3f})"


def pool(logs: list[Path]) -> None:
    """Several runs' logs pooled by round and by run (``--pool``); prints the JSON line."""
    runs = [_load(p) for p in logs]
    for key in SETTINGS:
        if len({str(r.get(key)) for r in runs}) > 1:
            sys.exit(f"the runs differ in {key}: {[r.get(key) for r in runs]}; pool like with like")
    all_watch: list[float] = []
    all_null: list[float] = []
    watch_means, null_means, fast_means = [], [], []
    per_run = []
    for path, run in zip(logs, runs, strict=True):
        watch, null = _round_logs(run)
        all_watch += watch
        all_null += null
        watch_means.append(statistics.mean(watch))
        null_means.append(statistics.mean(null))
        fast = run.get("watch / bare runs, pooled fast epochs")
        if fast is not None:
            fast_means.append(math.log(fast))
        per_run.append({"log": path.name, "rounds": len(watch),
                        "watch / bare runs": round(math.exp(watch_means[-1]), 4),
                        "control / bare": round(math.exp(null_means[-1]), 4),
                        "watch / bare runs, pooled fast epochs": fast})
        print(f"{path.name}: {len(watch)} rounds; watch / both bare runs "
              f"{math.exp(watch_means[-1]):.3f}, control / bare {math.exp(null_means[-1]):.3f}"
              + (f", pooled fast epochs {fast:.3f}" if fast is not None else ""))
    result: dict[str, object] = {"figure": "watch_keras_pool", "runs": len(runs),
                                 "rounds": len(all_watch),
                                 **{k: runs[0].get(k) for k in SETTINGS}, "per_run": per_run}
    for name, xs, means in (("watch / bare runs", all_watch, watch_means),
                            ("control / bare", all_null, null_means)):
        by_rounds, by_runs = _rounds(xs), _runs(means)
        print(f"{name}: " + _fmt("rounds pooled", by_rounds) + "; "
              + _fmt(f"over {len(means)} runs (t 95 %)", by_runs))
        result[f"{name}, rounds pooled"] = [round(x, 4) for x in by_rounds]
        result[f"{name}, over runs"] = [round(x, 4) for x in by_runs]
    # each round's fast epochs' median against both bare runs' (rounds with fast epochs in
    # every run): a round slowed whole leaves it, where it drags the best-epoch figure
    fast_rounds = [math.log(x) for run in runs
                   for x in run.get("watch / bare runs, fast epochs, rounds", [])]
    if len(fast_rounds) >= 2:
        by_rounds = _rounds(fast_rounds)
        print(_fmt(f"watch / bare runs, fast epochs, {len(fast_rounds)} rounds pooled (±2 SE)",
                   by_rounds))
        result["watch / bare runs, fast epochs, rounds pooled"] = [round(x, 4) for x in by_rounds]
    if len(fast_means) >= 2:
        fast_runs = _runs(fast_means)
        print(_fmt(f"watch / bare runs, pooled fast epochs, over {len(fast_means)} runs (t 95 %)",
                   fast_runs))
        result["watch / bare runs, pooled fast epochs, over runs"] = [round(x, 4) for x in fast_runs]
    print(json.dumps(result))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6, help="rounds (each runs every arm)")
    parser.add_argument("--steps", type=int, default=150, help="training steps per epoch")
    parser.add_argument("--input", choices=("pydataset", "tfdata"), default="pydataset")
    parser.add_argument("--backend", choices=("tensorflow", "jax", "torch"),
                        default="tensorflow",
                        help="KERAS_BACKEND of the script; the ablation switches are "
                             "TensorFlow's, so on the others run the whole watch with control "
                             "(and src=) arms")
    parser.add_argument("--arms", nargs="+", default=["end", "end,fetch,calls", "keras"],
                        help="ABL sets to run beside bare and the whole watch")
    parser.add_argument("--epochs", type=int, default=4,
                        help="epochs per run; those after the first are compared")
    parser.add_argument("--cpus", type=str, default=None,
                        help="run every arm on these cores only, e.g. '1' (the watching parent "
                             "then shares the training's cores)")
    parser.add_argument("--image-px", type=int, default=32,
                        help="the CNN's image side: 64 makes each step ~4x the compute (a fixed "
                             "cost a step would then weigh ~a quarter as much)")
    parser.add_argument("--pool", nargs="+", type=Path, metavar="LOG",
                        help="run nothing: pool these earlier runs' outputs (two or more, each "
                             "with a control arm) by round and by run")
    args = parser.parse_args()
    if args.pool is not None:
        if len(args.pool) < 2:
            parser.error("--pool needs two or more runs: one run's own interval is what a run "
                         "prints")
        pool(args.pool)
        return
    if args.epochs < 2:
        parser.error("--epochs must be at least 2: the first epoch traces and is not compared")
    if args.input == "tfdata" and args.backend != "tensorflow":
        parser.error("--input tfdata runs on --backend tensorflow only")
    if args.backend != "tensorflow" and (
            odd := [a for a in args.arms if a != "control" and not a.startswith("src=")]):
        parser.error(f"--arms {' '.join(odd)}: the ablation switches leave out TensorFlow's "
                     f"hooks; on {args.backend} run control and src= arms")
    for tree in (a[4:] for a in args.arms if a.startswith("src=")):
        if not (Path(tree) / "stepscope" / "observe" / "watch.py").is_file():
            parser.error(f"src={tree}: not a stepscope source tree (no stepscope/observe/"
                         "watch.py under it); give a checkout's src/, e.g. of `git worktree "
                         "add /tmp/old HEAD~1`")
    if any(_niced(a) for a in args.arms) and os.geteuid() != 0:
        parser.error("the nice arm needs root: this process is watch's parent and is set back "
                     "to nice 0 after each of its runs, which only root may do")
    if args.cpus is not None:
        # Children inherit the affinity: bare, watched and watch's parent alike.
        os.sched_setaffinity(0, {int(c) for c in args.cpus.split(",")})
    with tempfile.TemporaryDirectory(prefix="stepscope-keras-ablation-") as tmp:
        work = Path(tmp)
        src = patched_src(work)
        # The patched copy is what this process (watch's parent) and the child import.
        sys.path.insert(0, str(src))
        os.environ["PYTHONPATH"] = os.pathsep.join(
            [str(src), *filter(None, [os.environ.get("PYTHONPATH")])])
        sys.path.insert(0, str(Path(__file__).parent))
        import watch_keras_overhead as bench

        script = bench.write_script(work)
        arms = ["bare", "", *args.arms]
        fast: dict[str, list[float | None]] = {a: [] for a in arms}
        runs: dict[str, list[dict[str, Any]]] = {a: [] for a in arms}
        for r in range(args.rounds):
            epochs: dict[str, list[float]] = {}
            for a in arms[r % len(arms):] + arms[:r % len(arms)]:
                watched = a not in ("bare", "control")
                tree = a[4:] if a.startswith("src=") else None
                if watched and tree is None:
                    os.environ["ABL"] = a
                out = bench._run(script, work, r * 100 + arms.index(a), watched,
                                 args.steps, 1.0, args.input, backend=args.backend,
                                 epochs=args.epochs, px=args.image_px, tree=tree)
                os.environ.pop("ABL", None)
                if _niced(a):  # this process was watch's parent: back to the bare runs' nice
                    os.setpriority(os.PRIO_PROCESS, 0, 0)
                    Path("/proc/self/autogroup").write_text("0")
                runs[a].append(out)
                epochs[a] = out["epochs_img_s"]
            for a, m in _fast_medians(epochs).items():
                fast[a].append(m)
            print(f"round {r}: " + ", ".join(
                f"{a or 'watch'} {runs[a][-1]['images_per_s']:.0f} ({_img_s(fast[a][-1])})" for a in arms)
                + f" img/s, best epoch (fast epochs' median); load {os.getloadavg()[0]:.1f}",
                file=sys.stderr, flush=True)
    # each run's best epoch, img/s
    rates = {a: [float(o["images_per_s"]) for o in runs[a]] for a in arms}
    result: dict[str, object] = {"figure": "watch_keras_ablation", "backend": args.backend,
                                 "input": args.input,
                                 "runs": args.rounds, "epochs": args.epochs,
                                 "cpus": args.cpus, "image_px": args.image_px,
                                 "bare_img_s": [round(x) for x in rates["bare"]]}
    result.update(_against_bare_run("watched/bare", rates, arms))
    # The training process's own CPU per image (each run's leanest epoch after the first):
    # the direct cost, which the host's slowed phases move less than the wall clock.
    cpu = {a: [float(o["cpu_s_per_image"]) for o in runs[a]] for a in arms}
    result.update({f"{name}, CPU per image": ratio for name, ratio in _against_bare_run(
        "training-process CPU per image / bare's,", cpu, arms).items()})
    # The loop thread's own CPU a training step (each run's leanest epoch): the thread that
    # paces a Keras step, where watch's Python and what the graph runs inline on it land.
    loop = {a: [float(o["loop_cpu_us_per_step"]) for o in runs[a]] for a in arms}
    bare_loop = statistics.median(loop["bare"])
    print(f"bare: the loop thread's CPU a step {bare_loop:.0f} us (median of the runs' leanest "
          f"epochs, {min(loop['bare']):.0f}-{max(loop['bare']):.0f})")
    for a in arms[1:]:
        name = _arm_name(a, "control (bare)")
        got = statistics.median(loop[a])
        print(f"{name}: the loop thread's CPU a step {got:.0f} us "
              f"({min(loop[a]):.0f}-{max(loop[a]):.0f}), {got - bare_loop:+.0f} over bare")
        result[f"{name}, loop thread us a step over bare"] = round(got - bare_loop, 1)
    if "control" in rates:  # watched against the other bare run of the same round
        ratios = [x / c for x, c in zip(rates[""], rates["control"], strict=True)]
        print(f"watch/control median {statistics.median(ratios):.3f} "
              f"({min(ratios):.3f}-{max(ratios):.3f})")
        result["watch / control"] = round(statistics.median(ratios), 4)
        # Against both bare runs of each round (their geometric mean), every arm.
        for a in arms[1:]:
            if a != "control":
                key = _arm_name(a)
                result.update(_against_bare(key, "best epoch", list(rates[a]),
                                            list(rates["bare"]), list(rates["control"])))
                result.update(_against_bare(key, "fast epochs", fast[a], fast["bare"],
                                            fast["control"]))
    # Every arm's fast epochs, pooled over the rounds, against both bare runs' (or bare alone).
    top = max(e for a in arms for o in runs[a] for e in o["epochs_img_s"])
    fast_by_round = {a: [_fast_epochs([o], top) for o in runs[a]] for a in arms}
    print(f"fast epochs (>= {SLOW_PHASE} x the fastest, {top:.0f} img/s): " + ", ".join(
        f"{a or 'watch'} {sum(map(len, fast_by_round[a]))} of "
        f"{sum(len(o['epochs_img_s']) for o in runs[a])}" for a in arms))
    base = [b + c for b, c in zip(fast_by_round["bare"], fast_by_round["control"], strict=True)] \
        if "control" in arms else fast_by_round["bare"]
    for a in arms[1:]:
        name = _arm_name(a)
        result.update(_pooled_fast(name, fast_by_round[a],
                                   fast_by_round["bare"] if a == "control" else base))
    # Where a fast epoch's step goes: in the graph calls (the clocks' ops are there) or outside
    split = {a: _step_split(runs[a], top) for a in arms}
    # the graph calls are timed on TensorFlow only (elsewhere a step would read all "outside")
    if (base_split := split["bare"]) is not None and args.backend == "tensorflow":
        for a in arms:
            if (sp := split[a]) is not None:
                print(f"{a or 'watch'}: a fast epoch's step {sp[0]:.0f} us in the graph calls "
                      f"({sp[0] - base_split[0]:+.0f} against bare), {sp[1]:.0f} us outside "
                      f"({sp[1] - base_split[1]:+.0f})")
        if (slow := _step_split([o for a in arms for o in runs[a]], top, slowed=True)):
            # where a slowed epoch loses its time: in the graph calls or outside them
            print(f"slowed epochs, every arm: a step {slow[0]:.0f} us in the graph calls, "
                  f"{slow[1]:.0f} us outside")
            result["slowed step_us_graph_outside"] = [round(x) for x in slow]
        result["step_us_graph_outside"] = {a or "watch": [round(x) for x in sp]
                                           for a, sp in split.items() if sp is not None}
    result["epochs_img_s"] = {a or "watch": [[round(e) for e in o["epochs_img_s"]]
                                             for o in runs[a]] for a in arms}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
