"""``fitcheck explain --plot`` / ``--html``: the per-moment memory of a step, stacked by what
holds it, predicted beside measured, and a snapshot's allocation timeline (the view of
PyTorch's memory_viz) under the planner's per-moment levels. matplotlib is imported here only,
when a picture is asked for."""

from __future__ import annotations

import base64
import html
import io
import json
from typing import Any

from planner.runs.evidence import Moment
from planner.runs.explain import CATEGORY_WORDS, STACK_ORDER, Explanation
from planner.runs.units import GiB

COLORS = {"params": "#4c72b0", "optimizer_states": "#8172b3", "gradients": "#dd8452",
          "gathered_params": "#64b5cd", "comm_buffers": "#937860", "cublas_workspace": "#8c8c8c",
          "activations": "#55a868", "transients": "#c44e52", "optimizer_temporaries": "#da8bc3",
          "before_trace": "#4c72b0", "other": "#cccccc", "allocator": "#f2e6a6",
          "non_pytorch": "#555555", "requested": "#ffffff", "allocated": "#7f9fbf"}
LEGEND = {**CATEGORY_WORDS, "allocator": "allocator (reserved beyond allocated)",
          "non_pytorch": "non-PyTorch (CUDA context, NCCL, ...)",
          "requested": "the allocation that failed", "allocated": "allocated (no breakdown)"}


def _bars(ax: Any, x: Explanation) -> None:
    width = 0.38
    rows = [r for r in x.rows if r.moment is not Moment.LOADING or r.measured is not None]
    seen: set[str] = set()

    def seg(xpos: float, bottom: float, h: float, key: str, **kw: Any) -> float:
        if h <= 0:
            return bottom
        ax.bar(xpos, h / GiB, width, bottom=bottom / GiB, color=COLORS.get(key, "#cccccc"),
               edgecolor="black" if key == "requested" else "white", linewidth=0.6,
               label=None if key in seen else LEGEND.get(key, key), **kw)
        seen.add(key)
        return bottom + h

    for i, r in enumerate(rows):
        b = 0.0
        for cat in STACK_ORDER:
            b = seg(i - width / 2, b, float(getattr(r.predicted, cat)), cat)
        b = seg(i - width / 2, b, r.predicted_needed - float(r.predicted.total), "allocator")
        seg(i - width / 2, b, r.predicted_device - r.predicted_needed, "non_pytorch")
        m = r.measured
        if m is None:
            ax.text(i + width / 2, 0.5, "not\nmeasured", ha="center", va="bottom", fontsize=7,
                    color="#777777")
            continue
        b = 0.0
        if m.categories:
            for cat in ("before_trace", *STACK_ORDER, "other"):
                b = seg(i + width / 2, b, float(m.categories.get(cat, 0)), cat)
        elif m.allocated:
            b = seg(i + width / 2, b, float(m.allocated), "allocated")
        if m.reserved and m.allocated and m.reserved > m.allocated:
            b = seg(i + width / 2, b, float(m.reserved - m.allocated), "allocator", hatch="//")
        if m.device_used and m.reserved and m.device_used > m.reserved:
            b = seg(i + width / 2, b, float(m.device_used - m.reserved), "non_pytorch")
        if m.at_oom and m.requested:
            seg(i + width / 2, b, float(m.requested), "requested", hatch="..")
            ax.annotate("OOM", (i + width / 2, (b + m.requested) / GiB), xytext=(0, 12),
                        textcoords="offset points", ha="center", fontsize=8,
                        color="#c44e52", fontweight="bold",
                        arrowprops={"arrowstyle": "-", "color": "#c44e52"})
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([f"{r.moment}\npredicted | measured" for r in rows], fontsize=8)
    top = max([r.predicted_device for r in rows] + [
        (r.measured.device_used or r.measured.reserved or r.measured.allocated or 0)
        + (r.measured.requested or 0) for r in rows if r.measured]) / GiB
    cap = x.capacity_bytes / GiB
    usable = x.estimate.usable_bytes / GiB
    if cap <= 3 * top:  # the device's lines, when they are on the same scale as the bars
        ax.axhline(cap, color="black", linewidth=1)
        ax.text(-0.5, cap, f" device {cap:.1f} GiB", va="bottom", ha="left", fontsize=8)
        ax.axhline(usable, color="black", linewidth=0.8, linestyle="--")
        ax.text(-0.5, usable, f" usable at the {x.request.options.margin:.0%} margin "
                f"{usable:.1f} GiB", va="bottom", fontsize=7)
    else:
        ax.set_ylim(0, top * 1.25)
        ax.text(-0.5, top * 1.18, f" device {cap:.1f} GiB, usable {usable:.1f} GiB: off this "
                "scale", va="bottom", ha="left", fontsize=8)
    if x.broke_moment is not None:
        for i, r in enumerate(rows):
            if r.moment is x.broke_moment:
                ax.axvspan(i - 0.5, i + 0.5, color="#c44e52", alpha=0.07, linewidth=0)
    ax.set_ylim(0, ax.get_ylim()[1] * 1.08)
    ax.set_ylabel("GiB (2**30 bytes) per GPU")
    ax.set_title("memory per moment of the step: planner (left) vs run (right)", fontsize=10)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))


def _timeline(ax: Any, x: Explanation) -> None:
    snap = max(x.run.snapshots, key=lambda s: s.trace_entries)
    ts = [t for t, _ in snap.timeline]
    cats = [c for c in ("before_trace", *STACK_ORDER, "other")
            if any(d.get(c) for _t, d in snap.timeline)]
    ys = [[d.get(c, 0) / GiB for _t, d in snap.timeline] for c in cats]
    ax.stackplot(ts, ys, colors=[COLORS.get(c, "#cccccc") for c in cats],
                 labels=[LEGEND.get(c, c) for c in cats], linewidth=0)
    pred = {r.moment: r.predicted.total / GiB for r in x.rows}
    drawn = False
    for m, t0, t1 in snap.moment_spans:
        mm = Moment.FORWARD if m is Moment.LOSS else m
        if mm in pred:
            ax.hlines(pred[mm], t0, t1, colors="black", linewidth=1.2,
                      label=None if drawn else "planner: allocated at the moment")
            drawn = True
    unit = "s" if snap.moment_spans and snap.timeline and ts[-1] != len(ts) - 1 else "entry"
    ax.set_xlabel(f"time since the trace began ({unit})")
    ax.set_ylabel("GiB allocated")
    ax.set_title(f"snapshot trace ({snap.trace_entries} entries), stacked by category", fontsize=10)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))


def plot_png(x: Explanation) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with_trace = any(s.timeline for s in x.run.snapshots)
    fig, axes = plt.subplots(2 if with_trace else 1, 1, figsize=(11, 8.5 if with_trace else 5),
                             squeeze=False)
    _bars(axes[0][0], x)
    if with_trace:
        _timeline(axes[1][0], x)
    c = x.candidate
    fig.suptitle(f"fitcheck explain: {x.request.model.name} on {x.request.cluster.n_gpus} x "
                 f"{x.request.cluster.gpu.id}, {c.strategy}, checkpointing {c.checkpointing}",
                 fontsize=11)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


def html_report(text: str, png: bytes, doc: dict[str, Any]) -> str:
    img = base64.b64encode(png).decode("ascii")
    return ("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>fitcheck explain</title>"
            "<style>body{font-family:sans-serif;max-width:1200px;margin:1em auto}"
            "pre{background:#f6f6f6;padding:1em;overflow-x:auto;font-size:12px}</style></head>"
            "<body><h1>fitcheck explain</h1>"
            f"<img alt=\"memory per moment, predicted vs measured\" src=\"data:image/png;base64,"
            f"{img}\" style=\"max-width:100%\">"
            f"<pre>{html.escape(text)}</pre>"
            "<details><summary>JSON</summary>"
            f"<pre>{html.escape(json.dumps(doc, indent=2))}</pre></details></body></html>\n")
