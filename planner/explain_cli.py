"""``fitcheck explain`` and ``fitcheck calibrate``: learn from the user's own runs.

``explain`` reads what a run left behind (an out-of-memory message or the whole log with its
traceback, training logs, a memory snapshot) beside the job (plan's flags, ``--job``,
``--deepspeed-config``) and prints the planner's per-moment prediction next to the
measurement, what broke the limit, and what fits instead (planner/runs/explain.py).
``calibrate`` fits the runtime terms on the runs into a calibration file
(planner/runs/fit.py). Parsing, reading and fitting live in planner/runs/; this module parses
flags, calls, renders and writes. docs/explain.md.

Exit codes (docs/cli.md): explain 0 a change fits, 3 nothing fits; calibrate 0 written;
2 usage error; 4 bad input data (a file with no memory figure, a snapshot that would run code);
1 crash.
"""

from __future__ import annotations

import json
import os
from typing import Any

import click

from planner.cli_options import (
    CANDIDATES,
    DEEPSPEED,
    FINETUNE,
    HARDWARE,
    JOB_FORMATS,
    MODEL,
    TRAINING,
    field_options,
    given_values,
    request_from_options,
    terminal_width,
)
from planner.errors import EXIT_FITS, EXIT_NOTHING_FITS, InputDataError, UsageError

_JOB_OPTIONS = [
    click.option("--job", "job_paths", multiple=True, metavar="FILE",
                 type=click.Path(exists=True, dir_okay=False),
                 help="The job's config file(s), as for plan (docs/jobs.md); flags given "
                 "override it."),
    click.option("--deepspeed-config", "ds_config", metavar="FILE",
                 type=click.Path(exists=True, dir_okay=False),
                 help="A DeepSpeed config JSON of the job (read as a --job file)."),
    click.option("--format", "job_format", type=click.Choice(JOB_FORMATS, case_sensitive=False),
                 help="The --job file's format (default: told by its content)."),
]


def _job_options(fn: Any) -> Any:
    for opt in reversed(_JOB_OPTIONS):
        fn = opt(fn)
    return field_options(MODEL + TRAINING + FINETUNE + HARDWARE + CANDIDATES + DEEPSPEED)(fn)


def _request(kw: dict[str, Any], job_paths: tuple[str, ...], ds_config: str | None,
             job_format: str | None):
    """The job's request, built as plan builds it; (request, notes about the job file)."""
    if ds_config:
        if job_format is None and not job_paths:
            job_format = "deepspeed"
        job_paths = (*job_paths, ds_config)
    if job_paths:
        from planner.cli import job_notes
        from planner.jobs import plan_request

        request, job, resolved = plan_request(job_paths, job_format, given_values(kw))
        return request, job_notes(job, resolved)
    if job_format:
        raise UsageError("--format needs --job FILE")
    return request_from_options(kw), []


def _write_atomic(path: str, data: bytes) -> None:
    p = os.path.abspath(path)
    folder = os.path.dirname(p)
    if not os.path.isdir(folder):
        raise UsageError(f"{path}: no such directory {folder!r}")
    tmp = os.path.join(folder, f".{os.path.basename(p)}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _names_a_model(kw: dict[str, Any]) -> bool:
    from planner.fields import FIELDS

    return any(kw.get(f.dest) not in (None, False, ()) for f in FIELDS if f.section == "model")


def _pick_case(cases: list, case: str | None):
    if not cases:
        if case:
            raise UsageError("--case: no records file among the run files")
        return None
    if case is None:
        if len(cases) == 1:
            return cases[0]
        raise UsageError("--case: the records hold several cases; name one of "
                         + ", ".join(c.id for c in cases[:12]) + (" ..." if len(cases) > 12
                                                                   else ""))
    hit = [c for c in cases if c.id == case]
    if not hit:
        raise UsageError(f"--case: no case {case!r} in the records (e.g. "
                         + ", ".join(c.id for c in cases[:6]) + ")")
    return hit[0]


@click.command("explain")
@click.argument("run_files", nargs=-1, required=True, metavar="RUN_FILE...",
                type=click.Path(dir_okay=False))
@_job_options
@click.option("--case", "case", metavar="ID",
              help="With a records file of fitcheck's GPU runs: the case whose figures to use.")
@click.option("--json", "as_json", is_flag=True,
              help="One JSON object on stdout (docs/explain.md).")
@click.option("--plot", "plot_path", metavar="OUT.png", type=click.Path(dir_okay=False),
              help="Draw the per-moment memory, stacked by category, predicted vs measured (and "
              "the snapshot's timeline) to a PNG (needs matplotlib).")
@click.option("--html", "html_path", metavar="OUT.html", type=click.Path(dir_okay=False),
              help="A self-contained HTML report: the text, the picture and the JSON.")
def explain_cmd(run_files: tuple[str, ...], job_paths: tuple[str, ...], ds_config: str | None,
                job_format: str | None, case: str | None, as_json: bool,
                plot_path: str | None, html_path: str | None, **kw: Any) -> int:
    """Explain an out-of-memory (or any run) from what it left behind: the OOM message or the
    whole log, training logs, a memory snapshot.

    RUN_FILE: an out-of-memory message or log with its traceback, a torchtitan / HF Trainer /
    Lightning / DeepSpeed / accelerate / torchtune log, an nvidia-smi CSV, a
    torch.cuda.memory._dump_snapshot pickle (read without running code), or fitcheck's GPU
    records. The job: plan's flags, --job or --deepspeed-config, with the strategy,
    checkpointing and offload the job ran with.

    Exit codes: 0 a change fits, 3 nothing fits, 2 usage error, 4 bad input data (a file with
    no memory figure, a snapshot that would run code), 1 crash.
    """
    from planner.runs.explain import explain
    from planner.runs.read import read_run
    from planner.runs.render import explanation_json, explanation_text

    run, cases = read_run(run_files)
    picked = _pick_case(cases, case)
    if picked is not None:
        run = run.merged(picked.run)
    if run.empty:
        raise InputDataError(f"{', '.join(run_files)}: no memory figure to explain")
    if not job_paths and not ds_config and not _names_a_model(kw):
        # the evidence alone: what an OOM message says by its own figures
        from planner.runs.render import evidence_json, evidence_text

        if plot_path or html_path:
            raise UsageError("--plot/--html draw the prediction beside the run: give the job "
                             "(--model/--params/--config, --job or --deepspeed-config)")
        click.echo(json.dumps(evidence_json(run), indent=2) if as_json
                   else evidence_text(run, terminal_width()))
        return EXIT_FITS
    request, job_lines = _request(kw, job_paths, ds_config, job_format)
    x = explain(request, run)
    doc = explanation_json(x)
    doc["assumptions"] += job_lines
    if plot_path or html_path:
        from planner.explain_plot import html_report, plot_png

        png = plot_png(x)
        if plot_path:
            _write_atomic(plot_path, png)
            click.echo(f"fitcheck explain: wrote {plot_path}", err=True)
        if html_path:
            text = explanation_text(x, 110)
            _write_atomic(html_path, html_report(text, png, doc).encode("utf-8"))
            click.echo(f"fitcheck explain: wrote {html_path}", err=True)
    if as_json:
        click.echo(json.dumps(doc, indent=2))
    else:
        text = explanation_text(x, terminal_width())
        click.echo(text + "".join(f"\n  - {line}" for line in job_lines))
    return EXIT_FITS if x.any_fix_fits else EXIT_NOTHING_FITS


@click.command("calibrate")
@click.option("--from-log", "logs", multiple=True, metavar="FILE",
              type=click.Path(dir_okay=False),
              help="A run's log, OOM message, snapshot or nvidia-smi CSV (the job flags describe "
              "it; repeat for the files of one job), or fitcheck probe / GPU-run records (they "
              "carry their own jobs).")
@click.option("--runs", "manifest", metavar="RUNS.json", type=click.Path(dir_okay=False),
              help="Runs of different jobs: {\"runs\": [{\"id\", \"files\": [...], \"job\": {spec "
              "path: value}, \"source\"}]} (docs/explain.md).")
@_job_options
@click.option("--out", "out", metavar="CAL.json", type=click.Path(dir_okay=False),
              help="Write the calibration file here (atomically). Put it in "
              "$FITCHECK_CALIBRATION_PATH for --calibration auto.")
@click.option("--torch-version", metavar="V", help="The runs' torch version (stale detection); "
              "default: what the runs state, else unknown.")
@click.option("--cuda-version", metavar="V", help="The runs' CUDA version.")
@click.option("--driver-version", metavar="V", help="The runs' NVIDIA driver version.")
@click.option("--nccl-version", metavar="V", help="The runs' NCCL version.")
@click.option("--keep-all", is_flag=True, help="Write every fitted term, also those that make "
              "the held-out error worse than the defaults.")
@click.option("--json", "as_json", is_flag=True, help="The fit and the held-out errors as JSON.")
def calibrate_cmd(logs: tuple[str, ...], manifest: str | None, job_paths: tuple[str, ...],
                  ds_config: str | None, job_format: str | None, out: str | None,
                  torch_version: str | None, cuda_version: str | None,
                  driver_version: str | None, nccl_version: str | None, keep_all: bool,
                  as_json: bool, **kw: Any) -> int:
    """Fit the runtime terms (non-PyTorch memory, the allocator's reserved over allocated,
    compute efficiency eager / compiled) on your own runs into a calibration file.

    With several runs each is held out in turn and the planner's error on it is reported
    before and after. Exit codes: 0 fitted (and written), 2 usage error, 4 bad input data,
    1 crash.
    """
    from planner.runs import fit as fitmod
    from planner.runs.read import read_file

    if not logs and not manifest:
        raise UsageError("give the runs: --from-log FILE (repeatable) and/or --runs RUNS.json")
    cases: list = []
    versions: dict[str, str | None] = {}
    gpu_name = None
    user_run = None
    recorded = []
    for path in logs:
        run, recs = read_file(path)
        versions.update({k: v for k, v in run.versions.items() if v})
        gpu_name = gpu_name or run.gpu_name
        if recs:
            recorded += recs
        else:
            user_run = run if user_run is None else user_run.merged(run)
    if user_run is not None:
        request, _lines = _request(kw, job_paths, ds_config, job_format)
        cases.append(fitmod.case_from_request(request, user_run,
                                              id=os.path.basename(user_run.files[0]),
                                              source=", ".join(user_run.files)))
    if recorded:
        from planner.fields import FLAGS
        from planner.request import resolve_gpu

        gpu = resolve_gpu(kw.get("gpu") or recorded[0].gpu_profile, FLAGS, allow_files=True,
                          base_dir=None)
        cases += [fitmod.case_from_recorded(r, gpu) for r in recorded]
    if manifest:
        from planner.runs.manifest import read_manifest

        m_cases, m_versions = read_manifest(manifest)
        cases += m_cases
        versions.update({k: v for k, v in m_versions.items() if v})
    given = {"torch": torch_version, "cuda": cuda_version, "driver": driver_version,
             "nccl": nccl_version}
    versions.update({k: v for k, v in given.items() if v})
    gpu = fitmod.check_one_gpu(cases)
    fitted = fitmod.fit(cases)
    judged = fitmod.judge_terms(cases, fitted)
    dropped = [t for t, j in judged.items() if not j["keep"]]
    kept = fitted if keep_all else fitmod.restrict(
        fitted, {t for t, v in fitted.values.items() if v is not None and t not in dropped})
    notes = list(kept.notes)
    for t in dropped:
        j = judged[t]
        notes.append(f"{t}: fitted {fitted.values[t]['value']} but left out: held out, it "
                     f"predicts {'/'.join(j['quantities'])} with median |error| "
                     f"{j['median_abs_error_after']:.1%} vs the defaults' "
                     f"{j['median_abs_error_before']:.1%}" + (" (kept: --keep-all)" if keep_all
                                                              else ""))
    kept = fitmod.Fitted(values=kept.values, notes=tuple(notes))
    source = "runs: " + "; ".join(sorted({c.source or c.id for c in cases}))[:400]
    doc = fitmod.calibration_doc(kept, gpu, versions=versions, source=source,
                                 gpu_name=gpu_name)
    written = {t for t, v in kept.values.items() if v is not None}
    rows = fitmod.held_out(cases, written) if 2 <= len(cases) <= 20 else (
        fitmod.halves(cases, written)["rows"] if len(cases) > 20 else [])
    if out:
        _write_atomic(out, (json.dumps(doc, indent=1) + "\n").encode("utf-8"))
        click.echo(f"fitcheck calibrate: wrote {out} ({doc['id']}); use it with --calibration "
                   f"{out}, or put it in $FITCHECK_CALIBRATION_PATH for --calibration auto",
                   err=True)
    if as_json:
        click.echo(json.dumps({"schema_version": 1, "calibration": doc, "judged": judged,
                               "held_out": rows, "summary": fitmod.summary(rows)}, indent=2))
        return EXIT_FITS
    from planner.runs.units import MiB

    lines = [f"calibration {doc['id']} from {len(cases)} run(s) on {gpu.id}"]
    for k, v in doc["values"].items():
        if k == "activation_scale" or v is None:
            continue
        val = f"{v['value'] / MiB:.0f} MiB" if k.endswith("_bytes") or "bytes" in k else \
            f"{v['value']:.4g}"
        lines.append(f"  {k:<30} {val:>12}  (n {v['n']})")
    if rows:
        how = "each run held out in turn" if len(cases) <= 20 else "halves, both ways"
        lines.append(f"held out ({how}): median |error| before -> after")
        for q, s in fitmod.summary(rows).items():
            lines.append(f"  {q:<16} {s['median_abs_error_before']:6.1%} -> "
                         f"{s['median_abs_error_after']:6.1%}  ({s['n']} figures)")
        if len(cases) <= 20:
            for r in rows:
                lines.append(f"    {r['id']}: {r['quantity']} measured {r['measured']:.4g}, "
                             f"{r['error_before']:+.1%} -> {r['error_after']:+.1%}")
    else:
        lines.append("one run: nothing to hold out (give several to see the held-out error)")
    for n in doc["notes"]:
        lines.append(f"  - {n}")
    click.echo("\n".join(lines))
    return EXIT_FITS
