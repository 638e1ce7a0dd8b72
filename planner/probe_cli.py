"""``fitcheck probe``: real training steps under torchrun, measured per rank, and calibration.

The command parses flags, writes the worker's configuration and runs it with
``probes.cuda_launch.launch`` (torchrun in its own process session with a timeout; every
process of the run is killed on a timeout or a crash, the records measured until then kept).
``--calibrate CAL.json`` fits the planner's free terms on the records (probes/calibrate.py).
Multi-node: ``--torchrun-args`` replaces ``--standalone`` with your own rendezvous flags, or
``--print-srun`` prints a Slurm command line. docs/calibration.md.

Exit codes (docs/cli.md): 0 the probe ran (OOM candidates are results), 1 the probe failed
(crash, timeout), 2 usage error, 4 bad data (records that cannot be calibrated).
"""

from __future__ import annotations

import json
import os
import shlex
import uuid
from typing import Any

import click

from planner.cli_options import MODEL, TRAINING, field_options
from planner.errors import EXIT_FITS, UsageError
from planner.spec import Checkpointing, Offload, OptimizerKind

PROBED = ("ddp", "no_shard", "shard_grad_op", "full_shard", "hybrid_shard")
"""probes.cuda_launch.PROBED's names (the help text is built without importing probes)."""


@click.command("probe")
@field_options(MODEL + TRAINING)
@click.option("--gpu", metavar="PROFILE", help="The hardware profile id this machine's GPUs "
              "correspond to (stored in the records; required with --calibrate).")
@click.option("--nproc", type=click.IntRange(min=1), default=1, show_default=True,
              help="Processes (GPUs) per node.")
@click.option("--gpus-per-node", type=click.IntRange(min=1),
              help="GPUs per node for hybrid_shard's mesh (default: --nproc).")
@click.option("--strategy", "strategies", multiple=True, metavar="NAME[,NAME]",
              help="Candidates: " + ", ".join(PROBED) + ". Default: all five.")
@click.option("--offload", type=click.Choice(["auto"] + [str(o) for o in Offload],
                                            case_sensitive=False), default="auto",
              show_default=True, help="auto: none; params_and_optimizer: FSDP2 CPUOffloadPolicy.")
@click.option("--checkpointing", type=click.Choice(["auto"] + [str(c) for c in Checkpointing
                                                               if c is not Checkpointing.AUTO],
                                                  case_sensitive=False),
              default="auto", show_default=True, help="auto: none and full.")
@click.option("--out", "out", required=True, metavar="FILE",
              help="JSONL records (rewritten atomically after every candidate).")
@click.option("--device", type=click.Choice(["cuda", "cpu"]), default="cuda", show_default=True,
              help="cpu: gloo backend, memory fields null (CUDA falls back to it when absent).")
@click.option("--steps", type=click.IntRange(min=1), default=5, show_default=True,
              help="Measured steps per candidate.")
@click.option("--warmup", type=click.IntRange(min=0), default=2, show_default=True,
              help="Warm-up steps per candidate (not measured).")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=1), default=900.0,
              show_default=True, help="Seconds for the whole run; then every process is killed.")
@click.option("--proxy-layers", type=click.IntRange(min=1), help="Build a depth-reduced proxy "
              "(same width, K layers). Default: the full model unless its states alone would "
              "exceed 80 % of the device.")
@click.option("--no-bandwidth", is_flag=True, help="Skip the collective bandwidth sweep.")
@click.option("--torchrun-args", metavar="ARGS", help="Rendezvous flags for torchrun instead of "
              "--standalone (multi-node: '--nnodes 2 --rdzv-backend c10d --rdzv-endpoint "
              "HOST:29500 --rdzv-id JOB'); run the same command on every node.")
@click.option("--print-srun", is_flag=True, help="Write the worker configuration next to --out "
              "and print a Slurm srun command that runs it, instead of launching.")
@click.option("--calibrate", "calibrate_out", metavar="OUT.json",
              help="Fit a calibration file on the records (needs --gpu).")
def probe_cmd(gpu: str | None, nproc: int, gpus_per_node: int | None,
              strategies: tuple[str, ...], offload: str, checkpointing: str, out: str,
              device: str, steps: int, warmup: int, timeout_s: float, proxy_layers: int | None,
              no_bandwidth: bool, torchrun_args: str | None, print_srun: bool,
              calibrate_out: str | None, **kw: Any) -> int:
    """Measure real training steps per candidate on this machine's GPUs (torchrun).

    Records: JSONL in --out (docs/calibration.md). Exit codes: 0 the probe ran (an OOM
    candidate is a result), 1 it crashed or timed out, 2 usage error, 4 bad data.
    """
    from planner.fields import FLAGS, cli_values, parse
    from planner.request import job_from, resolve_gpu
    from probes.cuda_launch import ProbeFailed, expand_candidates, launch, srun_command
    from probes.runner import spec_to_dict

    values = parse(cli_values(kw), FLAGS)
    job = job_from(values, FLAGS, allow_files=True, base_dir=None)  # as a plan reads it
    model, training = job.model, job.training
    for w in job.warnings:
        click.echo(f"fitcheck probe: warning: {w}", err=True)
    if training.optimizer in (OptimizerKind.LION, OptimizerKind.ADAMW_8BIT):
        raise UsageError(f"--optimizer: {training.optimizer} is not in torch.optim (not probed)")
    profile = resolve_gpu(gpu, FLAGS, allow_files=True, base_dir=None) if gpu else None
    if calibrate_out and profile is None:
        raise UsageError("--calibrate: needs --gpu (the profile the calibration is for)")
    nnodes = 1
    extra = shlex.split(torchrun_args) if torchrun_args else None
    if extra:
        for i, a in enumerate(extra):
            if a in ("--nnodes", "--nnodes=") and i + 1 < len(extra):
                nnodes = int(extra[i + 1].split(":")[-1]) if extra[i + 1].split(":")[-1].isdigit() else 1
            elif a.startswith("--nnodes="):
                v = a.split("=", 1)[1].split(":")[-1]
                nnodes = int(v) if v.isdigit() else 1
    cands, skipped = expand_candidates(strategies, offload.lower(), checkpointing.lower(),
                                       nproc * nnodes)
    for s in skipped:
        click.echo(f"fitcheck probe: skipped {s}", err=True)
    config = {
        "model": spec_to_dict(model), "training": spec_to_dict(training),
        "candidates": [spec_to_dict(c) for c in cands],
        "gpu_profile": profile.id if profile else None,
        "gpus_per_node": gpus_per_node or nproc, "device": device, "steps": steps,
        "warmup": warmup, "proxy_layers": proxy_layers, "bandwidth": not no_bandwidth,
        "collective_timeout_s": max(60.0, timeout_s),
        "run_id": uuid.uuid4().hex,
    }
    if print_srun:
        cfg_path = os.path.abspath(out) + ".config.json"
        os.makedirs(os.path.dirname(cfg_path), exist_ok=True)
        with open(cfg_path, "w", encoding="utf-8") as f:
            json.dump(config, f, indent=1)
        click.echo(srun_command(cfg_path, os.path.abspath(out), nproc))
        return EXIT_FITS
    run = launch(config, nproc=nproc, out=out, timeout_s=timeout_s, torchrun_args=extra)
    steps_recs = [r for r in run.records if r.get("record") == "step"]
    n_oom = sum(1 for r in steps_recs if r.get("oom"))
    click.echo(f"fitcheck probe: {len(steps_recs)} candidate records ({n_oom} OOM) in "
               f"{run.wall_s:.1f} s -> {out}", err=True)
    if not run.ok:
        raise ProbeFailed(f"probe failed: {run.reason}")
    if calibrate_out:
        from probes.calibrate import fit_records, write_calibration

        doc = fit_records(run.records, profile)
        write_calibration(doc, calibrate_out)
        click.echo(f"fitcheck probe: calibration {doc['id']} -> {calibrate_out}", err=True)
    return EXIT_FITS
