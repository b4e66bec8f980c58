"""The shape of the code: no import circle in src/, no module over 600 lines.

Imports are read from the source (``ast``), every ``import`` and ``from ... import`` of a
stepscope module, at module level or inside a function: a deferred import still ties the two
modules together, so a circle through one is still a circle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.light  # quick, no process, no thread: shares make test's interpreter


SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "stepscope"
MAX_LINES = 600


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def import_graph() -> dict[str, set[str]]:
    """Module -> the stepscope modules it imports (``from a import b`` counts ``a.b`` when
    that is a module, else ``a``)."""
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in mods
                           else node.module for a in node.names]
            graph[name].update(t for t in targets if t in mods and t != name)
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_walker_sees_a_circle() -> None:
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle_in_src() -> None:
    graph = import_graph()
    assert len(graph) > 50  # the walk found the package
    assert find_cycles(graph) == []


def test_no_module_over_600_lines() -> None:
    long = {str(p.relative_to(SRC)): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert long == {}


# What crosses layers has typed contracts (analysis/contracts*.py, reports.py); the
# dict[str, Any] left in src/ are free-form by nature (JSON records the watch hooks write, YAML
# configs, keyword arguments handed on, torch state). The ceiling is the count when the
# contracts landed (226 before them): lower it when you type another, never raise it: a new
# cross-layer dict gets a TypedDict instead.
MAX_UNTYPED_DICTS = 42


def test_untyped_dicts_do_not_regrow() -> None:
    # Lines holding one, as `grep -r "dict\[str, Any\]" src | wc -l` counts them.
    found = {str(p.relative_to(SRC)): n for p in PACKAGE.rglob("*.py")
             if (n := sum("dict[str, Any]" in line
                          for line in p.read_text(encoding="utf-8").splitlines()))}
    assert sum(found.values()) <= MAX_UNTYPED_DICTS, sorted(found.items(), key=lambda kv: -kv[1])
