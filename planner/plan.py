"""From a question to an answer: expand candidates, estimate each, pick a recommendation.

The recommendation is a ranking over the candidates that fit. The memory-only ranking is the
order an engineer would try things in (issue 2): DDP, then SHARD_GRAD_OP, then HYBRID_SHARD
(multi-node only), then FULL_SHARD, the ZeRO stages, NO_SHARD; lighter checkpointing before
heavier; no offload before offload. ``plan(..., rank=...)`` takes any other key, so a
throughput model can rank instead.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from planner.memory import Estimate, Overheads, UnsupportedCandidate, check_supported, estimate
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


@dataclass(frozen=True, slots=True, kw_only=True)
class Recommendation:
    candidate: Candidate
    reasons: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Answer:
    question: Question
    estimates: tuple[Estimate, ...]
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
                    check_supported(cand, q.cluster.n_gpus)
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


def _why_not(e: Estimate) -> str:
    c = e.candidate
    label = f"{c.strategy}" + (f" + {c.checkpointing} checkpointing" if c.checkpointing is not Checkpointing.NONE else "") \
        + (f" + {c.offload} offload" if c.offload is not Offload.NONE else "")
    if not e.fits_gpu:
        return (f"{label}: needs {_gib(e.device_used_bytes)} per GPU, "
                f"{_gib(e.device_used_bytes - e.usable_bytes)} over the usable {_gib(e.usable_bytes)}")
    return (f"{label}: host RAM {_gib(e.host_bytes_per_node)} per node exceeds "
            f"{_gib(e.host_capacity_bytes)}")


def recommend(estimates: Sequence[Estimate], multi_node: bool,
              rank: Callable[[Estimate], object] | None = None) -> Recommendation | None:
    fitting = [e for e in estimates if e.fits]
    if not fitting:
        return None
    key = rank or (lambda e: preference_key(e, multi_node))
    best = min(fitting, key=key)
    c = best.candidate
    reasons = [
        f"{c.strategy} fits: {_gib(best.device_used_bytes)} of {_gib(best.usable_bytes)} usable "
        f"per GPU ({_gib(best.headroom_bytes)} headroom)"
    ]
    if rank is None:
        reasons.append("memory-only ranking: the least sharding, checkpointing and offload that "
                       "fit (each costs throughput: more communication, recompute, PCIe traffic)")
    for e in sorted(estimates, key=lambda e: preference_key(e, multi_node)):
        if e is best:
            continue
        if not e.fits:
            reasons.append("not " + _why_not(e))
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


def min_gpus(q: Question) -> int | None:
    """Fewest GPUs of this type for which some candidate fits (full nodes past one node).

    Sharding divides the model states by n while activations stay per GPU, so fitting is
    monotone in n; a doubling search then bisection finds the boundary.
    """
    gpn = q.cluster.gpus_per_node
    sizes = list(range(1, gpn + 1))
    for n in sizes:
        if _fits_with(q, n):
            return n
    lo, hi = 1, 2  # in nodes
    while not _fits_with(q, hi * gpn):
        lo, hi = hi, hi * 2
        if hi * gpn > MAX_GPUS_SEARCHED:
            return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _fits_with(q, mid * gpn):
            hi = mid
        else:
            lo = mid
    return hi * gpn


def plan(q: Question, rank: Callable[[Estimate], object] | None = None) -> Answer:
    offloads = q.offloads if q.offloads is not None else (Offload.NONE,)
    estimates, skipped = _expand(q, offloads)
    if q.offloads is None and not any(e.fits for e in estimates):
        more, _ = _expand(q, OFFLOAD_ORDER[1:])  # combinations that don't exist: silently
        estimates += more
    multi_node = q.cluster.n_nodes > 1
    rec = recommend(estimates, multi_node, rank)
    need = None if rec is not None else min_gpus(q)
    return Answer(question=q, estimates=tuple(estimates), recommendation=rec, min_gpus=need,
                  skipped=tuple(skipped))
