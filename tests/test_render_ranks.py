"""The ranks table (terminal) and the Ranks section (HTML) of a distributed run's report."""

from __future__ import annotations

import io
from typing import Any

import pytest
from rich.console import Console

from stepscope.render.html_ranks import ranks_section
from stepscope.render.terminal import rank_table

pytestmark = pytest.mark.light  # quick, no process, no thread: shares make test's interpreter


def _row(rank: int, **kw: Any) -> dict[str, Any]:
    base = {"rank": rank, "host": "n1" if rank < 2 else "n2", "node_rank": rank // 2,
            "status": "completed", "step_ms": 70.0, "data_wait_ms_per_step": 0.5,
            "compute_ms_per_step": 3.0, "comm_ms_per_step": 60.0, "arrived_last_frac": 0.0,
            "straggler": False, "cause": None, "recurrence": "never", "straggler_evidence": []}
    return {**base, **kw}


def _summary() -> dict[str, Any]:
    rows = [_row(0), _row(1), _row(2, status="failed"),
            _row(3, straggler=True, cause="compute", recurrence="every step",
                 arrived_last_frac=1.0, straggler_evidence=["rank 3 arrived last at 100 %"])]
    return {"ranks": rows, "distributed": {
        "verdict_text": "rank 3 is the straggler", "arrival": {"method": "measured: <one clock>"}}}


def test_terminal_table_groups_by_node_and_names_the_straggler() -> None:
    out = io.StringIO()
    table = rank_table(_summary())
    assert table is not None
    Console(width=120, file=out, color_system=None).print(table)
    text = out.getvalue()
    assert "n1 #0" in text and "n2 #1" in text and "failed" in text
    assert "compute, every step" in text
    assert text.index("n1 #0") < text.index("n2 #1")


def test_html_section_escapes_and_shows_evidence_only_for_stragglers() -> None:
    body = ranks_section(_summary())
    assert body is not None
    title, parts = body
    html = "".join(parts)
    assert title == "Ranks"
    assert "&lt;one clock&gt;" in html and "<one clock>" not in html
    assert html.count("why the others wait for it") == 1
    assert "rank 3 arrived last at 100 %" in html


def test_single_process_runs_have_no_rank_section() -> None:
    assert rank_table({"ranks": []}) is None
    assert ranks_section({"ranks": [_row(0)]}) is None
