"""The report's plots (matplotlib, imported only when a plot is asked for)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from planner.report.request import ReportRequest
from planner.report.sweep import Report
from planner.report.tables import fmt_count
from planner.spec import Strategy

GiB = 2**30
MATPLOTLIB_MISSING = "plots need matplotlib: pip install 'fitcheck-planner[plots]'"


def have_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


_GPU_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">")


def _gpu_style(j: int) -> dict[str, Any]:
    """Colour and marker per GPU type (lines that coincide stay distinguishable)."""
    return {"color": f"C{j % 10}", "marker": _GPU_MARKERS[j % len(_GPU_MARKERS)], "ms": 4.5,
            "lw": 1.5, "mfc": "none", "mew": 1.2}


def _provenance(g: Any, req: ReportRequest) -> str:
    """The provenance of the compute efficiency the plans use on GPU type ``g``: that of the
    plan's copy (a calibration may have replaced the profile's value; the efficiency does not
    depend on the model, so the first model's plan says it)."""
    from planner.throughput import efficiency_provenance

    j = req.gpus.index(g)
    return efficiency_provenance(req.plans[0][j].cluster.gpu, req.training.compile)


def _speed_label(g: Any, req: ReportRequest) -> tuple[str, dict[str, Any]]:
    """A GPU's label and line style on a speed plot: "(eff. derived)" or "(eff. assumed)" and a
    dashed line where its compute efficiency is not measured on its family
    (planner.throughput.efficiency_provenance; docs/throughput.md section 2)."""
    prov = _provenance(g, req)
    if prov == "measured":
        return g.id, {}
    return f"{g.id} (eff. {prov})", {"ls": "--"}


_STRATEGY_STYLE = {  # named equivalents share a colour: FSDP solid, DeepSpeed dashed
    Strategy.DDP: ("C0", "-", "o"),
    Strategy.NO_SHARD: ("C0", "--", "x"),
    Strategy.SHARD_GRAD_OP: ("C1", "-", "s"),
    Strategy.ZERO2: ("C1", "--", "x"),
    Strategy.FULL_SHARD: ("C2", "-", "^"),
    Strategy.ZERO3: ("C2", "--", "x"),
    Strategy.HYBRID_SHARD: ("C3", "-", "D"),
    Strategy.ZERO1: ("C4", "--", "x"),
}


class _Layout:
    """A fixed grid in inches (no constrained/tight layout: it costs more than the drawing)."""

    def __init__(self, nrows: int, ncols: int, w: float, h: float, *, left: float = 0.8,
                 right: float = 0.2, top: float = 0.65, bottom: float = 0.95,
                 wgap: float = 0.75, hgap: float = 0.75, sharey: Any = False) -> None:
        from matplotlib.figure import Figure

        W = left + right + ncols * w + (ncols - 1) * wgap
        H = top + bottom + nrows * h + (nrows - 1) * hgap
        self.W, self.H, self.top, self.bottom = W, H, top, bottom
        self.fig = Figure(figsize=(W, H), dpi=100)
        self.axes = self.fig.subplots(
            nrows, ncols, squeeze=False, sharey=sharey,
            gridspec_kw=dict(left=left / W, right=1 - right / W, top=1 - top / H,
                             bottom=bottom / H, wspace=wgap / w, hspace=hgap / h))

    def finish(self, title: str, handles: Sequence[Any], labels: Sequence[str],
               ncol: int) -> Any:
        """The title wrapped to the figure's width and the legend in as many rows as its
        entries need; the margins grow to hold both (nothing is cut off)."""
        import textwrap

        lines = textwrap.wrap(title, width=max(30, int(self.W * 11.5)))
        self.fig.suptitle("\n".join(lines), fontsize=11, y=1 - 0.12 / self.H, va="top")
        extra_top = 0.25 * (len(lines) - 1)
        extra_bottom = 0.0
        if handles:
            longest = max(len(label) for label in labels)
            per_row = max(1, min(ncol, int(self.W / (0.35 + 0.075 * longest))))
            rows = -(-len(handles) // per_row)
            extra_bottom = 0.3 * (rows - 1)
            self.fig.legend(handles, labels, loc="lower center", ncol=per_row, fontsize=9,
                            frameon=False, bbox_to_anchor=(0.5, 0.0))
        if extra_top or extra_bottom:
            H = self.H + extra_top + extra_bottom
            gs = self.axes[0][0].get_gridspec()
            self.fig.set_size_inches(self.W, H)
            # the axes keep their size in inches; only the margins grow
            gs.update(top=1 - (self.top + extra_top) / H, bottom=(self.bottom + extra_bottom) / H)
            for ax in self.fig.axes:
                ax.set_position(ax.get_subplotspec().get_position(self.fig))
            self.fig._suptitle.set_y(1 - 0.12 / H)
        return self.fig


def _log2_x(ax: Any, ns: Sequence[int], label: bool = True) -> None:
    from matplotlib.ticker import FixedFormatter, FixedLocator, NullLocator

    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(list(ns)))
    ax.xaxis.set_major_formatter(FixedFormatter([str(n) for n in ns]))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.tick_params(labelsize=8)
    if len(ns) > 1:
        ax.set_xlim(min(ns) / 1.3, max(ns) * 1.3)
    ax.grid(True, which="major", alpha=0.3)
    if label:
        ax.set_xlabel("GPUs (log scale)", fontsize=9)


def _log_y(ax: Any, fmt: Callable[[float, Any], str] | None = None) -> None:
    """Log y with ticks at 1, 2, 5 x 10^k written plainly (no 2 x 10^2), no minor ticks."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator

    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(fmt or (lambda v, _: fmt_count(v))))
    ax.yaxis.set_minor_locator(NullLocator())
    ax.grid(True, which="major", axis="y", alpha=0.3)


def _first(req: ReportRequest) -> tuple[int, int]:
    return req.seqs[0], req.micro_batches[0]


def _plot_setting(req: ReportRequest) -> str:
    seq, mb = _first(req)
    return f"seq {seq}, micro-batch {mb}, {req.training.precision}"


def _hide_unused(axes: Any, used: int, ncols: int) -> None:
    for k in range(used, len(axes) * ncols):
        axes[k // ncols][k % ncols].set_visible(False)


def plot_memory(report: Report) -> Any:
    """Device memory per GPU vs GPU count, one line per strategy (no offload, the lightest
    requested checkpointing), one panel per model x GPU type, capacity and usable lines."""
    from matplotlib.lines import Line2D

    req, rows = report.request, report.rows
    seq, mb = _first(req)
    ck, ck_heavy = req.checkpointings[0], req.checkpointings[-1]
    d_all = rows[(rows.seq == seq) & (rows.micro_batch == mb) & (rows.offload == "none")
                 & (rows.tp == 1)]
    d = d_all[d_all.checkpointing == str(ck)]
    d_heavy = d_all[d_all.checkpointing == str(ck_heavy)] if ck_heavy is not ck else None
    nm, ng = len(req.models), len(req.gpus)
    lay = _Layout(nm, ng, 3.0, 2.3, wgap=0.3, hgap=0.65, sharey="row")
    axes = lay.axes
    handles: dict[str, Any] = {}
    for i, (m, _) in enumerate(req.models):
        lo, hi = math.inf, 0.0
        for j, g in enumerate(req.gpus):
            ax = axes[i][j]
            sel = d[(d.model == m) & (d.gpu == g.id)]
            heavy = (d_heavy[(d_heavy.model == m) & (d_heavy.gpu == g.id)]
                     if d_heavy is not None else None)
            for s in req.strategies:
                ss = sel[sel.strategy == str(s)].sort_values("n")
                if not len(ss):
                    continue
                color, ls, marker = _STRATEGY_STYLE[s]
                if heavy is not None:  # the same strategy with the heaviest checkpointing
                    hh = heavy[heavy.strategy == str(s)].sort_values("n")
                    yh = hh.required_bytes / GiB
                    if len(hh):
                        lo = min(lo, float(yh.min()))
                        ax.plot(hh.n, yh, color=color, ls=ls, lw=0.9, alpha=0.35)
                y = ss.required_bytes / GiB
                lo, hi = min(lo, float(y.min())), max(hi, float(y.max()))
                (h,) = ax.plot(ss.n, y, color=color, ls=ls, marker=marker, ms=3.5, lw=1.3,
                               label=str(s))
                handles.setdefault(str(s), h)
            cap = g.memory_bytes / GiB
            lo, hi = min(lo, cap * (1 - req.margin)), max(hi, cap)
            h = ax.axhline(cap, color="black", lw=1.6, label="GPU capacity")
            handles.setdefault("GPU capacity", h)
            h = ax.axhline(cap * (1 - req.margin), color="black", lw=1.0, ls=":",
                           label=f"usable ({1 - req.margin:.0%} of capacity)")
            handles.setdefault("usable", h)
            ax.axhspan(cap, 1e12, color="tab:red", alpha=0.07, lw=0)
            _log2_x(ax, req.ns, label=i == nm - 1)
            ax.set_title(f"{m} on {g.id}", fontsize=10)
        _log_y(axes[i][0], lambda v, _: f"{v:,.0f}" if v >= 1 else f"{v:g}")
        if hi > 0:
            axes[i][0].set_ylim(lo / 1.4, hi * 1.4)
        axes[i][0].set_ylabel("GiB needed per GPU (log scale)", fontsize=9)
        axes[i][0].tick_params(axis="y", labelsize=8)
    if d_heavy is not None:
        handles[f"{ck_heavy} checkpointing"] = Line2D(
            [], [], color="gray", lw=0.9, alpha=0.5, label=f"faint: {ck_heavy} checkpointing")
    faint = f", faint: {ck_heavy}" if d_heavy is not None else ""
    title = (f"Device memory needed per GPU vs GPU count ({_plot_setting(req)}, no offload, "
             "no tensor parallel; "
             f"checkpointing {ck}{faint}); shaded: over capacity")
    hs = list(handles.values())
    return lay.finish(title, hs, [h.get_label() for h in hs], min(len(hs), 7))


def plot_min_gpus(report: Report) -> Any:
    """Grouped bars: the fewest GPUs per model (x) and GPU type (bars), one panel per
    seq x micro-batch, without offload."""
    import numpy as np
    import pandas as pd
    from matplotlib.ticker import FuncFormatter, NullLocator

    req, mins = report.request, report.min_gpus
    combos = [(s, b) for s in req.seqs for b in req.micro_batches]
    ncols = min(len(combos), 2)
    nrows = -(-len(combos) // ncols)
    width = max(5.0, 0.35 * len(req.models) * (len(req.gpus) + 1))
    lay = _Layout(nrows, ncols, width, 3.2, bottom=0.8, hgap=0.8)
    axes = lay.axes
    models = [m for m, _ in req.models]
    x = np.arange(len(models))
    bw = 0.8 / max(len(req.gpus), 1)
    for k, (seq, mb) in enumerate(combos):
        ax = axes[k // ncols][k % ncols]
        sel = mins[(mins.seq == seq) & (mins.micro_batch == mb)]
        top = 1
        for j, g in enumerate(req.gpus):
            vals = []
            for m in models:
                r = sel[(sel.model == m) & (sel.gpu == g.id)]
                v = r.min_gpus.iloc[0] if len(r) else None
                vals.append(None if v is None or pd.isna(v) else int(v))
            xs = x - 0.4 + bw * (j + 0.5)
            ax.bar(xs, [v if v is not None else 0 for v in vals], bw * 0.92, color=f"C{j}",
                   label=g.id)
            for xi, v in zip(xs, vals):
                ax.annotate("none" if v is None else str(v), (xi, v or 1), ha="center",
                            va="bottom", fontsize=7, xytext=(0, 1), textcoords="offset points")
                top = max(top, v or 1)
        ax.set_yscale("log", base=2)
        ax.set_ylim(0.8, top * 2.2)
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_locator(NullLocator())
        ax.set_xticks(x)
        ax.set_xticklabels(models, fontsize=9)
        ax.tick_params(axis="y", labelsize=8)
        ax.set_ylabel("minimum GPUs (log scale)", fontsize=9)
        ax.set_title(f"seq {seq}, micro-batch {mb}", fontsize=10)
        ax.grid(True, axis="y", alpha=0.3)
    _hide_unused(axes, len(combos), ncols)
    return lay.finish(f"Fewest GPUs for which some strategy fits, without offload "
                      f"({req.training.precision})", *axes[0][0].get_legend_handles_labels(),
                      len(req.gpus))


def _best_first(report: Report) -> Any:
    req, rows = report.request, report.rows
    seq, mb = _first(req)
    return rows[(rows.seq == seq) & (rows.micro_batch == mb) & rows.best]


def _model_grid(n_models: int) -> tuple[int, int]:
    ncols = min(n_models, 4)
    return -(-n_models // ncols), ncols


def plot_throughput(report: Report) -> Any:
    """Tokens/s per GPU of the recommended configuration vs GPU count, per model, a line per
    GPU type (missing points: nothing fits)."""
    from matplotlib.ticker import FuncFormatter

    req = report.request
    b = _best_first(report)
    nrows, ncols = _model_grid(len(req.models))
    lay = _Layout(nrows, ncols, 3.2, 2.5, bottom=0.9)
    axes = lay.axes
    for k, (m, _) in enumerate(req.models):
        ax = axes[k // ncols][k % ncols]
        for j, g in enumerate(req.gpus):
            sel = b[(b.model == m) & (b.gpu == g.id)].sort_values("n")
            name, dash = _speed_label(g, req)
            ax.plot(sel.n, sel.tokens_per_s_per_gpu, label=name, **_gpu_style(j), **dash)
        _log2_x(ax, req.ns)
        ax.set_ylim(bottom=0)
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
        ax.tick_params(labelsize=8)
        ax.set_title(m, fontsize=10)
        if k % ncols == 0:
            ax.set_ylabel("tokens/s per GPU", fontsize=9)
    _hide_unused(axes, len(req.models), ncols)
    return lay.finish(f"Throughput of the recommended strategy ({_plot_setting(req)}; "
                      f"no point: nothing fits{_eff_note(req)})",
                      *axes[0][0].get_legend_handles_labels(),
                      len(req.gpus))


def _eff_note(req: ReportRequest) -> str:
    """The title's note when a GPU's compute efficiency is not measured on its family."""
    from planner.error_bands import efficiency_widening

    provs = [_provenance(g, req) for g in req.gpus]
    if all(p == "measured" for p in provs):
        return ""
    w = max(efficiency_widening(p, req.training.compile) for p in provs)
    return (f"; dashed: compute efficiency not measured on that GPU family, derived from a "
            f"sibling or assumed, tokens/s band widened by {w * 100:.0f} points")


def plot_train_time_cost(report: Report) -> Any:
    """Days (and $, with prices) to train the tokens vs GPU count, per model, per GPU type."""
    req = report.request
    b = _best_first(report)
    per_model = 2 if req.prices else 1
    ncols = min(len(req.models), 4)
    blocks = -(-len(req.models) // ncols)
    lay = _Layout(blocks * per_model, ncols, 3.2, 2.4, bottom=0.9)
    axes = lay.axes
    kinds = [("train_days", "days to train (log scale)")]
    if req.prices:
        kinds.append(("cost_usd", "cost, $"))
    for k, (m, _) in enumerate(req.models):
        r0, c = (k // ncols) * per_model, k % ncols
        for dr, (col, ylabel) in enumerate(kinds):
            ax = axes[r0 + dr][c]
            for j, g in enumerate(req.gpus):
                sel = b[(b.model == m) & (b.gpu == g.id)].sort_values("n")
                if col == "cost_usd" and (req.prices or {}).get(g.id) is None:
                    continue
                name, dash = _speed_label(g, req)
                ax.plot(sel.n, sel[col], label=name, **_gpu_style(j), **dash)
            if col == "cost_usd":  # linear from 0: cost differences read as ratios
                from matplotlib.ticker import FuncFormatter

                ax.set_ylim(bottom=0)
                ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"${fmt_count(v)}"))
                ax.grid(True, which="major", axis="y", alpha=0.3)
            else:
                _log_y(ax)
            ax.tick_params(labelsize=8)
            _log2_x(ax, req.ns)
            ax.set_title(f"{m}: {'time' if col == 'train_days' else 'cost'}", fontsize=10)
            if c == 0:
                ax.set_ylabel(ylabel, fontsize=9)
    for k in range(len(req.models), blocks * ncols):
        for dr in range(per_model):
            axes[(k // ncols) * per_model + dr][k % ncols].set_visible(False)
    what = "Time and cost" if req.prices else "Time"
    price = "" if req.prices else "; no $ per GPU-hour given"
    return lay.finish(f"{what} to train {fmt_count(req.tokens)} tokens with the recommended "
                      f"strategy ({_plot_setting(req)}{price}{_eff_note(req)})",
                      *axes[0][0].get_legend_handles_labels(), len(req.gpus))


PLOTS: dict[str, tuple[Callable[[Report], Any], str, str]] = {
    "memory": (plot_memory, "Memory per GPU vs GPU count",
               "Predicted device memory per GPU (allocator reserve, CUDA context and NCCL "
               "buffers included) for each strategy, against the GPU's capacity (solid black) "
               "and the usable part after the margin (dotted); above capacity is shaded red."),
    "min_gpus": (plot_min_gpus, "Minimum GPUs per model and GPU type",
                 "The fewest GPUs of each type for which some requested strategy fits "
                 "without offload (the table below also lists the count with offload)."),
    "throughput": (plot_throughput, "Throughput vs GPU count",
                   "Tokens per second per GPU of the planner's recommendation at each GPU "
                   "count; a missing point means nothing fits there."),
    "train_time_cost": (plot_train_time_cost, "Time and cost to train",
                        "Days (and dollars, from the given price per GPU-hour) to train the "
                        "given number of tokens with the recommended configuration."),
}


def render_plot(fig: Any, fmt: str) -> bytes:
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format=fmt, dpi=100 if fmt == "png" else None,
                **({"metadata": {"Date": None}} if fmt == "svg" else {}))
    return buf.getvalue()
