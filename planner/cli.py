"""The ``fitcheck`` command: parse, call the planner, render. No arithmetic here.

``fitcheck [plan] OPTIONS`` plans (the default command); ``fitcheck trace OPTIONS`` measures
with the fake-tensor probes. Errors are one line on stderr with the exit codes of
planner.errors (docs/cli.md); a crash prints one line too (FITCHECK_DEBUG=1 for the traceback).
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable
from typing import Any

import click

from planner import __version__
from planner.errors import EXIT_CRASH, EXIT_FITS, EXIT_NOTHING_FITS, EXIT_USAGE, FitcheckError, UsageError
from planner.spec import (
    Attention,
    Checkpointing,
    MlpKind,
    Offload,
    OptimizerImpl,
    OptimizerKind,
    Precision,
    Strategy,
    TrainingSpec,
)


def _choice(enum_cls: type) -> click.Choice:
    return click.Choice([str(e) for e in enum_cls], case_sensitive=False)


POS = click.IntRange(min=1)


def model_options(f: Callable[..., Any]) -> Callable[..., Any]:
    opts = [
        click.option("--params", metavar="N", help="Total parameters (13e9, 13B): a Llama-style "
                     "shape is derived by a documented scaling rule and marked as assumed."),
        click.option("--model", "preset", metavar="PRESET", help="A preset id (see --list-models)."),
        click.option("--config", metavar="PATH", help="A local Hugging Face config.json."),
        click.option("--layers", type=POS, help="Transformer blocks (overrides)."),
        click.option("--hidden", type=POS, help="Hidden size (overrides)."),
        click.option("--heads", type=POS, help="Attention heads (overrides)."),
        click.option("--kv-heads", type=POS, help="Key/value heads: < heads for GQA (overrides)."),
        click.option("--ffn", type=POS, help="MLP inner width, per expert (overrides)."),
        click.option("--vocab", type=POS, help="Vocabulary size (overrides)."),
        click.option("--tied-embeddings/--untied-embeddings", default=None,
                     help="Output head shares the embedding table (overrides)."),
        click.option("--mlp", type=_choice(MlpKind), help="MLP type (overrides)."),
        click.option("--experts", type=POS, help="MoE experts per layer (overrides)."),
        click.option("--experts-per-token", type=POS, help="MoE experts each token uses."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def training_options(f: Callable[..., Any]) -> Callable[..., Any]:
    opts = [
        click.option("--seq", type=POS, default=2048, show_default=True, help="Sequence length."),
        click.option("--micro-batch", type=POS, default=1, show_default=True,
                     help="Sequences per GPU per forward."),
        click.option("--grad-accum", type=POS, default=1, show_default=True,
                     help="Micro-batches per optimizer step."),
        click.option("--precision", type=_choice(Precision), default="bf16-amp", show_default=True,
                     help="-amp keeps fp32 master weights; bf16 is pure bf16 params, grads and state."),
        click.option("--optimizer", type=_choice(OptimizerKind), default="adamw", show_default=True),
        click.option("--optimizer-impl", type=_choice(OptimizerImpl), default="foreach",
                     show_default=True, help="Step temporaries: foreach one state-sized copy, "
                     "fused none, for-loop the largest tensor's."),
        click.option("--attention", type=_choice(Attention), default="sdpa", show_default=True,
                     help="sdpa: flash-style kernels; eager: materialized T x T scores."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def hardware_options(f: Callable[..., Any]) -> Callable[..., Any]:
    opts = [
        click.option("--gpu", metavar="NAME|PATH", help="GPU profile id (see --list-gpus) or a TOML "
                     "profile file."),
        click.option("--n", "n_gpus", type=POS, default=1, show_default=True, help="Total GPUs."),
        click.option("--gpus-per-node", type=POS, help="Default: the profile's."),
        click.option("--host-ram-gib", type=float, help="Host RAM per node in GiB (default: the "
                     "profile's); checked for offload."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def candidate_options(f: Callable[..., Any]) -> Callable[..., Any]:
    opts = [
        click.option("--strategy", "strategies", multiple=True, metavar="NAME[,NAME]",
                     help="Candidates (repeat or comma-separate): " + ", ".join(str(s) for s in Strategy)
                     + ". Default: all."),
        click.option("--offload", type=click.Choice(["auto"] + [str(o) for o in Offload],
                                                    case_sensitive=False),
                     default="auto", show_default=True,
                     help="auto: none, and offload candidates only when nothing else fits."),
        click.option("--checkpointing", type=_choice(Checkpointing), default="auto",
                     show_default=True,
                     help="Activation checkpointing; auto: the lightest that fits, per strategy."),
        click.option("--margin", type=float, default=0.05, show_default=True,
                     help="Fraction of GPU memory kept free."),
        click.option("--global-batch", type=POS, help="Sequences per optimizer step over all "
                     "GPUs: sets --grad-accum to ceil(global / (micro-batch x n))."),
        click.option("--calibration", default="auto", show_default=True, metavar="FILE|auto|none",
                     help="Fitted runtime terms (docs/calibration.md): a calibration file, auto "
                     "(the one for this GPU and torch version, if any), or none (raw model)."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def _strategies(values: tuple[str, ...]) -> tuple[Strategy, ...]:
    if not values:
        return tuple(Strategy)
    out: list[Strategy] = []
    for value in values:
        for name in filter(None, (v.strip().lower() for v in value.split(","))):
            try:
                s = Strategy(name)
            except ValueError:
                raise UsageError(f"--strategy: unknown strategy {name!r}; choose from "
                                 + ", ".join(str(s) for s in Strategy)) from None
            if s not in out:
                out.append(s)
    return tuple(out)


def build_question(kw: dict[str, Any]):  # -> (Question, model_source)
    """Flags -> planner.plan.Question (shared by plan and trace)."""
    from planner.inputs import resolve_cluster, resolve_gpu, resolve_model
    from planner.plan import Question

    overrides = {k: kw[k] for k in ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab",
                                    "tied_embeddings", "mlp", "experts", "experts_per_token")}
    model, source = resolve_model(params=kw["params"], preset=kw["preset"], config=kw["config"],
                                  overrides=overrides)
    if kw["gpu"] is None:
        raise UsageError("--gpu: required (a profile id such as h100-80, or a TOML file; "
                         "see --list-gpus)")
    margin = kw["margin"]
    if not math.isfinite(margin) or not 0 <= margin < 1:
        raise UsageError(f"--margin: must be a fraction in [0, 1), got {margin}")
    gpu = resolve_gpu(kw["gpu"])
    overheads, assumptions, calibration = None, None, None
    if kw.get("calibration", "none") != "none":
        from planner.inputs import resolve_calibration

        overheads, gpu, assumptions, calibration = resolve_calibration(kw["calibration"], gpu,
                                                                       model)
        if calibration and calibration.get("stale"):
            click.echo(f"fitcheck: warning: {calibration['stale']}", err=True)
    cluster = resolve_cluster(gpu, kw["n_gpus"], kw["gpus_per_node"], kw["host_ram_gib"])
    training = TrainingSpec(
        seq=kw["seq"], micro_batch=kw["micro_batch"], grad_accum=kw["grad_accum"],
        precision=Precision(kw["precision"].lower()), optimizer=OptimizerKind(kw["optimizer"].lower()),
        optimizer_impl=OptimizerImpl(kw["optimizer_impl"].lower()),
        attention=Attention(kw["attention"].lower()))
    offload = kw["offload"].lower()
    question = Question(
        model=model, training=training, cluster=cluster,
        strategies=_strategies(kw["strategies"]),
        offloads=None if offload == "auto" else (Offload(offload),),
        checkpointing=Checkpointing(kw["checkpointing"].lower()), margin=margin,
        global_batch=kw["global_batch"], calibration=calibration,
        **({"overheads": overheads} if overheads else {}),
        **({"assumptions": assumptions} if assumptions else {}))
    return question, source


def _list_gpus(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    from hardware_profiles import load_all

    for pid, p in load_all().items():
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


# Subcommands imported only when named, so `fitcheck --params ...` never loads them (torch for
# trace/probe, pandas for report, http.server for serve).
LAZY_COMMANDS = {
    "trace": ("probes.cli", "trace_cmd", "Measure one step's memory with fake tensors (needs torch)."),
    "gate": ("planner.gate_cli", "gate_cmd", "Admit or reject a job spec (scheduler gating)."),
    "serve": ("planner.gate_cli", "serve_cmd", "Kubernetes validating admission webhook."),
    "report": ("planner.report_cli", "report_cmd", "Capacity-planning sweep: CSV, Markdown, HTML."),
    "probe": ("probes.cuda_cli", "probe_cmd", "CUDA probe runs under torchrun and calibration."),
}


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
@click.version_option(__version__, prog_name="fitcheck")
def cli() -> None:
    """fitcheck: will this training run fit, with which strategy?"""


@cli.command("plan")
@model_options
@training_options
@hardware_options
@candidate_options
@click.option("--find", type=click.Choice(["min-gpus", "max-micro-batch", "max-seq"]),
              help="Inverse question: the fewest GPUs of the type, or the largest micro-batch or "
              "sequence length that fits; the plan shown is at that value.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object on stdout (docs/cli.md).")
@click.option("--list-gpus", is_flag=True, expose_value=False, is_eager=True, callback=_list_gpus,
              help="List the embedded GPU profiles and exit.")
@click.option("--list-models", is_flag=True, expose_value=False, is_eager=True,
              callback=_list_models, help="List the model presets and exit.")
def plan_cmd(as_json: bool, find: str | None, **kw: Any) -> int:
    """Predict per-GPU memory for every strategy and recommend one.

    Exit codes: 0 a candidate fits, 3 nothing fits, 2 usage error, 4 bad input data
    (profile, config), 1 crash.
    """
    from planner.plan import find as find_value
    from planner.plan import plan
    from planner.render import answer_json, table

    question, source = build_question(kw)
    found = find_value(question, find) if find else None
    answer = found.answer if found else plan(question)
    if as_json:
        import json

        click.echo(json.dumps(answer_json(answer, source, found), indent=2))
    else:
        click.echo(table(answer, source, found))
    if found is not None and found.value is None:
        return EXIT_NOTHING_FITS
    return EXIT_FITS if answer.any_fits else EXIT_NOTHING_FITS


def _module_exists(name: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def main() -> None:
    cli.main()
