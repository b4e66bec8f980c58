"""Notebooks: examples/notebook.ipynb executed by nbclient on this interpreter's kernel (a Monitor
run in a cell, the report inline, no thread or signal handler left, a second run in the same
kernel), and stepscope.show's two faces on a hand-made run."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from stepscope.notebook import RunView, show
from tests.analysis_runs import PhaseSpec, RunSpec, make_run

ROOT = Path(__file__).parents[1]


def test_show_renders_html_and_text(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", RunSpec(phases=[PhaseSpec(epoch=1, data_wait_s=0.3),
                                                    PhaseSpec(epoch=1, phase="val")]))
    view = show(run)
    assert isinstance(view, RunView)
    page = view._repr_html_()
    assert page.startswith("<iframe") and "srcdoc=" in page
    assert "<script" not in page.lower()  # self-contained, nothing to run
    # The same sections as report.html, which show() also (re)wrote.
    report = (run / "report.html").read_text()
    for section in ('id="phases"', 'id="steps"', 'id="ledger"'):
        assert section in report
        assert section.replace('"', "&quot;") in page
    text = str(view)
    assert "\x1b[" not in text  # plain text, no colour codes
    assert view.answers[0].title in text
    assert repr(view) == text


def _kernelspec(tmp_path: Path, runs: Path) -> str:
    """A kernel for this interpreter and this checkout's source, in a private JUPYTER_PATH."""
    name = "stepscope-test"
    spec = tmp_path / "jupyter" / "kernels" / name
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": name, "language": "python",
        "env": {"PYTHONPATH": str(ROOT / "src"), "STEPSCOPE_NOTEBOOK_RUNS": str(runs)},
    }))
    return name


@pytest.mark.slow
def test_example_notebook_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    runs = tmp_path / "runs"
    kernel = _kernelspec(tmp_path, runs)
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    nb = nbformat.read(ROOT / "examples" / "notebook.ipynb", as_version=4)
    client = nbclient.NotebookClient(nb, kernel_name=kernel, timeout=300,
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()  # raises CellExecutionError if any cell fails (its asserts included)
    code = [c for c in nb.cells if c.cell_type == "code"]
    html = [o for o in code[1].outputs if o.get("output_type") == "execute_result"]
    assert html and "<iframe" in html[0]["data"]["text/html"]
    assert "threads left behind: []" in "".join(o.get("text", "") for o in code[2].outputs)
    second = "".join(o.get("text", "") for o in code[3].outputs)
    assert "report:" in second and str(runs / "second") in second
    assert (runs / "first" / "report.html").is_file() and (runs / "second" / "summary.json").is_file()
    verdicts = "".join(o.get("text", "") for o in code[4].outputs)
    # 4 ms x 8 images of planted loading per step against a ~1 ms model: input-bound.
    assert verdicts.count("input-bound") == 2, verdicts
