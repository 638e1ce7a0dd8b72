"""Writing a report: one class per output file, all written before any is replaced."""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Iterable, Sequence
from typing import Any

from planner.lazy_dataclass import dataclass
from planner.errors import UsageError
from planner.report.progress import Progress
from planner.report.request import ReportRequest, parse_list
from planner.report.html import html_page
from planner.report.plots import MATPLOTLIB_MISSING, PLOTS, have_matplotlib, render_plot
from planner.report.sweep import Report, run_sweep
from planner.report.tables import markdown

FORMATS = ("csv", "md", "html", "png", "svg")
PLOT_FORMATS = frozenset({"html", "png", "svg"})
DEFAULT_FORMATS = ("csv", "md", "html", "png")
PANDAS_MISSING = "fitcheck report needs pandas: pip install 'fitcheck-planner[reports]'"


def parse_formats(text: str | Iterable[str]) -> tuple[str, ...]:
    out = []
    for f in parse_list(text, "--format"):
        f = f.lower()
        if f not in FORMATS:
            raise UsageError(f"--format: unknown format {f!r}; choose from {', '.join(FORMATS)}")
        out.append(f)
    return tuple(dict.fromkeys(out))


def check_formats(formats: Sequence[str]) -> None:
    """pandas missing, or plots asked for without matplotlib: one line, exit 2, before any
    work."""
    try:
        import pandas  # noqa: F401
    except ImportError:
        raise UsageError(PANDAS_MISSING) from None
    if PLOT_FORMATS.intersection(formats) and not have_matplotlib():
        raise UsageError(MATPLOTLIB_MISSING)


class Rendered:
    """What several outputs share: each plot drawn once, its PNG rendered once."""

    def __init__(self, report: Report) -> None:
        self.report = report
        self._figs: dict[str, Any] = {}
        self._pngs: dict[str, bytes] = {}

    def figure(self, kind: str) -> Any:
        if kind not in self._figs:
            self._figs[kind] = PLOTS[kind][0](self.report)
        return self._figs[kind]

    def png(self, kind: str) -> bytes:
        if kind not in self._pngs:
            self._pngs[kind] = render_plot(self.figure(kind), "png")
        return self._pngs[kind]


class CsvOutput:
    """report.csv: one row per configuration (sweep.COLUMNS)."""

    name = "report.csv"

    def render(self, r: Rendered) -> bytes:
        return r.report.rows.to_csv(index=False).encode()


class MarkdownOutput:
    """report.md: the request, the minimum-GPU tables and the best configurations."""

    name = "report.md"

    def render(self, r: Rendered) -> bytes:
        return markdown(r.report).encode()


class PlotOutput:
    """One plot as a PNG or SVG file."""

    def __init__(self, kind: str, fmt: str) -> None:
        self.kind, self.fmt = kind, fmt
        self.name = f"{kind}.{fmt}"

    def render(self, r: Rendered) -> bytes:
        return r.png(self.kind) if self.fmt == "png" else render_plot(r.figure(self.kind), "svg")


class HtmlOutput:
    """report.html: one self-contained page, plots inline."""

    name = "report.html"

    def render(self, r: Rendered) -> bytes:
        return html_page(r.report, {k: r.png(k) for k in PLOTS}).encode()


def outputs(formats: Sequence[str]) -> list[Any]:
    out: list[Any] = []
    if "csv" in formats:
        out.append(CsvOutput())
    if "md" in formats:
        out.append(MarkdownOutput())
    for fmt in ("png", "svg"):
        if fmt in formats:
            out += [PlotOutput(kind, fmt) for kind in PLOTS]
    if "html" in formats:
        out.append(HtmlOutput())
    return out


def write_all(out_dir: str, files: dict[str, bytes]) -> list[str]:
    """Write every file to a temporary name in out_dir, then move them all into place: if any
    write fails, nothing is replaced and nothing is left behind. A reader sees each file old
    or new, never a part."""
    from planner.tempfiles import sweep

    names = set(files)
    # what a killed writer left (.NAME.XXXXXXXX.tmp of these files), an hour old
    sweep(out_dir, lambda n: n.endswith(".tmp") and n.startswith(".")
          and n[1:].rsplit(".", 2)[0] in names)
    temps: list[tuple[str, str]] = []
    try:
        for name, data in files.items():
            fd, tmp = tempfile.mkstemp(dir=out_dir, prefix=f".{name}.", suffix=".tmp")
            temps.append((tmp, os.path.join(out_dir, name)))
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            mask = os.umask(0)
            os.umask(mask)
            os.chmod(tmp, 0o666 & ~mask)
    except OSError as exc:
        for tmp, _ in temps:
            try:
                os.unlink(tmp)
            except OSError:
                pass
        raise UsageError(f"--out: cannot write into {out_dir!r}: "
                         f"{exc.strerror or type(exc).__name__}") from None
    except BaseException:  # interrupted (SIGINT, SIGTERM: planner.tempfiles): nothing left
        for tmp, _ in temps:
            try:
                os.unlink(tmp)
            except OSError:
                pass
        raise
    done = 0
    try:
        for tmp, path in temps:
            os.replace(tmp, path)
            done += 1
    finally:
        for tmp, _ in temps[done:]:
            try:
                os.unlink(tmp)
            except OSError:
                pass
    return [path for _, path in temps]


@dataclass(slots=True, kw_only=True)
class Written:
    report: Report
    paths: list[str]
    timings: dict[str, float]


def _usable_dir(out_dir: str) -> None:
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise UsageError(f"--out: {out_dir!r} exists and is not a directory")
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--out: cannot create {out_dir!r}: "
                         f"{exc.strerror or type(exc).__name__}") from None
    if not os.access(out_dir, os.W_OK | os.X_OK):
        raise UsageError(f"--out: {out_dir!r} is not writable")


def write_report(req: ReportRequest, out_dir: str, formats: Sequence[str] = DEFAULT_FORMATS,
                 progress: bool = False, stream: Any = None) -> Written:
    """Sweep and write the requested outputs into out_dir (created if missing)."""
    check_formats(formats)
    _usable_dir(out_dir)  # before the sweep: a bad --out fails fast
    report = run_sweep(req, progress=progress, stream=stream)
    timings = {"sweep": report.sweep_s}
    rendered = Rendered(report)
    files: dict[str, bytes] = {}
    outs = outputs(formats)
    bar = Progress(len(outs), "outputs        ", progress, stream)
    for out in outs:
        t = time.perf_counter()
        files[out.name] = out.render(rendered)
        kind = "plots" if isinstance(out, (PlotOutput, HtmlOutput)) else "tables"
        timings[kind] = timings.get(kind, 0.0) + time.perf_counter() - t
        bar.update()
    bar.close()
    return Written(report=report, paths=write_all(out_dir, files), timings=timings)
