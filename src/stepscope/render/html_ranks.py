"""The report's "Ranks" section for a distributed run: one row per rank, grouped by node, with
how each rank ended, its step split, how often it reached the gradient all-reduce last, and the
evidence behind a named straggler. Big jobs list the stragglers and failed ranks first."""

from __future__ import annotations

from stepscope.analysis.contracts_summary import RankRow, Summary
from stepscope.analysis.fmt import fmt_num, fmt_pct
from stepscope.render.html_page import how
from stepscope.render.svg import esc
from stepscope.render.terminal import RANK_ROWS_MAX, rank_order

Body = tuple[str, list[str]]
HEAD = ("node", "rank", "ended", "step ms", "data wait", "compute", "all-reduce",
        "arrived last", "straggler")


def _row(r: RankRow) -> str:
    node = str(r.get("host") or "?") + (f" #{r['node_rank']}" if r.get("node_rank") is not None
                                        else "")
    why = ", ".join(str(x) for x in (r.get("cause"), r.get("recurrence")) if x) \
        if r.get("straggler") else ""
    cells = [node, r["rank"], r.get("status") or "—",
             fmt_num(r.get("step_ms", r.get("wall_ms_per_step"))), fmt_num(r.get("data_wait_ms_per_step")),
             fmt_num(r.get("compute_ms_per_step")), fmt_num(r.get("comm_ms_per_step")),
             fmt_pct(r.get("arrived_last_frac")), why or ("yes" if r.get("straggler") else "")]
    return "<tr>" + "".join(f"<td>{esc(c)}</td>" for c in cells) + "</tr>"


def ranks_section(summary: Summary) -> Body | None:
    """The section, or None for a single-process run."""
    rows = summary.get("ranks") or []
    if len(rows) < 2 or "rank" not in rows[0]:
        return None
    shown = sorted(rank_order(rows), key=lambda r: (str(r.get("host")), r.get("node_rank") or 0,
                                                    int(r["rank"])))
    ths = "".join(f"<th>{esc(h)}</th>" for h in HEAD)
    parts = [f"<table><thead><tr>{ths}</tr></thead><tbody>"
             + "".join(_row(r) for r in shown) + "</tbody></table>"]
    if len(rows) > len(shown):
        parts.append(how(f"{len(rows) - len(shown)} more ranks in summary.json (the first "
                         f"{RANK_ROWS_MAX} shown: stragglers and failed ranks first)."))
    job = summary.get("distributed")
    arrival = job.get("arrival") if job else None
    text = ("ms per training step. all-reduce: time a gradient all-reduce was in flight, "
            "including waiting for slower ranks; arrived last: share of the all-reduces this "
            "rank reached last")
    if arrival and arrival.get("method"):
        text += f" ({arrival['method']})"
    parts.append(how(text + "."))
    for r in rows:
        if r.get("straggler_evidence"):
            items = "".join(f"<li>{esc(e)}</li>" for e in r["straggler_evidence"])
            parts.append(f"<h3>Rank {esc(r['rank'])}: why the others wait for it</h3>"
                         f"<ul>{items}</ul>")
    if job and (verdict_text := job.get("verdict_text")):
        parts.insert(0, f"<p>{esc(verdict_text)}</p>")
    return "Ranks", parts
