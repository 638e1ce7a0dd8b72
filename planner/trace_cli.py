"""`fitcheck trace` and `fitcheck --from-trace`: traces of real training steps on fake tensors.

`fitcheck trace` prints them beside the plan; `fitcheck --config X --from-trace` plans from
them (``plan_command``; the plan itself is probes/trace_plan.py's ``plan_from_traces``).

What is traced: with ``--config`` (a config.json, its directory, or a hub id cached locally)
the real Hugging Face class (probes/hf.py), at full depth or, with ``--depth scaled``, from
two shallow traces (probes/trace_plan.py); otherwise (``--model``, ``--params``, shape flags,
or ``--config`` with ``--reference-model``) fitcheck's reference transformer of that shape
(probes/models.py). The planner's column is left empty for architectures it does not model.

Each candidate runs in its own subprocess (probes.runner) with a timeout; a crash or hang in
torch is a failed probe with its reason. Exit codes: 0 every probe ran, 5 some probe failed
or is unsupported (others still reported), 2 usage, 4 bad input data, 1 crash.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from typing import Any

import click

from planner.cli_options import (
    CANDIDATES,
    HARDWARE,
    MODEL,
    TRAINING,
    field_options,
    request_from_options,
)
from planner.errors import EXIT_FITS, EXIT_TRACE_REFUSED, UsageError
from planner.spec import Candidate, Checkpointing, Offload, Strategy

EXIT_PROBE_FAILED = EXIT_TRACE_REFUSED  # 5: a probe failed or the model cannot be traced
TRACEABLE = (Strategy.DDP, Strategy.NO_SHARD, Strategy.SHARD_GRAD_OP, Strategy.FULL_SHARD,
             Strategy.HYBRID_SHARD)
GiB = 2**30


def _pct(x: float | None) -> str:
    if x is None:
        return "-"
    if x == float("inf"):
        return "inf"
    return f"{100 * x:+.1f}%"


@click.command("trace")
@field_options(MODEL + TRAINING + HARDWARE + CANDIDATES,
               gpu={"default": "h100-80", "show_default": True,
                    "help": "GPU profile (only sets capacity, which a trace does not use)."})
@click.option("--reference-model", is_flag=True,
              help="With --config: trace fitcheck's reference transformer of the config's "
              "shape instead of the Hugging Face class.")
@click.option("--depth", type=click.Choice(["full", "scaled"]), default="full",
              show_default=True,
              help="Hugging Face models: trace every layer, or two shallow depths scaled to the "
              "real one (what --from-trace plans use; seconds instead of minutes for 70B).")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=1), default=600.0,
              show_default=True, help="Seconds per traced candidate.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object on stdout.")
def trace_cmd(as_json: bool, timeout_s: float, reference_model: bool, depth: str,
              **kw: Any) -> int:
    """Trace one training step per candidate (FakeTensorMode, any world size, no GPU) and print
    the traced memory beside the planner's prediction, term by term.

    Same flags as the plan. --config traces the real Hugging Face class built from the
    config (no weights, no download); --gpu defaults to h100-80 (it only sets capacity,
    which a trace does not use); --strategy defaults to the traceable ones (ddp and the
    FSDP2 strategies; ZeRO and offload are reported unsupported); --checkpointing auto
    traces none.
    """
    from probes.compare import compare, comparison_json, traced_only
    from probes.runner import run_trace

    hf = bool(kw.get("config")) and not reference_model
    config: dict[str, Any] = {}
    tracer = None
    if hf:
        request, tracer, name = request_for_config(kw, depth=depth, timeout_s=timeout_s,
                                                   jobs=1)
        config = tracer.config
    else:
        request = request_from_options(kw)
        name = request.model.name
    if request.training.pipeline.enabled:
        # the pipeline's referee is probes/pipeline_trace.py (tests/test_pipeline.py)
        raise UsageError("--pp: fitcheck trace runs no pipeline schedule (NOT MODELLED "
                         "here); plan it without tracing")
    opts = request.options
    strategies = opts.strategies if kw["strategy"] else TRACEABLE
    ck = Checkpointing.NONE if opts.checkpointing is Checkpointing.AUTO else opts.checkpointing
    offload = opts.offloads[0] if opts.offloads else Offload.NONE
    q = request.resolved()
    if not hf:
        from planner.errors import InputDataError
        from probes.models import reference_spec

        try:  # what the reference module builds, and the planner predicts for it
            q = dataclasses.replace(q, model=reference_spec(q.model))
        except ValueError as exc:
            raise InputDataError(str(exc)) from None
    analytic = q.model_source != "trace" and not (hf and q.model_source != "config")
    # an approximate reading (--approximate) says what it left out
    from planner.notices import Kind, of_kind

    notes = of_kind(q.warnings, Kind.APPROXIMATE_READING) if hf and analytic else []
    results = []
    for strategy in strategies:
        # --tp N traces that degree (2-D dp x tp mesh, probes/finetune_tp.py); auto: none
        cand = Candidate(strategy=strategy, offload=offload, checkpointing=ck,
                         tp=opts.tp or 1)
        what = f"{name} ({config.get('model_type')}, Hugging Face class)" if hf else name
        click.echo(f"tracing {what}: {strategy} (checkpointing {ck}, offload {offload}) at "
                   f"world size {q.cluster.n_gpus} ...", err=True)
        if tracer is not None:
            from probes.trace_plan import TraceJob

            t = tracer.trace([TraceJob(candidate=cand, training=q.training,
                                       world_size=q.cluster.n_gpus,
                                       gpus_per_node=q.cluster.gpus_per_node)])[0]
            data = dict(t.result) if t.ok else {"ok": False, "reason": t.reason,
                                                "unsupported": t.unsupported}
            wall, rss, cached = t.wall_s, t.max_rss_bytes, t.cached
        else:
            r = run_trace(q.model, q.training, cand, q.cluster.n_gpus, q.cluster.gpus_per_node,
                          timeout_s=timeout_s)
            data = dict(r.data) if r.ok else {"ok": False, "reason": r.reason,
                                              "unsupported": r.unsupported}
            wall, rss, cached = r.wall_s, r.max_rss_bytes, False
        if analytic:
            c = compare(q.model, q.training, q.cluster, cand, data, wall_s=wall,
                        max_rss_bytes=rss, overheads=q.runtime.overheads)
        else:
            c = traced_only(cand, q.cluster.n_gpus, data, wall_s=wall, max_rss_bytes=rss)
        results.append(dataclasses.replace(c, model=dict(data.get("model", {}),
                                                         layers=data.get("n_blocks"),
                                                         scaled_from=data.get("scaled_from")),
                                           cached=cached))
    failed = any(not c.ok for c in results)
    if as_json:
        model = ({"source": "trace", "config": name, "model_type": config.get("model_type"),
                  "analytic": dataclasses.asdict(q.model) if analytic else None}
                 if hf else dataclasses.asdict(q.model) | {"source": q.model_source})
        doc = {
            "schema_version": 1,
            "model": model,
            "training": {k: str(v) if not isinstance(v, int) else v
                         for k, v in dataclasses.asdict(q.training).items()},
            "world_size": q.cluster.n_gpus,
            "gpus_per_node": q.cluster.gpus_per_node,
            "planner_compared": analytic,
            "notes": notes,
            "candidates": [comparison_json(c) for c in results],
        }
        click.echo(json.dumps(doc, indent=2, default=str))
    else:
        click.echo(_table(results, analytic, notes))
    return EXIT_PROBE_FAILED if failed else EXIT_FITS


def _table(results: list, analytic: bool = True, notes: list[str] | None = None) -> str:
    from tabulate import tabulate

    lines = []
    for c in results:
        head = (f"{c.candidate.strategy}  checkpointing {c.candidate.checkpointing}  offload "
                f"{c.candidate.offload}  world {c.world_size}")
        m = c.model or {}
        if m.get("class") and m.get("source") == "hf":
            depth = (f", scaled from {m['scaled_from'][0]} and {m['scaled_from'][1]} layers"
                     if m.get("scaled_from") else "")
            head += f"  [{m['class']}, {m.get('layers')} layers{depth}]"
        if not c.ok:
            word = "unsupported" if c.unsupported else "FAILED"
            lines.append(f"{head}: {word}: {c.reason}")
            lines.append("")
            continue

        def gib(x: int | None) -> str:
            return "-" if x is None else f"{x / GiB:.3f}"

        rows = [["peak allocated", gib(c.peak.traced_bytes), gib(c.peak.predicted_bytes),
                 _pct(c.peak.rel_error),
                 f"{c.traced_peak_phase} / {c.predicted_peak_phase or '-'}"]]
        for name, p in c.moments.items():
            rows.append([f"  at {name}", gib(p.traced_bytes), gib(p.predicted_bytes),
                         _pct(p.rel_error), ""])
        for name, p in c.categories.items():
            rows.append([f"  {name}", gib(p.traced_bytes), gib(p.predicted_bytes),
                         _pct(p.rel_error), ""])
        probe = "cached" if c.cached else (f"probe {c.wall_s:.1f} s, "
                                           f"{c.max_rss_bytes / 2**20:.0f} MiB RSS")
        lines.append(f"{head}  ({probe})")
        lines.append(tabulate(rows, headers=["GiB per GPU", "traced", "planner", "error",
                                             "peak at (trace / planner)"],
                              tablefmt="simple", disable_numparse=True))
        lines.append("")
    if not analytic:
        lines.append("(the planner has no model of this architecture: traced only; "
                     "fitcheck --config X --from-trace plans from traces)")
    for n in notes or []:
        lines.append(f"({n})")
    lines.append("(excluded from both: cuBLAS workspace, CUDA context, NCCL, allocator reserve, "
                 "DDP buckets, token ids, module buffers, host-side optimizer step counters)")
    return "\n".join(lines)


# --------------------------------------------------------------------------- --from-trace


SHAPE_FLAGS = ("params", "model", "layers", "hidden", "heads", "kv_heads", "ffn", "vocab",
               "tied_embeddings", "mlp", "experts", "experts_per_token")


def request_for_config(kw: dict[str, Any], **tracer_options: Any) -> tuple[Any, Any, str]:
    """(request, tracer, name) for ``--config X`` given to a traced command: the hub id
    resolved in the local cache, the Hugging Face class's tracer (``probes.trace_plan.HfTracer``
    with ``tracer_options``), and the request built by the plan's own builder: from the
    config.json when the analytic reader knows the architecture, else from the traced
    module's own structure (``build_request(..., traced=)``; no shape is invented)."""
    from planner.errors import InputDataError, UsageError
    from planner.fields import FLAGS, cli_values
    from planner.request import build_request
    from probes.hf import HfConfigError, read_config, resolve_config
    from probes.trace_plan import HfTracer

    value = kw.get("config")
    if not value:
        raise UsageError("tracing a real model needs --config (a config.json, its directory, "
                         "or a hub id cached locally)")
    given = [f"--{k.replace('_', '-')}" for k in SHAPE_FLAGS if kw.get(k) is not None]
    if given:
        raise UsageError(f"{', '.join(given)} cannot be combined with a traced --config (the "
                         "traced class is built from the config.json as it is; edit it)")
    try:
        path = resolve_config(value)
        config = read_config(path)
    except HfConfigError as exc:
        raise InputDataError(str(exc)) from None
    if not os.path.exists(os.path.expanduser(value)):
        name = value  # a hub id
    else:
        where = path.parent.name if path.name == "config.json" else path.stem
        name = str(config.get("_name_or_path") or where or config["model_type"])
    tracer = HfTracer(config, str(name), **tracer_options)
    try:
        request = request_from_options({**kw, "config": str(path)})
    except InputDataError:  # an architecture the analytic reader does not know
        request = build_request(cli_values({**kw, "config": None}), FLAGS,
                                traced=tracer.facts())
    return request, tracer, str(name)


def plan_command(kw: dict[str, Any], *, as_json: bool, wide: bool, width: int,
                 find: str | None = None) -> int:
    """``fitcheck --config X --from-trace``: the plan from traces; prints it, returns the
    exit code (0 fits, 3 nothing fits; refusals raise TraceRefused, exit 5)."""
    import json

    from planner.errors import EXIT_FITS, EXIT_NOTHING_FITS, UsageError
    from probes.trace_plan import (
        DEFAULT_TIMEOUT_S,
        plan_from_traces,
        traced_json,
        traced_table,
    )

    if find is not None:
        raise UsageError("--find cannot be combined with --from-trace (each value searched "
                         "would be a trace); --n, --micro-batch, --seq ask one at a time")
    timeout = float(os.environ.get("FITCHECK_TRACE_TIMEOUT", DEFAULT_TIMEOUT_S))
    request, tracer, name = request_for_config(kw, timeout_s=timeout)
    if sys.stderr.isatty():  # progress for people; scripts get one line or none
        tracer.on_start = lambda n: click.echo(
            f"fitcheck: tracing {n} configuration(s) of {name} on fake tensors ...", err=True)
    ta = plan_from_traces(request, tracer)
    if as_json:
        click.echo(json.dumps(traced_json(ta), indent=2))
    else:
        click.echo(traced_table(ta, width=width, wide=wide))
    return EXIT_FITS if ta.answer.any_fits else EXIT_NOTHING_FITS
