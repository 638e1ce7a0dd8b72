"""``fitcheck report``: a capacity-planning sweep written as CSV, Markdown, HTML and plots.

Parsing only; the sweep, tables and plots are the rest of planner/report/ (docs/reports.md). Errors are
planner.errors.UsageError, printed by the ``fitcheck`` group as one line with exit code 2.
"""

from __future__ import annotations

import sys
from typing import Any

import click

from planner.cli_options import field_options, plan_values
from planner.report.request import FIELD_PATHS, OFFLOAD_MODES
from planner.spec import Strategy


@click.command("report")
@click.option("--models", required=True, metavar="ID[,ID]",
              help="Model presets (see `fitcheck --list-models`) or config.json paths, "
              "comma-separated.")
@click.option("--gpus", required=True, metavar="ID[,ID]",
              help="GPU profiles (see `fitcheck --list-gpus`) or TOML files, comma-separated.")
@click.option("--n", "ns", default="8,16,32,64,128,256,512", show_default=True,
              metavar="N[,N]", help="GPU counts (whole nodes past one node).")
@click.option("--seq", "seqs", default="2048", show_default=True, metavar="T[,T]",
              help="Sequence lengths.")
@click.option("--micro-batch", "micro_batches", default="1", show_default=True,
              metavar="B[,B]", help="Sequences per GPU per forward.")
@click.option("--strategy", "strategies", multiple=True, metavar="NAME[,NAME]",
              help="Strategies (repeat or comma-separate): "
              + ", ".join(str(s) for s in Strategy) + ". Default: all.")
@click.option("--checkpointing", default="none,selective,full", show_default=True,
              metavar="MODE[,MODE]", help="Activation checkpointing modes swept.")
@click.option("--offload", type=click.Choice(OFFLOAD_MODES, case_sensitive=False),
              default="auto", show_default=True,
              help="As `fitcheck plan` (auto: offload candidates only where nothing else "
              "fits), or all: every offload mode for every configuration.")
@field_options(FIELD_PATHS + ("margin",))
@click.option("--tokens", default="1e12", show_default=True, metavar="N",
              help="Tokens to train, for the time and cost columns (1e12, 15T).")
@click.option("--price-per-gpu-hour", "prices", metavar="$[,$]|GPU=$[,...]",
              help="$ per GPU-hour: one for all, one per --gpus entry, or GPU=PRICE pairs.")
@click.option("--out", "out_dir", required=True, metavar="DIR", help="Output directory.")
@click.option("--format", "formats", default="csv,md,html,png", show_default=True,
              metavar="FMT[,FMT]", help="Any of csv, md, html, png, svg (html/png/svg need "
              "matplotlib: the plots extra).")
@click.option("--progress/--no-progress", default=None,
              help="Progress bar on stderr (default: only when stderr is a terminal).")
def report_cmd(models: str, gpus: str, ns: str, seqs: str, micro_batches: str,
               strategies: tuple[str, ...], checkpointing: str, offload: str,
               tokens: str, prices: str | None, out_dir: str, formats: str,
               progress: bool | None, **fields: Any) -> int:
    """Sweep models x GPU types x GPU counts x strategies x checkpointing and write a
    capacity-planning report (report.csv, report.md, report.html, plots) into --out. Every
    other option means what it means to `fitcheck plan`: each configuration is planned as
    `fitcheck --model M --gpu G --n N --seq T --micro-batch B` with them.

    Exit codes: 0 written, 2 usage error (unknown model or GPU, matplotlib missing for plots).
    """
    from planner.report.progress import progress_wanted
    from planner.report.request import build_request
    from planner.report.write import check_formats, parse_formats, write_report

    fmts = parse_formats(formats)
    check_formats(fmts)  # before the sweep: a missing matplotlib fails fast
    req = build_request(models=models, gpus=gpus, ns=ns, seqs=seqs, micro_batches=micro_batches,
                        strategies=strategies, checkpointing=checkpointing,
                        offload=offload.lower(), tokens=tokens, prices=prices,
                        training=plan_values(fields))
    written = write_report(req, out_dir, fmts, progress=progress_wanted(progress),
                           stream=sys.stderr)
    rows = written.report.rows
    total = sum(written.timings.values())
    for note in written.report.notes:
        click.echo(f"note: {note}", err=True)
    click.echo(f"{len(rows)} configurations ({int(rows.fits.sum())} fit, "
               f"{int((rows.outcome == 'at_risk').sum())} at risk) in {total:.2f} s; "
               f"wrote {', '.join(written.paths)}")
    return 0
