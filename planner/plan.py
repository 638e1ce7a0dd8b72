"""From a question to an answer: expand candidates, estimate each, pick a recommendation.

The recommendation is the fastest candidate that fits (planner/throughput.py's step time);
candidates within ``TIE`` of the fastest count as tied and the simplest of them wins, in the
order an engineer would try things: DDP, SHARD_GRAD_OP, HYBRID_SHARD (multi-node only),
FULL_SHARD, the ZeRO stages, NO_SHARD; lighter checkpointing before heavier; no offload before
offload. ``plan(..., rank="memory")`` ranks by that order alone.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from planner.memory import Estimate, Overheads, UnsupportedCandidate, check_supported, estimate
from planner.throughput import DEFAULT_ASSUMPTIONS, StepEstimate, ThroughputAssumptions, estimate_step
from planner.spec import (
    Candidate,
    Checkpointing,
    Cluster,
    ModelSpec,
    Offload,
    Strategy,
    TrainingSpec,
)

DEFAULT_STRATEGIES: tuple[Strategy, ...] = tuple(Strategy)
STRATEGY_PREFERENCE: tuple[Strategy, ...] = (
    Strategy.DDP,
    Strategy.SHARD_GRAD_OP,
    Strategy.HYBRID_SHARD,
    Strategy.FULL_SHARD,
    Strategy.ZERO1,
    Strategy.ZERO2,
    Strategy.ZERO3,
    Strategy.NO_SHARD,
)
CHECKPOINTING_ORDER = (Checkpointing.NONE, Checkpointing.SELECTIVE, Checkpointing.FULL)
OFFLOAD_ORDER = (Offload.NONE, Offload.OPTIMIZER, Offload.PARAMS_AND_OPTIMIZER)
# Named equivalents, for reasons and docs (DeepSpeed ZeRO stage <-> FSDP sharding strategy).
EQUIVALENT = {
    Strategy.ZERO2: Strategy.SHARD_GRAD_OP,
    Strategy.ZERO3: Strategy.FULL_SHARD,
    Strategy.SHARD_GRAD_OP: Strategy.ZERO2,
    Strategy.FULL_SHARD: Strategy.ZERO3,
    Strategy.NO_SHARD: Strategy.DDP,
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Question:
    model: ModelSpec
    training: TrainingSpec
    cluster: Cluster
    strategies: tuple[Strategy, ...] = DEFAULT_STRATEGIES
    offloads: tuple[Offload, ...] | None = None
    """None: no offload, and offload candidates only when nothing else fits."""
    checkpointing: Checkpointing = Checkpointing.AUTO
    margin: float = 0.05
    overheads: Overheads = dataclasses.field(default_factory=Overheads)
    global_batch: int | None = None
    """Sequences per optimizer step over all GPUs; sets grad_accum (pure data parallel)."""
    assumptions: ThroughputAssumptions = DEFAULT_ASSUMPTIONS
    """The step-time model's free terms (defaults, or a calibration's)."""
    calibration: dict[str, object] | None = None
    """Which calibration the overheads, profile and assumptions came from: id, source, stale."""

    def resolved(self) -> Question:
        """grad_accum from global_batch: ceil(global_batch / (micro_batch x n_gpus))."""
        if self.global_batch is None:
            return self
        per_step = self.training.micro_batch * self.cluster.n_gpus
        ga = max(1, -(-self.global_batch // per_step))
        return dataclasses.replace(self, training=dataclasses.replace(self.training, grad_accum=ga))


TIE = 0.02
"""Step times within 2 % are a tie (below the throughput model's resolution)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Recommendation:
    candidate: Candidate
    reasons: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Answer:
    question: Question
    estimates: tuple[Estimate, ...]
    steps: tuple[StepEstimate, ...]
    """Aligned with estimates: the step-time model of each candidate."""
    ddp_steps: tuple[StepEstimate, ...]
    """Aligned with estimates: DDP (no offload, same checkpointing) on the same hardware, the
    reference of each candidate's slowdown (hypothetical where DDP does not fit)."""
    recommendation: Recommendation | None
    min_gpus: int | None
    """When nothing fits: the fewest GPUs of this type for which a candidate fits (None if
    none does up to the search limit, or if something fits already)."""
    skipped: tuple[str, ...]
    """Requested combinations that do not exist (e.g. DDP with CPU offload)."""

    @property
    def any_fits(self) -> bool:
        return any(e.fits for e in self.estimates)


def preference_key(e: Estimate, multi_node: bool) -> tuple[int, int, int]:
    c = e.candidate
    strategies = [s for s in STRATEGY_PREFERENCE if multi_node or s is not Strategy.HYBRID_SHARD]
    s_rank = strategies.index(c.strategy) if c.strategy in strategies else len(STRATEGY_PREFERENCE)
    return (OFFLOAD_ORDER.index(c.offload), CHECKPOINTING_ORDER.index(c.checkpointing), s_rank)


def _expand(q: Question, offloads: Iterable[Offload]) -> tuple[list[Estimate], list[str]]:
    """One estimate per (strategy, offload); 'auto' checkpointing picks the lightest that fits."""
    out: list[Estimate] = []
    skipped: list[str] = []
    ckpts = CHECKPOINTING_ORDER if q.checkpointing is Checkpointing.AUTO else (q.checkpointing,)
    for offload in offloads:
        for strategy in q.strategies:
            if q.cluster.n_gpus == 1 and strategy not in (Strategy.DDP,) and not strategy.is_zero \
                    and offload is Offload.NONE:
                continue  # one GPU: every FSDP flavour is plain training plus overhead
            chosen: Estimate | None = None
            for ck in ckpts:
                cand = Candidate(strategy=strategy, offload=offload, checkpointing=ck)
                try:
                    check_supported(cand)
                except UnsupportedCandidate as exc:
                    skipped.append(f"{strategy}+{offload}: {exc}")
                    break
                chosen = estimate(q.model, q.training, q.cluster, cand, margin=q.margin,
                                  overheads=q.overheads)
                if chosen.fits:
                    break
            if chosen is not None:
                out.append(chosen)
    return out, skipped


def _gib(x: int) -> str:
    return f"{x / 2**30:.1f} GiB"


def label(c: Candidate) -> str:
    out = str(c.strategy)
    if c.checkpointing is not Checkpointing.NONE:
        out += f" + {c.checkpointing} checkpointing"
    if c.offload is not Offload.NONE:
        out += f" + {c.offload} offload"
    return out


def _why_not(e: Estimate) -> str:
    if not e.fits_gpu:
        return (f"{label(e.candidate)}: does not fit, needs {_gib(e.device_used_bytes)} per GPU, "
                f"{_gib(e.device_used_bytes - e.usable_bytes)} over the usable {_gib(e.usable_bytes)}")
    return (f"{label(e.candidate)}: does not fit, host RAM {_gib(e.host_bytes_per_node)} per node "
            f"exceeds {_gib(e.host_capacity_bytes)}")


def recommend(estimates: Sequence[Estimate], steps: Sequence[StepEstimate], multi_node: bool,
              rank: str = "throughput") -> Recommendation | None:
    """The fastest candidate that fits; ties (within TIE) go to the simplest."""
    scored = list(zip(estimates, steps))
    fitting = [(e, st) for e, st in scored if e.fits]
    if not fitting:
        return None
    simple = lambda pair: preference_key(pair[0], multi_node)  # noqa: E731
    if rank == "memory":
        best, best_step = min(fitting, key=simple)
    else:
        fastest = min(st.step_time_s for _, st in fitting)
        tied = [p for p in fitting if p[1].step_time_s <= fastest * (1 + TIE)]
        best, best_step = min(tied, key=simple)
    c = best.candidate
    reasons = [
        f"{label(c)} fits: {_gib(best.device_used_bytes)} of {_gib(best.usable_bytes)} usable "
        f"per GPU ({_gib(best.headroom_bytes)} headroom); step {best_step.step_time_s:.3g} s, "
        f"{best_step.tokens_per_s_per_gpu:,.0f} tokens/s/GPU, MFU {best_step.mfu:.0%}",
        "ranked by the memory-only order (least sharding, checkpointing, offload)"
        if rank == "memory" else
        f"ranked by predicted step time among candidates that fit; within {TIE:.0%} the "
        "simpler one wins",
    ]
    # fitting candidates fastest first, then those that do not fit
    order = lambda p: (not p[0].fits, p[1].step_time_s if p[0].fits else 0.0, simple(p))  # noqa: E731
    for e, st in sorted(scored, key=order):
        if e is best:
            continue
        if not e.fits:
            reasons.append("not " + _why_not(e))
        else:
            ratio = st.step_time_s / best_step.step_time_s
            if ratio >= 1:
                word = f"{ratio - 1:.0%} slower" if ratio > 1 + 0.005 else "as fast"
            else:
                word = f"{1 - ratio:.0%} faster but more complex (within the tie)"
            reasons.append(f"not {label(e.candidate)}: fits, {word} "
                           f"(step {st.step_time_s:.3g} s)")
    if c.strategy in EQUIVALENT:
        reasons.append(f"named equivalent: {c.strategy} ~ {EQUIVALENT[c.strategy]}")
    return Recommendation(candidate=c, reasons=tuple(reasons))


def _fits_with(q: Question, n: int) -> bool:
    cluster = dataclasses.replace(q.cluster, n_gpus=n)
    trial = dataclasses.replace(q, cluster=cluster, checkpointing=Checkpointing.AUTO,
                                offloads=tuple(OFFLOAD_ORDER))
    ests, _ = _expand(trial, trial.offloads or ())
    return any(e.fits for e in ests)


MAX_GPUS_SEARCHED = 1 << 16


def smallest_n(fits: Callable[[int], bool], gpus_per_node: int,
               limit: int = MAX_GPUS_SEARCHED) -> int | None:
    """Fewest GPUs n with fits(n): any count up to one node, whole nodes past it.

    Sharding divides the model states by n while activations stay per GPU, so from 2 GPUs on
    fitting is monotone in n (n = 1 differs: no NCCL, no DDP buckets). So: 1, then a
    bisection inside the node if a full node fits, else doubling whole nodes and bisecting.
    """
    if fits(1):
        return 1
    gpn = gpus_per_node
    if gpn > 1 and fits(gpn):
        lo, hi = 1, gpn
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if fits(mid):
                hi = mid
            else:
                lo = mid
        return hi
    lo, hi = 1, 2  # in nodes
    while not fits(hi * gpn):
        lo, hi = hi, hi * 2
        if hi * gpn > limit:
            return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid * gpn):
            hi = mid
        else:
            lo = mid
    return hi * gpn


def min_gpus(q: Question) -> int | None:
    """Fewest GPUs of this type for which some candidate (offload included) fits."""
    return smallest_n(lambda n: _fits_with(q, n), q.cluster.gpus_per_node)


def plan(q: Question, rank: str = "throughput") -> Answer:
    q = q.resolved()
    offloads = q.offloads if q.offloads is not None else (Offload.NONE,)
    estimates, skipped = _expand(q, offloads)
    if q.offloads is None and not any(e.fits for e in estimates):
        more, _ = _expand(q, OFFLOAD_ORDER[1:])  # combinations that don't exist: silently
        estimates += more
    steps = tuple(estimate_step(q.model, q.training, q.cluster, e.candidate, q.assumptions)
                  for e in estimates)
    ddp = {}
    for e in estimates:
        ck = e.candidate.checkpointing
        if ck not in ddp:
            ddp[ck] = estimate_step(q.model, q.training, q.cluster,
                                    Candidate(strategy=Strategy.DDP, checkpointing=ck),
                                    q.assumptions)
    multi_node = q.cluster.n_nodes > 1
    rec = recommend(estimates, steps, multi_node, rank)
    need = None if rec is not None else min_gpus(q)
    return Answer(question=q, estimates=tuple(estimates), steps=steps,
                  ddp_steps=tuple(ddp[e.candidate.checkpointing] for e in estimates),
                  recommendation=rec, min_gpus=need, skipped=tuple(skipped))


@dataclass(frozen=True, slots=True, kw_only=True)
class Found:
    """The answer to an inverse question, and the plan at that value."""

    question: str
    """min-gpus, max-micro-batch or max-seq."""
    value: int | None
    """None: no value fits (or none up to the search limit for min-gpus)."""
    answer: Answer


FIND_LIMIT = {"max-micro-batch": 1 << 14, "max-seq": 1 << 22}


def _fits_any(q: Question) -> bool:
    q = q.resolved()
    ests, _ = _expand(q, q.offloads if q.offloads is not None else OFFLOAD_ORDER)
    return any(e.fits for e in ests)


def _largest(fits, limit: int) -> int | None:
    """Largest v in [1, limit] with fits(v), fits being monotone decreasing in v."""
    if not fits(1):
        return None
    lo, hi = 1, 2
    while hi <= limit and fits(hi):
        lo, hi = hi, hi * 2
    hi = min(hi, limit + 1)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo


def find(q: Question, what: str, rank: str = "throughput") -> Found:
    """Answer `--find`: the fewest GPUs, or the largest micro-batch / sequence that fits.

    Activations grow with micro-batch and sequence length and nothing else shrinks, so
    fitting is monotone and a doubling search plus bisection finds the boundary.
    """
    if what == "min-gpus":
        n = q.cluster.n_gpus if _fits_any(q) and q.cluster.n_gpus == 1 else min_gpus(q)
        at = q if n is None else dataclasses.replace(
            q, cluster=dataclasses.replace(q.cluster, n_gpus=n))
        return Found(question=what, value=n, answer=plan(at, rank))
    field = {"max-micro-batch": "micro_batch", "max-seq": "seq"}[what]

    def with_value(v: int) -> Question:
        return dataclasses.replace(q, training=dataclasses.replace(q.training, **{field: v}))

    v = _largest(lambda v: _fits_any(with_value(v)), FIND_LIMIT[what])
    return Found(question=what, value=v, answer=plan(with_value(v or 1), rank))
