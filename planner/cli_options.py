"""What the click front ends share: options generated from the field registry
(planner/fields.py), the request they describe, and terminal facts. ``fitcheck`` (planner/cli.py)
and its subcommands (trace, probe, report, gate) import this module; none imports another
front end's command module."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable
from typing import Any

import click

from planner.fields import FIELDS, Field

# ---------------------------------------------------------------------------------------------
# Options from the field registry


def _complete_gpus(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[str]:
    from hardware_profiles import list_profiles

    return [g for g in list_profiles() if g.startswith(incomplete.lower())]


def _complete_presets(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[str]:
    from planner.presets import list_presets

    return [p for p in list_presets() if p.startswith(incomplete.lower())]


COMPLETERS: dict[str, Callable[..., list[str]]] = {
    "hardware.gpu": _complete_gpus, "model.preset": _complete_presets}


def _option(f: Field, **override: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    kw: dict[str, Any] = {"help": f.help}
    if f.is_flag:
        name = f.flag.lstrip("-")
        decls = [f"{f.flag}/--{'un' if name.startswith('tied') else 'no-'}{name}", f.dest]
        kw["default"] = None
    else:
        decls = [f.flag, f.dest]
        if f.choices and not f.multiple:
            kw["type"] = click.Choice(f.choices, case_sensitive=False)
        elif f.metavar:
            kw["metavar"] = f.metavar
        else:
            kw["metavar"] = "N" if f.path not in ("margin", "hardware.host_ram_gib") else "X"
        if f.multiple:
            kw["multiple"] = True
        if f.default is not None:
            kw["default"] = f.shown_default or str(f.default)
            kw["show_default"] = True
        if f.path in COMPLETERS:
            kw["shell_complete"] = COMPLETERS[f.path]
    kw.update(override)
    return click.option(*decls, **kw)


def field_options(paths: Iterable[str], **overrides: dict[str, Any]
                  ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A decorator adding the options of these fields (a section name takes all of it).
    ``overrides`` maps a field's dest to click option changes (another default, help)."""
    wanted = list(paths)
    chosen = [f for f in FIELDS if f.path in wanted or f.section in wanted]

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        for f in reversed(chosen):
            fn = _option(f, **overrides.get(f.dest, {}))(fn)
        return fn

    return deco


MODEL = ("model",)
TRAINING = ("training",)
FINETUNE = ("finetune",)
HARDWARE = ("hardware",)
CANDIDATES = ("strategy", "offload", "checkpointing", "parallel", "margin", "calibration")
VERDICT = ("at_risk",)
"""What a verdict does with a job at risk: the plan's exit code (the gate has its own flag)."""
DEEPSPEED = ("deepspeed",)


def request_from_options(kw: dict[str, Any]):
    """click's keyword arguments -> planner.request.Request (warnings go to stderr)."""
    from planner.fields import FLAGS
    from planner.request import build_request

    from planner.notices import Kind, of_kind

    request = build_request(plan_values(kw), FLAGS)
    for w in of_kind(request.warnings, Kind.CALIBRATION_STALE):
        click.echo(f"fitcheck: warning: {w}", err=True)
    return request



class JobFile(click.ParamType):
    """A job file: '-' (stdin), a regular file, or a torchtitan config registry entry
    'path/config_registry.py:NAME'. A FIFO, a device or a directory is refused: reading one
    could block forever or read what is not a job."""

    name = "file"

    def convert(self, value: Any, param: Any, ctx: Any) -> str:
        text = os.fspath(value)
        if text == "-":
            return text
        head, sep, tail = text.rpartition(":")
        file = head if sep and head.endswith(".py") and tail.isidentifier() else text
        if not os.path.exists(file):
            self.fail(f"{file!r}: no such file", param, ctx)
        if not os.path.isfile(file):
            self.fail(f"{file!r}: not a regular file (a directory, FIFO or device is not a "
                      "job file)", param, ctx)
        return text


JOB_FORMATS = ("torchtitan", "deepspeed", "accelerate", "trainer", "trl", "llamafactory",
               "axolotl", "litgpt", "torchtune", "kubeflow", "spec")
"""planner.jobs.JobFormat's names (a test keeps them equal) without importing planner.jobs."""


def plan_values(kw: dict[str, Any]) -> dict[str, Any]:
    """{path: raw} of every plan flag, defaults included, except the fields whose being given
    is itself news (planner.request.CP_ONLY: inert at context parallel degree 1, a warning
    when given): those only when given."""
    from planner.fields import cli_values
    from planner.request import CP_ONLY

    values = cli_values(kw)
    given = given_values(kw)
    for path in CP_ONLY:
        if path not in given:
            values[path] = None
    return values


def given_values(kw: dict[str, Any]) -> dict[str, Any]:
    """{path: raw} of the plan flags given on the command line (not their defaults)."""
    from click.core import ParameterSource

    from planner.fields import FIELDS

    ctx = click.get_current_context()
    out = {}
    for f in FIELDS:
        if f.dest in kw and ctx.get_parameter_source(f.dest) not in (
                None, ParameterSource.DEFAULT, ParameterSource.DEFAULT_MAP):
            out[f.path] = kw[f.dest]
    return out


def terminal_width() -> int:
    """$COLUMNS, else the terminal's width, else 80 (shutil.get_terminal_size's rule, without
    importing shutil on the fast path)."""
    try:
        return max(int(os.environ["COLUMNS"]), 40)
    except (KeyError, ValueError):
        pass
    try:
        return os.get_terminal_size(sys.stdout.fileno()).columns
    except (AttributeError, ValueError, OSError):
        return 80
