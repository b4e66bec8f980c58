"""The metrics registry: every series and fact the code writes is registered, and documented."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from stepscope.metrics import CHARTS, FACTS, METRICS, chart_sources, fact, metric, metric_names

pytestmark = pytest.mark.light  # quick, no process, no thread: shares make test's interpreter


ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "stepscope"
RECORDS_MD = ROOT / "docs" / "records.md"
# Series names are written with their unit in the name (STYLE.md): this finds them as literals.
UNIT_NAME = re.compile(r"^[a-z]+(_[a-z0-9]+)*_(pct|bytes|per_s|frac|w|c|mhz)$")
FACT_NAME = re.compile(
    r"^(env|mem|model|dataset|train|loader|loop|featcache|monitor|watch|stages|dist)\.[a-z0-9_.]+$")
# Literals that look like names but are none: file names and helpers.
NOT_NAMES = {"model.safetensors", "train.csv", "train.py", "phase_resident_frac", "add_bytes",
             "loader.val.augments",  # a summary path (analysis/evidence.py), fact loader.val_augments
             "image_bytes"}  # a loader.<figure> key (loader.image_bytes), not a series


def _literals(path: Path) -> list[str]:
    """String constants, f-strings with each placeholder as ``1``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            out.append(node.value)
        elif isinstance(node, ast.JoinedStr):
            out.append("".join(v.value if isinstance(v, ast.Constant) else "1"
                               for v in node.values))
    return out


def _sources() -> list[Path]:
    return [p for p in SRC.rglob("*.py") if p.name != "metrics.py"]


def test_every_series_name_the_observers_write_is_registered() -> None:
    written = {s for p in SRC.joinpath("observe").rglob("*.py") for s in _literals(p)
               if UNIT_NAME.match(s) and s not in NOT_NAMES}
    written |= {"disk_wait", "running", "threads", "workers", "alloc_retries", "ooms"}
    assert written - metric_names() == set()


def test_every_fact_key_the_code_writes_is_registered() -> None:
    keys = {s for p in _sources() for s in _literals(p)
            if FACT_NAME.match(s) and s not in NOT_NAMES and not s.endswith(".")}
    assert keys  # the scan finds them
    unregistered = set()
    for k in keys:
        try:
            fact(k)
        except KeyError:
            unregistered.add(k)
    assert unregistered == set()


def test_families_resolve_to_their_row() -> None:
    assert metric("gpu0:proc:4711", "mem_used_bytes").source == "gpu<N>:proc:<pid>"
    assert metric("gpu0", "mem_used_bytes").source == "gpu<N>"
    assert metric("disk:nvme0n1", "busy_pct").unit == "%"
    assert metric("tree", "read_rate_bytes_per_s").unit == "B/s"
    with pytest.raises(KeyError):
        metric("host", "util_pct")


def test_records_md_documents_every_registered_name() -> None:
    doc = RECORDS_MD.read_text(encoding="utf-8")
    missing = [f"{m.source}/{m.metric}" for m in METRICS
               if f"`{m.metric}`" not in doc or f"`{m.source}`" not in doc]
    missing += [f.key for f in FACTS if f"`{f.key}`" not in doc]
    assert missing == []


def test_every_chart_names_a_registered_series() -> None:
    # A typo in CHARTS would chart nothing, silently: each key must be a registered row.
    rows = {(m.source, m.metric) for m in METRICS}
    assert set(CHARTS) <= rows
    assert {(m.source, m.metric) for m in METRICS if m.chart} == set(CHARTS)
    assert chart_sources(metric("torch:cuda1", "reserved_bytes"), ["torch:cuda1", "gpu1"]) == [
        ("torch:cuda1", "torch:cuda1 reserved by PyTorch's allocator")]
