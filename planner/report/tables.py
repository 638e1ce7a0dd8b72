"""The report's tables (pandas; Markdown via tabulate)."""

from __future__ import annotations

from typing import Any

from planner import __version__
from planner.candidates import label
from planner.report.request import ReportRequest
from planner.report.sweep import Report
from planner.search import MAX_GPUS_SEARCHED
from planner.spec import Candidate, Checkpointing, Offload, Strategy

GiB = 2**30


def fmt_count(x: float) -> str:
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:g}{unit}"
    return f"{x:g}"


def describe(req: ReportRequest) -> list[str]:
    """The request, as bullet lines (both the Markdown and the HTML header)."""
    t = req.training
    price = ("none given (no cost columns)" if not req.prices else
             ", ".join(f"{g} ${p:g}" for g, p in req.prices.items()))
    return [
        f"models: {', '.join(m for m, _ in req.models)}",
        f"GPUs: {', '.join(g.id for g in req.gpus)}; n: {', '.join(map(str, req.ns))}",
        f"seq: {', '.join(map(str, req.seqs))}; micro-batch: "
        f"{', '.join(map(str, req.micro_batches))}; grad-accum: {t.grad_accum} "
        f"(gradient sync {t.grad_sync})",
        f"precision: {t.precision}; optimizer: {t.optimizer} ({t.optimizer_impl}); "
        f"attention: {t.attention}; loss: {t.loss}; compile: {t.compile}; allocator: "
        f"{t.allocator}; margin: {req.margin:g} (fits: the 90% interval of the need, from the "
        "measured error of its kind of job, is within capacity x (1 - margin); docs/accuracy.md)",
        f"strategies: {', '.join(map(str, req.strategies))}; checkpointing: "
        f"{', '.join(map(str, req.checkpointings))}; offload: {req.offload}; tensor parallel: "
        f"{'auto' if req.options.tp is None else req.options.tp}",
        f"tokens to train: {fmt_count(req.tokens)}; $ per GPU-hour: {price}",
    ] + calibrations(req)


def calibrations(req: ReportRequest) -> list[str]:
    """Which GPU types a calibration applies to (none: no line)."""
    used = {}
    for row in req.plans:
        for g, r in zip(req.gpus, row):
            if r.runtime.calibration:
                used.setdefault(g.id, r.runtime.calibration["id"])
    if not used:
        return []
    line = "calibration: " + ", ".join(f"{g} {c}" for g, c in used.items())
    if len(used) < len(req.gpus):
        line += "; the other GPU types: none"
    return [line + " (docs/calibration.md)"]


def min_gpu_tables(report: Report) -> list[tuple[str, Any]]:
    """(title, DataFrame) per seq x micro-batch: model rows x GPU columns, cells "n: strategy"."""
    import pandas as pd

    req, mins = report.request, report.min_gpus
    gpu_ids = [g.id for g in req.gpus]
    model_ids = [m for m, _ in req.models]
    out = []
    variants = [("", "without offload")]
    if "min_gpus_offload" in mins:
        variants.append(("_offload", "CPU offload allowed (as `fitcheck --find min-gpus`)"))
    for seq in req.seqs:
        for mb in req.micro_batches:
            sel = mins[(mins.seq == seq) & (mins.micro_batch == mb)]
            for suffix, words in variants:
                cell = {}
                for r in sel.itertuples(index=False):
                    n = getattr(r, "min_gpus" + suffix)
                    rec = getattr(r, "recommended" + suffix)
                    cell[(r.model, r.gpu)] = (f"none up to {MAX_GPUS_SEARCHED}" if pd.isna(n)
                                              else f"{int(n)}: {rec}")
                table = pd.DataFrame([[cell.get((m, g), "") for g in gpu_ids] for m in model_ids],
                                     columns=gpu_ids)
                table.insert(0, "model", model_ids)
                out.append((f"seq {seq}, micro-batch {mb}, {words}", table))
    return out


def best_table(report: Report, model: str) -> Any:
    """The recommended configuration at each swept (gpu, n, seq, micro-batch) of one model."""
    req, rows = report.request, report.rows
    b = rows[(rows.model == model) & rows.best]
    out = b[["gpu", "n", "seq", "micro_batch"]].copy()
    out["recommended"] = [label(Candidate(strategy=Strategy(s), checkpointing=Checkpointing(c),
                                          offload=Offload(o), tp=int(t)))
                          for s, c, o, t in zip(b.strategy, b.checkpointing, b.offload, b.tp)]
    out["needs GiB/GPU"] = (b.required_bytes / GiB).round(1)
    out["tokens/s/GPU"] = b.tokens_per_s_per_gpu.round(0).astype("int64")
    out["tokens/s"] = b.tokens_per_s.round(0).astype("int64")
    out["MFU"] = (b.mfu * 100).round(1).astype(str) + " %"
    out[f"days for {fmt_count(req.tokens)} tokens"] = b.train_days.map(lambda d: f"{d:.3g}")
    out["GPU-hours"] = b.gpu_hours.map(lambda h: f"{h:,.0f}")
    if req.prices:
        out["cost $"] = b.cost_usd.map(lambda c: f"{c:,.0f}")
    return out.reset_index(drop=True)


def markdown(report: Report) -> str:
    req = report.request
    rows = report.rows
    lines = ["# fitcheck capacity report", "",
             f"fitcheck {__version__}: {len(rows)} configurations, {int(rows.fits.sum())} fit, "
             f"{int((rows.outcome == 'at_risk').sum())} at risk (the interval of the need "
             "straddles the usable memory; `oom_probability` in report.csv). "
             "Every number is the planner's own (`planner.memory.estimate`, "
             "`planner.throughput.estimate_step`); `report.csv` has one row per configuration.",
             ""]
    lines += [f"- {d}" for d in describe(req)]
    lines += [f"- note: {n}" for n in report.notes]
    lines += ["", "## Minimum GPUs per model and GPU type", "",
              "The fewest GPUs of each type for which some candidate fits (every count up to "
              "one node, then whole nodes), and the planner's recommendation at that count.", ""]
    for title, table in min_gpu_tables(report):
        lines += [f"### {title}", "", table.to_markdown(index=False), ""]
    lines += ["## Throughput and time to train per model", "",
              f"At each swept GPU count where something fits: the recommended configuration "
              f"(fastest that fits, ties to the simplest), its throughput, and the time "
              f"{'and cost ' if req.prices else ''}to train {fmt_count(req.tokens)} tokens.", ""]
    for m, _ in req.models:
        t = best_table(report, m)
        lines += [f"### {m}", ""]
        lines += [t.to_markdown(index=False) if len(t) else "Nothing fits at the swept GPU counts.",
                  ""]
    return "\n".join(lines)
