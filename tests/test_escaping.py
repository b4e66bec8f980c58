"""Every user-controlled string reaches the HTML report, the trace and TensorBoard's text as
inert text: run name, command line, class and file names, config values, notes, environment."""

from __future__ import annotations

import html
import json
from pathlib import Path

import pytest

from stepscope.analysis.explain import explain
from stepscope.analysis.summary import build_summary
from stepscope.analysis.timeline import load_timeline
from stepscope.render import tensorboard
from stepscope.render.html import write_report
from stepscope.render.trace import write_trace
from stepscope.store.db import RunReader, RunWriter
from stepscope.store.records import PhaseRecord, ProcessInfo, RunInfo, Sample, StepRecord

pytestmark = pytest.mark.light  # quick, no process, no thread: shares make test's interpreter


HOSTILE = [
    '<script>alert("x")</script>',
    '"><img src=x onerror=alert(1)>',
    "</style><svg onload=alert(2)>",
    "`](javascript:alert(3)) | <b>",
]
T0 = 1_700_000_000.0


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("hostile") / "run"
    h = " ".join(HOSTILE)
    w = RunWriter(d, RunInfo(name=h, command=f"python train.py --out {h}", started=T0, pid=7,
                             config={"csv": h, "classes": HOSTILE}), clock=lambda: T0 + 60)
    w.put_process(ProcessInfo(7, 1, "main", h, T0, T0 + 60))
    w.put_phase(PhaseRecord(0, 1, "train", T0, T0 + 50, 50, 400))
    for i in range(50):
        w.add_step(StepRecord(0, i, T0 + i, 1.0, 0.7, 0.05, 0.2, 0.05, 8, warmup=i < 2))
    w.add_samples([Sample(T0 + i, "host", "cpu_util_pct", 50.0) for i in range(60)])
    w.note(h, f"bad file {h}.jpg skipped")
    w.fact("env.hostile", h, h)
    w.fact("data.classes", HOSTILE, "class names from the CSV")
    w.fact("data.bad_files", [f"images/{x}.jpg" for x in HOSTILE], "files that failed to decode")
    w.close("completed")
    return d


def _no_raw_markup(text: str) -> None:
    for s in HOSTILE:
        assert s not in text
    for tag in ("<script", "<img", "<svg onload", "| <b>"):  # the report has its own <svg>, <b>
        assert tag not in text.lower()


def test_html_report_escapes_every_string(run: Path, tmp_path: Path) -> None:
    with RunReader(run) as r:
        summary = build_summary(r)
        tl = load_timeline(r, max_points=50)
    out = write_report(tmp_path / "report.html", summary, tl, explain(summary),
                       {"csv": " ".join(HOSTILE), "classes": HOSTILE})
    text = out.read_text()
    _no_raw_markup(text)
    assert html.escape(HOSTILE[0], quote=False) in text or html.escape(HOSTILE[0]) in text


def test_trace_keeps_strings_as_json_data(run: Path, tmp_path: Path) -> None:
    with RunReader(run) as r:
        tl = load_timeline(r, max_points=50)
    doc = json.loads(write_trace(tmp_path / "trace.json", tl).read_text())
    names = json.dumps(doc)
    assert json.loads(names) == doc  # valid JSON whatever the names held
    assert doc["otherData"]["run"] == " ".join(HOSTILE)  # kept as data, intact


def test_tensorboard_text_escapes_every_string(run: Path) -> None:
    with RunReader(run) as r:
        summary = build_summary(r)
    summary["findings"] = [{"title": HOSTILE[0], "severity": HOSTILE[1], "evidence": HOSTILE,
                            "fix": HOSTILE[2], "expected_gain": HOSTILE[3]}]
    texts = [tensorboard.run_markdown(summary),
             tensorboard.verdicts_markdown([{**p, "phase": HOSTILE[1]} for p in summary["phases"]]),
             tensorboard.findings_markdown(summary["findings"]),
             tensorboard.answers_markdown(explain(summary))]
    for text in texts:
        _no_raw_markup(text)
    assert "&lt;script&gt;" in texts[0]
