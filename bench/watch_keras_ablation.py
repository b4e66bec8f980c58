"""Where does ``stepscope watch``'s cost on a Keras/TensorFlow script go? An ablation.

Runs ``watch_keras_overhead.py``'s small CNN bare, watched, and watched with parts of the
Keras/TensorFlow instrumentation left out, rotating the order every round so host drift hits
all arms alike. The parts are left out in a temporary copy of ``src/`` (switches read from the
``ABL`` environment variable are patched into the copy; the product has no such switch):

- ``end``: each step's graph-end clock (``_ends_clocked`` returns the step function as is);
- ``fetch``: the fetch clock on ``tf.data`` iterators (``clock_fetches`` not installed);
- ``calls``: the graph-call timer (``time_graph_calls`` not installed);
- ``keras``: every Keras hook (the ``keras`` import hook returns at once): what is left is the
  watching parent, the injected ``sitecustomize`` and the framework-neutral hooks;
- ``pool``: PyDataset worker timing; ``gil``: the loop thread's GIL clocks;
- ``control``: not an ablation but a second bare run in the same rotation, so each round shows
  how far two bare runs read apart beside what watching costs.

A patch whose anchor text is gone (the code moved on) stops the bench with the anchor named.

Usage:
    .venv/bin/python bench/watch_keras_ablation.py [--rounds 6] [--input pydataset|tfdata]
        [--arms control end end,fetch,calls keras pool,gil]

The bare arm's throughput is printed each round: on a host whose bare runs swing by more than a
few per cent, the round says nothing. The last line is one JSON object (median ratio per arm).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
INJECT = Path("stepscope/observe/inject")

# (file under src/, anchor text, replacement): each inserts one ABL switch.
PATCHES = [
    (INJECT / "stepscope_watch_keras_backends.py",
     '    """``fn``, a step\'s function traced into a graph, with the end of its work clocked."""\n',
     '    """``fn``, a step\'s function traced into a graph, with the end of its work clocked."""\n'
     '    import os\n    if "end" in os.environ.get("ABL", ""):\n        return fn\n'),
    (INJECT / "stepscope_watch_keras_backends.py",
     "        clock_fetches(tf, clock, steps.clock)\n",
     '        import os\n        if "fetch" not in os.environ.get("ABL", ""):\n'
     "            clock_fetches(tf, clock, steps.clock)\n"),
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6, help="rounds (each runs every arm)")
    parser.add_argument("--steps", type=int, default=150, help="training steps per epoch")
    parser.add_argument("--input", choices=("pydataset", "tfdata"), default="pydataset")
    parser.add_argument("--arms", nargs="+", default=["end", "end,fetch,calls", "keras"],
                        help="ABL sets to run beside bare and the whole watch")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="stepscope-keras-ablation-") as tmp:
        work = Path(tmp)
        src = patched_src(work)
        # The patched copy is what this process (watch's parent) and the child import.
        sys.path.insert(0, str(src))
        os.environ["PYTHONPATH"] = os.pathsep.join(
            [str(src), *filter(None, [os.environ.get("PYTHONPATH")])])
        sys.path.insert(0, str(Path(__file__).parent))
        import watch_keras_overhead as bench

        script = work / "keras_small.py"
        script.write_text(bench.SCRIPT)
        arms = ["bare", "", *args.arms]
        rates: dict[str, list[float]] = {a: [] for a in arms}
        for r in range(args.rounds):
            for a in arms[r % len(arms):] + arms[:r % len(arms)]:
                watched = a not in ("bare", "control")
                if watched:
                    os.environ["ABL"] = a
                out = bench._run(script, work, r * 100 + arms.index(a), watched,
                                 args.steps, 1.0, args.input)
                os.environ.pop("ABL", None)
                rates[a].append(out["images_per_s"])
            print(f"round {r}: " + ", ".join(f"{a or 'watch'} {rates[a][-1]:.0f}" for a in arms)
                  + f" img/s; load {os.getloadavg()[0]:.1f}", file=sys.stderr, flush=True)
    result: dict[str, object] = {"figure": "watch_keras_ablation", "input": args.input,
                                 "runs": args.rounds,
                                 "bare_img_s": [round(x) for x in rates["bare"]]}
    for a in arms[1:]:
        ratios = [x / b for x, b in zip(rates[a], rates["bare"], strict=True)]
        name = {"": "watch", "control": "control (bare)"}.get(a, f"without {a}")
        print(f"{name}: watched/bare median {statistics.median(ratios):.3f} "
              f"({min(ratios):.3f}-{max(ratios):.3f})")
        result[name] = round(statistics.median(ratios), 4)
    if "control" in rates:  # watched against the other bare run of the same round
        ratios = [x / c for x, c in zip(rates[""], rates["control"], strict=True)]
        print(f"watch/control median {statistics.median(ratios):.3f} "
              f"({min(ratios):.3f}-{max(ratios):.3f})")
        result["watch / control"] = round(statistics.median(ratios), 4)
        # Against both bare runs of each round: their geometric mean, and the rounds' mean log
        # ratio with ±2 standard errors (the ratios spread log-normally, ~±15 % a round here).
        logs = [math.log(x / math.sqrt(b * c)) for x, b, c in
                zip(rates[""], rates["bare"], rates["control"], strict=True)]
        mean = statistics.mean(logs)
        half = 2 * statistics.stdev(logs) / math.sqrt(len(logs)) if len(logs) > 1 else math.inf
        print(f"watch / both bare runs: {math.exp(mean):.3f} "
              f"(±2 SE {math.exp(mean - half):.3f}-{math.exp(mean + half):.3f}); "
              f"under them in {sum(x < 0 for x in logs)} of {len(logs)} rounds")
        result["watch / bare runs"] = round(math.exp(mean), 4)
        result["watch / bare runs, 2 SE"] = [round(math.exp(mean - half), 4),
                                             round(math.exp(mean + half), 4)]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
