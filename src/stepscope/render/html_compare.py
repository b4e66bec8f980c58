"""``stepscope compare``'s HTML page: run b against run a, phase by phase, on the report's page.

Examples:
    >>> cmp = compare_summaries(a, b)
    >>> write_compare_report(Path("compare.html"), cmp, a, b)  # doctest: +SKIP
"""

from __future__ import annotations

from pathlib import Path

from stepscope.analysis.compare import Comparison
from stepscope.analysis.contracts_summary import Summary
from stepscope.analysis.fmt import fmt_bytes, fmt_num, fmt_pct, fmt_ratio
from stepscope.atomic import atomic_write_text
from stepscope.render.html_page import how, page, section
from stepscope.render.svg import PALETTE, Bar, bar_chart, esc, legend
from stepscope.render.terminal import fmt_verdict


def _compare_rows(cmp: Comparison) -> str:
    rows = []
    for p in cmp.phases:
        a_v = fmt_verdict(p.a_verdict, p.a_input_cause)
        b_v = fmt_verdict(p.b_verdict, p.b_input_cause)
        cells = [p.epoch, p.phase, fmt_num(p.a_images_per_s), fmt_num(p.b_images_per_s),
                 fmt_ratio(p.ratio), fmt_pct(p.a_data_wait_frac), fmt_pct(p.b_data_wait_frac)]
        verdict = f"{a_v} → {b_v}" if p.verdict_changed else a_v
        rows.append("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in cells)
                    + f'<td class="l">{"<b>" if p.verdict_changed else ""}{esc(verdict)}'
                    f'{"</b>" if p.verdict_changed else ""}</td></tr>')
    head = "".join(f"<th>{h}</th>" for h in ("epoch", "phase", "a img/s", "b img/s", "b ÷ a",
                                             "a wait", "b wait"))
    return (f"<table><thead><tr>{head}<th class=\"l\">verdict a → b</th></tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table>")


def _compare_memory(cmp: Comparison) -> str:
    rows = "".join(
        f"<tr><td class=\"l\">{esc(d.item)}</td><td>{esc(fmt_bytes(d.a_bytes))}</td>"
        f"<td>{esc(fmt_bytes(d.b_bytes))}</td><td>{esc(fmt_bytes(d.delta_bytes))}</td></tr>"
        for d in cmp.memory)
    rows += (f"<tr><th class=\"l\">total</th><th>{esc(fmt_bytes(cmp.memory_total_a))}</th>"
             f"<th>{esc(fmt_bytes(cmp.memory_total_b))}</th><th></th></tr>")
    return ("<table><thead><tr><th class=\"l\">item</th><th>a</th><th>b</th><th>b − a</th>"
            f"</tr></thead><tbody>{rows}</tbody></table>")


def _run_line(summary: Summary) -> str:
    run = summary.get("run") or {}
    command = f" (<code>{esc(run['command'])}</code>)" if run.get("command") else ""
    return f"{esc(run.get('name') or '?')}{command}"


def render_compare_report(cmp: Comparison, a_summary: Summary,
                          b_summary: Summary) -> str:
    """The comparison report as one HTML string (see :func:`write_compare_report`)."""
    colors = (PALETTE[9], PALETTE[0])
    groups = [(f"{p.epoch} {p.phase}", [Bar(f"a: {cmp.a_name}", p.a_images_per_s or 0.0,
                                            colors[0]),
                                        Bar(f"b: {cmp.b_name}", p.b_images_per_s or 0.0,
                                            colors[1])]) for p in cmp.phases]
    waits = [(f"{p.epoch} {p.phase}", [Bar("a", 100 * (p.a_data_wait_frac or 0.0), colors[0]),
                                       Bar("b", 100 * (p.b_data_wait_frac or 0.0), colors[1])])
             for p in cmp.phases]
    keys = legend([(f"a: {cmp.a_name}", colors[0], "box"), (f"b: {cmp.b_name}", colors[1], "box")])
    cards = [(fmt_ratio(cmp.train_ratio), "training img/s, b ÷ a"),
             (fmt_ratio(cmp.val_ratio), "validation img/s, b ÷ a"),
             (f"{fmt_num(cmp.train_images_per_s_a)} → {fmt_num(cmp.train_images_per_s_b)}",
              "training img/s, a → b")]
    resolved = ", ".join(cmp.findings_resolved) or "none"
    new = ", ".join(cmp.findings_new) or "none"
    body = [
        f"<h1>{esc(cmp.b_name)} against {esc(cmp.a_name)}</h1>",
        f"<p class=\"sub\">a: {_run_line(a_summary)} · b: {_run_line(b_summary)}</p>",
        "<div class=\"cards\">" + "".join(f'<div class="card"><b>{esc(v)}</b><span>{esc(k)}'
                                          "</span></div>" for v, k in cards) + "</div>",
        section("speed", "Throughput per epoch and phase",
                bar_chart(groups, unit="img/s", y_label="images per second", stacked=False),
                keys, how("Higher is faster. Phases are matched by epoch number.")),
        section("wait", "Share of step time waiting for data",
                bar_chart(waits, unit="pct", y_label="waiting for data (%)", stacked=False),
                keys, how("Lower is better: time the model sat idle waiting for a batch.")),
        section("table", "Phase by phase", _compare_rows(cmp)),
        section("memory", "Memory ledger", _compare_memory(cmp)),
        section("findings", "Findings",
                f"<p>Resolved in b: {esc(resolved)}. New in b: {esc(new)}.</p>"),
    ]
    return page(f"stepscope compare · {cmp.b_name} vs {cmp.a_name}", body)


def write_compare_report(path: Path, cmp: Comparison, a_summary: Summary,
                         b_summary: Summary) -> Path:
    """Write the comparison of two runs as one self-contained HTML file at ``path``.

    Examples:
        >>> write_compare_report(Path("compare.html"), cmp, a, b)  # doctest: +SKIP
    """
    return atomic_write_text(Path(path), render_compare_report(cmp, a_summary, b_summary))


__all__ = ["render_compare_report", "write_compare_report"]
