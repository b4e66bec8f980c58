"""What does ``stepscope watch`` cost a training script? Throughput watched / bare.

Runs one small PyTorch training script (a small CNN on 32x32 tensors, DataLoader, SGD, a
validation pass per epoch) bare and under :func:`stepscope.observe.watch.watch`, alternating so
machine noise hits both alike. The script measures its own steady-state throughput (training
images per second after the first epoch's warm-up steps) and writes it to a file, so process
start-up, imports and the watcher's own start-up are not counted: only what watching adds while
training runs. Each run reports its best epoch (3 epochs), since other load on a shared machine
only slows epochs down while watching costs every epoch alike (hooks in the loop, the parent's samplers and writer competing for the CPUs).
It also reports the training process's CPU time per image, watched / bare: the hooks' own cost,
which other load on a shared machine disturbs less than it disturbs throughput.

Usage:
    .venv/bin/python bench/watch_overhead.py [--runs 3] [--steps 120] [--interval 1.0]

The last line is the headline figure as one JSON object (median of the per-pair ratios).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from stepscope.observe.watch import watch

SCRIPT = '''
import json, sys, time
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

out, steps = sys.argv[1], int(sys.argv[2])
torch.manual_seed(0)
train = DataLoader(TensorDataset(torch.randn(steps * 32, 3, 32, 32),
                                 torch.randint(0, 10, (steps * 32,))), batch_size=32, shuffle=True)
val = DataLoader(TensorDataset(torch.randn(256, 3, 32, 32), torch.randint(0, 10, (256,))),
                 batch_size=64)
model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                      nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                      nn.Flatten(), nn.Linear(32, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
loss_fn = nn.CrossEntropyLoss()
epoch_rates, cpu_per_image, losses = [], [], []
for epoch in range(3):
    model.train()
    t0, n = None, 0
    for i, (x, y) in enumerate(train):
        if (epoch == 0 and i == 10) or (epoch > 0 and t0 is None):
            # (epoch 0: leave the one-off start-up costs out)
            t0, c0, n = time.perf_counter(), time.process_time(), 0
        loss = loss_fn(model(x.to("cpu")), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        n += x.shape[0]
        if i % 20 == 0:
            losses.append(loss.item())  # a logging step (no printing: both runs stay silent)
    epoch_rates.append(n / (time.perf_counter() - t0))
    cpu_per_image.append((time.process_time() - c0) / n)
    model.eval()
    with torch.no_grad():
        for x, y in val:
            model(x)
with open(out, "w") as f:
    # The best epoch: other load on a shared machine only ever slows an epoch down, while
    # watching's own costs (hooks every step, sampling every second) hit every epoch alike.
    json.dump({"images_per_s": max(epoch_rates), "cpu_s_per_image": min(cpu_per_image)}, f)
'''


def _run(script: Path, work: Path, index: int, watched: bool, steps: int, interval_s: float
         ) -> dict[str, float]:
    out = work / f"result-{index}-{int(watched)}.json"
    cmd = [sys.executable, str(script), str(out), str(steps)]
    if watched:
        result = watch(cmd, work / f"run-{index}", interval_s=interval_s)
        if result.exit_code != 0:
            raise SystemExit(f"watched run failed with exit code {result.exit_code}")
    else:
        # In its own session like the watched child: with the kernel's autogroup scheduling
        # (sched_autogroup_enabled) a new session is a new CPU-share group, which alone makes
        # a process faster on a busy machine and would flatter the watched runs.
        subprocess.run(cmd, check=True, start_new_session=True)
    return {k: float(v) for k, v in json.loads(out.read_text()).items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="runs of each kind (>= 3)")
    parser.add_argument("--steps", type=int, default=400, help="training steps per epoch")
    parser.add_argument("--interval", type=float, default=1.0, help="sampling period (s)")
    args = parser.parse_args()
    ratios: list[float] = []
    cpu_ratios: list[float] = []
    with tempfile.TemporaryDirectory(prefix="stepscope-watch-bench-") as tmp:
        work = Path(tmp)
        script = work / "train_small.py"
        script.write_text(SCRIPT)
        for i in range(max(args.runs, 3)):
            # Alternate which goes first so a drift in machine load favours neither.
            order = (False, True) if i % 2 == 0 else (True, False)
            rates = {w: _run(script, work, i, w, args.steps, args.interval) for w in order}
            bare, watched = rates[False], rates[True]
            ratios.append(watched["images_per_s"] / bare["images_per_s"])
            cpu_ratios.append(watched["cpu_s_per_image"] / bare["cpu_s_per_image"])
            print(f"pair {i}: bare {bare['images_per_s']:.0f} img/s, watched "
                  f"{watched['images_per_s']:.0f} img/s, ratio {ratios[-1]:.4f}; "
                  f"training-process CPU per image watched/bare {cpu_ratios[-1]:.4f}",
                  file=sys.stderr, flush=True)
    print(f"watched/bare throughput: median {statistics.median(ratios):.4f} "
          f"(min {min(ratios):.4f}, max {max(ratios):.4f}) over {len(ratios)} pairs; "
          f"training-process CPU per image watched/bare: median "
          f"{statistics.median(cpu_ratios):.4f} (less sensitive to other load on the machine)")
    print(json.dumps({"figure": "watch_overhead_ratio", "value": round(statistics.median(ratios), 4),
                      "min": round(min(ratios), 4), "max": round(max(ratios), 4),
                      "runs": len(ratios)}))


if __name__ == "__main__":
    main()
