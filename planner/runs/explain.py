"""Explain a run: the planner's per-moment prediction beside what the run measured, which
moment and which category broke the limit, whether fragmentation did, and what fits instead.

``explain(request, run)`` takes the job (the one typed request of planner/request.py; its
strategy, checkpointing and offload are the job's own) and the evidence read from the user's
files (planner/runs/read.py) and returns an ``Explanation``: plain data that
planner/runs/render.py prints as text or JSON and the front end draws.
"""

from __future__ import annotations

from dataclasses import field
from typing import Any

from planner.lazy_dataclass import dataclass
from planner.candidates import label, preference_key
from planner.errors import UsageError
from planner.memory import Breakdown, Estimate, Phase, estimate
from planner.memory.estimator import fragmentation
from planner.plan import Answer, per_token, plan
from planner.request import Request
from planner.runs.evidence import (
    MOMENT_PHASES,
    Moment,
    OomEvent,
    Quantity,
    Run,
)
from planner.runs.units import GiB, size
from planner.spec import (
    Allocator,
    Candidate,
    Checkpointing,
    LossKind,
    Offload,
    OptimizerImpl,
    Strategy,
)
from planner.throughput import estimate_step

__all__ = ["Explanation", "Fix", "MomentRow", "explain", "evidence_findings", "job_candidate",
           "oom_findings"]

MOMENTS_SHOWN = (Moment.LOADING, Moment.FORWARD, Moment.BACKWARD, Moment.OPTIMIZER)
STACK_ORDER = ("params", "optimizer_states", "gradients", "gathered_params", "comm_buffers",
               "cublas_workspace", "activations", "transients", "optimizer_temporaries")
"""What stays for the whole step first, then what a moment adds: the category during which
the stack crosses the limit is the one that broke it."""
CATEGORY_WORDS = {
    "params": "parameters", "gradients": "gradients", "optimizer_states": "optimizer states",
    "gathered_params": "gathered (unsharded) parameters / autocast copies",
    "activations": "activations saved for backward",
    "transients": "temporaries (loss, logits, recompute, gradient buffers)",
    "comm_buffers": "communication buffers (DDP buckets, reduce-scatter)",
    "optimizer_temporaries": "optimizer-step temporaries (foreach)",
    "cublas_workspace": "cuBLAS workspace", "other": "not attributed",
    "before_trace": "allocated before the snapshot's trace began (weights, typically)"}


@dataclass(frozen=True, slots=True, kw_only=True)
class Measured:
    allocated: int | None = None
    reserved: int | None = None
    device_used: int | None = None
    at_oom: bool = False
    """Figures at a failure: a lower bound of what the moment needed."""
    requested: int | None = None
    categories: dict[str, int] = field(default_factory=dict)
    source: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class MomentRow:
    moment: Moment
    phase: Phase
    """The planner's moment that holds the prediction (the largest of those it covers)."""
    predicted: Breakdown
    predicted_needed: int
    predicted_device: int
    measured: Measured | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Fix:
    """One change to the job and the planner's verdict on it."""

    change: str
    """As flags ('--strategy full_shard --checkpointing selective')."""
    label: str
    fits: bool
    needed_bytes: int
    usable_bytes: int
    step_time_s: float | None = None
    tokens_per_s_per_gpu: float | None = None
    fits_device: bool | None = None
    """Whether it fits the whole device without the margin (needed <= capacity)."""
    oom_probability: float | None = None
    """Levers: the probability of running out of memory (the risk, docs/accuracy.md §5);
    ``fits`` is False and this is set when the change leaves the job at risk."""
    kind: str = "candidate"
    """'candidate' (plan's ranking on these GPUs), 'lever' (one setting of the job changed),
    'gpus' (the fewest GPUs of the type that fit)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Explanation:
    request: Request
    candidate: Candidate
    estimate: Estimate
    run: Run
    rows: tuple[MomentRow, ...]
    step_peak: Measured | None
    capacity_bytes: int
    capacity_source: str
    limit_bytes: int
    """What the allocator could reach: capacity (or the fraction cap) - non-PyTorch memory."""
    non_pytorch_bytes: int
    non_pytorch_source: str
    broke_moment: Moment | None
    broke_source: str
    broke_category: str | None
    broke_category_source: str
    findings: tuple[str, ...]
    fragmentation_cause: bool | None
    expandable_would_help: bool | None
    fixes: tuple[Fix, ...]
    answer: Answer
    assumptions: tuple[str, ...]

    @property
    def any_fix_fits(self) -> bool:
        return any(f.fits for f in self.fixes)


# ---------------------------------------------------------------------------------------------
# The job


def job_candidate(r: Request) -> tuple[Candidate, list[str]]:
    """The one candidate the job ran with, from the request's options. Offload ``auto`` and
    TP ``auto`` mean none for a job as written (plan adds offload/TP candidates only when
    nothing fits); checkpointing ``auto`` is read as none and said so; several strategies are
    a usage error past one GPU (at one GPU every strategy is plain training)."""
    o = r.options
    notes: list[str] = []
    if len(o.strategies) == 1:
        s = o.strategies[0]
    elif r.cluster.n_gpus == 1:
        s = Strategy.DDP
        notes.append("one GPU: plain training (no wrapper), listed as ddp")
    else:
        raise UsageError("--strategy: name the one strategy the job ran with ("
                         + " ".join(str(x) for x in Strategy) + "); explain compares one job")
    if o.offloads is not None and len(o.offloads) > 1:
        raise UsageError("--offload: name the one offload mode the job ran with")
    off = o.offloads[0] if o.offloads else Offload.NONE
    ck = o.checkpointing
    if ck is Checkpointing.AUTO:
        ck = Checkpointing.NONE
        notes.append("checkpointing: none assumed (give --checkpointing selective|full if the "
                     "job checkpointed activations)")
    return Candidate(strategy=s, offload=off, checkpointing=ck, tp=o.tp or 1), notes


def _flags(c: Candidate, job: Candidate) -> str:
    parts = []
    if c.strategy is not job.strategy:
        parts.append(f"--strategy {c.strategy}")
    if c.checkpointing is not job.checkpointing:
        parts.append(f"--checkpointing {c.checkpointing}")
    if c.offload is not job.offload:
        parts.append(f"--offload {c.offload}")
    if c.tp != job.tp:
        parts.append(f"--tp {c.tp}")
    return " ".join(parts) or "(no change)"


# ---------------------------------------------------------------------------------------------
# Measured per moment


def _measured_by_moment(run: Run) -> tuple[dict[Moment, Measured], Measured | None]:
    out: dict[Moment, Measured] = {}
    step: Measured | None = None

    def better(m: Moment, new: Measured) -> None:
        old = out.get(m)
        if old is None or (new.at_oom and not old.at_oom) or (
                (new.allocated or 0) > (old.allocated or 0) and old.at_oom == new.at_oom):
            out[m] = new

    for ev in run.ooms:
        mo = Moment.FORWARD if ev.moment is Moment.LOSS else ev.moment
        better(mo, Measured(allocated=ev.allocated.value, reserved=ev.reserved,
                            device_used=ev.process_in_use.value if ev.process_in_use else None,
                            at_oom=True, requested=ev.requested.value, source=ev.where))
    for snap in run.snapshots:
        for m, peak in snap.moment_peaks.items():
            mo = Moment.FORWARD if m is Moment.LOSS else m
            if mo in MOMENTS_SHOWN:
                better(mo, Measured(allocated=peak, categories=snap.moment_categories.get(m, {}),
                                    source=f"{snap.where} (trace)"))
        s = Measured(allocated=snap.peak_allocated_bytes, reserved=snap.reserved_bytes,
                     categories=snap.categories_at_peak, source=snap.where)
        step = s if step is None or (s.allocated or 0) > (step.allocated or 0) else step
    for smp in run.samples:
        alloc = smp.get(Quantity.PEAK_ALLOCATED)
        res = smp.get(Quantity.PEAK_RESERVED)
        dev = smp.get(Quantity.DEVICE_USED)
        if smp.moment in (Moment.FORWARD, Moment.BACKWARD, Moment.OPTIMIZER, Moment.LOADING):
            if alloc is not None:
                better(smp.moment, Measured(allocated=alloc, reserved=res, source=smp.where))
            continue
        if alloc is None and res is None and dev is None:
            continue
        cur = step or Measured()
        step = Measured(allocated=max(filter(None, (cur.allocated, alloc)), default=None),
                        reserved=max(filter(None, (cur.reserved, res)), default=None),
                        device_used=max(filter(None, (cur.device_used, dev)), default=None),
                        categories=cur.categories,
                        source=", ".join(filter(None, (cur.source, smp.format))) if
                        smp.format not in cur.source else cur.source)
    return out, step


# ---------------------------------------------------------------------------------------------
# The analysis


def _row(moment: Moment, e: Estimate, measured: Measured | None, extra: int,
         allocator: Allocator, ov: Any) -> MomentRow:
    phases = [p for p in MOMENT_PHASES[moment] if p in e.phases]
    best = max(phases, key=lambda p: e.phases[p].total)
    b = e.phases[best]
    needed = int(b.total + fragmentation(b.total, ov, allocator))
    return MomentRow(moment=moment, phase=best, predicted=b, predicted_needed=needed,
                     predicted_device=needed + extra, measured=measured)


def _stack_crossing(b: Breakdown, limit: int) -> tuple[str | None, list[tuple[str, int, int]]]:
    """(the category during which the stacked breakdown crosses ``limit``, the stack)."""
    total = 0
    stack = []
    crossing = None
    for cat in STACK_ORDER:
        v = int(getattr(b, cat))
        if not v:
            continue
        total += v
        stack.append((cat, v, total))
        if crossing is None and total > limit:
            crossing = cat
    return crossing, stack


def _first_over(rows: list[MomentRow], limit: int) -> MomentRow | None:
    order = [Moment.LOADING, Moment.FORWARD, Moment.BACKWARD, Moment.OPTIMIZER]
    for m in order:
        r = next((x for x in rows if x.moment is m), None)
        if r is not None and r.predicted_needed > limit:
            return r
    return None


def _levers(r: Request, job: Candidate, cat: str | None,
            frag: bool | None) -> list[tuple[str, Request]]:
    t = r.training
    out: list[tuple[str, Request]] = []
    if frag or (t.allocator is Allocator.DEFAULT and cat is not None):
        if t.allocator is Allocator.DEFAULT:
            out.append(("--allocator expandable (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True)",
                        r.with_training(allocator=Allocator.EXPANDABLE)))
    if t.optimizer_impl is not OptimizerImpl.FUSED:
        out.append(("--optimizer-impl fused", r.with_training(optimizer_impl=OptimizerImpl.FUSED)))
    if t.micro_batch > 1:
        half = t.micro_batch // 2
        out.append((f"--micro-batch {half} --grad-accum {t.grad_accum * (t.micro_batch // half)}",
                    r.with_training(micro_batch=half,
                                    grad_accum=t.grad_accum * (t.micro_batch // half))))
    if t.loss is LossKind.FP32 and not t.keep_logits:
        out.append(("--loss chunked", r.with_training(loss=LossKind.CHUNKED)))
    return out


def explain(r: Request, run: Run, *, rank: str = "throughput") -> Explanation:
    r = r.resolved()
    job, assumptions = job_candidate(r)
    ov = r.runtime.overheads
    e = estimate(r.model, r.training, r.cluster, job, margin=r.options.margin, overheads=ov)
    extra = int(e.cuda_context_bytes + e.nccl_bytes)
    by_moment, step_peak = _measured_by_moment(run)
    rows = [_row(m, e, by_moment.get(m), extra, r.training.allocator, ov)
            for m in MOMENTS_SHOWN]
    findings: list[str] = []

    # the device as the run saw it
    oom: OomEvent | None = max(run.ooms, key=lambda o: o.allocated.value, default=None)
    cap_fig = next((s.figures[Quantity.CAPACITY] for s in run.samples
                    if Quantity.CAPACITY in s.figures), None)
    if oom is not None:
        capacity = oom.capacity.value
        cap_src = f"the OOM message ({oom.capacity.text} total capacity)"
    elif cap_fig is not None:
        capacity, cap_src = cap_fig.value, f"the log ({cap_fig.text})"
    else:
        capacity, cap_src = r.cluster.gpu.memory_bytes, f"the {r.cluster.gpu.id} profile"
    if oom is not None and oom.non_pytorch is not None:
        non_pt = oom.non_pytorch
        np_src = ("the OOM message: this process's memory in use - reserved by PyTorch"
                  if oom.process_in_use is not None else
                  "the OOM message: device used (capacity - free) - reserved by PyTorch, other "
                  "processes included")
    elif step_peak is not None and step_peak.device_used and step_peak.reserved:
        non_pt = step_peak.device_used - step_peak.reserved
        np_src = "device used - peak reserved (two logs of the same run)"
    else:
        non_pt = extra
        np_src = "predicted (CUDA context + NCCL buffers; no measurement of it)"
    limit_base = oom.limit if oom is not None else capacity
    limit = limit_base - non_pt

    # which moment
    broke_m: Moment | None = None
    broke_src = ""
    if oom is not None and oom.moment is not Moment.UNKNOWN:
        broke_m = Moment.FORWARD if oom.moment is Moment.LOSS else oom.moment
        broke_src = f"the traceback: {oom.moment_evidence}"
        if oom.moment is Moment.LOSS:
            broke_src += " (the loss, at the end of forward)"
    snap_oom = next((s.oom for s in run.snapshots if s.oom), None)
    if broke_m is None and snap_oom is not None:
        broke_m = Moment(snap_oom["moment"]) if snap_oom["moment"] in Moment._value2member_map_ \
            else None
        if broke_m in (Moment.LOSS,):
            broke_m = Moment.FORWARD
        broke_src = f"the snapshot's oom entry ({snap_oom['where']})"
    over = _first_over(rows, limit)
    if broke_m is None or broke_m in (Moment.UNKNOWN, Moment.STEP):
        if over is not None:
            broke_m = over.moment
            broke_src = (f"the planner's timeline: {over.phase} is the first moment whose "
                         f"predicted need ({size(over.predicted_needed)}) exceeds the "
                         f"{size(limit)} the allocator could reach")
        else:
            broke_m = None
    row = next((x for x in rows if x.moment is broke_m), None)

    # which category
    cat: str | None = None
    cat_src = ""
    if row is not None:
        crossing, stack = _stack_crossing(row.predicted, limit)
        if crossing is not None:
            cat = crossing
            parts = " + ".join(f"{CATEGORY_WORDS.get(c, c)} {v / GiB:.2f}" for c, v, _t in stack)
            cat_src = (f"predicted at {row.phase}: {parts} GiB; the stack crosses "
                       f"{size(limit)} at {CATEGORY_WORDS.get(crossing, crossing)}")
        meas = row.measured
        if meas is not None and meas.categories:
            top = max(meas.categories.items(), key=lambda kv: kv[1])
            findings.append(f"the snapshot at {row.moment}: largest holder "
                            f"{CATEGORY_WORDS.get(top[0], top[0])} {size(top[1])} of "
                            f"{size(sum(meas.categories.values()))} allocated")
    if oom is not None and oom.category_hint:
        findings.append(f"the failing allocation ({oom.requested.text}) was "
                        f"{CATEGORY_WORDS.get(oom.category_hint, oom.category_hint)}: "
                        f"{oom.category_evidence}")
        if cat is None:
            cat = oom.category_hint
            cat_src = f"the traceback's innermost frames: {oom.category_evidence}"

    expandable_on = (r.training.allocator is Allocator.EXPANDABLE or any(
        s.expandable_segments for s in run.snapshots))
    more, frag_cause, exp_help = oom_findings(oom, expandable_on, extra) if oom is not None \
        else ([], None, None)
    findings += more
    peak_need = max(x.predicted_needed for x in rows)
    if frag_cause and peak_need > limit:
        exp_help = False
        findings.append(f"but the planner predicts the step needs {size(peak_need)} at its peak, "
                        f"more than the {size(limit)} the allocator could reach: removing the "
                        "fragmentation would move the out-of-memory, not remove it")
    # the planner's verdict on the job as it ran
    verdict = ("predicts it fits" if e.fits else
               f"predicts it is at risk ({e.oom_probability:.0%} probability of running out of "
               "memory)" if e.outcome == "at_risk" else "predicts it does not fit")
    findings.append(f"the planner {verdict} as it ran: needs {size(e.required_bytes)} at "
                    f"{e.peak_phase} of {size(e.usable_bytes)} usable "
                    f"({r.options.margin:.0%} margin) on a {size(e.capacity_bytes)} device")
    if oom is not None and row is not None:
        reached = oom.allocated.value + oom.requested.value
        pred = int(row.predicted.total)
        findings.append(f"at {row.moment} the run had {oom.allocated.text} allocated and asked "
                        f"{oom.requested.text} more ({size(reached)}, a lower bound of the "
                        f"moment's need); the planner predicts {size(pred)} allocated there "
                        f"({(pred - reached) / reached:+.1%})")
    elif step_peak is not None and step_peak.reserved and not run.ooms:
        res = step_peak.reserved
        findings.append(f"no out-of-memory in the evidence: the reserved peak was {size(res)} "
                        f"of the {size(capacity)} device ({size(capacity - res - non_pt)} left "
                        f"after non-PyTorch memory); the planner predicts "
                        f"{size(e.peak_reserved_bytes)} reserved "
                        f"({(e.peak_reserved_bytes - res) / res:+.1%})")

    # what fits instead: plan's candidates for this model, training run and hardware (every
    # strategy, checkpointing and offload, TP when nothing fits), ranked as plan ranks them
    alternatives = r.with_options(strategies=tuple(Strategy), offloads=None,
                                  checkpointing=Checkpointing.AUTO, tp=None)
    answer = plan(alternatives, rank)
    multi = r.cluster.n_nodes > 1
    fitting = [(es, st) for es, st in zip(answer.estimates, answer.steps) if es.fits]
    rec = answer.recommendation
    fitting.sort(key=lambda p: (rec is None or p[0].candidate != rec.candidate,
                                per_token(p[1]), preference_key(p[0].candidate, multi)))
    fixes = [Fix(change=_flags(es.candidate, job), label=label(es.candidate), fits=True,
                 needed_bytes=int(es.required_bytes), usable_bytes=int(es.usable_bytes),
                 step_time_s=float(st.step_time_s),
                 tokens_per_s_per_gpu=float(st.tokens_per_s_per_gpu))
             for es, st in fitting]
    for change, rr in _levers(r, job, cat, frag_cause):
        le = estimate(rr.model, rr.training, rr.cluster, job, margin=rr.options.margin,
                      overheads=rr.runtime.overheads)
        st = estimate_step(rr.model, rr.training, rr.cluster, job, rr.runtime.assumptions)
        fixes.append(Fix(change=change, label=f"{label(job)} with {change.split(' (')[0]}",
                         fits=bool(le.fits), needed_bytes=int(le.required_bytes),
                         fits_device=bool(le.required_bytes <= le.capacity_bytes),
                         oom_probability=(le.oom_probability if le.outcome == "at_risk"
                                          else None),
                         usable_bytes=int(le.usable_bytes), step_time_s=float(st.step_time_s),
                         tokens_per_s_per_gpu=float(st.tokens_per_s_per_gpu), kind="lever"))
    from planner.plan import min_gpus

    no_offload = alternatives.with_options(offloads=(Offload.NONE,))
    fits_here = any(es.fits and es.candidate.offload is Offload.NONE
                    for es in answer.estimates)
    n_more = answer.min_gpus if answer.min_gpus is not None else (
        min_gpus(no_offload, start=r.cluster.n_gpus + 1) if not fits_here else None)
    if n_more is not None:
        more = plan(no_offload.with_gpus(n_more) if answer.min_gpus is None
                    else alternatives.with_gpus(n_more), rank)
        best = more.recommendation
        fixes.append(Fix(change=f"--n {n_more}" + (f" {_flags(best.candidate, job)}"
                                                   if best and _flags(best.candidate, job)
                                                   != "(no change)" else ""),
                         label=f"{n_more} GPUs of the type"
                         + ("" if answer.min_gpus is not None else " without offload")
                         + (f": {label(best.candidate)}" if best else ""),
                         fits=best is not None, needed_bytes=int(next(
                             (es.required_bytes for es in more.estimates
                              if best and es.candidate == best.candidate), 0)),
                         usable_bytes=int(next((es.usable_bytes for es in more.estimates), 0)),
                         kind="gpus"))
    return Explanation(
        request=r, candidate=job, estimate=e, run=run, rows=tuple(rows), step_peak=step_peak,
        capacity_bytes=capacity, capacity_source=cap_src, limit_bytes=limit,
        non_pytorch_bytes=non_pt, non_pytorch_source=np_src, broke_moment=broke_m,
        broke_source=broke_src, broke_category=cat, broke_category_source=cat_src,
        findings=tuple(findings), fragmentation_cause=frag_cause,
        expandable_would_help=exp_help, fixes=tuple(fixes), answer=answer,
        assumptions=tuple(assumptions))


def oom_findings(oom: OomEvent, expandable_on: bool = False, predicted_non_pytorch: int | None
                 = None) -> tuple[list[str], bool | None, bool | None]:
    """What one out-of-memory message says by itself: (findings, fragmentation was the cause,
    expandable segments would help). Needs no job: the message's own figures."""
    findings: list[str] = []
    frag_cause: bool | None = None
    exp_help: bool | None = None
    Q, F, C = oom.requested.value, oom.free.value, oom.capacity.value
    if oom.allowed is not None:
        findings.append(f"the process was capped at {oom.allowed.text} "
                        "(torch.cuda.set_per_process_memory_fraction), far below the device's "
                        f"{oom.capacity.text}: the cap, not the device, was the limit"
                        if oom.allowed.value < 0.9 * C else
                        f"the process was capped at {oom.allowed.text} of {oom.capacity.text}")
    if oom.allocated.value > C:
        findings.append(f"{oom.allocated.text} allocated on a device of {oom.capacity.text}: the "
                        "figures do not describe one discrete GPU (shared or unified memory, "
                        "e.g. Windows WDDM or an integrated GPU)")
    if Q > C:
        findings.append(f"one allocation of {oom.requested.text} is larger than the whole "
                        f"device ({oom.capacity.text}): no setting of the allocator makes it "
                        "fit; a tensor's shape is the cause (a batch, sequence, resolution or "
                        "vocabulary dimension)")
        return findings, False, False
    if oom.allowed is None and F - Q >= max(256 * 2**20, Q // 10):
        findings.append(f"the device reported {oom.free.text} free, more than the "
                        f"{oom.requested.text} requested: not a shortage of memory at that "
                        "moment (another process took it in between, the device is shared with "
                        "the display or a VM, or the driver failed the allocation)")
        return findings, False, None
    R = oom.reserved_unallocated.value if oom.reserved_unallocated is not None else None
    if R is not None:
        limit = oom.allowed.value if oom.allowed is not None else C
        room = F if oom.allowed is None else max(0, limit - (oom.allocated.value + R))
        if Q <= room + R and R >= 256 * 2**20 and R > room:
            frag_cause = True
            findings.append(f"fragmentation: {size(R)} was reserved by "
                            "PyTorch but unallocated (blocks split inside live segments, kept "
                            "after the allocator freed its cache and retried); the "
                            f"{oom.requested.text} request would have fit in free + that "
                            f"({size(room + R)})")
            exp_help = not expandable_on
            findings.append("expandable_segments would help "
                            "(PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True): segments grow "
                            "in 2 MiB pages and freed pages serve requests of any size"
                            if exp_help else "expandable segments were already on")
        elif Q <= room + R:
            frag_cause = None
            findings.append(f"at the limit: {oom.allocated.text} allocated and {size(R)} "
                            f"reserved but unallocated; the {oom.requested.text} request "
                            "needed a contiguous block the small gaps left could not give "
                            "(fragmentation is a minor part here: the job needs less memory)")
        else:
            frag_cause = False
            exp_help = False if R < Q else None
            findings.append(f"fragmentation was not the cause: {size(R)} reserved but "
                            f"unallocated; even packed perfectly the {oom.requested.text} "
                            f"request needed {size(Q - room - R)} more than free + "
                            "reserved-unallocated")
    np_ = oom.non_pytorch
    if np_ is not None:
        line = (f"non-PyTorch memory {size(np_)} ("
                + ("this process's memory in use - reserved by PyTorch" if oom.process_in_use
                   else "device used - reserved by PyTorch: other processes included") + ")")
        if predicted_non_pytorch is not None:
            line += f"; the planner assumes {size(predicted_non_pytorch)} (CUDA context + NCCL)"
        if np_ > 2 * 2**30 or (predicted_non_pytorch is not None
                                and np_ - predicted_non_pytorch > 2**30):
            line += (": more than a CUDA context and NCCL hold: other processes on the device, "
                     "a second framework, or libraries outside PyTorch's allocator")
        findings.append(line)
    if oom.other_processes:
        findings.append("processes on the device: " + ", ".join(
            f"PID {pid} {f.text}" for pid, f in oom.other_processes)
            + (" (with no 'this process' line, one of them is this process seen from another "
               "PID namespace, as in containers)" if oom.process_in_use is None else ""))
    return findings, frag_cause, exp_help


def evidence_findings(run: Run) -> list[tuple[str, list[str], bool | None, bool | None]]:
    """Without a job: per out-of-memory message, (where, findings, fragmentation was the
    cause, expandable segments would help), from its own figures."""
    expandable = any(s.expandable_segments for s in run.snapshots)
    out = []
    for o in run.ooms:
        f, frag, exp = oom_findings(o, expandable)
        if frag:
            f.append("without the job fitcheck cannot tell whether the step would fit with no "
                     "fragmentation at all: give the job's flags for the planner's need")
        if o.moment is not Moment.UNKNOWN:
            f.insert(0, f"moment: {o.moment} (the traceback: {o.moment_evidence})")
        if o.category_hint:
            f.insert(1 if o.moment is not Moment.UNKNOWN else 0,
                     f"the failing allocation ({o.requested.text}) was "
                     f"{CATEGORY_WORDS.get(o.category_hint, o.category_hint)}: "
                     f"{o.category_evidence}")
        out.append((o.where, f, frag, exp))
    return out
