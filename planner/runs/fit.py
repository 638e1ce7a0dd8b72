"""Calibration from runs: fit the runtime terms no trace sees on the user's own runs.

Each run is a ``Case``: a job (model, training, cluster, candidate) and the evidence its
files hold. A user's log is paired with the job flags; fitcheck's own GPU records carry their
job (planner/runs/records.py), so probe records and public logs go through this same code.
What each term is fitted on (least squares, defaults for the terms no run measures):

=================================  ============================================================
term                               observations
=================================  ============================================================
``cuda_context_bytes``,            ``y = ctx + c * nccl``, y = this process's memory in use -
``nccl_bytes_per_communicator``    reserved (an OOM message's NVML line; a record's device used -
                                   reserved), plus what the driver keeps (profile total -
                                   cudaMemGetInfo total, where the run states it); c = NCCL
                                   communicators the run had. nccl is reported only when a run
                                   had a multi-rank communicator
``allocator_fragmentation``        ``f`` = the median over runs of U / A: A allocated at the peak, U
                                   reserved beyond it that the allocator could not release: an
                                   OOM's 'reserved but unallocated' (after the allocator's
                                   free-and-retry), a least-limit record's limit - A, a log's
                                   peak reserved - A - the planner's releasable cache (A the
                                   planner's when the log prints reserved only, as torchtitan's
                                   does); runs with expandable segments are left out
(both, from device-used-only runs) three or more runs that print only the device's used memory:
                                   used - releasable - NCCL = ctx + (1 + f) * A, A the planner's
``compute_efficiency``,            ``e`` = the median over runs of x / (t - o): t the measured
``compiled_compute_efficiency``    step time (tokens/s per GPU, samples/s over all GPUs, a
                                   record's step time), x = FLOPs per step / dense peak, o the
                                   planner's exposed communication and offload time; eager and
                                   torch.compile runs apart
=================================  ============================================================

``held_out`` leaves each run out in turn, fits on the rest and scores the planner on it before
(defaults) and after (fitted); ``halves`` fits on one half and scores the other, both ways.
Standard library only (on the planner's path).
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import field
from typing import Any

from planner.lazy_dataclass import dataclass
from planner.calibration import SCHEMA_VERSION, apply, parse_calibration
from planner.errors import InputDataError
from planner.memory import Estimate, Overheads, estimate
from planner.request import Request
from planner.runs.evidence import Moment, Quantity, Run
from planner.runs.explain import job_candidate
from planner.runs.records import Recorded
from planner.spec import (
    Allocator,
    Candidate,
    Cluster,
    CompileMode,
    GpuProfile,
    ModelSpec,
    TrainingSpec,
)
from planner.throughput import StepEstimate, estimate_step, peak_flops

__all__ = ["Case", "Fitted", "QUANTITIES", "calibration_doc", "case_from_recorded",
           "case_from_request", "check_one_gpu", "fit", "halves", "held_out", "observe", "predict",
           "score", "summary", "judge_terms", "restrict", "TERMS"]

QUANTITIES = ("peak_allocated", "peak_reserved", "needed", "device_used", "step_time")
"""What a run can measure and the planner predicts (the keys of ``predict``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Case:
    id: str
    model: ModelSpec
    training: TrainingSpec
    cluster: Cluster
    candidate: Candidate
    run: Run
    source: str = ""
    fake_group: bool = False
    one_rank_nccl: bool = False
    """A world-size-1 run with an NCCL process group: one communicator the planner (which
    counts none on one GPU) does not."""
    device_total_bytes: int | None = None
    margin: float = 0.0


def case_from_request(r: Request, run: Run, id: str, source: str = "") -> Case:
    r = r.resolved()
    c, _notes = job_candidate(r)
    total = next((o.capacity.value for o in run.ooms), None)
    return Case(id=id, model=r.model, training=r.training, cluster=r.cluster, candidate=c,
                run=run, source=source, device_total_bytes=total, margin=r.options.margin)


def case_from_recorded(rec: Recorded, gpu: GpuProfile) -> Case:
    w = rec.world_size
    cl = Cluster(gpu=gpu, n_gpus=w, gpus_per_node=min(w, rec.gpus_per_node or w),
                 host_ram_bytes_per_node=gpu.host_ram_bytes_per_node)
    return Case(id=rec.id, model=rec.model, training=rec.training, cluster=cl,
                candidate=rec.candidate, run=rec.run, source=rec.run.files[0] if rec.run.files
                else "", fake_group=rec.fake_group,
                one_rank_nccl=(w == 1 and not rec.fake_group),
                device_total_bytes=rec.device_total_bytes)


# ---------------------------------------------------------------------------------------------
# What a run measured


@dataclass(slots=True)
class Observations:
    nonpt: list[tuple[float, int, bool, str]] = field(default_factory=list)
    """(y in the profile's frame, communicators, one-rank only, where)"""
    frag: list[tuple[float, float, bool, str]] = field(default_factory=list)
    """(allocated A, unreleasable U, A predicted rather than measured, where)"""
    time: list[tuple[float, float, float, bool, str]] = field(default_factory=list)
    """(x = FLOPs / peak, o = exposed comm + offload, t measured, compiled, where)"""
    device: list[tuple[float, float, int, float, str]] = field(default_factory=list)
    """Runs that measure only the device's used memory (nvidia-smi / NVML): (allocated peak
    A predicted, releasable cache L predicted, communicators, device used, where)."""
    measured: dict[str, float] = field(default_factory=dict)
    """The case's headline measurements, by QUANTITIES name."""
    notes: list[str] = field(default_factory=list)


def _estimate(case: Case, ov: Overheads, gpu: GpuProfile | None = None) -> Estimate:
    cl = case.cluster if gpu is None else dataclasses.replace(case.cluster, gpu=gpu)
    return estimate(case.model, case.training, cl, case.candidate, margin=case.margin,
                    overheads=ov)


def _step(case: Case, gpu: GpuProfile | None = None) -> StepEstimate:
    cl = case.cluster if gpu is None else dataclasses.replace(case.cluster, gpu=gpu)
    return estimate_step(case.model, case.training, cl, case.candidate)


def _needed_at_peak(e: Estimate) -> int:
    return int(e.breakdown.total + e.allocator_overhead_bytes)


def _releasable(e: Estimate) -> int:
    """The planner's releasable cache at the reserved peak (reserved - needed)."""
    return max(0, int(e.peak_reserved_bytes) - _needed_at_peak(e))


def _communicators(case: Case, e: Estimate, ov: Overheads) -> int:
    if case.fake_group:
        return 0
    if case.one_rank_nccl:
        return 1
    return int(round(e.nccl_bytes / ov.nccl_bytes_per_communicator))


def observe(case: Case) -> Observations:
    ov = Overheads()
    gpu = case.cluster.gpu
    e = _estimate(case, ov)
    obs = Observations()
    comm = _communicators(case, e, ov)
    run = case.run
    gap = None if case.device_total_bytes is None else gpu.memory_bytes - case.device_total_bytes
    # non-PyTorch memory
    for o in run.ooms:
        if o.process_in_use is not None and o.reserved is not None:
            g = gpu.memory_bytes - o.capacity.value
            obs.nonpt.append((float(o.non_pytorch + g), comm, case.one_rank_nccl, o.where))
    peaks = _peaks(run)
    if Quantity.DEVICE_USED in peaks and Quantity.PEAK_RESERVED in peaks and gap is not None:
        y = peaks[Quantity.DEVICE_USED] - peaks[Quantity.PEAK_RESERVED] + gap
        obs.nonpt.append((float(y), comm, case.one_rank_nccl, case.id))
    # fragmentation (of the default allocator: runs with expandable segments measure another
    # term, which calibration files do not carry)
    expandable = case.training.allocator is Allocator.EXPANDABLE
    for o in (() if expandable else run.ooms):
        if o.reserved_unallocated is not None and o.requested.value <= o.capacity.value:
            obs.frag.append((float(o.allocated.value), float(o.reserved_unallocated.value),
                             False, o.where))
    if expandable:
        pass
    elif Quantity.NEEDED in peaks and Quantity.PEAK_ALLOCATED in peaks:
        a = peaks[Quantity.PEAK_ALLOCATED]
        obs.frag.append((float(a), float(max(0, peaks[Quantity.NEEDED] - a)), False, case.id))
    elif Quantity.DEVICE_USED in peaks and Quantity.PEAK_RESERVED not in peaks \
            and Quantity.PEAK_ALLOCATED not in peaks and not run.ooms:
        obs.device.append((float(e.peak_allocated_bytes), float(_releasable(e)), comm,
                           float(peaks[Quantity.DEVICE_USED]), case.id))
    elif Quantity.PEAK_RESERVED in peaks and not run.ooms:
        res_fig = _peak_fig(run, Quantity.PEAK_RESERVED)
        if res_fig is not None and res_fig.resolution <= 0.05 * res_fig.value:
            predicted_a = Quantity.PEAK_ALLOCATED not in peaks
            a = float(e.peak_allocated_bytes) if predicted_a else peaks[Quantity.PEAK_ALLOCATED]
            u = peaks[Quantity.PEAK_RESERVED] - a - _releasable(e)
            obs.frag.append((a, float(max(0.0, u)), predicted_a, case.id))
    # step time
    t = _step_time(case)
    if t is not None:
        st = _step(case)
        x = st.flops_per_step / peak_flops(gpu, case.training.precision, case.training.tf32)
        o_s = 0.0 if case.fake_group else st.step_time_s - st.compute_s
        if t > o_s:
            obs.time.append((x, o_s, t, case.training.compile is not CompileMode.NONE, case.id))
        else:
            obs.notes.append(f"{case.id}: the measured step ({t:.3g} s) is shorter than the "
                             f"planner's exposed communication alone ({o_s:.3g} s): not used "
                             "for the compute efficiency (check the GPUs per node and the "
                             "links of the job)")
    # headline measurements
    names = {Quantity.PEAK_ALLOCATED: "peak_allocated", Quantity.PEAK_RESERVED: "peak_reserved",
             Quantity.NEEDED: "needed", Quantity.DEVICE_USED: "device_used"}
    for q, name in names.items():
        if q in peaks and not run.ooms:
            obs.measured[name] = float(peaks[q])
    if t is not None:
        obs.measured["step_time"] = t
    return obs


def _peaks(run: Run) -> dict[Quantity, int]:
    out: dict[Quantity, int] = {}
    for s in run.samples:
        if s.moment not in (Moment.STEP,):
            continue
        for q, f in s.figures.items():
            out[q] = max(out.get(q, 0), f.value)
    return out


def _peak_fig(run: Run, q: Quantity):
    figs = [s.figures[q] for s in run.samples if q in s.figures and s.moment is Moment.STEP]
    return max(figs, key=lambda f: f.value, default=None)


def _step_time(case: Case) -> float | None:
    t = case.training
    tokens = t.micro_batch * t.seq * t.grad_accum
    times = [s.step_time_s for s in case.run.samples if s.step_time_s]
    if times:
        return statistics.median(times)
    tps = [s.tokens_per_s_per_gpu for s in case.run.samples if s.tokens_per_s_per_gpu]
    if len(tps) > 1:
        tps = tps[1:]  # the first interval holds warm-up (and compilation)
    times += [tokens * (case.candidate.tp or 1) / v / (case.candidate.tp or 1) for v in tps]
    if not times:
        dp = case.cluster.n_gpus // max(1, case.candidate.tp)
        sps = [s.samples_per_s for s in case.run.samples if s.samples_per_s]
        if len(sps) > 1:
            sps = sps[1:]
        times += [t.micro_batch * t.grad_accum * dp / v for v in sps]
    return statistics.median(times) if times else None


# ---------------------------------------------------------------------------------------------
# Fitting


@dataclass(frozen=True, slots=True, kw_only=True)
class Fitted:
    values: dict[str, dict[str, Any] | None]
    """Calibration ``values`` entries (planner/calibration.py's schema)."""
    notes: tuple[str, ...] = ()


def _through_origin(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    den = sum(x * x for x in xs)
    return None if den <= 0 else sum(x * y for x, y in zip(xs, ys)) / den


def _stats(res: Sequence[float], rel: Sequence[float], n: int, method: str) -> dict[str, Any]:
    return {"n": n,
            "rms_residual": math.sqrt(sum(r * r for r in res) / len(res)) if res else None,
            "max_abs_residual": max(abs(r) for r in res) if res else None,
            "relative_error": statistics.median(rel) if rel else None,
            "held_out_error": None, "method": method}


def _loo(n: int, fit1: Callable[[list[int]], float | None],
         err: Callable[[float, int], float]) -> float | None:
    if n < 3:
        return None
    errs = []
    for i in range(n):
        v = fit1([j for j in range(n) if j != i])
        if v is not None:
            errs.append(abs(err(v, i)))
    return statistics.median(errs) if errs else None


def fit(cases: Sequence[Case]) -> Fitted:
    """The runtime terms from the runs' observations (``observe``); None where no run
    measures a term (the planner's default stays)."""
    obs = [observe(c) for c in cases]
    notes: list[str] = [n for o in obs for n in o.notes]
    values: dict[str, dict[str, Any] | None] = {
        "cuda_context_bytes": None, "nccl_bytes_per_communicator": None,
        "allocator_fragmentation": None, "compute_efficiency": None,
        "compiled_compute_efficiency": None}
    # context and NCCL
    pts = [p for o in obs for p in o.nonpt]
    if pts:
        ys = [p[0] for p in pts]
        cs = [p[1] for p in pts]
        nccl = None
        if len(set(cs)) > 1:
            mc, my = statistics.fmean(cs), statistics.fmean(ys)
            slope = sum((c - mc) * (y - my) for c, y in zip(cs, ys)) / sum((c - mc) ** 2
                                                                          for c in cs)
            ctx = my - slope * mc
            nccl = slope
        else:
            nccl_default = Overheads().nccl_bytes_per_communicator
            ctx = statistics.median(y - c * nccl_default for y, c in zip(ys, cs))
            if cs[0]:
                notes.append(f"every run had {cs[0]} NCCL communicator(s): the context is fitted "
                             f"with the default {nccl_default / 2**20:.0f} MiB per communicator")
        res = [y - (ctx + c * (nccl or Overheads().nccl_bytes_per_communicator))
               for y, c in zip(ys, cs)]
        rel = [abs(r) / y for r, y in zip(res, ys) if y]

        def ctx_of(idx: list[int]) -> float:
            return statistics.median(ys[j] - cs[j] * (nccl or Overheads()
                                                      .nccl_bytes_per_communicator)
                                     for j in idx)

        held = _loo(len(ys), ctx_of, lambda v, i: (v + cs[i] * (nccl or Overheads()
                    .nccl_bytes_per_communicator) - ys[i]) / ys[i])
        values["cuda_context_bytes"] = {
            "value": int(round(max(ctx, 0.0))), **_stats(res, rel, len(ys), (
                "this process's memory in use - reserved (OOM messages' NVML line, records' "
                "device used - reserved) + what the driver keeps, minus NCCL")),
            "held_out_error": held}
        one_rank_only = all(p[2] for p in pts if p[1])
        if nccl is not None and not one_rank_only and nccl > 0:
            values["nccl_bytes_per_communicator"] = {
                "value": int(round(nccl)), "n": len(ys), "rms_residual": None,
                "max_abs_residual": None, "relative_error": None, "held_out_error": None,
                "method": "slope of non-PyTorch memory on the number of communicators"}
        elif nccl is not None:
            notes.append(f"NCCL: {nccl / 2**20:.0f} MiB per one-rank communicator measured; a "
                         "one-rank communicator has no peers, so nccl_bytes_per_communicator "
                         "is not fitted")
    # runs that measure the device's used memory only: with a fitted context their excess over
    # the predicted allocated bytes is fragmentation; without one, three or more of them fit
    # both (device used - releasable - NCCL = ctx + (1 + f) * A)
    dev = [p for o in obs for p in o.device]
    nccl_b = Overheads().nccl_bytes_per_communicator
    ctx_fit = values["cuda_context_bytes"]["value"] if values["cuda_context_bytes"] else None
    extra_frag: list[tuple[float, float, bool, str]] = []
    if dev and ctx_fit is None and len(dev) >= 3 and len({round(p[0]) for p in dev}) >= 3:
        A = [p[0] for p in dev]
        Y = [p[3] - p[1] - p[2] * nccl_b for p in dev]
        ma, my = statistics.fmean(A), statistics.fmean(Y)
        slope = sum((a - ma) * (y - my) for a, y in zip(A, Y)) / sum((a - ma) ** 2 for a in A)
        ctx_j = my - slope * ma
        if slope >= 1.0 and ctx_j > 0:
            res = [y - (ctx_j + slope * a) for a, y in zip(A, Y)]
            values["cuda_context_bytes"] = {
                "value": int(round(ctx_j)), **_stats(res, [abs(r) / y for r, y in zip(res, Y)],
                                                     len(A), (
                    "intercept of device used - the planner's releasable cache - NCCL on the "
                    "planner's allocated peak, over runs that measure the device's used memory "
                    "only (fitted jointly with allocator_fragmentation = slope - 1)")),
                "held_out_error": None}
            ctx_fit = values["cuda_context_bytes"]["value"]
            notes.append("context and fragmentation fitted jointly on device-used-only runs "
                          "(nvidia-smi / NVML figures): their allocated peaks are the planner's")
    for a, l_, c, d, where in dev:
        ctx0 = ctx_fit if ctx_fit is not None else cases[0].cluster.gpu.cuda_context_bytes
        extra_frag.append((a, max(0.0, d - ctx0 - c * nccl_b - a - l_), True, where))
    # fragmentation
    fr = [p for o in obs for p in o.frag] + extra_frag
    if fr:
        A = [p[0] for p in fr]
        U = [p[1] for p in fr]
        f = statistics.median(u / a for a, u in zip(A, U) if a > 0) if any(A) else None
        if f is not None:
            f = min(max(f, 0.0), 2.0)
            res = [u - f * a for a, u in zip(A, U)]
            rel = [abs(r) / (a + u) for r, a, u in zip(res, A, U)]
            held = _loo(len(A), lambda idx: statistics.median(U[j] / A[j] for j in idx),
                        lambda v, i: ((1 + v) * A[i] - (A[i] + U[i])) / (A[i] + U[i]))
            n_pred = sum(1 for p in fr if p[2])
            values["allocator_fragmentation"] = {
                "value": round(f, 4), **_stats(res, rel, len(A), (
                    "median over runs of the unreleasable reserved bytes / the allocated bytes at "
                    "the peak (robust to one fragmented run; OOM messages' "
                    "reserved-but-unallocated, "
                    "least-limit records, peak reserved - releasable cache)"
                    + (f"; {n_pred} of the runs print reserved only: their allocated peak is the "
                       "planner's" if n_pred else ""))),
                "held_out_error": held}
    # compute efficiency
    for compiled, key in ((False, "compute_efficiency"), (True, "compiled_compute_efficiency")):
        pts_t = [p for o in obs for p in o.time if p[3] is compiled]
        if not pts_t:
            continue
        # each run implies e_i = x_i / (t_i - o_i); their median (robust: one large model or one
        # odd run must not decide the efficiency of every other)
        implied = [p[0] / (p[2] - p[1]) for p in pts_t]
        eff = min(1.0, statistics.median(implied))
        res = [p[2] - (p[1] + p[0] / eff) for p in pts_t]
        rel = [abs(r) / p[2] for r, p in zip(res, pts_t)]
        held = _loo(len(pts_t), lambda idx: statistics.median(implied[j] for j in idx),
                    lambda v, i: (pts_t[i][1] + pts_t[i][0] / v - pts_t[i][2]) / pts_t[i][2])
        values[key] = {"value": round(eff, 4), **_stats(res, rel, len(pts_t), (
            "median over runs of FLOPs per step / dense peak / (measured step time - the "
            "planner's exposed communication and offload time)"
            + ("; torch.compile runs" if compiled
                                                       else "; eager runs"))),
            "held_out_error": held}
    return Fitted(values=values, notes=tuple(notes))


# ---------------------------------------------------------------------------------------------
# Scoring


def calibration_doc(fitted: Fitted, gpu: GpuProfile, *, versions: dict[str, str | None],
                    source: str, gpu_name: str | None = None, date: str | None = None,
                    memory_bytes: int | None = None, records: list[dict] | None = None
                    ) -> dict[str, Any]:
    """The calibration file (docs/calibration.md §3) for ``gpu``; validated by the planner's
    own reader before it is returned."""
    date = date or _dt.datetime.now(_dt.timezone.utc).date().isoformat()
    torch_v = versions.get("torch")
    vals = {k: v for k, v in fitted.values.items()}
    vals.setdefault("activation_scale", {})
    vals["activation_scale"] = {}
    vals["intra_node_comm_efficiency"] = None
    vals["inter_node_comm_efficiency"] = None
    doc = {
        "schema_version": SCHEMA_VERSION,
        "id": f"{gpu.id}-runs-torch{(torch_v or 'unknown').split('+')[0]}-{date}",
        "source": source,
        "gpu": {"profile": gpu.id, "name": gpu_name or gpu.name,
                "memory_bytes": int(memory_bytes or gpu.memory_bytes)},
        "versions": {k: versions.get(k) for k in ("driver", "cuda", "torch", "nccl")},
        "date": date,
        "values": vals,
        "notes": list(fitted.notes) + ([] if any(versions.values()) else [
            "no software versions were given or found in the runs: the file is never reported "
            "stale"]),
        "records": records or [],
    }
    import json

    parse_calibration(json.loads(json.dumps(doc)), "<fitted from runs>")
    return doc


def _apply(case: Case, doc: dict[str, Any] | None) -> tuple[Overheads, GpuProfile]:
    if doc is None:
        return Overheads(), case.cluster.gpu
    cal = parse_calibration(doc, "<fitted>")
    return apply(cal, Overheads(), case.cluster.gpu, check_gpu=False)


def predict(case: Case, doc: dict[str, Any] | None = None) -> dict[str, float]:
    """The planner's figures for the case's headline measurements, with the calibration
    ``doc`` applied (None: the defaults)."""
    ov, gpu = _apply(case, doc)
    e = _estimate(case, ov, gpu)
    st = _step(case, gpu)
    # a fake process group's collectives move nothing and take no time
    t = st.compute_s + st.offload_s if case.fake_group else st.step_time_s
    return {"peak_allocated": float(e.peak_allocated_bytes),
            "peak_reserved": float(e.peak_reserved_bytes),
            "needed": float(_needed_at_peak(e)),
            "device_used": float(e.device_used_bytes),
            "step_time": float(t)}


def score(cases: Sequence[Case], doc: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Per case and measured quantity: measured, predicted, relative error."""
    out = []
    for c in cases:
        meas = observe(c).measured
        pred = predict(c, doc)
        for q, m in meas.items():
            out.append({"id": c.id, "quantity": q, "measured": m, "predicted": pred[q],
                        "error": (pred[q] - m) / m})
    return out


TERMS = {"cuda_context_bytes": ("device_used",), "nccl_bytes_per_communicator": ("device_used",),
         "allocator_fragmentation": ("needed", "peak_reserved", "device_used"),
         "compute_efficiency": ("step_time",), "compiled_compute_efficiency": ("step_time",)}
"""Each fitted term and the measured quantities it predicts."""


def restrict(fitted: Fitted, terms: set[str] | None) -> Fitted:
    if terms is None:
        return fitted
    return Fitted(values={k: (v if k in terms else None) for k, v in fitted.values.items()},
                  notes=fitted.notes)


def _doc_for(cases: Sequence[Case], terms: set[str] | None = None) -> dict[str, Any]:
    gpu = cases[0].cluster.gpu
    return calibration_doc(restrict(fit(cases), terms), gpu, versions={}, source="held out",
                           date="2000-01-01")


def held_out(cases: Sequence[Case], terms: set[str] | None = None) -> list[dict[str, Any]]:
    """Leave each case out, fit on the others, score it before (defaults) and after."""
    rows = []
    for i, c in enumerate(cases):
        rest = [x for j, x in enumerate(cases) if j != i]
        doc = _doc_for(rest, terms) if rest else None
        before = {(r["quantity"]): r for r in score([c], None)}
        after = {(r["quantity"]): r for r in score([c], doc)}
        for q, b in before.items():
            rows.append({"id": c.id, "quantity": q, "measured": b["measured"],
                         "before": b["predicted"], "after": after[q]["predicted"],
                         "error_before": b["error"], "error_after": after[q]["error"]})
    return rows


def halves(cases: Sequence[Case], terms: set[str] | None = None) -> dict[str, Any]:
    """Fit on one half (sorted by id, even positions), score the other, then the other way
    round: the held-out errors before and after, and the values fitted on each half."""
    s = sorted(cases, key=lambda c: c.id)
    a, b = s[0::2], s[1::2]
    rows = []
    fitted = []
    for fit_on, score_on in ((a, b), (b, a)):
        if not fit_on or not score_on:
            continue
        doc = _doc_for(fit_on, terms)
        fitted.append({k: (v or {}).get("value") for k, v in doc["values"].items()
                       if k != "activation_scale"})
        before = score(score_on, None)
        after = score(score_on, doc)
        for x, y in zip(before, after):
            rows.append({"id": x["id"], "quantity": x["quantity"], "measured": x["measured"],
                         "before": x["predicted"], "after": y["predicted"],
                         "error_before": x["error"], "error_after": y["error"]})
    return {"rows": rows, "fitted": fitted}


def summary(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Median |error| before and after, per quantity."""
    out = {}
    for q in QUANTITIES:
        rs = [r for r in rows if r["quantity"] == q]
        if rs:
            out[q] = {"n": len(rs),
                      "median_abs_error_before": statistics.median(abs(r["error_before"])
                                                                   for r in rs),
                      "median_abs_error_after": statistics.median(abs(r["error_after"])
                                                                  for r in rs)}
    return out


def check_one_gpu(cases: Sequence[Case]) -> GpuProfile:
    ids = sorted({c.cluster.gpu.id for c in cases})
    if len(ids) != 1:
        raise InputDataError(f"calibrate: the runs are on different GPU profiles ({', '.join(ids)})"
                             "; a calibration is for one GPU type")
    if not any(observe(c).nonpt or observe(c).frag or observe(c).time or observe(c).device
               for c in cases):
        raise InputDataError("calibrate: no run measures a runtime term (non-PyTorch memory, "
                             "reserved vs allocated, or step time)")
    return cases[0].cluster.gpu


def judge_terms(cases: Sequence[Case], fitted: Fitted, *, slack: float = 0.005
                ) -> dict[str, dict[str, Any]]:
    """Per fitted term: the held-out median |error| of what it predicts, with the defaults and
    with that term alone fitted (leave-one-out up to 20 runs, else halves), and whether to
    keep it (no worse than the defaults by more than ``slack``)."""
    out = {}
    for term, quantities in TERMS.items():
        if fitted.values.get(term) is None:
            continue
        if len(cases) < 2:
            out[term] = {"keep": True, "why": "one run: nothing to hold out"}
            continue
        rows = held_out(cases, {term}) if len(cases) <= 20 else halves(cases, {term})["rows"]
        if term == "compute_efficiency":
            rows = [r for r in rows if not _compiled(cases, r["id"])]
        elif term == "compiled_compute_efficiency":
            rows = [r for r in rows if _compiled(cases, r["id"])]
        rows = [r for r in rows if r["quantity"] in quantities]
        if not rows:
            out[term] = {"keep": True, "why": "no held-out run measures what it predicts"}
            continue
        before = statistics.median(abs(r["error_before"]) for r in rows)
        after = statistics.median(abs(r["error_after"]) for r in rows)
        out[term] = {"keep": after <= before + slack, "n": len(rows),
                     "median_abs_error_before": before, "median_abs_error_after": after,
                     "quantities": list(quantities)}
    return out


def _compiled(cases: Sequence[Case], id: str) -> bool:
    return any(c.id == id and c.training.compile is not CompileMode.NONE for c in cases)
