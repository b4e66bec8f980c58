"""The page both HTML reports are built on: the document, its CSS, a section, the reading hints.

One self-contained file: the CSS is inlined, there is no script, every string is escaped.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from stepscope.render.svg import esc


def css() -> str:
    return (Path(__file__).parent / "assets" / "report.css").read_text(encoding="utf-8")


def page(title: str, body: Sequence[str]) -> str:
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
        f"<title>{esc(title)}</title><style>{css()}</style></head><body><main>"
        + "\n".join(body)
        + "<footer>Made by stepscope. Every figure comes from a run's database (run.db, in its "
        "run directory); byte figures are decimal (1 MB = 10⁶ bytes).</footer></main></body>"
        "</html>\n"
    )


def section(anchor: str, title: str, *parts: str) -> str:
    return f'<section id="{esc(anchor)}"><h2>{esc(title)}</h2>{"".join(parts)}</section>'


def how(text: str) -> str:
    return f'<p class="how">{esc(text)}</p>'


def empty(text: str) -> str:
    return f'<p class="empty">{esc(text)}</p>'



__all__ = ["css", "empty", "how", "page", "section"]
