"""The ``fitcheck`` command: parse, call the planner, render. No arithmetic here.

``fitcheck [plan] OPTIONS`` plans (the default command); ``fitcheck trace|gate|serve|report|
probe`` are loaded only when named. The plan's options are generated from the field registry
(planner/fields.py), which gate specs and job configs share. Errors are one line on stderr
with the exit codes of planner.errors (docs/cli.md); a crash prints one line too
(FITCHECK_DEBUG=1 for the traceback).
"""

from __future__ import annotations

import os
import sys
from typing import Any

import click

from planner import DISTRIBUTION, __version__
from planner.errors import (
    EXIT_CRASH,
    EXIT_FITS,
    EXIT_NOTHING_FITS,
    EXIT_USAGE,
    FitcheckError,
    UsageError,
)
from planner.cli_options import (  # noqa: F401  (JOB_FORMATS, request_from_options: API)
    CANDIDATES,
    DEEPSPEED,
    FINETUNE,
    HARDWARE,
    JOB_FORMATS,
    MODEL,
    JobFile,
    TRAINING,
    VERDICT,
    field_options,
    given_values,
    request_from_options,
    terminal_width,
)
from planner.fields import FIELDS

# ---------------------------------------------------------------------------------------------
# Eager listings


def _list_gpus(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    from planner.hardware import all_gpus

    for pid, p in all_gpus().items():
        click.echo(f"{pid:14s} {p.memory_bytes / 2**30:7.1f} GiB  {p.name}")
    ctx.exit(0)


def _list_models(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    from planner.params import active_params, total_params
    from planner.presets import get_preset, list_presets

    for name in list_presets():
        m = get_preset(name)
        total, active = total_params(m), active_params(m)
        extra = f" ({active / 1e9:.2f}B active)" if active != total else ""
        click.echo(f"{name:16s} {total / 1e9:8.2f}B{extra}")
    ctx.exit(0)


# ---------------------------------------------------------------------------------------------
# The group

# Subcommands imported only when named, so `fitcheck --params ...` never loads them (torch for
# trace/probe, pandas for report, the server for serve).
LAZY_COMMANDS = {
    "trace": ("planner.trace_cli", "trace_cmd", "Measure one step's memory with fake tensors (needs torch)."),
    "gate": ("planner.gate_cli", "gate_cmd", "Admit or reject a job spec (scheduler gating)."),
    "serve": ("planner.gate_cli", "serve_cmd", "Kubernetes validating admission webhook."),
    "report": ("planner.report.cli", "report_cmd", "Capacity-planning sweep: CSV, Markdown, HTML."),
    "probe": ("planner.probe_cli", "probe_cmd", "CUDA probe runs under torchrun and calibration."),
    "explain": ("planner.explain_cli", "explain_cmd", "Explain an out-of-memory or a run from its log, OOM message or snapshot."),
    "calibrate": ("planner.explain_cli", "calibrate_cmd", "Fit a calibration file on your own runs' logs."),
}


def _collector_on() -> None:
    """Before a command that runs long or allocates a lot (a server, a sweep, a trace): the
    cyclic garbage collector on (the console script starts without it: planner/console.py)."""
    import gc

    gc.enable()


def _module_exists(name: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


class FitcheckGroup(click.Group):
    """`fitcheck OPTIONS` runs `plan`; errors become one line and an exit code."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        lazy = [name for name, (mod, _, _) in LAZY_COMMANDS.items() if _module_exists(mod)]
        return sorted(set(super().list_commands(ctx)) | set(lazy))

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in self.commands:
            return self.commands[name]
        if name in LAZY_COMMANDS and _module_exists(LAZY_COMMANDS[name][0]):
            import importlib

            _collector_on()

            module, attr, _ = LAZY_COMMANDS[name]
            cmd = getattr(importlib.import_module(module), attr)
            self.add_command(cmd, name)
            return cmd
        return None

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [("plan", "Predict per-GPU memory and speed per strategy (the default).")]
        rows += [(name, LAZY_COMMANDS[name][2]) for name in self.list_commands(ctx)
                 if name in LAZY_COMMANDS]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if not args:
            args = ["--help"]
        elif (args[0] not in self.commands and args[0] not in LAZY_COMMANDS
              and args[0] not in ("--help", "-h", "--version")):
            args = ["plan", *args]
        return super().parse_args(ctx, args)

    def resolve_command(self, ctx: click.Context, args: list[str]):
        # shell completion of `fitcheck --gp<TAB>`: the options are the plan command's
        if ctx.resilient_parsing and args and args[0] not in self.commands \
                and args[0] not in LAZY_COMMANDS:
            args = ["plan", *args]
        return super().resolve_command(ctx, args)

    def shell_complete(self, ctx: click.Context, incomplete: str) -> list:
        """`fitcheck --gp<TAB>` completes the plan command's options (the default command)."""
        out = super().shell_complete(ctx, incomplete)
        if incomplete.startswith("-"):
            seen = {c.value for c in out}
            out += [c for c in self.commands["plan"].shell_complete(ctx, incomplete)
                    if c.value not in seen]
        return out

    def format_help(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        plan_cmd = self.commands["plan"]
        with click.Context(plan_cmd, info_name=f"{ctx.info_name} [plan]") as pctx:
            plan_cmd.format_help(pctx, formatter)
        self.format_commands(ctx, formatter)

    def main(self, args: Any = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        try:
            rv = super().main(args, prog_name or "fitcheck", complete_var, standalone_mode=False,
                              **extra)
        except click.exceptions.Exit as exc:
            sys.exit(exc.exit_code)
        except click.ClickException as exc:
            click.echo(f"fitcheck: error: {exc.format_message()}", err=True)
            sys.exit(EXIT_USAGE)
        except click.Abort:
            click.echo("fitcheck: aborted", err=True)
            sys.exit(EXIT_CRASH)
        except FitcheckError as exc:
            click.echo(f"fitcheck: error: {exc}", err=True)
            sys.exit(exc.exit_code)
        except Exception as exc:  # a crash: one line unless asked for the traceback
            if os.environ.get("FITCHECK_DEBUG"):
                import traceback

                traceback.print_exc()
            click.echo(f"fitcheck: internal error: {type(exc).__name__}: {exc} "
                       "(FITCHECK_DEBUG=1 shows the traceback)", err=True)
            sys.exit(EXIT_CRASH)
        sys.exit(rv if isinstance(rv, int) else EXIT_FITS)


@click.group(cls=FitcheckGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="fitcheck",
                      message=f"%(prog)s (distribution {DISTRIBUTION}) %(version)s")
def cli() -> None:
    """fitcheck: will this training run fit, with which strategy?"""


def _changes(f, raw) -> bool:
    """The option was given a value that is not its default, as the field's own check reads
    both ("--pp 1" and "--ep-imbalance 1.0" are the defaults; "--tp 1" is no tensor parallel,
    as "auto" without TP). A value the check refuses counts as given: the plan that follows
    names it."""
    if raw in (None, False, ()) or raw in (f.default, f.shown_default):
        return False
    try:
        value = f.check(raw)
        default = None if f.default is None else f.check(f.default)
    except Exception:  # noqa: BLE001 - the refusal is the plan's to word
        return True
    return value != default and not (f.path == "parallel.tp" and value == 1)


@cli.command("plan")
@field_options(MODEL + TRAINING + FINETUNE + HARDWARE + CANDIDATES + VERDICT + DEEPSPEED)
@click.option("--find", type=click.Choice(["min-gpus", "max-micro-batch", "max-seq"]),
              help="Inverse question: the fewest GPUs of the type, or the largest micro-batch or "
              "sequence length that fits with the given strategies, offload and checkpointing; "
              "the plan shown is at that value.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object on stdout (docs/cli.md).")
@click.option("--wide", is_flag=True, help="Every memory term and speed figure, in two tables "
              "(default: one table with the columns that fit the terminal).")
@click.option("--from-trace", "from_trace", is_flag=True,
              help="With --config: answer from traces of the real Hugging Face class on fake "
              "tensors (any architecture; seconds; cached) instead of the formulas; exit 5 when "
              "it cannot be traced (docs/trace.md).")
@click.option("--list-gpus", is_flag=True, expose_value=False, is_eager=True, callback=_list_gpus,
              help="List the embedded GPU profiles and exit.")
@click.option("--list-models", is_flag=True, expose_value=False, is_eager=True,
              callback=_list_models, help="List the model presets and exit.")
@click.option("--job", "job_paths", multiple=True, metavar="FILE", type=JobFile(),
              help="Plan the job a config file describes (torchtitan TOML or a config "
              "registry entry FILE.py:NAME, DeepSpeed JSON, accelerate / HF Trainer / TRL / "
              "LLaMA-Factory / axolotl / litgpt / torchtune YAML, Kubeflow manifest, gate "
              "spec; repeat for the files of one job); flags given override it (docs/jobs.md).")
@click.option("--deepspeed-config", "ds_config", metavar="FILE", type=JobFile(),
              help="A DeepSpeed config JSON: its stage, offload, precision, batch and engine "
              "settings (buckets, overlap_comm, ZeRO-3 thresholds; \"auto\" filled in as the HF "
              "integration does), read as a --job file of the job; --ds-* flags override it.")
@click.option("--format", "job_format", type=click.Choice(JOB_FORMATS, case_sensitive=False),
              help="The --job file's format (default: told by its content).")
@click.option("--write-job", metavar="OUT", type=click.Path(dir_okay=False),
              help="Write the --job file with the recommended strategy, offload and "
              "checkpointing to OUT (atomically; OUT may be the file itself).")
@click.option("--job-diff", is_flag=True, help="Print the change --write-job would make, as a "
              "unified diff, instead of the table.")
def plan_cmd(as_json: bool, wide: bool, find: str | None, job_paths: tuple[str, ...],
             ds_config: str | None, job_format: str | None, write_job: str | None,
             job_diff: bool, **kw: Any) -> int:
    """Predict per-GPU memory for every strategy and recommend one.

    Exit codes: 0 a candidate fits (or, when none fits for sure, one is at risk and
    --at-risk is admit or warn), 3 nothing fits, 2 usage error, 4 bad input data (profile,
    config, job file), 1 crash.
    """
    if kw.pop("from_trace", False):  # memory from traces of the real module (probes/)
        _collector_on()
        from planner.trace_cli import plan_command

        if job_paths:
            raise UsageError("--from-trace plans the --config it is given, not a --job file")
        untraced = [f.flag for f in FIELDS if f.section in ("finetune", "parallel")
                    and _changes(f, kw.get(f.dest))]
        if untraced:
            raise UsageError(f"--from-trace: {', '.join(untraced)} not traced yet; drop "
                             "--from-trace for the analytic plan")
        return plan_command(kw, as_json=as_json, wide=wide, width=terminal_width(), find=find)
    from planner.plan import find as find_value
    from planner.plan import plan
    from planner.render import answer_json, table

    job = resolved = rw = mesh = None
    if ds_config:  # the same reader as --job (planner/jobs/readers/deepspeed.py)
        if job_format is None and not job_paths:
            job_format = "deepspeed"
        job_paths = (*job_paths, ds_config)
    if job_paths:
        from planner.jobs import plan_request

        request, job, resolved = plan_request(job_paths, job_format, given_values(kw))
    elif job_format or write_job or job_diff:
        raise UsageError("--format, --write-job and --job-diff need --job FILE")
    elif kw.get("mesh") == "auto" and not find:  # the layout search (planner/mesh.py)
        from planner.cli_options import plan_values
        from planner.fields import FLAGS
        from planner.mesh import search as search_mesh

        mesh = search_mesh(plan_values(kw), FLAGS)
        request = mesh.answer.request
    else:
        request = request_from_options(kw)
    found = find_value(request, find) if find else None
    answer = found.answer if found else mesh.answer if mesh else plan(request)
    notes = job_notes(job, resolved) if job is not None else []
    if write_job or job_diff:
        from planner.jobs.write import rewrite, write_atomic

        rw, alt = rewrite(job, request, fixed=resolved.given, given=given_values(kw))
        if rw is None:
            code = _nothing_to_write(job, alt)
            if not as_json:
                raise click.exceptions.Exit(code)
        if write_job and rw is not None:
            try:
                write_atomic(write_job, rw.text, like=job.path)
            except OSError as exc:  # a missing folder, no permission, a full disk: nothing written
                raise UsageError(f"--write-job: cannot write {write_job!r}: "
                                 f"{exc.strerror or type(exc).__name__}") from None
        same = "no change: the job already asks for the recommendation"
        for line in ([*rw.changes, *rw.notes] or [same]) if rw is not None else []:
            click.echo(f"fitcheck: {job.path}: {line}", err=True)
        if write_job and rw is not None:
            click.echo(f"fitcheck: wrote {write_job}", err=True)
    if as_json:
        import json

        doc = answer_json(answer, found)
        doc["assumptions"] += notes
        doc["warnings"] = [*(resolved.warnings if resolved else []), *request.warnings]
        if mesh is not None:
            doc["inputs"]["mesh"] = "auto"
            doc["mesh"] = mesh.as_json()
        if job is not None:
            doc["job"] = {"files": list(job.files), "format": str(job.format),
                          "layout": job.layout or None, "unmodelled": list(resolved.unmodelled),
                          "rewrite": None if rw is None else {
                              "path": write_job, "changes": rw.changes, "notes": rw.notes,
                              "candidate": {"strategy": str(rw.candidate.strategy),
                                            "offload": str(rw.candidate.offload),
                                            "checkpointing": str(rw.candidate.checkpointing)},
                              "diff": rw.diff()}}
        click.echo(json.dumps(doc, indent=2))
    elif job_diff and rw is not None:
        click.echo(rw.diff(), nl=False)
        return EXIT_FITS
    else:
        from planner.notices import Kind
        from planner.render import _wrap

        width = terminal_width()
        text = table(answer, found, width=width, wide=wide)
        # approximate readings of --config (and other request warnings) under the table
        notes = [*(f"warning: {w}" for w in request.warnings
                   if getattr(w, "kind", None) != Kind.CALIBRATION_STALE), *notes]
        if mesh is not None and mesh.chosen is None:  # else the recommendation's reasons
            notes += ["mesh: no layout fits", *mesh.reasons]
        click.echo("\n".join([text, *(line for n in notes for line in _wrap(
            f"  - {n}", 10**6 if wide else width, "    "))]))
    if rw is not None:
        return EXIT_FITS
    if write_job or job_diff:  # --json: the answer printed, nothing written
        return EXIT_NOTHING_FITS
    if found is not None and found.value is None:
        return EXIT_NOTHING_FITS
    if answer.any_fits:
        return EXIT_FITS
    # nothing fits for sure: a candidate at risk counts as a fit unless --at-risk rejects it
    from planner.error_bands import rejects

    e = answer.least_risk()[0]
    at_risk = e is not None and not rejects(request.options.at_risk, e.oom_probability)
    return EXIT_FITS if at_risk else EXIT_NOTHING_FITS


def job_notes(job, resolved) -> list[str]:
    """The job's lines for the assumptions block: what was read, assumed, not modelled."""
    head = f"job: {', '.join(job.files)} read as {job.format}" + (
        f" ({job.layout})" if job.layout else "")
    return [head, *resolved.warnings, *(f"NOT MODELLED: {u}" for u in resolved.unmodelled)]


def _nothing_to_write(job, answer) -> int:
    need = answer.min_gpus if answer is not None else None
    click.echo(f"fitcheck: {job.path}: nothing it can say fits on this hardware"
               + (f" (needs at least {need} GPUs of the type)" if need else "")
               + "; not written", err=True)
    return EXIT_NOTHING_FITS


def main() -> None:
    from planner.tempfiles import exit_on_terminate

    exit_on_terminate()  # SIGTERM runs the cleanup of temporary files (planner/tempfiles.py)
    cli.main()
