"""``stepscope tune``: the pure ranking helpers, the loader timer on real JPEGs, the rich table, and
one whole tune on the synthetic fixture, within its budget, whose YAML trains."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
from rich.console import Console

from stepscope.analysis.fmt import fmt_ratio
from stepscope.analysis.summary import build_summary
from stepscope.analysis.tune import (
    choose_winner,
    predicted_vs_achieved,
    run_rate,
    run_workers_curve,
    skip_notes,
)
from stepscope.policy import chunk_rates
from stepscope.render.jsonout import dumps, tune_json
from stepscope.render.tune import tune_table
from stepscope.store.db import RunReader
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
from tests.analysis_runs import PhaseSpec, RunSpec, make_run
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


def _baseline_run(run_dir: Path) -> Path:
    """A recorded baseline: one worker whose items take 15 ms each (66 img/s), waited on by a
    model that could take 145 img/s, on 4 cores; its stage counters as the loader writes them."""
    stages = {"stages_measured": True, "loader_workers": 1, "persistent_workers": False,
              "items": 320.0, "fetch_s": 4.8, "fetch_cpu_s": 0.5, "fetch_runq_s": 0.0,
              "stage_s": {"item": 4.8}, "workers": [{"busy_s": 4.8}], "waits": 40,
              "wait_s": 6.0, "wait_cpu_s": 0.05, "not_ready_steps": 38, "first_wait_s": 0.3}
    return make_run(run_dir, RunSpec(
        phases=[PhaseSpec(epoch=1, workers=1, data_wait_s=0.15, compute_s=0.05)],
        facts={"env.cpu_count": 4, "stages.phase.0": stages}))


def test_tune_puts_the_capacity_prediction_beside_what_each_run_achieved(tmp_path: Path) -> None:
    run_dir = _baseline_run(tmp_path / "run0")
    curve = run_workers_curve(run_dir)
    with RunReader(run_dir) as reader:
        phase = build_summary(reader)["phases"][0]
    assert curve and curve == phase["workers_curve"]  # the very curve compare reads
    yours = {"workers": "1", "prefetch": 2, "aug_backend": "fused", "precision": "fp32",
             "channels_last": True}
    rows = [
        TuneRow("compute", "trunk forward, fp32 channels_last", {}, 500.0, 480.0, 510.0),
        TuneRow("run", "one worker", yours, 40.0, 38.0, 42.0, baseline=True),
        TuneRow("run", "two workers", {**yours, "workers": "2"}, 120.0, 110.0, 125.0),
        TuneRow("run", "bf16 two workers", {**yours, "workers": "2", "precision": "bf16"},
                150.0, 140.0, 155.0),
        TuneRow("run", "four workers", {**yours, "workers": "4"}, skipped="needs ~9 s, 2 s left"),
    ]
    result = TuneResult(rows, dict(yours), "two workers won", budget_s=30.0, elapsed_s=29.0,
                        baseline_workers_curve=curve)
    result.price(predicted_vs_achieved(result.rows, result.baseline_workers_curve))
    assert rows[2].capacity_speedup == curve["2"] and rows[2].achieved_speedup == 3.0
    # A precision change beside the worker count is a gain the model never priced.
    assert rows[3].capacity_speedup is None and rows[3].achieved_speedup == 3.75
    for row in (rows[0], rows[1], rows[4]):
        assert row.capacity_speedup is None and row.achieved_speedup is None

    console = Console(width=160, record=True, color_system=None, force_terminal=False)
    console.print(tune_table(result))
    lines = [line.strip() for line in console.export_text().splitlines()]
    two = next(line for line in lines if line.startswith("two workers"))
    assert two.split()[-2:] == ["3.0×", fmt_ratio(curve["2"])]  # × yours, then model ×
    bf16 = next(line for line in lines if line.startswith("bf16 two workers"))
    assert "3.8×" in bf16 and fmt_ratio(curve["2"]) not in bf16
    assert any(line.startswith("model ×: the speed-up the capacity model predicted")
               for line in lines)

    out = json.loads(dumps(tune_json(result.to_dict(), "tuned.yaml")))
    assert out["baseline_workers_curve"] == curve
    assert out["rows"][2]["capacity_speedup"] == curve["2"]
    assert out["rows"][2]["achieved_speedup"] == 3.0 and out["rows"][1]["achieved_speedup"] is None

    # Without the baseline's stage capacities the prediction and its legend disappear.
    result.price(predicted_vs_achieved(result.rows, {}))
    assert rows[2].capacity_speedup is None and rows[2].achieved_speedup == 3.0
    console = Console(width=160, record=True, color_system=None, force_terminal=False)
    console.print(tune_table(result))
    text = console.export_text()
    assert "model ×:" not in text and "× yours:" in text


def test_tune_cli_prices_the_runs_with_the_baseline_curve(monkeypatch: pytest.MonkeyPatch,
                                                           tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from stepscope import cli
    from stepscope.train import tune as tuning

    yours = {"workers": "1", "prefetch": 2, "aug_backend": "fused", "precision": "fp32",
             "channels_last": True}
    seen: dict[str, object] = {}

    def fake_tune(cfg: object, **kw: object) -> TuneResult:  # no training: the CLI's wiring
        seen.update(kw)
        rows = [TuneRow("run", "one worker", yours, 40.0, 38.0, 42.0, baseline=True),
                TuneRow("run", "two workers", {**yours, "workers": "2"}, 120.0, 110.0, 125.0)]
        return TuneResult(rows, dict(yours), "", budget_s=9.0, elapsed_s=8.0,
                          baseline_workers_curve={"2": 2.5})

    monkeypatch.setattr(cli, "_train_config_from_args", lambda args: None)
    monkeypatch.setattr(tuning, "tune", fake_tune)
    monkeypatch.setattr(tuning, "write_tuned_config", lambda *a: None)
    out = CliRunner().invoke(cli.app, ["tune", "--json", "--out-config",
                                       str(tmp_path / "t.yaml")])
    assert out.exit_code == 0, out.output
    assert seen["read_curve"] is run_workers_curve
    doc = json.loads(out.stdout)
    assert doc["rows"][1]["capacity_speedup"] == 2.5 and doc["rows"][1]["achieved_speedup"] == 3.0
