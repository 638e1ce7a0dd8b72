"""The planner against the trace: same model, same step, one rank; term by term.

What neither side can see is left out of both: the cuBLAS workspace, CUDA context, NCCL and
the allocator (planner only: no trace has them), DDP's gradient buckets (the trace runs the
plain module on one rank: DDP's reducer cannot run on fake tensors), the batch's token ids
and targets and module buffers (trace only: 16 bytes a token and RoPE's inv_freq), and
Adam's 0-dim step counters (host memory on CUDA unless the optimizer is fused).

Categories compared (planner term <-> trace category), each at the moment named:

- params         params                         <-> params (+ a quantized base's constants,
                                                    module buffers here) (optimizer)
- gradients      gradients                      <-> grads + unsharded_grads (optimizer)
- optimizer      optimizer_states + temporaries <-> optimizer               (optimizer)
- activations    activations + transients       <-> activations + temp      (loss_bwd)
                 (+ autocast's cached weights, which the trace files under activations)
- fsdp_buffers   gathered_params + comm_buffers <-> unsharded_params + all_gather
                                                    + reduce_scatter        (block_bwd)

``traced_only`` gives the same rows for a trace the planner has no model of (an architecture
it cannot read): the planner's column is None.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from planner.memory import PHASES, Breakdown, Estimate, Overheads, estimate
from planner.spec import Candidate, Cluster, ModelSpec, Strategy, TrainingSpec


@dataclass(frozen=True, slots=True, kw_only=True)
class Pair:
    traced_bytes: int
    predicted_bytes: int | None
    """None: the planner has no model of this architecture (a traced-only row)."""

    @property
    def rel_error(self) -> float | None:
        """(predicted - traced) / traced; None when nothing was traced or predicted."""
        if self.predicted_bytes is None:
            return None
        if self.traced_bytes == 0:
            return None if self.predicted_bytes == 0 else float("inf")
        return (self.predicted_bytes - self.traced_bytes) / self.traced_bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class Comparison:
    candidate: Candidate
    world_size: int
    ok: bool
    reason: str = ""
    unsupported: bool = False
    peak: Pair | None = None
    traced_peak_phase: str = ""
    predicted_peak_phase: str = ""
    categories: dict[str, Pair] = field(default_factory=dict)
    moments: dict[str, Pair] = field(default_factory=dict)
    wall_s: float = 0.0
    max_rss_bytes: int = 0
    model: dict[str, Any] = field(default_factory=dict)
    """What was traced: the trace's "model" facts (class, source, depth)."""
    cached: bool = False
    """The trace was read from the cache (probes/trace_cache.py)."""


def _invisible(e: Estimate, b: Breakdown, candidate: Candidate, n: int) -> int:
    """Planner bytes no trace holds: the cuBLAS workspace, and DDP's buckets."""
    ddp_buckets = b.comm_buffers if candidate.strategy is Strategy.DDP and n > 1 else 0
    return b.cublas_workspace + ddp_buckets


def _trace_extra(result: dict[str, Any], snap: dict[str, int]) -> int:
    """Trace bytes the planner does not model: inputs, buffers, host-side step counters."""
    scalars = result.get("optimizer_scalar_bytes", 0) if result.get("optimizer_scalars_on_host") else 0
    # a quantized base's constants are buffers in the trace but resident params to the planner
    buffers = snap.get("buffers", 0) - result.get("quant_const_bytes", 0)
    return snap.get("inputs", 0) + buffers + (scalars if snap.get("optimizer") else 0)


def _cat(snap: dict[str, int], *names: str) -> int:
    return sum(snap.get(n, 0) for n in names)


def compare(model: ModelSpec, training: TrainingSpec, cluster: Cluster, candidate: Candidate,
            result: dict[str, Any], *, wall_s: float = 0.0, max_rss_bytes: int = 0,
            overheads: Overheads | None = None) -> Comparison:
    """Pair a trace result (probes.trace / probes.runner) with the planner's estimate."""
    n = cluster.n_gpus
    if not result.get("ok"):
        return Comparison(candidate=candidate, world_size=n, ok=False,
                          reason=str(result.get("reason", "probe failed")),
                          unsupported=bool(result.get("unsupported")), wall_s=wall_s,
                          max_rss_bytes=max_rss_bytes)
    e = estimate(model, training, cluster, candidate, margin=0.0, overheads=overheads)
    pb = e.phases
    moments = result.get("moments", {})
    out_moments: dict[str, Pair] = {}
    for m in PHASES:
        if m not in moments or m not in pb:
            continue
        snap = moments[m]["at_peak"]
        traced = moments[m]["peak_bytes"] - _trace_extra(result, snap)
        out_moments[m] = Pair(traced_bytes=traced,
                              predicted_bytes=pb[m].total - _invisible(e, pb[m], candidate, n))
    peak_snap = result["at_peak"]
    peak = Pair(traced_bytes=result["peak_bytes"] - _trace_extra(result, peak_snap),
                predicted_bytes=e.peak_allocated_bytes - _invisible(e, e.breakdown, candidate, n))
    cats: dict[str, Pair] = {}

    def snap_of(m: str) -> dict[str, int]:
        return moments.get(m, {}).get("at_peak", {})

    opt = snap_of("optimizer")
    if opt and "optimizer" in pb:
        b = pb["optimizer"]
        scalars = result.get("optimizer_scalar_bytes", 0)
        cats["params"] = Pair(traced_bytes=_cat(opt, "params")
                              + result.get("quant_const_bytes", 0), predicted_bytes=b.params)
        cats["gradients"] = Pair(traced_bytes=_cat(opt, "grads", "unsharded_grads"),
                                 predicted_bytes=b.gradients)
        cats["optimizer"] = Pair(traced_bytes=_cat(opt, "optimizer") - scalars,
                                 predicted_bytes=b.optimizer_states + b.optimizer_temporaries)
    loss = snap_of("loss_bwd")
    if loss and "loss_bwd" in pb:
        b = pb["loss_bwd"]
        fsdp_gathered = 0
        if candidate.strategy.is_fsdp:
            fsdp_gathered = b.gathered_params
        cache = b.gathered_params - fsdp_gathered  # autocast's weight cache (DDP / 1 GPU)
        cats["activations"] = Pair(traced_bytes=_cat(loss, "activations", "temp"),
                                   predicted_bytes=b.activations + b.transients + cache)
    bb = snap_of("block_bwd")
    if candidate.strategy.is_fsdp and bb and "block_bwd" in pb:
        b = pb["block_bwd"]
        cats["fsdp_buffers"] = Pair(
            traced_bytes=_cat(bb, "unsharded_params", "all_gather", "reduce_scatter"),
            predicted_bytes=b.gathered_params + b.comm_buffers)
    return Comparison(candidate=candidate, world_size=n, ok=True, peak=peak,
                      traced_peak_phase=str(result.get("peak_phase", "")),
                      predicted_peak_phase=str(e.peak_phase), categories=cats,
                      moments={str(k): v for k, v in out_moments.items()},
                      wall_s=wall_s, max_rss_bytes=max_rss_bytes)


def traced_only(candidate: Candidate, world_size: int, result: dict[str, Any], *,
                wall_s: float = 0.0, max_rss_bytes: int = 0) -> Comparison:
    """A trace with no planner counterpart (an architecture the analytic model does not
    know): the same rows, the planner's column empty. The same exclusions as ``compare``
    (inputs, buffers, host-side step counters) keep the numbers comparable."""
    if not result.get("ok"):
        return Comparison(candidate=candidate, world_size=world_size, ok=False,
                          reason=str(result.get("reason", "probe failed")),
                          unsupported=bool(result.get("unsupported")), wall_s=wall_s,
                          max_rss_bytes=max_rss_bytes)
    moments = result.get("moments", {})
    out_moments = {str(m): Pair(traced_bytes=moments[m]["peak_bytes"]
                                - _trace_extra(result, moments[m]["at_peak"]),
                                predicted_bytes=None)
                   for m in map(str, PHASES) if m in moments}
    cats: dict[str, Pair] = {}
    opt = moments.get("optimizer", {}).get("at_peak", {})
    if opt:
        cats["params"] = Pair(traced_bytes=_cat(opt, "params"), predicted_bytes=None)
        cats["gradients"] = Pair(traced_bytes=_cat(opt, "grads", "unsharded_grads"),
                                 predicted_bytes=None)
        cats["optimizer"] = Pair(traced_bytes=_cat(opt, "optimizer")
                                 - result.get("optimizer_scalar_bytes", 0), predicted_bytes=None)
    loss = moments.get("loss_bwd", {}).get("at_peak", {})
    if loss:
        cats["activations"] = Pair(traced_bytes=_cat(loss, "activations", "temp"),
                                   predicted_bytes=None)
    bb = moments.get("block_bwd", {}).get("at_peak", {})
    if candidate.strategy.is_fsdp and bb:
        cats["fsdp_buffers"] = Pair(traced_bytes=_cat(bb, "unsharded_params", "all_gather",
                                                      "reduce_scatter"), predicted_bytes=None)
    return Comparison(candidate=candidate, world_size=world_size, ok=True,
                      peak=Pair(traced_bytes=result["peak_bytes"]
                                - _trace_extra(result, result["at_peak"]), predicted_bytes=None),
                      traced_peak_phase=str(result.get("peak_moment")
                                            or result.get("peak_phase", "")),
                      categories=cats, moments=out_moments, wall_s=wall_s,
                      max_rss_bytes=max_rss_bytes)


def comparison_json(c: Comparison) -> dict[str, Any]:
    def pair(p: Pair) -> dict[str, Any]:
        return {"traced_bytes": p.traced_bytes, "predicted_bytes": p.predicted_bytes,
                "rel_error": p.rel_error}

    out: dict[str, Any] = {
        "strategy": str(c.candidate.strategy),
        "offload": str(c.candidate.offload),
        "checkpointing": str(c.candidate.checkpointing),
        "world_size": c.world_size,
        "ok": c.ok,
        "reason": c.reason or None,
        "unsupported": c.unsupported,
        "wall_s": c.wall_s,
        "max_rss_bytes": c.max_rss_bytes,
        "cached": c.cached,
        "traced_model": c.model or None,
    }
    if c.ok and c.peak is not None:
        out.update({
            "traced_peak_allocated_bytes": c.peak.traced_bytes,
            "predicted_peak_allocated_bytes": c.peak.predicted_bytes,
            "peak_rel_error": c.peak.rel_error,
            "traced_peak_phase": c.traced_peak_phase,
            "predicted_peak_phase": c.predicted_peak_phase or None,
            "categories": {k: pair(v) for k, v in c.categories.items()},
            "moments": {k: pair(v) for k, v in c.moments.items()},
        })
    return out


def every_cp_rank(model: Any, training: Any, candidate: Any, cluster: Any,
                  world_size: int, gpus_per_node: int = 8) -> dict[str, tuple[int, int]]:
    """The whole step traced once per cp rank (global ranks 0 .. cp - 1 of a fake group of
    ``world_size``: the causal load balancing gives them different ring work) and held to
    the planner: {moment: (the largest traced over the cp ranks, the planner's)}. Raises
    if a trace fails (its reason)."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from probes.trace import trace_step

    worst: dict[str, tuple[int, int]] = {}
    for rank in range(training.cp):
        if dist.is_initialized():
            dist.destroy_process_group()
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
        try:
            got = compare(model, training, cluster, candidate,
                          trace_step(model, training, candidate, world_size, gpus_per_node))
        finally:
            dist.destroy_process_group()
        if not got.ok:
            raise RuntimeError(f"cp rank {rank}: {got.reason}")
        for m, pair in got.moments.items():
            traced = max(pair.traced_bytes, worst.get(m, (0, 0))[0])
            worst[m] = (traced, pair.predicted_bytes)
    return worst
