"""An Explanation as text for people or as JSON for programs (docs/explain.md).

Bytes stay integers until here; tables print GiB (2**30) and say so.
"""

from __future__ import annotations

import textwrap
from typing import Any

from planner.candidates import label
from planner.runs.evidence import CATEGORIES, Moment, Quantity, Run
from planner.runs.explain import CATEGORY_WORDS, Explanation
from planner.runs.units import GiB, size

__all__ = ["SCHEMA_VERSION", "evidence_json", "evidence_text", "explanation_json",
           "explanation_text", "run_json"]

SCHEMA_VERSION = 1


def _g(n: int | None) -> str:
    return "-" if n is None else f"{n / GiB:.2f}"


def _wrap(text: str, width: int, indent: str = "  - ", sub: str = "    ") -> list[str]:
    return textwrap.wrap(text, width=max(width, 40), initial_indent=indent,
                         subsequent_indent=sub, break_on_hyphens=False) or [indent]


def _evidence_lines(run: Run) -> list[str]:
    out = []
    for o in run.ooms:
        at = f" in the {o.moment}" if o.moment is not Moment.UNKNOWN else ""
        out.append(f"{o.where}: {o.backend} out of memory ({o.format} wording)"
                   f"{at}: tried to allocate {o.requested.text}, {o.allocated.text} allocated, "
                   f"{size(o.reserved_unallocated.value) if o.reserved_unallocated else '?'}"
                   " reserved "
                   f"but unallocated, {o.free.text} free of {o.capacity.text}")
    by_format: dict[str, list] = {}
    for s in run.samples:
        by_format.setdefault(s.format, []).append(s)
    for fmt, ss in by_format.items():
        peaks = []
        for q in (Quantity.PEAK_ALLOCATED, Quantity.PEAK_RESERVED, Quantity.DEVICE_USED,
                  Quantity.NEEDED):
            vals = [s.get(q) for s in ss if s.get(q) is not None]
            if vals:
                peaks.append(f"{q.value.replace('_', ' ')} {size(max(vals))}")
        out.append(f"{ss[0].where.rsplit(':', 1)[0]}: {fmt} log, {len(ss)} memory line(s)"
                   + (f": max {', '.join(peaks)}" if peaks else ""))
    for s in run.snapshots:
        out.append(f"{s.where}: memory snapshot, {s.trace_entries} trace entries, peak "
                   f"{size(s.peak_allocated_bytes)} allocated in the {s.peak_moment}, "
                   f"{size(s.reserved_bytes)} reserved at the dump"
                   + (", expandable segments" if s.expandable_segments else ""))
    return out


def explanation_text(x: Explanation, width: int = 100) -> str:
    r, c = x.request, x.candidate
    t, cl = r.training, r.cluster
    lines = [f"job       {r.model.name}: {cl.n_gpus} x {cl.gpu.name}, {label(c)}; seq {t.seq}, "
             f"micro-batch {t.micro_batch}, grad-accum {t.grad_accum}, {t.precision}, "
             f"{t.optimizer} ({t.optimizer_impl})", "evidence"]
    lines += [line for e in _evidence_lines(x.run) for line in _wrap(e, width, "  ", "    ")]
    lines += ["", "memory per moment, GiB (predicted: the planner; measured: the run; 'oom' = "
              "at the failure, a lower bound)",
              f"{'moment':<10} {'pred alloc':>10} {'pred need':>10} {'pred dev':>9} "
              f"{'meas alloc':>10} {'meas rsvd':>10} {'meas dev':>9}  source"]
    for row in x.rows:
        m = row.measured
        tag = " (oom)" if m is not None and m.at_oom else ""
        lines.append(f"{row.moment.value:<10} {_g(int(row.predicted.total)):>10} "
                     f"{_g(row.predicted_needed):>10} {_g(row.predicted_device):>9} "
                     f"{_g(m.allocated if m else None):>10} {_g(m.reserved if m else None):>10} "
                     f"{_g(m.device_used if m else None):>9}  "
                     f"{(m.source + tag) if m else ''}")
    sp = x.step_peak
    e = x.estimate
    lines.append(f"{'step peak':<10} {_g(int(e.peak_allocated_bytes)):>10} "
                 f"{_g(int(e.breakdown.total + e.allocator_overhead_bytes)):>10} "
                 f"{_g(int(e.device_used_bytes)):>9} {_g(sp.allocated if sp else None):>10} "
                 f"{_g(sp.reserved if sp else None):>10} {_g(sp.device_used if sp else None):>9}"
                 f"  {sp.source if sp else ''}")
    lines += ["", f"device: {size(x.capacity_bytes)} ({x.capacity_source}); non-PyTorch "
              f"{size(x.non_pytorch_bytes)} ({x.non_pytorch_source}); the allocator could "
              f"reach {size(x.limit_bytes)}"]
    lines = lines[:-1] + _wrap(lines[-1], width, "", "  ")
    lines += ["", "what broke the limit"]
    if x.broke_moment is not None:
        lines += _wrap(f"moment: {x.broke_moment} ({x.broke_source})", width)
    else:
        lines += _wrap("moment: none (the planner's timeline stays under the limit and the "
                       "evidence has no out-of-memory with a traceback)", width)
    if x.broke_category is not None:
        lines += _wrap(f"category: {CATEGORY_WORDS.get(x.broke_category, x.broke_category)} "
                       f"({x.broke_category_source})", width)
    for f in x.findings:
        lines += _wrap(f, width)
    cands = [f for f in x.fixes if f.kind == "candidate"]
    levers = [f for f in x.fixes if f.kind != "candidate"]
    lines += ["", "what fits instead on these GPUs (ranked as `fitcheck plan` ranks them)"]
    if not cands:
        lines.append("  nothing the plan lists fits on these GPUs")
    for i, f in enumerate(cands, 1):
        lines += _wrap(f"{i}. {f.label}: {f.change}  needs {size(f.needed_bytes)} of "
                       f"{size(f.usable_bytes)} usable, step {f.step_time_s:.3g} s, "
                       f"{f.tokens_per_s_per_gpu:,.0f} tokens/s/GPU", width, "  ", "     ")
    if levers:
        lines += ["", f"one setting of the job changed ({label(c)} kept), checked by the planner"]
        for f in levers:
            if f.kind == "gpus":
                lines += _wrap(f"{f.change}: {f.label}"
                               + (f", needs {size(f.needed_bytes)} of {size(f.usable_bytes)} "
                                  "usable" if f.needed_bytes else ""), width)
                continue
            if f.fits:
                verdict = "fits"
            elif f.oom_probability is not None:
                verdict = (f"at risk ({f.oom_probability:.0%} probability of running out of "
                           "memory, from the planner's measured error)")
            else:
                verdict = "does not fit" + (
                    f" at the {r.options.margin:.0%} margin (fits the "
                    f"{size(x.estimate.capacity_bytes)} device without it)"
                    if f.fits_device and r.options.margin else "")
            lines += _wrap(f"{f.change}: {verdict}, needs {size(f.needed_bytes)} of "
                           f"{size(f.usable_bytes)} usable", width)
    notes = [*x.assumptions, *x.run.notes,
             *(str(w) for w in r.warnings)]
    if notes:
        lines += ["", "assumptions"] + [line for n in notes for line in _wrap(n, width)]
    return "\n".join(lines)


def _fig(f: Any) -> dict[str, Any] | None:
    return None if f is None else {"bytes": f.value, "resolution_bytes": f.resolution,
                                   "printed": f.text}


def run_json(run: Run) -> dict[str, Any]:
    return {
        "files": list(run.files),
        "ooms": [{
            "where": o.where, "format": o.format, "backend": o.backend,
            "exception": o.exception or None, "device": o.device,
            "requested": _fig(o.requested), "capacity": _fig(o.capacity), "free": _fig(o.free),
            "allocated": _fig(o.allocated), "reserved_unallocated": _fig(o.reserved_unallocated),
            "reserved_bytes": o.reserved, "process_in_use": _fig(o.process_in_use),
            "non_pytorch_bytes": o.non_pytorch, "allowed": _fig(o.allowed),
            "private_pools": _fig(o.private_pools),
            "other_processes": [{"pid": p, "in_use": _fig(f)} for p, f in o.other_processes],
            "hint": o.hint or None, "moment": str(o.moment),
            "moment_evidence": o.moment_evidence or None, "category": o.category_hint,
            "category_evidence": o.category_evidence or None} for o in run.ooms],
        "samples": [{
            "where": s.where, "format": s.format, "moment": str(s.moment),
            "label": s.label or None, "step": s.step,
            "figures": {str(q): _fig(f) for q, f in s.figures.items()},
            "tokens_per_s_per_gpu": s.tokens_per_s_per_gpu, "samples_per_s": s.samples_per_s,
            "mfu": s.mfu} for s in run.samples],
        "snapshots": [{
            "where": s.where, "reserved_bytes": s.reserved_bytes,
            "allocated_bytes": s.allocated_bytes, "peak_allocated_bytes": s.peak_allocated_bytes,
            "peak_moment": str(s.peak_moment),
            "moment_peaks_bytes": {str(k): v for k, v in s.moment_peaks.items()},
            "categories_at_peak_bytes": s.categories_at_peak,
            "expandable_segments": s.expandable_segments, "oom": s.oom,
            "largest_at_peak": [{"bytes": b, "category": cat, "frame": fr}
                                for b, cat, fr in s.largest_at_peak],
            "trace_entries": s.trace_entries} for s in run.snapshots],
        "versions": run.versions,
        "notes": list(run.notes),
    }


def explanation_json(x: Explanation) -> dict[str, Any]:
    from planner.render import answer_json

    c = x.candidate
    rows = []
    for row in x.rows:
        m = row.measured
        rows.append({
            "moment": str(row.moment), "planner_moment": str(row.phase),
            "predicted": {"allocated_bytes": int(row.predicted.total),
                          "needed_bytes": row.predicted_needed,
                          "device_used_bytes": row.predicted_device,
                          "categories_bytes": {k: int(getattr(row.predicted, k))
                                               for k in CATEGORIES}},
            "measured": None if m is None else {
                "allocated_bytes": m.allocated, "reserved_bytes": m.reserved,
                "device_used_bytes": m.device_used, "at_oom": m.at_oom,
                "requested_bytes": m.requested, "categories_bytes": m.categories or None,
                "source": m.source}})
    sp = x.step_peak
    e = x.estimate
    return {
        "schema_version": SCHEMA_VERSION,
        "job": {"candidate": {"strategy": str(c.strategy), "offload": str(c.offload),
                              "checkpointing": str(c.checkpointing), "tp": c.tp},
                "plan": answer_json(x.answer)["inputs"]},
        "evidence": run_json(x.run),
        "moments": rows,
        "step_peak": {
            "predicted": {"allocated_bytes": int(e.peak_allocated_bytes),
                          "reserved_bytes": int(e.peak_reserved_bytes),
                          "needed_bytes": int(e.required_bytes - e.cuda_context_bytes
                                              - e.nccl_bytes),
                          "device_used_bytes": int(e.device_used_bytes),
                          "peak_moment": str(e.peak_phase)},
            "measured": None if sp is None else {
                "allocated_bytes": sp.allocated, "reserved_bytes": sp.reserved,
                "device_used_bytes": sp.device_used, "source": sp.source}},
        "device": {"capacity_bytes": x.capacity_bytes, "capacity_source": x.capacity_source,
                   "non_pytorch_bytes": x.non_pytorch_bytes,
                   "non_pytorch_source": x.non_pytorch_source,
                   "allocator_limit_bytes": x.limit_bytes},
        "diagnosis": {
            "moment": None if x.broke_moment is None else str(x.broke_moment),
            "moment_source": x.broke_source or None,
            "category": x.broke_category, "category_source": x.broke_category_source or None,
            "fragmentation_cause": x.fragmentation_cause,
            "expandable_segments_would_help": x.expandable_would_help,
            "planner_fits_as_run": bool(e.fits),
            "planner_required_bytes": int(e.required_bytes),
            "findings": list(x.findings)},
        "fixes": [{"kind": f.kind, "change": f.change, "label": f.label, "fits": f.fits,
                   "fits_device_without_margin": f.fits_device,
                   "oom_probability": f.oom_probability,
                   "needed_bytes": f.needed_bytes, "usable_bytes": f.usable_bytes,
                   "step_time_s": f.step_time_s,
                   "tokens_per_s_per_gpu": f.tokens_per_s_per_gpu} for f in x.fixes],
        "assumptions": [*x.assumptions, *x.run.notes],
        "warnings": [str(w) for w in x.request.warnings],
    }


def evidence_text(run: Run, width: int = 100) -> str:
    """The evidence alone (no job given): what each file holds, what each OOM says."""
    from planner.runs.explain import evidence_findings

    lines = ["evidence (no job given: give the job's flags, --job or --deepspeed-config for "
             "the planner's prediction and what fits instead)"]
    lines += [line for e in _evidence_lines(run) for line in _wrap(e, width, "  ", "    ")]
    for where, findings, _f, _e in evidence_findings(run):
        lines += ["", f"what {where} says"]
        lines += [line for f in findings for line in _wrap(f, width)]
    if run.notes:
        lines += ["", "assumptions"] + [line for n in run.notes for line in _wrap(n, width)]
    return "\n".join(lines)


def evidence_json(run: Run) -> dict[str, Any]:
    from planner.runs.explain import evidence_findings

    return {"schema_version": SCHEMA_VERSION, "job": None, "evidence": run_json(run),
            "diagnosis": [{"where": w, "findings": f, "fragmentation_cause": fr,
                           "expandable_segments_would_help": ex}
                          for w, f, fr, ex in evidence_findings(run)]}
