"""Trace-backed plans: the full plan of a model from traces of the real module, not formulas.

``plan_from_traces(request, tracer)`` answers what ``planner.plan.plan`` answers (the same
``planner.plan.Answer``, so ``planner.render.table`` / ``answer_json`` print it), with every
candidate's memory measured: each (strategy, checkpointing) candidate is traced
(``probes.trace``, fake tensors, one rank of the real world size), its per-moment categories
become ``planner.memory.Breakdown`` s (``phases_from_trace``) and
``planner.memory.from_phases`` adds what no trace holds (CUDA context, NCCL, the allocator's
fragmentation and cache, host RAM, the cuBLAS workspace, DDP's gradient buckets) and the fit.
The step time is the planner's throughput model (``planner.throughput.step_core``) on
parameter counts read from the real module (``probes.hf.matmul_counts``).

Tracers: ``HfTracer`` (a config.json: the Hugging Face class, traced in subprocesses with
timeouts, scaled by depth, cached on disk) and ``probes.api.ModuleTracer`` (a module in this
process). Scaling (``scale_result``): when the decoder layers repeat with period p (every
layer's parameter shapes and every per-layer config list), the model is traced at two shallow
depths d1 < d2 (4 and 5 layers for p = 1) at full width, and each category of each moment is
extended linearly to the real depth L: v(L) = v(d2) + (v(d2) - v(d1)) (L - d2) / (d2 - d1).
The tracker keeps each moment's peak per block; a moment's memory inside block i is linear in
L for i counted from either end (below it: activations kept; above it: gradients made), so
the first two and last two blocks and the root (before and after the blocks) are
extrapolated and the largest taken (tests/test_hf_trace.py checks the scaled numbers against
full-depth traces). Layers that do not repeat are traced at full depth.

Not traced, so not in a trace-backed plan (listed under "skipped"): DeepSpeed ZeRO and CPU
offload (probes/trace.py), and training-loop options the traced loop does not run (loss
variants, --keep-logits, --compile, --grad-sync last, fine-tuning). A candidate whose trace
fails is skipped with the failing operation; when no candidate can be traced the plan is
refused (``TraceRefused``, exit 5), never answered from a guess.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from planner.candidates import expand, fit_first_key, label
from planner.errors import EXIT_TRACE_REFUSED, FitcheckError
from planner.memory import PHASES, Breakdown, Estimate, Overheads, Phase, from_phases
from planner.memory.estimator import init_mode, load_bytes
from planner.plan import Answer, offload_modes, recommend
from planner.request import Request
from planner.search import smallest_n
from planner.spec import (
    Candidate,
    Cluster,
    CompileMode,
    GradSync,
    InitMode,
    LossKind,
    Offload,
    Strategy,
    TracedModel,
    TrainingSpec,
)
from planner.throughput import StepEstimate, step_core, step_inputs

MIN_GPUS_LIMIT = 4096
"""Largest GPU count the trace-backed min-GPUs search traces (each count is a trace)."""
DEFAULT_TIMEOUT_S = 600.0


class TraceRefused(FitcheckError):
    """No number can be given: the model could not be traced (one line, exit 5)."""

    exit_code = EXIT_TRACE_REFUSED


# --------------------------------------------------------------------------- the model


# --------------------------------------------------------------------------- tracers


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceJob:
    """One candidate to trace: one rank of ``world_size``."""

    candidate: Candidate
    training: TrainingSpec
    world_size: int
    gpus_per_node: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Traced:
    """A candidate's trace at the real depth (scaled or not), or why there is none."""

    job: TraceJob
    ok: bool
    result: dict[str, Any] = field(default_factory=dict)
    reason: str = ""
    unsupported: bool = False
    depths: tuple[int, ...] = ()
    """The depths traced (two: scaled to the real depth; one: the real depth)."""
    cached: bool = False
    wall_s: float = 0.0
    """Time spent tracing it now (0 when read from the cache)."""
    max_rss_bytes: int = 0


class Tracer(Protocol):
    """Traces candidates of one model; knows the model's structure."""

    name: str

    def facts(self) -> TracedModel: ...

    def trace(self, jobs: Sequence[TraceJob]) -> list[Traced]: ...


def _config_period_guess(config: dict[str, Any], n: int) -> int | None:
    """The period of the config's per-layer lists (before inspection confirms it)."""
    from probes.hf import period_of

    lists = [v for k, v in config.items()
             if isinstance(v, list) and len(v) == n and k != "architectures"]
    return period_of(lists) if lists else 1


class HfTracer:
    """The Hugging Face class of a config.json, traced in subprocesses (probes.runner):
    scaled from shallow depths when its layers repeat, cached (probes.trace_cache)."""

    def __init__(self, config: dict[str, Any], name: str, *, depth: str = "scaled",
                 timeout_s: float = DEFAULT_TIMEOUT_S, cache: Any = None, jobs: int | None = None,
                 options: dict[str, Any] | None = None) -> None:
        from probes.trace_cache import TraceCache

        if depth not in ("scaled", "full"):
            raise ValueError(f"depth must be 'scaled' or 'full', got {depth!r}")
        self.config = config
        self.name = name
        self.depth = depth
        self.timeout_s = timeout_s
        self.cache = cache if cache is not None else TraceCache.default()
        self.jobs = jobs or max(1, min(2, os.cpu_count() or 1))
        self.options = dict(options or {})
        self._facts: TracedModel | None = None
        self.trace_wall_s = 0.0
        self.children = 0
        self.on_start: Any = None
        """Called with the number of traces about to run in subprocesses (progress)."""

    # -- inspection

    def _inspect_job(self) -> dict[str, Any]:
        return {"inspect": {"config": self.config}}

    def _take_inspect(self, data: dict[str, Any]) -> None:
        self._facts = TracedModel.from_inspect(data, self.name)

    def facts(self) -> TracedModel:
        if self._facts is None:
            job = self._inspect_job()
            hit = self.cache.get(job)
            if hit is None:
                from probes.runner import run_job

                t0 = time.monotonic()
                r = run_job(job, timeout_s=self.timeout_s)
                self.trace_wall_s += time.monotonic() - t0
                self.children += 1
                if not r.ok:
                    raise TraceRefused(f"{self.name}: cannot build the model: {r.reason}")
                self.cache.put(job, r.data)
                hit = r.data
            self._take_inspect(hit["inspect"])
        return self._facts

    # -- tracing

    def _depths(self, n_layers: int, period: int | None) -> tuple[int, ...]:
        from probes.hf import scaled_depths

        if self.depth == "full":
            return (n_layers,)
        pair = scaled_depths(n_layers, period)
        return pair if pair is not None else (n_layers,)

    def _job(self, job: TraceJob, layers: int, n_layers: int) -> dict[str, Any]:
        from probes.runner import job_to_dict

        source = {"kind": "hf", "config": self.config,
                  "layers": None if layers == n_layers else layers}
        return job_to_dict(source, job.training, job.candidate, job.world_size,
                           job.gpus_per_node, self.options or None)

    def trace(self, jobs: Sequence[TraceJob]) -> list[Traced]:
        from probes.hf import num_layers

        n_cfg = num_layers(self.config)
        inspect_job = None
        if self._facts is None:
            hit = self.cache.get(self._inspect_job())
            if hit is not None:
                self._take_inspect(hit["inspect"])
            elif self.depth == "scaled" or n_cfg is None:
                inspect_job = self._inspect_job()  # run alongside the first traces
        if self._facts is not None:
            n, period = self._facts.n_layers, self._facts.period
        elif n_cfg is None:
            self.facts()
            n, period = self._facts.n_layers, self._facts.period
        else:  # a guess from the config; checked against the inspection below
            n, period = n_cfg, _config_period_guess(self.config, n_cfg)
        results, rerun = self._run(jobs, n, period, inspect_job)
        if rerun:  # the guess was wrong: trace again at the depths the structure asks for
            results, _ = self._run(jobs, self._facts.n_layers, self._facts.period, None)
        return results

    def _run(self, jobs: Sequence[TraceJob], n: int, period: int | None,
             inspect_job: dict[str, Any] | None) -> tuple[list[Traced], bool]:
        from probes.runner import run_batch

        depths = self._depths(n, period)
        found: dict[tuple[int, int], dict[str, Any]] = {}
        failures: dict[int, tuple[str, bool]] = {}
        pending: list[tuple[tuple[int, int], dict[str, Any]]] = []
        for i, job in enumerate(jobs):
            for d in depths:
                child = self._job(job, d, n)
                hit = self.cache.get(child)
                if hit is None:
                    pending.append(((i, d), child))
                elif hit.get("ok"):
                    found[i, d] = hit
                else:  # a failure the same code and versions would repeat
                    failures[i] = (str(hit.get("reason")), bool(hit.get("unsupported")))
        cost: dict[int, tuple[float, int]] = {}
        batches = self._split(pending, inspect_job)
        if batches and self.on_start is not None:
            self.on_start(len(pending))
        t0 = time.monotonic()
        with ThreadPoolExecutor(max_workers=max(1, len(batches))) as pool:
            outs = list(pool.map(lambda b: (b, run_batch([c for _, c in b],
                                                         timeout_s=self.timeout_s)), batches))
        if batches:
            self.trace_wall_s += time.monotonic() - t0
            self.children += len(batches)
        rerun = False
        for batch, rs in outs:
            for (key, child), r in zip(batch, rs):
                if key == ("inspect",):
                    if not r.ok:
                        raise TraceRefused(f"{self.name}: cannot build the model: {r.reason}")
                    self.cache.put(child, r.data)
                    self._take_inspect(r.data["inspect"])
                    continue
                i, d = key
                share = len(batch)
                w, rss = cost.get(i, (0.0, 0))
                cost[i] = (w + r.wall_s / share, max(rss, r.max_rss_bytes))
                if r.ok or r.data.get("deterministic"):
                    self.cache.put(child, r.data)
                if r.ok:
                    found[i, d] = r.data
                else:
                    failures[i] = (r.reason, r.unsupported)
        if inspect_job is not None and self._facts is not None:
            rerun = (self._facts.n_layers, self._facts.period) != (n, period) \
                and self._depths(self._facts.n_layers, self._facts.period) != depths
        out = []
        for i, job in enumerate(jobs):
            wall, rss = cost.get(i, (0.0, 0))
            if i in failures:
                reason, unsupported = failures[i]
                out.append(Traced(job=job, ok=False, reason=reason, unsupported=unsupported,
                                  depths=depths, cached=i not in cost, wall_s=wall,
                                  max_rss_bytes=rss))
                continue
            cached = i not in cost
            if len(depths) == 2:
                d1, d2 = depths
                result = scale_result(found[i, d1], found[i, d2], d1, d2, n)
            else:
                result = found[i, depths[0]]
            out.append(Traced(job=job, ok=True, result=result, depths=depths, cached=cached,
                              wall_s=wall, max_rss_bytes=rss))
        return out, rerun

    def _split(self, pending: list, inspect_job: dict[str, Any] | None) -> list[list]:
        """The jobs in at most ``self.jobs`` batches (a candidate's depths kept together)."""
        groups: dict[int, list] = {}
        for key, child in pending:
            groups.setdefault(key[0], []).append((key, child))
        ordered = list(groups.values())
        n_batches = min(self.jobs, len(ordered)) if ordered else (1 if inspect_job else 0)
        batches: list[list] = [[] for _ in range(n_batches)]
        for k, g in enumerate(ordered):
            batches[k % n_batches].extend(g)
        if inspect_job is not None:
            batches[0].insert(0, (("inspect",), inspect_job))
        return [b for b in batches if b]


# --------------------------------------------------------------------------- scaling


def _lerp(v1: int, v2: int, d1: int, d2: int, n: int) -> int:
    """v at depth n, linear through (d1, v1) and (d2, v2)."""
    return v2 + round((v2 - v1) * (n - d2) / (d2 - d1))


def _lerp_dict(a: dict[str, int], b: dict[str, int], d1: int, d2: int, n: int) -> dict[str, int]:
    return {k: max(0, _lerp(a.get(k, 0), b.get(k, 0), d1, d2, n)) for k in sorted(set(a) | set(b))}


_MOMENT_PHASE = {"forward": "forward", "loss_bwd": "backward", "block_bwd": "backward",
                 "bwd_end": "backward", "optimizer": "optimizer"}


def _groups(sub: dict[str, Any], d: int) -> dict[str, dict[str, int]]:
    """A moment's sub-moments at depth d that stay alike as the depth grows: outside the
    blocks (before and after them), the first two blocks (counted from the bottom) and the last two (from the top).
    A middle block's memory is linear in its index, so its largest is at one of these."""
    picks = {"before_blocks": "-1", "after_blocks": "-2", "first": "0", "second": "1",
             "second_last": str(d - 2), "last": str(d - 1)}
    return {g: sub[i]["at_peak"] for g, i in picks.items() if i in sub}


def scale_result(r1: dict[str, Any], r2: dict[str, Any], d1: int, d2: int,
                 n: int) -> dict[str, Any]:
    """A trace result at depth ``n`` from results at depths d1 < d2 (module doc).

    Every category of each moment's sub-moments that keep their place as the model deepens
    (outside the blocks; the first, second, second-to-last and last block) is extended
    linearly, and the moment's peak is the largest of them; likewise the end of step, the
    per-category maxima and the parameter count. Needs d1 >= 4 so that those four blocks
    are distinct at both depths (``probes.hf.scaled_depths``)."""
    if d1 < 4:
        raise ValueError(f"scaling needs traces of at least 4 layers, got {d1} and {d2}")
    out = dict(r2)
    moments = {}
    subs1, subs2 = r1.get("sub_moments", {}), r2.get("sub_moments", {})
    for m in r2.get("moments", {}):
        g1, g2 = _groups(subs1.get(m, {}), d1), _groups(subs2.get(m, {}), d2)
        best = None
        for g in g1.keys() & g2.keys():
            cats = _lerp_dict(g1[g], g2[g], d1, d2, n)
            cats["total"] = sum(v for k, v in cats.items() if k != "total")
            if best is None or cats["total"] > best[1]["total"]:
                best = (g, cats)
        if best is not None:
            moments[m] = {"peak_bytes": best[1]["total"], "at_peak": best[1],
                          "sub_moment": best[0]}
    out["moments"] = moments
    out.pop("sub_moments", None)
    out["end_of_step"] = _lerp_dict(r1["end_of_step"], r2["end_of_step"], d1, d2, n)
    out["max_by_category"] = _lerp_dict(r1["max_by_category"], r2["max_by_category"], d1, d2, n)
    out["n_params"] = _lerp(r1["n_params"], r2["n_params"], d1, d2, n)
    out["optimizer_scalar_bytes"] = _lerp(r1["optimizer_scalar_bytes"],
                                          r2["optimizer_scalar_bytes"], d1, d2, n)
    if moments:
        top = max(moments, key=lambda m: moments[m]["peak_bytes"])
        out["peak_bytes"] = moments[top]["peak_bytes"]
        out["at_peak"] = dict(moments[top]["at_peak"])
        out["peak_phase"] = _MOMENT_PHASE.get(top, top)
        out["peak_moment"] = top
    out["n_blocks"] = n
    out["scaled_from"] = [d1, d2]
    return out


# --------------------------------------------------------------------------- trace -> estimate


def phases_from_trace(result: dict[str, Any], candidate: Candidate, training: TrainingSpec,
                      n_gpus: int, ov: Overheads, init_load: tuple[int, int] = (0, 0)
                      ) -> dict[Phase, Breakdown]:
    """Each traced moment's categories as a Breakdown (allocated bytes on one GPU):

    =====================  ===================================================================
    params                 params + buffers (module buffers: RoPE tables, position ids)
    gradients              grads + unsharded_grads
    optimizer_states       optimizer after the step (the steady state), less Adam's 0-dim
                           step counters when they live on the host (not fused)
    optimizer_temporaries  optimizer beyond that (the step's temporaries)
    gathered_params        unsharded_params (FSDP's all-gathered units)
    activations            activations + inputs (the batch's token ids and labels); under
                           DDP -amp also autocast's cached bf16 weights, which the tracker
                           files under activations
    transients             temp (backward temporaries) + anything uncategorised
    comm_buffers           all_gather + reduce_scatter, plus DDP's gradient buckets (one
                           gradient-sized copy unless ``ddp_bucket_view``; no trace has them:
                           DDP's reducer cannot run on fake tensors)
    cublas_workspace       the profile's workspace (no CPU trace has one)
    =====================  ===================================================================

    The INIT moment follows the planner's rule (``planner.memory.moments.initialization``)
    on the traced resident parameters; ``init_load`` = (whole model, one block) in the dtype
    they are loaded in."""
    from types import SimpleNamespace

    from planner.memory.moments import initialization

    scalars = result.get("optimizer_scalar_bytes", 0) if result.get("optimizer_scalars_on_host") \
        else 0
    states = max(0, result["end_of_step"].get("optimizer", 0) - scalars)
    buckets = 0
    if candidate.strategy is Strategy.DDP and n_gpus > 1 and not ov.ddp_bucket_view:
        # a second copy of every gradient, as they are at the optimizer step
        at_step = result.get("moments", {}).get("optimizer", {}).get("at_peak", {})
        buckets = at_step.get("grads", 0) or result["max_by_category"].get("grads", 0)
    known = {"params", "buffers", "grads", "unsharded_grads", "optimizer", "unsharded_params",
             "activations", "inputs", "temp", "all_gather", "reduce_scatter", "total"}
    out: dict[Phase, Breakdown] = {}
    for m in PHASES:
        if m is Phase.INIT or str(m) not in result.get("moments", {}):
            continue
        s = result["moments"][str(m)]["at_peak"]
        opt = max(0, s.get("optimizer", 0) - scalars)
        out[m] = Breakdown(
            params=s.get("params", 0) + s.get("buffers", 0),
            gradients=s.get("grads", 0) + s.get("unsharded_grads", 0),
            optimizer_states=min(opt, states),
            optimizer_temporaries=max(0, opt - states),
            gathered_params=s.get("unsharded_params", 0),
            activations=s.get("activations", 0) + s.get("inputs", 0),
            transients=s.get("temp", 0) + sum(v for k, v in s.items() if k not in known),
            comm_buffers=s.get("all_gather", 0) + s.get("reduce_scatter", 0) + buckets,
            cublas_workspace=ov.cublas_workspace_bytes)
    resident = result["end_of_step"].get("params", 0) + result["end_of_step"].get("buffers", 0)
    init = initialization(SimpleNamespace(
        init=str(init_mode(training, candidate)), load_bytes=init_load[0],
        unit_load_bytes=init_load[1], states=SimpleNamespace(params=resident),
        work=SimpleNamespace(init_extra=0)))  # traces cover FSDP/DDP: no DeepSpeed flattening
    return {Phase.INIT: init, **out}


def releasable_cache(phases: dict[Phase, Breakdown], training: TrainingSpec,
                     candidate: Candidate) -> list[int]:
    """Free blocks the allocator keeps cached at each moment, by the analytic planner's
    reduce-scatter-stream mechanism (planner.memory.estimator ``reduce_scatter_cache``): under
    FSDP the previous step's sharded gradients (the trace's gradients at the optimizer step)
    sit free in the reduce-scatter (FSDP1: post-backward) stream's pool until this step's
    backward produces them again; the moment's own gradients are counted, not free. The
    all-gather stream's buffers and the loss gap are not derived from a trace's moments (0):
    docs/model.md §7.4. Only peak_reserved reads it, never the fit."""
    from planner.memory.estimator import sharded_gradients_free
    from planner.spec import Offload

    opt = phases.get(Phase.OPTIMIZER)
    if opt is None or not candidate.strategy.is_fsdp or candidate.offload is not Offload.NONE \
            or candidate.strategy is Strategy.NO_SHARD:
        return [0 for _ in phases]
    return [int(sharded_gradients_free(p, b.gradients, opt.gradients, training))
            for p, b in phases.items()]


def estimate_from_trace(traced: Traced, facts: TracedModel, cluster: Cluster, *,
                        margin: float, ov: Overheads) -> Estimate:
    """The candidate's Estimate from its trace (``planner.memory.from_phases``)."""
    from planner.candidates import degree_of
    from planner.error_bands import plan_risk_band

    job = traced.job
    c, training = job.candidate, job.training
    full = facts.params * load_bytes(training)
    unit = max(facts.per_block_params, default=0) * load_bytes(training)
    phases = phases_from_trace(traced.result, c, training, cluster.n_gpus, ov, (full, unit))
    mode = init_mode(training, c)
    ranks = cluster.gpus_on_busiest_node
    init_host = full if mode is InitMode.RANK0 else (
        ranks * full if mode in (InitMode.FULL, InitMode.FULL_GPU) else 0)
    how = (f"traced at {traced.depths[0]} and {traced.depths[1]} layers, scaled to "
           f"{facts.n_layers}" if len(traced.depths) == 2 else
           f"traced at full depth ({traced.depths[0]} layers)")
    notes = (f"memory from a trace of {facts.cls} ({how})",)
    if c.strategy is Strategy.DDP and cluster.n_gpus > 1:
        notes += ("DDP gradient buckets added to the trace (one gradient-sized copy)",)
    return from_phases(c, phases, degree=degree_of(c.strategy, cluster.n_gpus,
                                                   cluster.gpus_per_node),
                       n_gpus=cluster.n_gpus, gpus_per_node=cluster.gpus_per_node,
                       capacity=cluster.gpu.memory_bytes, context=cluster.gpu.cuda_context_bytes,
                       host_capacity=cluster.host_ram_bytes_per_node, margin=margin, ov=ov,
                       cached=releasable_cache(phases, training, c), notes=notes,
                       allocator=training.allocator, init_host=init_host,
                       # the analytic planner's measured error for this kind of job: none is
                       # measured for trace-backed plans yet, and the runtime terms are the same
                       risk=plan_risk_band(training, c.strategy, (facts.experts or 0) > 1))


def step_from_facts(r: Request, facts: TracedModel, candidate: Candidate) -> StepEstimate:
    """The planner's step-time model on the real module's counts: the request's hardware,
    assumptions and collectives, with layers, attention width, all parameters and the matmul
    weights per block (their mean) and in the head read from the module."""
    x = step_inputs(r.model, r.training, r.cluster, candidate, r.runtime.assumptions)
    L = facts.n_layers
    x = dataclasses.replace(
        x, n_layers=float(L), q_dim=float(facts.q_dim), p_total=float(facts.params),
        p_block=sum(facts.matmul_per_block) / max(L, 1), p_head=float(facts.matmul_head))
    out = step_core(x)
    return StepEstimate(*(float(getattr(out, f)) for f in StepEstimate.__slots__))


# --------------------------------------------------------------------------- the plan


@dataclass(frozen=True, slots=True, kw_only=True)
class TracedAnswer:
    """A trace-backed plan: the Answer (render it with planner.render) and where it came
    from."""

    answer: Answer
    facts: TracedModel
    traced: tuple[Traced, ...]
    """Every candidate traced (the kept ones and the tries that did not fit)."""
    trace_wall_s: float
    """Wall time spent tracing (subprocesses included; 0 when all came from the cache)."""
    children: int
    """Trace subprocesses started."""
    notes: tuple[str, ...] = ()


def untraceable(training: TrainingSpec) -> str | None:
    """Why the traced loop cannot stand for this training run (None: it can)."""
    if training.loss is not LossKind.FP32:
        return f"--loss {training.loss}: the traced loop runs the model's own fp32 loss"
    if training.keep_logits:
        return "--keep-logits: the traced loop drops the logits before backward"
    if training.compile is not CompileMode.NONE:
        return f"--compile {training.compile}: the traced loop runs eager"
    if training.grad_sync is GradSync.LAST and training.grad_accum > 1:
        return "--grad-sync last: the traced loop reduces every micro-batch"
    if training.fsdp_version != 2:
        return "--fsdp 1: FSDP1 refuses to run without an accelerator; traces use FSDP2"
    ft = getattr(training, "finetune", None)
    if ft is not None and not ft.full:
        return "fine-tuning (LoRA, frozen layers): the traced loop trains every parameter"
    return None


def _jobs(cands: Sequence[Candidate], r: Request, n: int | None = None) -> list[TraceJob]:
    return [TraceJob(candidate=c, training=r.training, world_size=n or r.cluster.n_gpus,
                     gpus_per_node=r.cluster.gpus_per_node) for c in cands]


def _traceable(c: Candidate) -> str | None:
    if getattr(c, "tp", 1) != 1:
        return "tensor parallelism is not traced"
    if c.strategy.is_zero:
        return "DeepSpeed ZeRO is not traced (no DeepSpeed under fake tensors)"
    if c.offload is not Offload.NONE:
        return "CPU offload is not traced (CPUOffloadPolicy fails under fake tensors)"
    return None


def plan_from_traces(request: Request, tracer: Tracer, *, rank: str = "throughput",
                     search_min_gpus: bool = True) -> TracedAnswer:
    """The full plan of ``request`` with every candidate's memory traced (module doc)."""
    r = request.resolved()
    why = untraceable(r.training)
    if why:
        raise TraceRefused(f"not traceable: {why}")
    skipped: list[str] = []
    groups = []
    for tries in expand(r.options.strategies, offload_modes(r), r.options.checkpointing,
                        r.cluster.n_gpus, skipped):
        reason = _traceable(tries[0])
        if reason:
            skipped.append(f"{label(tries[0])}: not traced: {reason}")
            continue
        groups.append(list(tries))
    if not groups:
        raise TraceRefused("no traceable candidate (DDP and the FSDP strategies are traced; "
                           "ZeRO and offload are not): "
                           + "; ".join(skipped[:3]))
    # Every checkpointing mode a group may need is traced at once: one round of subprocesses
    # (a few seconds of imports each) costs more than the extra shallow traces.
    flat = [(g, c) for g, tries in enumerate(groups) for c in tries]
    outs = tracer.trace(_jobs([c for _, c in flat], r))
    facts = tracer.facts()
    all_traced = list(outs)
    chosen: dict[int, tuple[Estimate, Traced]] = {}
    failed: dict[int, Traced] = {}
    for (g, _), t in zip(flat, outs):
        if g in chosen and chosen[g][0].fits:
            continue  # a lighter mode already fits
        if t.ok:
            chosen[g] = (estimate_from_trace(t, facts, r.cluster, margin=r.options.margin,
                                             ov=r.runtime.overheads), t)
        else:
            failed.setdefault(g, t)
    for g, t in failed.items():
        if g not in chosen:
            skipped.append(f"{label(t.job.candidate)}: trace failed: {t.reason}")
    if not chosen:
        first = next(iter(failed.values()))
        raise TraceRefused(f"{tracer.name}: no candidate could be traced: "
                           f"{label(first.job.candidate)}: {first.reason}")
    r = dataclasses.replace(r, model=facts.proxy_spec(), model_source="trace", traced=facts)
    estimates = [chosen[g][0] for g in sorted(chosen)]
    steps = tuple(step_from_facts(r, facts, e.candidate) for e in estimates)
    ddp = {}
    for e in estimates:
        ck = e.candidate.checkpointing
        if ck not in ddp:
            ddp[ck] = step_from_facts(r, facts, Candidate(strategy=Strategy.DDP, checkpointing=ck))
    rec = recommend(estimates, steps, r.cluster.n_nodes > 1, rank)
    need = None
    notes: list[str] = []
    if rec is None and search_min_gpus:
        need = _min_gpus(r, tracer, [tries for g, tries in enumerate(groups) if g in chosen],
                         notes)
        if need is None and not notes:
            notes.append(f"no candidate fits on up to {MIN_GPUS_LIMIT} GPUs of this type "
                         "(searched by tracing)")
    if rec is None and r.options.offloads is None:
        notes.append("offload candidates, which the analytic plan tries when nothing else "
                     "fits, are not traced (run without --from-trace for them)")
    answer = Answer(request=r, estimates=tuple(estimates), steps=steps,
                    ddp_steps=tuple(ddp[e.candidate.checkpointing] for e in estimates),
                    recommendation=rec, min_gpus=need, skipped=tuple(skipped))
    return TracedAnswer(answer=answer, facts=facts, traced=tuple(all_traced),
                        trace_wall_s=round(getattr(tracer, "trace_wall_s", 0.0), 3),
                        children=int(getattr(tracer, "children", 0)), notes=tuple(notes))


def _min_gpus(r: Request, tracer: Tracer, groups: list[list[Candidate]],
              notes: list[str]) -> int | None:
    """Fewest GPUs (more than asked) for which a traced candidate fits.

    Only sharded candidates shrink with more GPUs (DDP's and NO_SHARD's memory per GPU does
    not depend on the count past one), the most memory-saving first. For each, two traces
    (at the asked count n and at 2n) give every category of every moment as a + b / N (what
    FSDP shards falls as 1/N, the rest stays); the smallest count that fits by that is then
    checked by tracing it and the count below it, with the planner's bisection
    (planner.search.smallest_n) between the two when the check fails. Every answer given is
    a traced one."""
    n0, gpn = r.cluster.n_gpus, r.cluster.gpus_per_node
    order = [c for c in sorted((c for tries in groups for c in tries), key=fit_first_key)
             if c.strategy in (Strategy.FULL_SHARD, Strategy.SHARD_GRAD_OP,
                               Strategy.HYBRID_SHARD)]
    if not order:
        return None
    seen: dict[tuple[Candidate, int], Traced] = {}

    def trace_all(pairs: list[tuple[Candidate, int]]) -> None:
        todo = [(c, n) for c, n in dict.fromkeys(pairs) if (c, n) not in seen]
        outs = tracer.trace([TraceJob(candidate=c, training=r.training, world_size=n,
                                      gpus_per_node=gpn) for c, n in todo])
        seen.update(zip(todo, outs))

    def fits_result(c: Candidate, n: int, result: dict[str, Any]) -> bool:
        t = Traced(job=TraceJob(candidate=c, training=r.training, world_size=n,
                                gpus_per_node=gpn), ok=True, result=result, depths=(0,))
        return estimate_from_trace(t, tracer.facts(), r.with_gpus(n).cluster,
                                   margin=r.options.margin, ov=r.runtime.overheads).fits

    def fits(n: int) -> bool:
        trace_all([(c, n) for c in order])  # one round of subprocesses per count
        return any(seen[c, n].ok and fits_result(c, n, seen[c, n].result) for c in order)

    c = order[0]
    n2 = 2 * n0 if n0 * 2 <= gpn or (2 * n0) % gpn == 0 else n0 + gpn
    trace_all([(c, n0), (c, n2)])
    a, b = seen[c, n0], seen[c, n2]
    guess = None
    if a.ok and b.ok:
        if b.result["peak_bytes"] >= a.result["peak_bytes"]:
            # the most sharded candidate does not shrink with more GPUs (e.g. FSDP's dim-0
            # padding of expert weights with fewer experts than ranks): none will
            notes.append(f"more GPUs do not help: {label(c)} traced at {n0} and {n2} GPUs "
                         f"needs {a.result['peak_bytes'] / 2**30:.1f} and "
                         f"{b.result['peak_bytes'] / 2**30:.1f} GiB allocated")
            return None
        n_a, n_b = a.job.world_size, b.job.world_size
        guess = smallest_n(lambda n: fits_result(c, n, scale_world(a.result, b.result, n_a,
                                                                   n_b, n)),
                           gpn, start=n0 + 1, limit=MIN_GPUS_LIMIT)
    if guess is not None:
        from planner.search import count_at, index_of

        i = index_of(guess, gpn)
        below = count_at(i - 1, gpn) if i > 0 else None
        trace_all([(x, n) for n in (guess, below) if n is not None and n > n0 for x in order])
        if fits(guess) and (below is None or below <= n0 or not fits(below)):
            return guess
    return smallest_n(fits, gpn, start=n0 + 1, limit=MIN_GPUS_LIMIT)


def scale_world(r1: dict[str, Any], r2: dict[str, Any], n1: int, n2: int,
                n: int) -> dict[str, Any]:
    """A result at world size n from results at n1 and n2: every category of every moment
    as a + b / N through the two (a guess that ``_min_gpus`` checks by tracing)."""
    def at(v1: int, v2: int) -> int:
        return max(0, round(v2 + (v1 - v2) * (1 / n - 1 / n2) / (1 / n1 - 1 / n2)))

    def cats(x: dict[str, int], y: dict[str, int]) -> dict[str, int]:
        return {k: at(x.get(k, 0), y.get(k, 0)) for k in set(x) | set(y)}

    out = dict(r2)
    out["moments"] = {}
    for m in r1.get("moments", {}).keys() & r2.get("moments", {}).keys():
        c = cats(r1["moments"][m]["at_peak"], r2["moments"][m]["at_peak"])
        c["total"] = sum(v for k, v in c.items() if k != "total")
        out["moments"][m] = {"peak_bytes": c["total"], "at_peak": c}
    out["end_of_step"] = cats(r1["end_of_step"], r2["end_of_step"])
    out["max_by_category"] = cats(r1["max_by_category"], r2["max_by_category"])
    return out


# --------------------------------------------------------------------------- output


def model_line(facts: TracedModel) -> str:
    active = (f" ({facts.active_params / 1e9:.2f}B active)"
              if facts.active_params != facts.params else "")
    shape = ", ".join(s for s in (
        f"{facts.n_layers} layers",
        f"hidden {facts.hidden}" if facts.hidden else "",
        f"{facts.heads} heads ({facts.kv_heads} kv)" if facts.heads else "",
        f"ffn {facts.ffn}" if facts.ffn else "",
        f"{facts.experts} experts" if facts.experts else "",
        f"vocab {facts.vocab}" if facts.vocab else "") if s)
    return (f"model     {facts.name}: {facts.cls}, {facts.params / 1e9:.2f}B params{active}; "
            f"{shape} [TRACED]")


def trace_line(ta: TracedAnswer) -> str:
    ok = [t for t in ta.traced if t.ok]
    depths = sorted({t.depths for t in ok})
    how = "; ".join(f"scaled from {d[0]} and {d[1]} layers" if len(d) == 2
                    else f"full depth ({d[0]} layers)" for d in depths)
    cached = sum(t.cached for t in ok)
    return (f"memory    from traces of the real {ta.facts.cls} on fake tensors ({how}); "
            f"{len(ok)} candidate trace(s), {cached} from the cache, trace time "
            f"{ta.trace_wall_s:.1f} s in {ta.children} subprocess(es)")


def traced_table(ta: TracedAnswer, *, width: int = 100, wide: bool = False) -> str:
    """planner.render.table with the model line from the real module and the trace's
    provenance (the rest is the plan's own rendering)."""
    from planner.render import table

    lines = table(ta.answer, width=width, wide=wide).splitlines()
    end = 1
    while end < len(lines) and lines[end].startswith(" " * 10):
        end += 1  # the model line's wrapped continuation
    import textwrap

    head = [w for line in (model_line(ta.facts), trace_line(ta))
            for w in ([line] if wide else textwrap.wrap(line, width=max(width, 40),
                                                        subsequent_indent=" " * 10,
                                                        break_long_words=False))]
    out = head + lines[end:]
    extra = [f"  - memory: {n}" for n in dict.fromkeys(
        n for e in ta.answer.estimates for n in e.notes)]
    extra += [f"  - model: {n}" for n in ta.facts.notes] + [f"  - {n}" for n in ta.notes]
    extra.append("  - step time: the planner's throughput model on the traced module's "
                 "parameter counts (matmul weights per block and head, attention width)")
    return "\n".join(out + extra)


def traced_json(ta: TracedAnswer) -> dict[str, Any]:
    """planner.render.answer_json with ``"source": "trace"`` at the top and per candidate,
    the real module's facts under inputs.model, and each candidate's trace."""
    from planner.render import answer_json

    d = answer_json(ta.answer)
    d["source"] = "trace"
    d["inputs"]["model"] = ta.facts.as_json()
    by_cand = {}
    for t in ta.traced:
        if t.ok or t.job.candidate not in by_cand:
            by_cand[t.job.candidate] = t
    for e, c in zip(ta.answer.estimates, d["candidates"]):
        t = by_cand.get(e.candidate)
        c["source"] = "trace"
        if t is not None:
            c["trace"] = {"layers_traced": list(t.depths), "cached": t.cached,
                          "wall_s": round(t.wall_s, 3), "max_rss_bytes": t.max_rss_bytes,
                          "traced_peak_phase": t.result.get("peak_moment")
                          or t.result.get("peak_phase")}
    d["trace"] = {"wall_s": ta.trace_wall_s, "subprocesses": ta.children,
                  "traces": len(ta.traced), "from_cache": sum(t.cached for t in ta.traced if t.ok),
                  "failed": [{"candidate": label(t.job.candidate), "reason": t.reason}
                             for t in ta.traced if not t.ok],
                  "notes": list(ta.notes)}
    return d
