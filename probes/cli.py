"""`fitcheck trace`: trace real training steps on fake tensors and print them beside the plan.

Each candidate runs in its own subprocess (probes.runner) with a timeout; a crash or hang in
torch is a failed probe with its reason. Exit codes: 0 every probe ran, 5 some probe failed
or is unsupported (others still reported), 2 usage, 4 bad input data, 1 crash.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from typing import Any

import click

from planner.cli import CANDIDATES, HARDWARE, MODEL, TRAINING, field_options, request_from_options
from planner.errors import EXIT_FITS
from planner.spec import Candidate, Checkpointing, Offload, Strategy

EXIT_PROBE_FAILED = 5
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
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=1), default=600.0,
              show_default=True, help="Seconds per traced candidate.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object on stdout.")
def trace_cmd(as_json: bool, timeout_s: float, **kw: Any) -> int:
    """Trace one training step per candidate (FakeTensorMode, any world size, no GPU) and print
    the traced memory beside the planner's prediction, term by term.

    Same flags as the plan. --gpu defaults to h100-80 (it only sets capacity, which a trace
    does not use); --strategy defaults to the traceable ones (ddp and the FSDP2 strategies;
    ZeRO and offload are reported unsupported); --checkpointing auto traces none.
    """
    from probes.compare import compare, comparison_json
    from probes.runner import run_trace

    request = request_from_options(kw)
    opts = request.options
    strategies = opts.strategies if kw["strategy"] else TRACEABLE
    ck = Checkpointing.NONE if opts.checkpointing is Checkpointing.AUTO else opts.checkpointing
    offload = opts.offloads[0] if opts.offloads else Offload.NONE
    q = request.resolved()
    results = []
    for strategy in strategies:
        cand = Candidate(strategy=strategy, offload=offload, checkpointing=ck)
        click.echo(f"tracing {strategy} (checkpointing {ck}, offload {offload}) at world size "
                   f"{q.cluster.n_gpus} ...", err=True)
        r = run_trace(q.model, q.training, cand, q.cluster.n_gpus, q.cluster.gpus_per_node,
                      timeout_s=timeout_s)
        data = dict(r.data) if r.ok else {"ok": False, "reason": r.reason,
                                          "unsupported": r.unsupported}
        results.append(compare(q.model, q.training, q.cluster, cand, data, wall_s=r.wall_s,
                               max_rss_bytes=r.max_rss_bytes, overheads=q.runtime.overheads))
    failed = any(not c.ok for c in results)
    if as_json:
        doc = {
            "schema_version": 1,
            "model": dataclasses.asdict(q.model) | {"source": q.model_source},
            "training": {k: str(v) if not isinstance(v, int) else v
                         for k, v in dataclasses.asdict(q.training).items()},
            "world_size": q.cluster.n_gpus,
            "gpus_per_node": q.cluster.gpus_per_node,
            "candidates": [comparison_json(c) for c in results],
        }
        click.echo(json.dumps(doc, indent=2, default=str))
    else:
        click.echo(_table(results))
    return EXIT_PROBE_FAILED if failed else EXIT_FITS


def _table(results: list) -> str:
    from tabulate import tabulate

    lines = []
    for c in results:
        head = (f"{c.candidate.strategy}  checkpointing {c.candidate.checkpointing}  offload "
                f"{c.candidate.offload}  world {c.world_size}")
        if not c.ok:
            word = "unsupported" if c.unsupported else "FAILED"
            lines.append(f"{head}: {word}: {c.reason}")
            lines.append("")
            continue
        rows = [["peak allocated", f"{c.peak.traced_bytes / GiB:.3f}",
                 f"{c.peak.predicted_bytes / GiB:.3f}", _pct(c.peak.rel_error),
                 f"{c.traced_peak_phase} / {c.predicted_peak_phase}"]]
        for name, p in c.moments.items():
            rows.append([f"  at {name}", f"{p.traced_bytes / GiB:.3f}",
                         f"{p.predicted_bytes / GiB:.3f}", _pct(p.rel_error), ""])
        for name, p in c.categories.items():
            rows.append([f"  {name}", f"{p.traced_bytes / GiB:.3f}",
                         f"{p.predicted_bytes / GiB:.3f}", _pct(p.rel_error), ""])
        lines.append(f"{head}  (probe {c.wall_s:.1f} s, {c.max_rss_bytes / 2**20:.0f} MiB RSS)")
        lines.append(tabulate(rows, headers=["GiB per GPU", "traced", "planner", "error",
                                             "peak at (trace / planner)"],
                              tablefmt="simple", disable_numparse=True))
        lines.append("")
    lines.append("(excluded from both: cuBLAS workspace, CUDA context, NCCL, allocator reserve, "
                 "DDP buckets, token ids, host-side optimizer step counters)")
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(trace_cmd())
