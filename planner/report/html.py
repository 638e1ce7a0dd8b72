"""The report as one self-contained HTML page: tables inline, plots as data URIs."""

from __future__ import annotations

import base64
import html

from planner import __version__
from planner.report.plots import PLOTS
from planner.report.sweep import Report
from planner.report.tables import best_table, describe, min_gpu_tables


_CSS = """body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;
margin:2em auto;max-width:1400px;padding:0 1em;color:#222}
h1{font-size:1.6em}h2{margin-top:2em;border-bottom:1px solid #ddd}
img{max-width:100%;height:auto;border:1px solid #eee}
table{border-collapse:collapse;font-size:0.85em;margin:0.6em 0}
th,td{border:1px solid #ccc;padding:3px 7px;text-align:right}
th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}
.note{color:#555}"""


def html_page(report: Report, pngs: dict[str, bytes]) -> str:
    """One self-contained page: tables inline, plots as base64 PNG data URIs."""
    req, rows = report.request, report.rows

    def e(text: str) -> str:
        """Escaped, with Markdown `code` spans as <code>."""
        parts = html.escape(text).split("`")
        return "".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(parts))

    out = ["<!doctype html>", '<html lang="en"><head><meta charset="utf-8">',
           "<title>fitcheck capacity report</title>", f"<style>{_CSS}</style></head><body>",
           "<h1>fitcheck capacity report</h1>",
           f"<p>fitcheck {e(__version__)}: {len(rows)} configurations, {int(rows.fits.sum())} "
           f"fit, {int((rows.outcome == 'at_risk').sum())} at risk (the interval of the need "
           "straddles the usable memory; oom_probability in report.csv). Every number is the planner's own; report.csv has one row per "
           "configuration.</p>", "<ul>"]
    out += [f"<li>{e(d)}</li>" for d in describe(req)]
    out += [f'<li class="note">note: {e(n)}</li>' for n in report.notes]
    out.append("</ul>")
    for kind, (_, title, words) in PLOTS.items():
        out.append(f'<h2 id="{kind}">{e(title)}</h2><p>{e(words)}</p>')
        if kind in pngs:
            data = base64.b64encode(pngs[kind]).decode("ascii")
            out.append(f'<img src="data:image/png;base64,{data}" alt="{html.escape(title)}">')
        if kind == "min_gpus":
            for t_title, table in min_gpu_tables(report):
                out.append(f"<h3>{e(t_title)}</h3>")
                out.append(table.to_html(index=False, border=0))
        if kind == "train_time_cost":
            for m, _ in req.models:
                t = best_table(report, m)
                out.append(f"<h3>{e(m)}</h3>")
                out.append(t.to_html(index=False, border=0) if len(t)
                           else "<p>Nothing fits at the swept GPU counts.</p>")
    out.append("</body></html>")
    return "\n".join(out)
