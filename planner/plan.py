"""From a request to an answer: expand candidates, estimate each, pick a recommendation.

The recommendation is the fastest candidate that fits (planner/throughput.py's step time);
candidates within ``TIE`` of the fastest count as tied and the simplest of them wins, in the
order an engineer would try things (planner/candidates.py ``preference_key``): DDP,
SHARD_GRAD_OP, HYBRID_SHARD (multi-node only), FULL_SHARD, the ZeRO stages, NO_SHARD; lighter
checkpointing before heavier; no offload before offload. ``plan(..., rank="memory")`` ranks by
that order alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from planner.candidates import (
    EQUIVALENT,
    OFFLOAD_ORDER,
    TP_DEGREES,
    expand,
    fit_first_key,
    label,
    preference_key,
    tp_problem,
)
from planner.memory import Estimate, estimate
from planner.request import Request
from planner.search import largest, smallest_n
from planner.spec import Candidate, Offload, Strategy
from planner.throughput import StepEstimate, estimate_step

TIE = 0.02
"""Step times within 2 % are a tie (below the throughput model's resolution)."""
FIND_LIMIT = {"max-micro-batch": 1 << 14, "max-seq": 1 << 22}
FIND_QUESTIONS = ("min-gpus", "max-micro-batch", "max-seq")


@dataclass(frozen=True, slots=True, kw_only=True)
class Recommendation:
    candidate: Candidate
    reasons: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Answer:
    request: Request
    estimates: tuple[Estimate, ...]
    steps: tuple[StepEstimate, ...]
    """Aligned with estimates: the step-time model of each candidate."""
    ddp_steps: tuple[StepEstimate, ...]
    """Aligned with estimates: DDP (no offload, same checkpointing) on the same hardware, the
    reference of each candidate's slowdown (hypothetical where DDP does not fit)."""
    recommendation: Recommendation | None
    min_gpus: int | None
    """When nothing fits: the fewest GPUs of this type, more than asked, for which a candidate
    of the request fits (None if none does up to the search limit, or if something fits)."""
    skipped: tuple[str, ...]
    """Requested combinations that do not exist (e.g. DDP with CPU offload)."""

    @property
    def any_fits(self) -> bool:
        return any(e.fits for e in self.estimates)

    def chosen(self) -> tuple[Estimate, StepEstimate] | tuple[None, None]:
        """The recommended candidate's estimate and step."""
        rec = self.recommendation
        for e, st in zip(self.estimates, self.steps):
            if rec is not None and e.candidate == rec.candidate:
                return e, st
        return None, None


def _estimate(r: Request, c: Candidate) -> Estimate:
    return estimate(r.model, r.training, r.cluster, c, margin=r.options.margin,
                    overheads=r.runtime.overheads)


def auto_tp_degrees(r: Request) -> tuple[int, ...]:
    """The TP degrees `--tp auto` may add: those the model and the node allow."""
    return tuple(t for t in TP_DEGREES
                 if tp_problem(r.model, t, r.cluster.n_gpus, r.cluster.gpus_per_node) is None)


AUTO_TP_STRATEGIES = (Strategy.FULL_SHARD, Strategy.HYBRID_SHARD)
"""What `--tp auto` composes with TP: FSDP2 over the data-parallel mesh dimension as
torchtitan's 2-D (and HSDP 3-D) meshes do."""


def evaluate(r: Request, offloads: Sequence[Offload],
             skipped: list[str] | None = None) -> list[Estimate]:
    """One estimate per (strategy, offload): the lightest checkpointing that fits (the
    heaviest if none does) when the request says auto, else the one asked for."""
    out = []
    for tries in expand(r.options.strategies, offloads, r.options.checkpointing,
                        r.cluster.n_gpus, skipped, tps=(r.options.tp or 1,)):
        for c in tries:
            e = _estimate(r, c)
            if e.fits:
                break
        out.append(e)
    return out


def auto_tp_strategies(r: Request) -> list[Strategy]:
    return [s for s in r.options.strategies if s in AUTO_TP_STRATEGIES
            and (s is not Strategy.HYBRID_SHARD or r.cluster.n_nodes > 1)]


def evaluate_auto_tp(r: Request) -> list[Estimate]:
    """`--tp auto` when nothing fits without TP: per FSDP strategy of the request, the
    smallest TP degree that fits (each with the lightest checkpointing that fits), or the
    largest when none does, as `--checkpointing auto` picks a mode."""
    out = []
    strategies = auto_tp_strategies(r)
    for s in strategies:
        last = None
        for tp in auto_tp_degrees(r):
            found = evaluate(r.with_options(strategies=(s,), tp=tp), (Offload.NONE,))
            last = found[0] if found else last
            if last is not None and last.fits:
                break
        if last is not None:
            out.append(last)
    return out


def offload_modes(r: Request, *, for_fit: bool = False) -> tuple[Offload, ...]:
    """The offload modes the request allows; 'auto' allows all of them to fit, shown only
    when nothing else fits."""
    if r.options.offloads is not None:
        return r.options.offloads
    return OFFLOAD_ORDER if for_fit else (Offload.NONE,)


def fits_any(r: Request) -> bool:
    """Whether some candidate of the request fits (offload included when 'auto')."""
    r = r.resolved()
    if r.options.tp is not None:
        tps = (r.options.tp,) if not tp_problem(r.model, r.options.tp, r.cluster.n_gpus,
                                                 r.cluster.gpus_per_node) else ()
    else:
        tps = (1,) + auto_tp_degrees(r)
    tries = [c for group in expand(r.options.strategies, offload_modes(r, for_fit=True),
                                   r.options.checkpointing, r.cluster.n_gpus, tps=tps,
                                   quiet_tp=True)
             for c in group
             if c.tp == 1 or r.options.tp is not None or c.strategy in auto_tp_strategies(r)]
    return any(_estimate(r, c).fits for c in sorted(tries, key=fit_first_key))


def min_gpus(r: Request, start: int = 1) -> int | None:
    """Fewest GPUs of this type (>= start) for which a candidate of the request fits."""
    return smallest_n(lambda n: fits_any(r.with_gpus(n)), r.cluster.gpus_per_node, start=start)


def _gib(x: int) -> str:
    return f"{x / 2**30:.1f} GiB"


def why_not(e: Estimate) -> str:
    if not e.fits_gpu:
        return (f"does not fit, needs {_gib(e.required_bytes)} per GPU, "
                f"{_gib(e.required_bytes - e.usable_bytes)} over the usable "
                f"{_gib(e.usable_bytes)}")
    return (f"does not fit, host RAM {_gib(e.host_bytes_per_node)} per node exceeds "
            f"{_gib(e.host_capacity_bytes)}")


def recommend(estimates: Sequence[Estimate], steps: Sequence[StepEstimate], multi_node: bool,
              rank: str = "throughput") -> Recommendation | None:
    """The fastest candidate that fits; ties (within TIE) go to the simplest."""
    scored = list(zip(estimates, steps))
    fitting = [(e, st) for e, st in scored if e.fits]
    if not fitting:
        return None

    def simple(pair: tuple[Estimate, StepEstimate]) -> tuple[int, int, int]:
        return preference_key(pair[0].candidate, multi_node)

    # time per token per GPU: under tensor parallel a step trains 1/tp of the tokens per GPU,
    # so step times compare only through tokens/s/GPU
    def per_token(st: StepEstimate) -> float:
        return 1.0 / st.tokens_per_s_per_gpu

    if rank == "memory":
        best, best_step = min(fitting, key=simple)
    else:
        fastest = min(per_token(st) for _, st in fitting)
        tied = [p for p in fitting if per_token(p[1]) <= fastest * (1 + TIE)]
        best, best_step = min(tied, key=simple)
    c = best.candidate
    reasons = [
        f"{label(c)} fits: needs {_gib(best.required_bytes)} of {_gib(best.usable_bytes)} usable "
        f"per GPU ({_gib(best.headroom_bytes)} headroom); step {best_step.step_time_s:.3g} s, "
        f"{best_step.tokens_per_s_per_gpu:,.0f} tokens/s/GPU, MFU {best_step.mfu:.0%}",
        "ranked by the memory-only order (least sharding, checkpointing, offload)"
        if rank == "memory" else
        f"ranked by predicted tokens/s per GPU among candidates that fit; within {TIE:.0%} "
        "the simpler one wins",
    ]

    def order(p: tuple[Estimate, StepEstimate]) -> tuple:
        """Fitting candidates fastest first, then those that do not fit."""
        return (not p[0].fits, per_token(p[1]) if p[0].fits else 0.0, simple(p))

    for e, st in sorted(scored, key=order):
        if e is best:
            continue
        if not e.fits:
            reasons.append(f"not {label(e.candidate)}: {why_not(e)}")
            continue
        ratio = per_token(st) / per_token(best_step)
        if ratio >= 1:
            word = f"{ratio - 1:.0%} slower" if ratio > 1 + 0.005 else "as fast"
        else:
            word = f"{1 - ratio:.0%} faster but more complex (within the tie)"
        reasons.append(f"not {label(e.candidate)}: fits, {word} (step {st.step_time_s:.3g} s)")
    if c.strategy in EQUIVALENT:
        reasons.append(f"named equivalent: {c.strategy} ~ {EQUIVALENT[c.strategy]}")
    return Recommendation(candidate=c, reasons=tuple(reasons))


def plan(r: Request, rank: str = "throughput") -> Answer:
    r = r.resolved()
    skipped: list[str] = []
    estimates = evaluate(r, offload_modes(r), skipped)
    if not any(e.fits for e in estimates):
        if r.options.tp is None and Offload.NONE in offload_modes(r):
            # tensor parallel (torchtitan's 2-D mesh) beside offload
            estimates += evaluate_auto_tp(r)
        if r.options.offloads is None:
            # combinations that don't exist are left out silently here
            estimates += evaluate(r, OFFLOAD_ORDER[1:])
    steps = tuple(estimate_step(r.model, r.training, r.cluster, e.candidate,
                                r.runtime.assumptions) for e in estimates)
    ddp: dict = {}
    for e in estimates:
        ck = e.candidate.checkpointing
        if ck not in ddp:
            ddp[ck] = estimate_step(r.model, r.training, r.cluster,
                                    Candidate(strategy=Strategy.DDP, checkpointing=ck),
                                    r.runtime.assumptions)
    rec = recommend(estimates, steps, r.cluster.n_nodes > 1, rank)
    need = None if rec is not None else min_gpus(r, start=r.cluster.n_gpus + 1)
    return Answer(request=r, estimates=tuple(estimates), steps=steps,
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


def find(r: Request, what: str, rank: str = "throughput") -> Found:
    """Answer `--find`: the fewest GPUs, or the largest micro-batch / sequence that fits,
    with the request's own strategies, offload and checkpointing."""
    if what == "min-gpus":
        n = min_gpus(r)
        return Found(question=what, value=n, answer=plan(r if n is None else r.with_gpus(n), rank))
    field = {"max-micro-batch": "micro_batch", "max-seq": "seq"}[what]
    v = largest(lambda v: fits_any(r.with_training(**{field: v})), FIND_LIMIT[what])
    return Found(question=what, value=v, answer=plan(r.with_training(**{field: v or 1}), rank))
