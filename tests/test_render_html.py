"""The HTML report: self-contained, escaped, bounded, and rendered for real in headless Chromium."""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from stepscope.analysis.compare import compare_summaries
from stepscope.analysis.contracts import ledger_item, make_finding
from stepscope.analysis.timeline import Timeline, load_timeline
from stepscope.render.html import NVML_NOTE, SECTIONS, write_report
from stepscope.render.html_compare import write_compare_report
from stepscope.store.db import RunReader, RunWriter
from stepscope.store.records import PhaseRecord, ProcessInfo, RunInfo, Sample, StepRecord
from tests.conftest import report_size_bench

EVIL = "<script>alert(1)</script>"
ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Answer:
    title: str
    text: str


def _summary(reader: RunReader) -> dict[str, Any]:
    summary: dict[str, Any] = report_size_bench()._summary_for(reader)
    # Built by the analysis's own constructors, so the fixture has the shape the analysis emits.
    summary["findings"] = [make_finding("input_bound_train", "high", EVIL,
                                        [f"class {EVIL} in the dataset"], "more workers",
                                        "~2.1× faster")]
    summary["memory"]["ledger"].append(ledger_item(EVIL, 1e8, EVIL))
    return summary


def _evil_run(run_dir: Path) -> Path:
    """A tiny CPU-only run whose user strings are all hostile markup."""
    t0 = 1_000.0
    w = RunWriter(run_dir, RunInfo(name="evil", command=f"python train.py --tag '{EVIL}'",
                                   started=t0, pid=7), clock=lambda: t0 + 60)
    w.put_process(ProcessInfo(7, 1, "main", EVIL, t0, t0 + 60))
    w.put_phase(PhaseRecord(0, 1, "train", t0, t0 + 60, 30, 240))
    w.add_samples(Sample(t0 + i, "host", "cpu_util_pct", 50.0) for i in range(60))
    w.add_samples(Sample(t0 + i, "proc:7", "cpu_util_pct", 90.0) for i in range(60))
    for s in range(30):
        w.add_step(StepRecord(0, s, t0 + 2 * s, 2.0, 1.0, 0.1, 0.8, 0.1, 8))
    w.note("gpu", f"no NVML here {EVIL}")
    w.close("completed")
    return run_dir


@pytest.fixture(scope="module")
def small_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Timeline, dict[str, Any]]:
    run_dir = report_size_bench().write_synthetic_run(tmp_path_factory.mktemp("r") / "small", hours=0.25,
                                           epochs=3, workers=3)
    with RunReader(run_dir) as r:
        return run_dir, load_timeline(r), _summary(r)


def _report(small_run: tuple[Path, Timeline, dict[str, Any]]) -> str:
    run_dir, tl, summary = small_run
    path = write_report(run_dir / "report.html", summary, tl, [Answer(f"Why {EVIL}?", "First.\n\nSecond.")],
                        {"data": {"csv": EVIL, "batch": 8}, "model": "efficientnet_lite0"})
    assert path == run_dir / "report.html"
    return path.read_text(encoding="utf-8")


def test_report_is_self_contained(small_run: tuple[Path, Timeline, dict[str, Any]]) -> None:
    html = _report(small_run)
    assert "<script" not in html  # no script at all, so none to fail offline
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html)
    assert "@import" not in html and "url(" not in html
    for anchor in ("phases", "findings", "explain", "steps", "cpu", "gpu", "disk", "memory",
                   "ledger", "config"):
        assert f'id="{anchor}"' in html
    assert "time since start (min)" in html and "CPU busy (%)" in html
    assert "NVML" in html and "at least one kernel was running" in NVML_NOTE


def test_user_strings_are_escaped(small_run: tuple[Path, Timeline, dict[str, Any]],
                                  tmp_path: Path) -> None:
    html = _report(small_run)
    assert EVIL not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    run_dir = _evil_run(tmp_path / "evil")
    with RunReader(run_dir) as r:
        tl = load_timeline(r)
    summary = {"run": {"name": EVIL, "command": EVIL}, "phases": [], "memory": {},
               "findings": [], "ranks": []}
    text = write_report(run_dir / "report.html", summary, tl, [Answer(EVIL, EVIL)], {EVIL: EVIL}).read_text()
    assert EVIL not in text and text.count("&lt;script&gt;") >= 6
    assert "No GPU was recorded" in text  # and the reason from the note, escaped


def test_report_size_is_bounded_by_buckets(small_run: tuple[Path, Timeline, dict[str, Any]],
                                           tmp_path: Path) -> None:
    run_dir, _, summary = small_run
    with RunReader(run_dir) as r:
        coarse = write_report(tmp_path / "report.html", summary, load_timeline(r, max_points=100), [], {})
        size_coarse = coarse.stat().st_size
        fine = write_report(tmp_path / "report.html", summary, load_timeline(r, max_points=800), [], {})
    assert size_coarse < fine.stat().st_size < 2_000_000


def test_compare_report(small_run: tuple[Path, Timeline, dict[str, Any]], tmp_path: Path) -> None:
    _, _, a = small_run
    b = {**a, "run": {**a["run"], "name": EVIL}}
    path = write_compare_report(tmp_path / "cmp" / "compare.html", compare_summaries(a, b), a, b)
    html = path.read_text()
    assert EVIL not in html and "1.00×" in html and "<script" not in html


# -- in a real browser -------------------------------------------------------------------------
def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def _render_in_chromium(page: Path, shot: Path, profile: Path) -> list[str]:
    """Screenshot ``page``; return the browser console lines it logged (errors included)."""
    cmd = [_chromium() or "chromium", "--headless", "--no-sandbox", "--disable-gpu",
           "--disable-quic", "--no-first-run", "--disable-background-networking",
           "--disable-component-update", "--disable-sync", f"--user-data-dir={profile}",
           "--enable-logging=stderr", "--v=0", f"--screenshot={shot}",
           "--window-size=1400,3000", page.resolve().as_uri()]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert shot.exists(), proc.stderr[-2000:]
    return [ln for ln in proc.stderr.splitlines() if ":CONSOLE" in ln or "Uncaught" in ln]


needs_chromium = pytest.mark.skipif(
    _chromium() is None,
    reason="chromium is not installed (apt-get install -y chromium); CI installs it")


@needs_chromium
def test_console_check_catches_errors(tmp_path: Path) -> None:
    page = tmp_path / "bad.html"
    page.write_text("<html><body>x<script>throw new Error('bad thing')</script></body></html>")
    lines = _render_in_chromium(page, tmp_path / "bad.png", tmp_path / "profile")
    assert any("bad thing" in ln for ln in lines)


@needs_chromium
def test_report_renders_in_chromium(small_run: tuple[Path, Timeline, dict[str, Any]],
                                    tmp_path: Path) -> None:
    import numpy as np
    from PIL import Image

    _report(small_run)
    shot = tmp_path / "report.png"
    t0 = time.perf_counter()
    console = _render_in_chromium(small_run[0] / "report.html", shot, tmp_path / "profile")
    # a hang guard beside the run's own 120 s timeout: a fresh container's first Chromium
    # builds its font cache, under the suite's load
    assert time.perf_counter() - t0 < 120
    assert console == []
    rgb = np.asarray(Image.open(shot).convert("RGB"), dtype=np.int32)
    non_white = float((rgb.sum(axis=2) < 720).mean())
    assert non_white > 0.08  # charts and tables, not a blank page
    assert len(np.unique(rgb.reshape(-1, 3), axis=0)) > 200  # many colours: the charts drew


def test_nav_and_body_come_from_one_section_list(small_run: Any, tmp_path: Path) -> None:
    """Every nav link points at a section on the page, in the page's order (SECTIONS)."""
    _, tl, summary = small_run
    html = write_report(tmp_path / "report.html", summary, tl, [], {}).read_text()
    nav = re.findall(r'<a href="#([a-z]+)">', html.split("<nav>")[1].split("</nav>")[0])
    ids = re.findall(r'<section id="([a-z]+)">', html)
    assert nav == [a for a in ids if a in nav]  # same order
    assert set(nav) <= set(ids)
    assert "explain" not in nav  # no answers: no section, no dangling link
    assert ids == [s.anchor for s in SECTIONS if s.anchor in ids]


def test_a_charted_registry_series_reaches_the_report_without_a_renderer_edit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A new sampler's series: registered with a chart, recorded in the run, and nothing else.
    from stepscope import metrics
    fan = metrics.Metric("fan<N>", "speed_rpm", "rpm", "fan speed (a made-up sampler)",
                         metrics.Chart("cooling", "fan speed", "{source} speed"))
    swap = metrics.Metric("host", "swap_used_bytes", "B", "swap in use (made up)",
                          metrics.Chart("memory", "memory", "machine: swap", 2))
    monkeypatch.setattr(metrics, "METRICS", (*metrics.METRICS, fan, swap))
    run_dir = _evil_run(tmp_path / "run")
    w = RunWriter(run_dir, RunInfo(name="fan", command="x", started=1_000.0, pid=7),
                  clock=lambda: 1_060.0)
    w.add_samples(Sample(1_000.0 + i, src, name, v) for i in range(60)
                  for src, name, v in (("fan1", "speed_rpm", 1200.0),
                                       ("host", "swap_used_bytes", 2e9)))
    w.close("completed")
    with RunReader(run_dir) as r:
        tl = load_timeline(r)
    summary: Any = {"run": {"name": "fan"}, "phases": [], "memory": {}, "findings": [],
                    "ranks": []}
    html = write_report(tmp_path / "report.html", summary, tl, [], {}).read_text()
    assert 'id="series"' in html and "fan1 speed" in html and "fan speed (a made-up sampler)" in html
    memory = html.split('id="memory"', 1)[1].split("</section>", 1)[0]
    assert "machine: swap" in memory and "Host memory" in memory
    monkeypatch.setattr(metrics, "METRICS", tuple(m for m in metrics.METRICS
                                                  if m not in (fan, swap)))
    html = write_report(tmp_path / "report.html", summary, tl, [], {}).read_text()
    assert 'id="series"' not in html and "fan1 speed" not in html and 'id="memory"' not in html
