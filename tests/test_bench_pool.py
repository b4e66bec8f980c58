"""bench/watch_keras_ablation.py --pool: several runs pooled by round and by run."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import bench_module

pytestmark = pytest.mark.light
ablation = bench_module("watch_keras_ablation")


def _log(path: Path, watch: list[float], bare: list[float], control: list[float],
         **settings: Any) -> Path:
    """An ablation log whose rounds' best epochs are these (img/s), two epochs a run."""
    run = {"figure": "watch_keras_ablation", "input": "tfdata", "epochs": 3, "cpus": None,
           "image_px": 32, **settings,
           "epochs_img_s": {"watch": [[w * 0.9, w] for w in watch],
                            "bare": [[b, b * 0.8] for b in bare],
                            "control": [[c] for c in control]}}
    path.write_text("round 0: ...\n" + json.dumps(run) + "\n")
    return path


def test_rounds_and_runs_pooled(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                monkeypatch: pytest.MonkeyPatch) -> None:
    # Run a: watch 2 % under both bare runs in both rounds; run b: 4 % under.
    a = _log(tmp_path / "a.log", [98.0, 98.0], [100.0, 100.0], [100.0, 100.0])
    b = _log(tmp_path / "b.log", [96.0, 96.0], [100.0, 100.0], [100.0, 100.0])
    monkeypatch.setattr("sys.argv", ["ablation", "--pool", str(a), str(b)])
    ablation.main()
    out = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert [r["watch / bare runs"] for r in out["per_run"]] == [0.98, 0.96]
    mean = math.exp((math.log(0.98) + math.log(0.96)) / 2)
    assert out["watch / bare runs, rounds pooled"][0] == pytest.approx(mean, abs=1e-4)
    assert out["watch / bare runs, over runs"][0] == pytest.approx(mean, abs=1e-4)
    # Two runs: the t interval (12.7 standard errors of the runs' mean) is far wider than the
    # rounds' (2 SE of four rounds), which takes the runs' difference for round-to-round noise.
    lo_r, hi_r = out["watch / bare runs, rounds pooled"][1:]
    lo_k, hi_k = out["watch / bare runs, over runs"][1:]
    assert lo_k < lo_r < hi_r < hi_k
    assert out["control / bare, rounds pooled"][0] == pytest.approx(1.0)


def test_fast_epoch_rounds_are_pooled_across_runs(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # Each run's per-round fast-epoch figures (a round slowed whole is not among them) are
    # pooled as rounds; a run without them (an older log) adds none.
    a = _log(tmp_path / "a.log", [98.0, 50.0], [100.0, 100.0], [100.0, 100.0],
             **{"watch / bare runs, fast epochs, rounds": [0.99, 0.98]})
    b = _log(tmp_path / "b.log", [99.0, 99.0], [100.0, 100.0], [100.0, 100.0],
             **{"watch / bare runs, fast epochs, rounds": [1.0, 0.99]})
    c = _log(tmp_path / "c.log", [99.0, 99.0], [100.0, 100.0], [100.0, 100.0])
    monkeypatch.setattr("sys.argv", ["ablation", "--pool", str(a), str(b), str(c)])
    ablation.main()
    out = json.loads(capsys.readouterr().out.splitlines()[-1])
    mean, lo, hi = out["watch / bare runs, fast epochs, rounds pooled"]
    logs = [math.log(x) for x in (0.99, 0.98, 1.0, 0.99)]
    assert mean == pytest.approx(math.exp(sum(logs) / 4), abs=1e-4)
    assert lo < mean < hi and out["watch / bare runs, rounds pooled"][0] < 0.95


def test_runs_of_different_settings_are_refused(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    a = _log(tmp_path / "a.log", [98.0, 97.0], [100.0, 100.0], [100.0, 99.0])
    b = _log(tmp_path / "b.log", [98.0, 97.0], [100.0, 100.0], [100.0, 99.0], image_px=64)
    monkeypatch.setattr("sys.argv", ["ablation", "--pool", str(a), str(b)])
    with pytest.raises(SystemExit, match="differ in image_px"):
        ablation.main()


def test_a_log_without_a_control_arm_is_refused(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    bad = tmp_path / "bad.log"
    bad.write_text(json.dumps({"figure": "watch_keras_ablation", "epochs_img_s": {"bare": []}}))
    good = _log(tmp_path / "a.log", [98.0, 97.0], [100.0, 100.0], [100.0, 99.0])
    monkeypatch.setattr("sys.argv", ["ablation", "--pool", str(good), str(bad)])
    with pytest.raises(SystemExit, match="control arm"):
        ablation.main()


def test_an_arm_from_another_tree_is_named_and_checked(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``src=PATH`` runs the watch from another checkout: named by its path, and a path that is
    no stepscope source tree stops the bench before any run, saying what to give."""
    assert ablation._arm_name("src=/tmp/old/src") == "watch from /tmp/old/src"
    monkeypatch.setattr("sys.argv", ["ablation", "--arms", f"src={tmp_path}"])
    with pytest.raises(SystemExit):
        ablation.main()
    err = capsys.readouterr().err
    assert f"src={tmp_path}: not a stepscope source tree" in err and "git worktree" in err


def test_arm_names_say_what_each_arm_runs() -> None:
    assert ablation._arm_name("") == "watch"
    assert ablation._arm_name("end,fetch") == "without end,fetch"
    assert ablation._arm_name("nice") == "parent at nice 19"
    assert ablation._arm_name("nice,end") == "parent at nice 19, without end"
    # a tree's path may hold any word: its parent is its own process, never niced here
    assert ablation._arm_name("src=/tmp/nice/src") == "watch from /tmp/nice/src"
    assert not ablation._niced("src=/tmp/nice/src")
