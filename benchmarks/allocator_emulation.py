"""Peak reserved memory: the caching-allocator emulator (probes/alloc_emu.py) fed with the
fake-tensor trace's allocation stream, against the GPU records and the planner.

    PYTHONPATH=. python benchmarks/allocator_emulation.py [--ids ID,ID] [--json OUT]
    PYTHONPATH=. python benchmarks/allocator_emulation.py --from-json OUT [--replan] [--write MD]
    PYTHONPATH=. python benchmarks/allocator_emulation.py --loss-only
    PYTHONPATH=. python benchmarks/allocator_emulation.py --table2 [--steps N]
    PYTHONPATH=. python benchmarks/allocator_emulation.py --rows ID,ID [--steps N]

Per GPU record (benchmarks/gpu_runs/*/run*-records.jsonl, record "case"; a case measured
identically on several GPUs or runs is traced once and scored on each record): the reference
model's training step is traced (probes/trace.py ``trace_step``, ``warmup="iteration"``: the
optimizer state is created inside the first tracked step, as on the GPU; ``--steps`` steps,
2 by default: the emulated reserved peak does not move after the second step on the cases
checked with more; ``record_events=True``) and its allocation stream replayed through the emulator with the
record's allocator (default or expandable segments) and the device's capacity (memory total
minus what was used before the case). Printed per record: measured max allocated / max
reserved (``torch.cuda.max_memory_*``), the emulator's, and the planner's
(``Estimate.peak_allocated_bytes`` / ``peak_reserved_bytes``), and the reserved-beyond-allocated
"overhead" each predicts (emulated max reserved - emulated max allocated; the planner's
allocator terms) added to the *measured* allocated peak, which scores the allocator mechanism
apart from the trace's or the planner's allocated bytes. Nothing is fitted to the records.

``--from-json``: the table of a saved ``--json`` (tracing nothing); with ``--replan`` the
planner's columns are recomputed by the planner as it is now and a before / after table per
strategy and allocator is printed first (how docs/model.md §7.4's terms were scored).

``--loss-only``: the loss region alone (probes/alloc_loss.py ``loss_region``): torchtitan
9dec370's fp32 cross-entropy forward and backward at 32768 tokens x 128256 vocab, traced on
fake tensors and replayed under expandable segments and the default allocator.

``--rows``: public rows of benchmarks/memory_measurements.csv (``csv_rows``), with the
default stream's own hole at the peak (``CachingAllocator.default_stream_hole``: the term
the planner's ``fragmentation`` stands for with fixed segments, docs/model.md §7.4).

Default ids: the single-GPU Llama-3.2-1B cases of the default allocator and every expandable
one (cheap to trace on two CPU cores: about a minute each).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from planner.hardware import load_gpu  # noqa: E402
from planner.spec import Allocator  # noqa: E402
from probes.alloc_emu import CachingAllocator  # noqa: E402
from probes.alloc_loss import loss_region  # noqa: E402
from probes.gpu_records import read_runs, row_of  # noqa: E402

GiB = 1 << 30
RUNS = {"2026-11-26-h100": "h100-80", "2026-11-26-h100-b": "h100-80",
        "2026-11-26-h200": "h200"}
DEFAULT_IDS = ("w1-1b-ddp-none", "w1-1b-fsdp-none", "w1-1b-ddp-full", "w1-1b-fsdp-full",
               "w1-1b-ddp-sel", "w1-1b-fsdp-sel", "w1-1b-ddp-none-bf16",
               "w1-1b-fsdp-none-bf16", "w1-1b-sgo-none", "w1-1b-fsdp-none-ga2-last",
               "exp-1b-ddp-none", "exp-1b-fsdp-full", "exp-1b-fsdp-none-ga2-last")


def records(ids: set[str] | None) -> list[tuple[dict[str, Any], str, int]]:
    """(record, profile id, device bytes) of every successful case record with these ids
    (None: all)."""
    out = []
    for folder, profile in RUNS.items():
        recs = read_runs(REPO / "benchmarks" / "gpu_runs" / folder)
        env = next((r for r in recs if r.get("record") == "env"), {})
        total = int(env.get("memory_total_mib", 0)) << 20
        for r in recs:
            if r.get("record") == "case" and r.get("ok") and (ids is None or r["id"] in ids):
                out.append((r, profile, total))
    return out


def emulate(events: list, expandable: bool, capacity: int) -> CachingAllocator:
    return CachingAllocator(expandable=expandable, capacity=capacity).replay(events)


def trace_events(row: Any, steps: int) -> tuple[list, float]:
    from probes.trace import trace_step

    t0 = time.perf_counter()
    res = trace_step(row.model, row.training, row.cand, world_size=row.cluster.n_gpus,
                     gpus_per_node=row.cluster.gpus_per_node, warmup="iteration",
                     warmup_iterations=max(1, steps - 1), record_events=True)
    return res["alloc_events"], time.perf_counter() - t0


def err(pred: float, meas: float) -> float:
    return (pred - meas) / meas


def p90(xs: list[float]) -> float:
    s = sorted(abs(x) for x in xs)
    return s[min(len(s) - 1, int(round(0.9 * (len(s) - 1))))]


def compare(ids: set[str] | None, skipped: dict[str, str],
            steps: int = 2) -> list[dict[str, Any]]:
    """The rows of every record with these ids (None: every successful case record);
    ``skipped`` collects the ids the trace could not run, with the reason."""
    rows_out: list[dict[str, Any]] = []
    traced: dict[str, tuple[list, float]] = {}
    for rec, profile, total in records(ids):
        gpu = load_gpu(profile)
        row = row_of(rec, gpu)
        if row.training.activation_offload:
            # trace_step does not run activation offloading (probes/offload_trace.py does,
            # without an allocation stream): its allocated bytes would be another loop's
            skipped[rec["id"]] = "activation offloading: not run by probes.trace.trace_step"
            continue
        if rec["id"] not in traced:
            try:
                traced[rec["id"]] = trace_events(row, steps)
            except Exception as exc:  # a case the fake-tensor trace does not run
                traced[rec["id"]] = ([], 0.0)
                skipped[rec["id"]] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
                print(f"not traced {rec['id']}: {skipped[rec['id']]}", file=sys.stderr)
                continue
            print(f"traced {rec['id']}: {len(traced[rec['id']][0])} events in "
                  f"{traced[rec['id']][1]:.0f} s", file=sys.stderr)
        events, _ = traced[rec["id"]]
        if not events:
            continue
        expandable = row.training.allocator is Allocator.EXPANDABLE
        capacity = total - int(rec["before"]["device_used"]) if total else 1 << 62
        emu = emulate(events, expandable, capacity)
        est = row.est()
        a, res = rec["max_allocated_bytes"], rec["max_reserved_bytes"]
        emu_over = emu.max_reserved - emu.max_allocated
        cached = emu.cached_at_peak()
        plan_over = est.peak_reserved_bytes - est.peak_allocated_bytes
        rows_out.append({
            "id": rec["id"], "run": f"{profile}/{rec['_run']}", "allocator":
            row.training.allocator.value, "measured_allocated": a, "measured_reserved": res,
            "emu_allocated": emu.max_allocated, "emu_reserved": emu.max_reserved,
            "plan_allocated": int(est.peak_allocated_bytes),
            "plan_reserved": int(est.peak_reserved_bytes),
            "emu_overhead": emu_over, "plan_overhead": int(plan_over),
            "measured_overhead": res - a,
            "emu_cached_default_stream": cached.get(0, 0),
            "emu_cached_other_streams": sum(v for k, v in cached.items() if k != 0),
            "err_emu_reserved": err(emu.max_reserved, res),
            "err_plan_reserved": err(est.peak_reserved_bytes, res),
            "err_emu_overhead": err(a + emu_over, res),
            "err_plan_overhead": err(a + plan_over, res),
        })
    return rows_out


def replan(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The saved rows with the planner's columns recomputed by the planner as it is now (the
    emulated and measured columns kept): scores a change of the planner's allocator terms
    without tracing again. Also keeps the saved planner reserved as ``plan_reserved_before``
    and adds each record's strategy."""
    recs = {(r["id"], f"{profile}/{r['_run']}"): (r, profile) for r, profile, _ in records(None)}
    out = []
    for r in rows:
        rec, profile = recs[(r["id"], r["run"])]
        row = row_of(rec, load_gpu(profile))
        est = row.est()
        a, res = r["measured_allocated"], r["measured_reserved"]
        over = int(est.peak_reserved_bytes - est.peak_allocated_bytes)
        out.append({**r, "strategy": row.cand.strategy.value,
                    "plan_reserved_before": r.get("plan_reserved_before", r["plan_reserved"]),
                    "plan_allocated": int(est.peak_allocated_bytes),
                    "plan_reserved": int(est.peak_reserved_bytes), "plan_overhead": over,
                    "err_plan_reserved": err(est.peak_reserved_bytes, res),
                    "err_plan_overhead": err(a + over, res)})
    return out


def by_group(rows: list[dict[str, Any]]) -> str:
    """Median |error| (p90) of the planner's reserved before and after ``replan``, per strategy
    and allocator."""
    groups: dict[str, list] = {"all": rows}
    for r in rows:
        groups.setdefault(f"{r['strategy']}, {r['allocator']}", []).append(r)
    out = ["| records | n | planner reserved before: median abs err (p90) | after |",
           "|---|---:|---|---|"]
    for name, rs in groups.items():
        before = [err(r["plan_reserved_before"], r["measured_reserved"]) for r in rs]
        after = [r["err_plan_reserved"] for r in rs]
        out.append(f"| {name} | {len(rs)} | "
                   f"{statistics.median(abs(x) for x in before) * 100:.1f}% "
                   f"({p90(before) * 100:.1f}%) | "
                   f"{statistics.median(abs(x) for x in after) * 100:.1f}% "
                   f"({p90(after) * 100:.1f}%) |")
    return "\n".join(out)


def table(rows: list[dict[str, Any]]) -> str:
    g = lambda b: f"{b / GiB:.2f}"  # noqa: E731
    pc = lambda x: f"{x * 100:+.1f}%"  # noqa: E731
    lines = ["| case | GPU/run | alloc. | measured alloc. / reserved GiB | emulated alloc. / "
             "reserved | err | planner alloc. / reserved | err | overhead GiB: measured / "
             "emulated / planner | err of meas. alloc. + overhead: emulated / planner | "
             "emulated cache at the peak GiB: default stream / other streams |",
             "|---|---|---|---|---|---:|---|---:|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['id']} | {r['run']} | {r['allocator']} | {g(r['measured_allocated'])} / "
            f"{g(r['measured_reserved'])} | {g(r['emu_allocated'])} / {g(r['emu_reserved'])} "
            f"| {pc(r['err_emu_reserved'])} | {g(r['plan_allocated'])} / "
            f"{g(r['plan_reserved'])} | {pc(r['err_plan_reserved'])} | "
            f"{g(r['measured_overhead'])} / {g(r['emu_overhead'])} / {g(r['plan_overhead'])} "
            f"| {pc(r['err_emu_overhead'])} / {pc(r['err_plan_overhead'])} | "
            f"{g(r['emu_cached_default_stream'])} / {g(r['emu_cached_other_streams'])} |")
    lines.append("")
    for subset, label_set in ((rows, "all records"),
                              ([r for r in rows if r["allocator"] == "default"], "default allocator"),
                              ([r for r in rows if r["allocator"] == "expandable"],
                               "expandable segments")):
        if not subset:
            continue
        lines.append(f"Median |error| (p90) over {len(subset)} records, {label_set}: " + "; ".join(
            f"{label} {statistics.median(abs(r[k]) for r in subset) * 100:.1f}% "
            f"({p90([r[k] for r in subset]) * 100:.1f}%)"
            for k, label in (("err_emu_reserved", "emulated reserved"),
                             ("err_plan_reserved", "planner reserved"),
                             ("err_emu_overhead", "measured allocated + emulated overhead"),
                             ("err_plan_overhead", "measured allocated + planner overhead")))
            + "  ")
    return "\n".join(lines)


TABLE2 = ("tt-h100-llama3.1-8b-fsdp8-cp1-seq32k-float8-compiled",
          "tt-h100-llama3.1-8b-fsdp4-cp2-seq64k-float8-compiled",
          "tt-h100-llama3.1-8b-fsdp2-cp4-seq128k-float8-compiled",
          "tt-h100-llama3.1-8b-fsdp1-cp8-seq256k-float8-compiled")


def table2(steps: int = 2) -> str:
    """torchtitan's Table 2 rows (benchmarks/memory_measurements.csv), as ``csv_rows``."""
    return csv_rows(TABLE2, steps)


def csv_rows(ids: tuple[str, ...] | list[str], steps: int = 2) -> str:
    """Public rows of benchmarks/memory_measurements.csv: each row's request as
    benchmarks/memory_accuracy.py builds it, traced eager (a compiled row's full
    checkpointing keeps only the blocks' inputs, compiled or not; FSDP1 rows are traced as
    FSDP2: the fake-tensor trace runs ``fully_shard``) for ``steps`` steps and replayed
    under the row's allocator. An nvidia_smi row is compared with the emulated reserved plus
    the planner's CUDA context and NCCL (the row's ``context_bytes`` where stated)."""
    import csv
    import dataclasses

    from benchmarks.memory_accuracy import predict_request
    from planner.spec import Candidate, CompileMode
    from probes.models import reference_spec
    from probes.trace import trace_step

    rows = {r["id"]: r for r in csv.DictReader(
        (REPO / "benchmarks" / "memory_measurements.csv").open())}
    out = ["| row | metric | measured GiB | planner | emulated allocated | "
           "emulated | error | default-stream hole GiB (% of emulated allocated) | "
           "emulated cache at the peak GiB: per stream |",
           "|---|---|---:|---:|---:|---:|---:|---|---|"]
    for rid in ids:
        if rid not in rows:
            raise SystemExit(f"allocator_emulation: no row {rid!r} in memory_measurements.csv")
        row = rows[rid]
        req, est = predict_request(row)
        cand = Candidate(strategy=req.options.strategies[0], offload=req.options.offloads[0],
                         checkpointing=req.options.checkpointing, tp=req.options.tp or 1)
        training = dataclasses.replace(req.training, compile=CompileMode.NONE)
        res = trace_step(reference_spec(req.model), training, cand,
                         world_size=req.cluster.n_gpus,
                         gpus_per_node=req.cluster.gpus_per_node, warmup="iteration",
                         warmup_iterations=steps - 1, record_events=True)
        emu = emulate(res["alloc_events"], training.allocator is Allocator.EXPANDABLE,
                      1 << 62)
        metric = row["metric"].strip()
        outside = est.device_used_bytes - est.peak_reserved_bytes  # context + NCCL
        planned, emulated = {
            "max_allocated": (est.peak_allocated_bytes, emu.max_allocated),
            "nvidia_smi": (est.device_used_bytes, emu.max_reserved + outside),
        }.get(metric, (est.peak_reserved_bytes, emu.max_reserved))
        meas = int(row["value_bytes"])
        hole = emu.default_stream_hole()
        cached = ", ".join(f"{k}: {v / GiB:.2f}" for k, v in sorted(emu.cached_at_peak().items()))
        out.append(f"| {rid} | {metric} | {meas / GiB:.2f} | {planned / GiB:.2f} "
                   f"({err(planned, meas) * 100:+.1f}%) | {emu.max_allocated / GiB:.2f} | "
                   f"{emulated / GiB:.2f} | {err(emulated, meas) * 100:+.1f}% | "
                   f"{hole / GiB:.2f} ({hole / emu.max_allocated * 100:.1f}%) | {cached} |")
        print(out[-1], file=sys.stderr)
    return "\n".join(out)


def write_block(path: Path, body: str) -> None:
    begin, end = "<!-- allocator-emulation:begin -->", "<!-- allocator-emulation:end -->"
    text = path.read_text()
    if begin not in text or end not in text:
        raise SystemExit(f"allocator_emulation: {path} has no {begin} ... {end} block")
    head, rest = text.split(begin, 1)
    tail = rest.split(end, 1)[1]
    path.write_text(f"{head}{begin}\n{body}\n{end}{tail}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ids", default=",".join(DEFAULT_IDS),
                    help="comma-separated record ids, or 'all'")
    ap.add_argument("--json", default=None, help="write the per-record numbers here")
    ap.add_argument("--from-json", default=None, metavar="JSON",
                    help="print (and --write) the table of a previous --json, tracing nothing")
    ap.add_argument("--replan", action="store_true",
                    help="with --from-json: recompute the planner's columns with the planner "
                    "as it is now and print before / after per strategy and allocator")
    ap.add_argument("--loss-only", action="store_true")
    ap.add_argument("--table2", action="store_true",
                    help="torchtitan's Table 2 rows (minutes each) instead of the GPU records")
    ap.add_argument("--rows", default=None, metavar="ID,ID",
                    help="rows of benchmarks/memory_measurements.csv instead of the GPU "
                    "records (traced eager, seconds to a minute each)")
    ap.add_argument("--steps", type=int, default=2,
                    help="training steps traced per case (the GPU records ran 5; reserved "
                    "stops growing after the second step: checked on w1-1b-fsdp-full with 5 "
                    "and on Table 2's FSDP 8 row with 3)")
    ap.add_argument("--write", default=None, metavar="MD",
                    help="also put the table between the allocator-emulation markers of MD "
                    "(docs/accuracy.md)")
    args = ap.parse_args(argv)
    if args.table2:
        print(table2(args.steps))
        return 0
    if args.rows:
        print(csv_rows(args.rows.split(","), args.steps))
        return 0
    if args.loss_only:
        for exp in (True, False):
            r = loss_region(expandable=exp)  # 32768 tokens x 128256 vocab, hidden 4096
            print(f"loss region, {'expandable' if exp else 'default'}: "
                  f"max allocated {r['max_allocated'] / GiB:.2f} GiB, max reserved "
                  f"{r['max_reserved'] / GiB:.2f} GiB, reserved beyond allocated "
                  f"{r['overhead'] / GiB:.2f} GiB ({r['overhead_per_logit']:.3f} B per logit)")
        return 0
    skipped: dict[str, str] = {}
    if args.from_json:
        saved = json.loads(Path(args.from_json).read_text())
        rows, skipped = saved["rows"], saved["skipped"]
        if args.replan:
            rows = replan(rows)
            print(by_group(rows) + "\n")
    else:
        rows = compare(None if args.ids == "all" else set(args.ids.split(",")), skipped,
                       args.steps)
    body = table(rows) + "".join(f"\n- not traced: {k}: {v}" for k, v in sorted(skipped.items()))
    print(body)
    if args.write:
        write_block(Path(args.write), body)
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "skipped": skipped}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
