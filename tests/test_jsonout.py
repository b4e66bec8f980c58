"""--json of explain / compare / doctor / tune and export --csv: what the commands print matches
the schemas documented in docs/json.md, field for field."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from stepscope.cli import app
from stepscope.render.jsonout import dumps, tune_json
from stepscope.store.export import PHASE_COLUMNS, SAMPLE_COLUMNS, STEP_COLUMNS
from tests.analysis_runs import PhaseSpec, RunSpec, make_run

pytestmark = pytest.mark.light  # quick, no process, no thread: shares make test's interpreter


DOC = Path(__file__).parents[1] / "docs" / "json.md"
runner = CliRunner()


def _doc_fields(schema: str) -> set[str]:
    """The field names of the table under the heading that names ``schema``."""
    text = DOC.read_text()
    section = text.split(f"schema `{schema}`", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `([a-z_]+)` \|", section, flags=re.M))


def _doc_csv_columns(file: str) -> list[str]:
    row = next(line for line in DOC.read_text().splitlines() if line.startswith(f"| `{file}`"))
    return [c.strip() for c in row.split("|")[3].strip(" `").split(",")]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("json")
    slow = make_run(base / "a", RunSpec(phases=[PhaseSpec(epoch=1, data_wait_s=0.2),
                                                PhaseSpec(epoch=1, phase="val")]), name="a")
    fast = make_run(base / "b", RunSpec(phases=[PhaseSpec(epoch=1, data_wait_s=0.01),
                                                PhaseSpec(epoch=1, phase="val"),
                                                PhaseSpec(epoch=2)]), name="b")
    return slow, fast


def _json(args: list[str]) -> dict:
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    return dict(json.loads(result.stdout))


def test_explain_json_matches_the_doc(runs: tuple[Path, Path]) -> None:
    out = _json(["explain", str(runs[0]), "--json"])
    assert set(out) == _doc_fields("stepscope.explain")
    assert out["schema"] == "stepscope.explain" and out["schema_version"] == 1
    assert out["run"]["name"] == "a"
    assert out["answers"][0]["number"] == 1
    assert {"number", "title", "text"} == set(out["answers"][0])
    assert "input-bound" in out["answers"][0]["title"].lower() or out["answers"][0]["text"]


def test_compare_json_matches_the_doc(runs: tuple[Path, Path]) -> None:
    out = _json(["compare", str(runs[0]), str(runs[1]), "--json"])
    assert set(out) == _doc_fields("stepscope.compare")
    assert out["a"]["name"] == "a" and out["b"]["name"] == "b"
    train = out["train"]
    assert train["ratio"] == pytest.approx(train["b_images_per_s"] / train["a_images_per_s"])
    first = out["phases"][0]
    # b's train steps wait 10 ms instead of 200: a 405 ms step becomes 215 ms.
    assert first["ratio"] == pytest.approx(0.405 / 0.215, rel=0.02)
    assert (first["epoch"], first["phase"]) == (1, "train")
    assert first["a_verdict"] == "input-bound" and first["verdict_changed"] is True
    assert out["only_in_b"] == [{"epoch": 2, "phase": "train"}]


def test_doctor_json_matches_the_doc() -> None:
    out = _json(["doctor", "--json", "--budget-s", "2", "--augment", "none"])
    assert set(out) == _doc_fields("stepscope.doctor")
    assert out["schema"] == "stepscope.doctor"
    assert out["ceilings"]["forward_fp32"]["images_per_s"] > 0
    assert isinstance(out["prediction"], str)


def test_tune_json_matches_the_doc() -> None:
    from stepscope.train.tune import TuneResult, TuneRow

    result = TuneResult(rows=[TuneRow("run", "2 workers", {"workers": "2"}, images_per_s=40.0,
                                      winner=True)],
                        winner={"workers": "2"}, reason="fastest", budget_s=10, elapsed_s=9.5)
    out = json.loads(dumps(tune_json(result.to_dict(), "tuned.yaml")))
    assert set(out) == _doc_fields("stepscope.tune")
    assert out["rows"][0]["images_per_s"] == 40.0 and out["winner"] == {"workers": "2"}


def test_json_is_strict() -> None:
    text = dumps({"x": float("nan"), "y": [float("inf"), 1.5]})
    assert json.loads(text) == {"x": None, "y": [None, 1.5]}


def test_export_csv(runs: tuple[Path, Path], tmp_path: Path) -> None:
    result = runner.invoke(app, ["export", str(runs[1]), "--csv", str(tmp_path / "csv")])
    assert result.exit_code == 0, result.output
    for name, columns in (("steps.csv", STEP_COLUMNS), ("phases.csv", PHASE_COLUMNS),
                          ("samples.csv", SAMPLE_COLUMNS)):
        assert _doc_csv_columns(name) == columns
        with (tmp_path / "csv" / name).open() as f:
            rows = list(csv.DictReader(f))
        assert list(rows[0]) == columns
    with (tmp_path / "csv" / "steps.csv").open() as f:
        steps = list(csv.DictReader(f))
    assert len(steps) == 120  # three phases of 40 steps
    assert {(s["epoch"], s["phase"]) for s in steps} == {("1", "train"), ("1", "val"),
                                                        ("2", "train")}
    assert float(steps[5]["data_wait_s"]) == pytest.approx(0.01)


def test_export_of_a_non_run_is_one_line(tmp_path: Path) -> None:
    result = runner.invoke(app, ["export", str(tmp_path), "--csv", str(tmp_path / "out")])
    assert result.exit_code != 0
    assert "no run database" in str(result.exception)
