"""``stepscope tune``: the pure ranking helpers, the loader timer on real JPEGs, the rich table, and
one whole tune on the synthetic fixture, within its budget, whose YAML trains."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
from rich.console import Console

from stepscope.analysis.tune import choose_winner, run_rate, skip_notes
from stepscope.policy import chunk_rates
from stepscope.render.tune import tune_table
from stepscope.train import augment
from stepscope.train.config import resolve_config
from stepscope.train.loop import train
from stepscope.train.tune import (
    TUNED_KEYS,
    TuneResult,
    TuneRow,
    _loader,
    _resolve_split,
    time_loader,
    tune,
    worker_counts,
    write_tuned_config,
)
from tests.conftest import data_flags


def test_worker_counts_double_up_to_the_cores() -> None:
    assert worker_counts(1) == [0, 1]
    assert worker_counts(2) == [0, 1, 2]
    assert worker_counts(12) == [0, 1, 2, 4, 8, 12]
    assert worker_counts(2, also=5) == [0, 1, 2, 5]


def test_chunk_rates_span_one_burst_of_workers() -> None:
    # Two workers deliver in pairs: one slow batch, one instant. Per pair the rate is steady.
    assert chunk_rates([0.2, 0.0, 0.2, 0.0], [8, 8, 8, 8], 2) == [80.0, 80.0]
    assert chunk_rates([0.1, 0.1, 0.1], [8, 8, 4], 2) == [80.0]  # short tail dropped
    assert chunk_rates([0.1], [8], 4) == [80.0]  # unless it is all there is
    assert chunk_rates([], [], 1) == []


def _run_row(label: str, rate: float, lo: float, hi: float, wait: float, *, baseline: bool = False
             ) -> TuneRow:
    return TuneRow("run", label, {"workers": label[0], "prefetch": 2, "aug_backend": "fused",
                                  "precision": "bf16", "channels_last": True}, rate, lo, hi,
                   predicted_images_per_s=rate * 1.2, data_wait_frac=wait, baseline=baseline)


def test_winner_is_the_fastest_real_run_and_the_reason_says_why() -> None:
    rows = [
        TuneRow("compute", "trunk forward, bf16 channels_last", {}, 500.0, 480.0, 510.0),
        _run_row("0 workers", 50.0, 45.0, 55.0, 0.6, baseline=True),
        _run_row("2 workers", 120.0, 110.0, 125.0, 0.05),
        TuneRow("run", "1 worker", {}, skipped="needs ~9 s, 2 s left"),
    ]
    best, reason = choose_winner(rows)
    assert best is rows[2]
    assert "2.4× your current settings' 50.0 img/s (45.0–55.0)" in reason
    assert "waited for data 60 %" in reason
    assert "noise" not in reason
    rows[2].min_images_per_s = 50.0  # now the spreads overlap
    assert "within this machine's noise" in choose_winner(rows)[1]
    assert choose_winner(rows[:1])[0] is None


def test_loader_timer_runs_past_epochs_and_skips_the_first_batch(synth80: Path) -> None:
    cfg = resolve_config({**data_flags(synth80), "img_size": 64, "weights": "none"})
    split = _resolve_split(cfg)
    loader = _loader(cfg, split.train, "fused", 0)
    epoch_batches = len(loader)
    times, sizes, warmup_s = time_loader(loader, seconds=0.0, min_batches=epoch_batches + 2,
                                         clock=time.perf_counter)
    assert len(times) == epoch_batches + 2  # one epoch turnover inside
    assert warmup_s > 0
    assert all(0 < n <= cfg.batch_size for n in sizes)


def _result() -> TuneResult:
    rows = [
        TuneRow("compute", "trunk forward, bf16 channels_last", {}, 512.0, 480.0, 530.0),
        TuneRow("compute", "trunk forward, fp32 NCHW", {}, skipped="compute share of the budget spent"),
        TuneRow("loader", "loader only, 2 worker(s), fused augment", {}, 1400.0, 1300.0, 1500.0),
        _run_row("0 worker(s), fused augment, bf16 channels_last", 50.0, 45.0, 55.0, 0.62,
                 baseline=True),
        _run_row("2 worker(s), prefetch 2, fused augment, bf16 channels_last", 120.0, 110.0,
                 125.0, 0.05),
    ]
    rows[-1].winner = True
    return TuneResult(rows, dict(rows[-1].changes), "2 workers trained at 120 img/s.",
                      ["feature_cache is not tuned."], budget_s=30.0, elapsed_s=28.4)


def test_table_marks_the_winner_with_spread_and_reason() -> None:
    console = Console(width=150, record=True, color_system=None, force_terminal=False)
    console.print(tune_table(_result()))
    out = console.export_text()
    lines = [line.strip() for line in out.splitlines()]
    assert lines[0] == "stepscope tune: 28 s of a 30 s budget on cpu"
    winner = next(line for line in lines if "★ winner" in line)
    assert "2 worker(s), prefetch 2" in winner and " 120 " in winner and "110–125" in winner
    yours = next(line for line in lines if line.startswith("yours"))
    assert "50.0" in yours and "45.0–55.0" in yours and "62 %" in yours
    assert "skipped: compute share of the budget spent" in out
    assert "1,400" in out and "1,300–1,500" in out
    assert "why: 2 workers trained at 120 img/s." in out
    assert "winner: workers=2, prefetch=2, aug_backend=fused, precision=bf16, channels_last=True" in out
    assert "note: feature_cache is not tuned." in out


def test_tuned_yaml_keeps_the_user_keys_and_sets_the_winner(synth80: Path, tmp_path: Path) -> None:
    cfg = resolve_config({**data_flags(synth80), "img_size": 64, "lr": 3e-4, "resume": "x"})
    merged = write_tuned_config(_result(), cfg, tmp_path / "sub" / "tuned.yaml")
    back = resolve_config({}, tmp_path / "sub" / "tuned.yaml")
    assert back == merged
    assert (back.workers, back.prefetch, back.precision) == ("2", 2, "bf16")
    assert (back.img_size, back.lr, back.resume) == (64, 3e-4, None)
    assert (tmp_path / "sub" / "tuned.yaml").read_text().startswith("# written by stepscope tune")


@pytest.mark.slow
def test_tune_on_real_data_respects_its_budget_and_its_yaml_trains(
        synth80: Path, tmp_path: Path) -> None:
    cfg = resolve_config({**data_flags(synth80), "img_size": 64, "weights": "none"})
    seen: list[tuple[str, float]] = []
    budget_s = 30.0
    t0 = time.perf_counter()
    result = tune(cfg, read_rate=run_rate, budget_s=budget_s,
                  progress=lambda text, frac: seen.append((text, frac)))
    result.decide(*choose_winner(result.rows), skip_notes(result.rows))
    wall_s = time.perf_counter() - t0
    print(f"tune took {wall_s:.1f} s of {budget_s:.0f}")
    Console(width=150).print(tune_table(result))
    assert wall_s <= budget_s + 5.0
    measured = {r.kind for r in result.rows if r.images_per_s is not None}
    assert measured == {"compute", "loader", "run"}
    assert all(r.images_per_s is None or r.min_images_per_s <= r.images_per_s  # type: ignore[operator]
               <= r.max_images_per_s for r in result.rows)  # type: ignore[operator]
    assert sum(r.winner for r in result.rows) == 1
    assert set(result.winner) == set(TUNED_KEYS)
    assert result.reason
    assert seen and all(0.0 <= f <= 1.0 for _, f in seen)
    yaml_path = tmp_path / "tuned.yaml"
    write_tuned_config(result, cfg, yaml_path)
    tuned = resolve_config({"out": str(tmp_path / "run"), "max_steps": 2, "epochs": 1},
                           yaml_path)
    assert {k: getattr(tuned, k) for k in TUNED_KEYS} == result.winner
    assert train(tuned).status == "completed"


def test_gpu_backend_loader_only_decodes_and_resizes(synth80: Path) -> None:
    # --aug-backend gpu leaves the augmentation to the device: the workers' output is the
    # plain resized image, the same every time.
    cfg = resolve_config({**data_flags(synth80), "img_size": 64, "weights": "none"})
    items = _resolve_split(cfg).train[:1]
    batch = next(iter(_loader(cfg, items, "gpu", 0)))
    plain = augment.create_transform(None, 64, train=False, backend="fused")(items[0].path)
    assert torch.equal(batch.images[0], plain)
