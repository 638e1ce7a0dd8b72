"""From a request to an answer: expand candidates, estimate each, pick a recommendation.

The recommendation is the fastest candidate that fits (planner/throughput.py's step time);
candidates within ``TIE`` of the fastest count as tied and the simplest of them wins, in the
order an engineer would try things (planner/candidates.py ``preference_key``): DDP,
SHARD_GRAD_OP, HYBRID_SHARD (multi-node only), FULL_SHARD, the ZeRO stages, NO_SHARD; lighter
checkpointing before heavier; no offload before offload. ``plan(..., rank="memory")`` ranks by
that order alone.

Every rule is written once, over ``Points``: which candidates are listed and with which
checkpointing (``listing``), tensor parallel when nothing fits (``evaluate_auto_tp``), offload
when nothing fits, the recommendation (``best_index``) and the fewest GPUs (``fits_any``,
``fewest_gpus``). ``One`` is a single configuration of plain numbers (``plan``, ``find``); the
report's sweep (planner/report/sweep.py ``Grid``) is many configurations as numpy arrays, one
per element. The rules read numbers through ``planner.vec``, so both front ends run the same
code and a report row cannot disagree with the plan of its configuration.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

from planner.lazy_dataclass import dataclass
from planner import vec
from planner.candidates import (
    EQUIVALENT,
    OFFLOAD_ORDER,
    TP_DEGREES,
    checkpointing_modes,
    expand,
    fit_first_key,
    label,
    listed_at,
    preference_key,
    tp_problem,
)
from planner.memory import Estimate, estimate
from planner.request import Request
from planner.search import MAX_GPUS_SEARCHED, Counts, and_not, any_true, first_true, largest
from planner.spec import Candidate, Checkpointing, Offload, Strategy
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

    def least_risk(self) -> tuple[Estimate, StepEstimate] | tuple[None, None]:
        """When nothing fits: the candidate at risk with the least probability of running out
        of memory (then the fastest), and its step; (None, None) if none is at risk."""
        pairs = [(e, st) for e, st in zip(self.estimates, self.steps)
                 if e.outcome == "at_risk"]
        if not pairs:
            return None, None
        return min(pairs, key=lambda p: (p[0].oom_probability, per_token(p[1])))

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


# ---------------------------------------------------------------------------------------------
# Where the rules are evaluated


class Points(Protocol):
    """One configuration or many: the GPU count, the GPU and its node, the sequence length and
    micro-batch per point (numbers, or numpy arrays with one configuration per element);
    everything else is ``request``'s (model, training run, options, runtime terms)."""

    request: Request
    modes: tuple[Checkpointing, ...]
    """The checkpointing modes each (strategy, offload, TP degree) tries, lightest first."""
    n_gpus: Any
    gpus_per_node: Any
    levels: int
    """How many steps of the GPU-count bisection to ask at once (planner.search.bisect)."""

    def estimate(self, c: Candidate) -> Estimate: ...

    def step(self, c: Candidate) -> StepEstimate: ...

    def fits(self, c: Candidate, among: Any) -> Any:
        """``estimate(c).fits``, read only where ``among``."""

    def each(self, rule: Callable[[int, int], bool]) -> Any:
        """``rule(n_gpus, gpus_per_node)`` at every point (a scalar rule: ``tp_problem``)."""

    def with_gpus(self, n: Any) -> Points:
        """The same points at other GPU counts."""

    def search(self, queries: list[tuple[Any, Any]], rule: Callable[[Points], Any]
               ) -> list[Any]:
        """``rule`` at each query's GPU counts ``(n, live)``, where live (elsewhere False)."""


class One:
    """The plan's points: one configuration, plain numbers (``--global-batch`` resolved)."""

    def __init__(self, r: Request, _counts: dict[int, One] | None = None) -> None:
        self.request = r = r.resolved()
        self.modes = checkpointing_modes(r.options.checkpointing)
        if r.training.ep > 1 and (r.options.tp or 1) > 1:
            # EP x TP under selective checkpointing is not traced (expert_parallel.
            # ep_tp_problem refuses it when asked): `auto` tries none and full
            self.modes = tuple(m for m in self.modes if m is not Checkpointing.SELECTIVE)
        self.n_gpus, self.gpus_per_node = r.cluster.n_gpus, r.cluster.gpus_per_node
        self._estimates: dict[Candidate, Estimate] = {}
        self._counts = {} if _counts is None else _counts
        """The same request at other GPU counts, shared by all of them (a search asks a
        count's estimates more than once)."""
        self._counts[self.n_gpus] = self

    def estimate(self, c: Candidate) -> Estimate:
        if c not in self._estimates:
            self._estimates[c] = _estimate(self.request, c)
        return self._estimates[c]

    def step(self, c: Candidate) -> StepEstimate:
        r = self.request
        return estimate_step(r.model, r.training, r.cluster, c, r.runtime.assumptions)

    def fits(self, c: Candidate, among: Any = True) -> bool:
        return self.estimate(c).fits

    def each(self, rule: Callable[[int, int], bool]) -> bool:
        return rule(self.n_gpus, self.gpus_per_node)

    def with_gpus(self, n: int) -> One:
        n = int(n)
        if n not in self._counts:
            One(self.request.with_gpus(n), self._counts)
        return self._counts[n]

    levels = 1
    """A search asks one count at a time: each answer is a plan's worth of estimates."""

    def search(self, queries: list[tuple[int, bool]], rule: Callable[[Points], Any]
               ) -> list[bool]:
        return [bool(rule(self.with_gpus(n))) if live else False for n, live in queries]


def multi_node(at: Points) -> Any:
    return at.n_gpus > at.gpus_per_node


def tp_allowed(at: Points, tp: int) -> Any:
    """Where the model and the node allow TP ``tp`` (``tp_problem`` finds nothing)."""
    model, ep = at.request.model, at.request.training.ep
    return at.each(lambda n, gpn: tp_problem(model, tp, n, gpn, ep) is None)


def offload_modes(r: Request, *, for_fit: bool = False) -> tuple[Offload, ...]:
    """The offload modes the request allows; 'auto' allows all of them to fit, shown only
    when nothing else fits."""
    if r.options.offloads is not None:
        return r.options.offloads
    return OFFLOAD_ORDER if for_fit else (Offload.NONE,)


# ---------------------------------------------------------------------------------------------
# Which candidates are listed


@dataclass(frozen=True, slots=True)
class Listed:
    """One (strategy, offload, TP degree) of a plan and where it is listed."""

    tries: tuple[Candidate, ...]
    """Its checkpointing modes, lightest first."""
    shown: Any
    """Where it is listed (a bool, or a bool array over the points)."""
    pick: Any
    """Which of ``tries`` is listed there: the lightest that fits, else the heaviest."""
    fits: Any
    """Whether that one fits (read where shown)."""


def lightest_fitting(at: Points, tries: Sequence[Candidate], among: Any) -> tuple[Any, Any]:
    """`--checkpointing auto` (one mode: that one), per point of ``among``: the index of the
    lightest of ``tries`` that fits, else the heaviest's, and whether it fits. Tries them in
    order and stops once every point has one."""
    pick, fit, open_ = len(tries) - 1, False, among
    for i, c in enumerate(tries):
        if not any_true(open_):
            break
        f = at.fits(c, open_) & open_
        pick = vec.where(f, i, pick)
        fit = fit | f
        open_ = and_not(open_, f)
    return pick, fit


def _listed(at: Points, groups: Iterable[tuple[Candidate, ...]], where: Any) -> list[Listed]:
    out = []
    for tries in groups:
        shown = where & listed_at(tries[0], at.n_gpus)
        if any_true(shown):
            out.append(Listed(tries, shown, *lightest_fitting(at, tries, shown)))
    return out


AUTO_TP_STRATEGIES = (Strategy.FULL_SHARD, Strategy.HYBRID_SHARD)
"""What `--tp auto` composes with TP: FSDP2 over the data-parallel mesh dimension as
torchtitan's 2-D (and HSDP 3-D) meshes do."""


def evaluate_auto_tp(at: Points, need: Any) -> list[Listed]:
    """`--tp auto` where ``need`` (nothing fits without TP): per FSDP strategy of the request
    that composes with TP (HYBRID_SHARD only across nodes), the smallest TP degree the model
    and the node allow that fits (with the lightest checkpointing that fits), or the largest
    when none does, as `--checkpointing auto` picks a mode."""
    out = []
    for s in at.request.options.strategies:
        if s not in AUTO_TP_STRATEGIES:
            continue
        want = need & (multi_node(at) if s is Strategy.HYBRID_SHARD else True)
        if not any_true(want):
            continue
        tried, chosen, done = [], 0, False
        for tp in TP_DEGREES:
            todo = and_not(want & tp_allowed(at, tp), done)
            if not any_true(todo):
                continue
            (tries,) = expand((s,), (Offload.NONE,), at.modes, None, tps=(tp,))
            pick, fit = lightest_fitting(at, tries, todo)
            chosen = vec.where(todo, tp, chosen)
            done = done | fit
            tried.append((tp, tries, pick, fit))
        for tp, tries, pick, fit in tried:
            shown = want & (chosen == tp)
            if any_true(shown):
                out.append(Listed(tries, shown, pick, fit))
    return out


def listing(at: Points, skipped: list[str] | None = None) -> list[Listed]:
    """The candidates a plan lists at each point, in its order: per (strategy, offload, TP
    degree) of the request, its checkpointing (``lightest_fitting``); where none of them
    fits, TP (`--tp auto`: ``evaluate_auto_tp``) and then CPU offload (`--offload auto`)
    beside them. ``skipped`` collects the requested combinations that do not exist."""
    r = at.request
    o = r.options
    tps = (o.tp or 1,)
    out = _listed(at, expand(o.strategies, offload_modes(r), at.modes, None, skipped, tps=tps),
                  True)
    nothing = True
    for g in out:
        nothing = and_not(nothing, g.shown & g.fits)
    if any_true(nothing):
        if o.tp is None and Offload.NONE in offload_modes(r):
            # tensor parallel (torchtitan's 2-D mesh) beside offload
            out += evaluate_auto_tp(at, nothing)
        if o.offloads is None:
            # combinations that don't exist are left out silently here
            out += _listed(at, expand(o.strategies, OFFLOAD_ORDER[1:], at.modes, None,
                                      tps=tps), nothing)
    return out


# ---------------------------------------------------------------------------------------------
# The fewest GPUs


def fit_tries(at: Points) -> list[Candidate]:
    """Every candidate the request allows a fit with, most memory saved first: its
    strategies, checkpointing modes and offload modes (offload 'auto': all of them) and, with
    `--tp auto`, the TP degrees of the strategies that compose with TP."""
    o = at.request.options
    tps = (o.tp,) if o.tp is not None else (1,) + TP_DEGREES
    return [c for c in sorted((c for group in expand(o.strategies,
                                                     offload_modes(at.request, for_fit=True),
                                                     at.modes, None, tps=tps, quiet_tp=True)
                               for c in group), key=fit_first_key)
            if not (c.tp > 1 and o.tp is None and c.strategy not in AUTO_TP_STRATEGIES)]


def runs_at(at: Points, c: Candidate) -> Any:
    """Where ``c`` may run at these points' GPU counts: listed there (one GPU answers FSDP
    with DDP's row), its TP degree allowed by the model and the node, and, under `--tp auto`,
    HYBRID_SHARD composed with TP across nodes only."""
    ok = listed_at(c, at.n_gpus)
    if c.tp > 1:
        ok = ok & tp_allowed(at, c.tp)
        if at.request.options.tp is None and c.strategy is Strategy.HYBRID_SHARD:
            ok = ok & multi_node(at)
    return ok


def fits_any(at: Points | Request, among: Any = True) -> Any:
    """Whether some candidate of the request fits (``fit_tries``, where ``runs_at``), per
    point of ``among``."""
    if isinstance(at, Request):
        at = One(at)
    ok: Any = False
    for c in fit_tries(at):
        todo = and_not(among & runs_at(at, c), ok)
        if not any_true(todo):
            continue
        ok = ok | (at.fits(c, todo) & todo)
        if not any_true(and_not(among, ok)):
            break
    return ok


def fewest_gpus(at: Points, start: int = 1) -> tuple[Any, Any]:
    """`--find min-gpus` per point: (found, n), the fewest GPUs of the type (>= start, up to
    planner.search.MAX_GPUS_SEARCHED) for which a candidate of the request fits.

    Fitting is not monotone in the GPU count, so each candidate is searched on its own
    (``first_fit``), most memory saved first, each below the fewest found so far; one GPU
    (no NCCL, no DDP buckets) is asked on its own."""
    none = MAX_GPUS_SEARCHED + 1
    best: Any = at.gpus_per_node * 0 + none
    if start <= 1:
        (one,) = at.search([(at.gpus_per_node * 0 + 1, True)], fits_any)
        best = vec.where(one, 1, best)
    for c in fit_tries(at):
        best = vec.minimum(best, first_fit(at, c, max(start, 2), best))
    return best < none, best


def _padded(r: Request, c: Candidate) -> bool:
    """Whether FSDP2 pads ``c``'s stacked expert weights by a shard degree that grows with
    the GPU count (planner.memory.states.expert_padding)."""
    return (r.model.is_moe and r.training.fsdp_version == 2
            and c.strategy in (Strategy.FULL_SHARD, Strategy.SHARD_GRAD_OP,
                               Strategy.HYBRID_SHARD))


def _grows(c: Candidate) -> bool:
    """Whether ``c``'s device memory grows with its shard degree: ZeRO-3 with the parameters
    offloaded keeps only the persistent parameters on the GPU, each whole on every rank
    (planner.memory.zero.zero_states: (p - ceil(p / d)) x bytes), beside terms that do not
    depend on the degree."""
    return c.strategy is Strategy.ZERO3 and c.offload is Offload.PARAMS_AND_OPTIMIZER


def count_step(r: Request, c: Candidate) -> int:
    """The GPU counts ``c`` runs on are multiples of this within a node: its TP degree, or
    for ZeRO-3 with ZeRO++ hpZ the hpZ group, which DeepSpeed requires to divide the GPUs
    (planner.memory.zero.zeropp_problem); counts below the group (where it would be the
    whole world) are not searched."""
    h = r.training.deepspeed.zero_hpz_partition_size
    if c.strategy is Strategy.ZERO3 and h > 1:
        return h
    return c.tp


def first_fit(at: Points, c: Candidate, start: int, below: Any) -> Any:
    """The fewest GPUs (>= start > 1, < below) at which ``c`` fits, per point; ``below``
    where none does. Searched over the counts its TP degree runs on (planner.search.Counts),
    by bisection on stretches of them where fitting has a known shape:

    * device memory per GPU does not grow with the count (the states shard, the rest is per
      GPU), except (a) where FSDP2 pads stacked MoE experts to ceil(E / d) rows per rank
      (d ranks): there the gathered and reduce-scattered experts grow as d x ceil(E / d),
      so on each stretch of counts with the same ceil(E / d) device memory is convex (a
      falling sharded part plus a rising padded one), and the counts where the device fits
      are a run; and (b) ZeRO-3 with the parameters offloaded (``_grows``), where it does not
      fall (the persistent parameters held whole grow as p - ceil(p / d)): convex too, one
      stretch;
    * host RAM per node grows with the ranks on it within a node (a process, and its share
      of offloaded states, each; past the experts, a padded stretch's d x ceil(E / d)), and
      does not grow past one node (ranks per node fixed, shares shrinking).

    Within a node: the first count where the device fits, if the host fits there (past it,
    the host only fits less). Past a node: the first count that fits on the run where the
    device fits. A node boundary is a boundary of stretches too (HYBRID_SHARD adds a
    communicator there). tests/test_min_gpus.py and benchmarks/fuzz.py check found minima
    against a plan of every count."""
    r = at.request
    # the counts its TP group or hpZ group divides, times a context-parallel group beside it
    # (or an expert-parallel group: never both, planner/expert_parallel.py ep_problem)
    t = count_step(r, c) * r.training.cp * r.training.ep
    counts = Counts(at.gpus_per_node, t)
    runs = at.each(lambda n, gpn: c.tp <= gpn)  # a TP group lives inside a node
    if c.tp > 1:  # and the model allows it (or not, at any count)
        runs = runs & at.with_gpus(at.gpus_per_node * 0 + c.tp).each(
            lambda n, gpn: tp_problem(r.model, c.tp, n, max(gpn, n), r.training.ep) is None)
    lo = counts.index_of(start)
    end = vec.minimum(counts.last_index(MAX_GPUS_SEARCHED), counts.index_of(below) - 1) + 1
    end = vec.where(runs, end, lo)
    within = counts.within

    def ask(rule: Callable[[Points], Any]) -> Callable[[list[tuple[Any, Any]]], list[Any]]:
        return lambda qs: at.search([(counts.at(i), live & (i < end)) for i, live in qs], rule)

    def fits(p: Points) -> Any:
        ok = runs_at(p, c)
        return p.fits(c, ok) & ok

    def device_fits(p: Points) -> Any:
        return p.estimate(c).fits_gpu

    def device_misses(p: Points) -> Any:
        return and_not(True, p.estimate(c).fits_gpu)

    def rises(p: Points) -> Any:
        """Device memory at the next count is no less than here."""
        step = Counts(p.gpus_per_node, t)
        nxt = p.with_gpus(step.at(step.index_of(p.n_gpus) + 1))
        return nxt.estimate(c).required_bytes >= p.estimate(c).required_bytes

    def search(rule: Callable[[Points], Any], a: Any, b: Any, where: Any, **how: bool) -> Any:
        return first_true(ask(rule), vec.where(where, a, b), b, levels=at.levels, **how)

    found: Any = below
    padded = _padded(r, c)
    if not (padded or _grows(c)):
        # within a node: the first count where the device fits, if the host fits there
        b_end = vec.minimum(within, end)
        todo = lo < b_end
        dev = search(device_fits, lo, b_end, todo, top=True)
        (ok,) = ask(fits)([(dev, todo & (dev < b_end))])
        ok = ok & todo & (dev < b_end)
        found = vec.where(ok, counts.at(dev), found)
        # past a node: fitting does not turn false again
        a = vec.maximum(lo, within)
        todo = and_not(a < end, ok)
        i = search(fits, a, end, todo, top=True)
        return vec.where(todo & (i < end), counts.at(i), found)
    experts = r.model.n_experts
    # past a node the padding goes on growing (HYBRID_SHARD: a node's ranks, fixed)
    multi_padded = padded and c.strategy is not Strategy.HYBRID_SHARD
    pos, active = lo, lo < end
    while any_true(active):
        n = counts.at(pos)
        inside = pos < within
        if padded and r.training.ep > 1:
            # torchtitan's EP places the experts its own way (dim 0, then dim 1 past E)
            from planner.expert_parallel import padding_stretch_end

            same = vec.minimum(padding_stretch_end(r.model, r.training.ep, n),
                               MAX_GPUS_SEARCHED)
        elif padded:
            q = vec.ceil_div(experts, n)
            same = vec.where(q >= 2, (experts - 1) // vec.maximum(q - 1, 1), MAX_GPUS_SEARCHED)
            if not multi_padded:
                same = vec.where(inside, same, MAX_GPUS_SEARCHED)
        else:
            same = n * 0 + MAX_GPUS_SEARCHED
        stop = vec.minimum(vec.minimum(counts.last_index(same) + 1,
                                       vec.where(inside, within, end)), end)
        # device memory is convex on [pos, stop): its lowest point, the first count that fits
        low = search(rises, pos, stop - 1, active, gallop=True)
        dev = search(device_fits, pos, low + 1, active, top=True)
        has = active & (dev <= low)
        (here,) = ask(fits)([(dev, has & inside)])
        ok = has & inside & here
        # past a node: the last count the device fits, and the first that fits up to it
        last = search(device_misses, low, stop, and_not(has, inside)) - 1
        i = search(fits, dev, last + 1, and_not(has, inside), top=True)
        ok = ok | (and_not(has, inside) & (i <= last))
        found = vec.where(ok, counts.at(vec.where(inside, dev, i)), found)
        active = and_not(active & (stop < end), ok)
        pos = stop
    return found


def min_gpus(r: Request, start: int = 1) -> int | None:
    """Fewest GPUs of this type (>= start) for which a candidate of the request fits."""
    if r.training.pipeline.enabled:
        return pipeline_min_gpus(r, start)
    if r.training.optimizer_in_backward:
        # modelled on one GPU only (planner.request.in_backward_problem)
        return 1 if start <= 1 and fits_any(r.with_gpus(1)) else None
    found, n = fewest_gpus(One(r), start)
    return n if found else None


def pipeline_min_gpus(r: Request, start: int) -> int | None:
    """Under ``--pp``: the fewest GPUs pp x tp x dp (dp >= 2 data-parallel ranks per stage;
    tp the given TP degree of each stage, 1 without; under ``--cp`` dp = dp_shard x cp, so
    the GPUs step by pp x tp x cp) at or above ``start`` that fit. The pipeline, its TP and
    its CP are fixed, so more GPUs only shard each stage's states over more ranks: the need
    falls with dp, and the first fit is found by bisection over dp_shard
    (``MAX_GPUS_SEARCHED`` at most)."""
    cp = r.training.cp
    # the GPUs of one dp_shard rank: its pipeline, TP and CP groups
    pp = r.training.pipeline.degree * (r.options.tp or 1) * cp
    lo, hi = max(-(-2 // cp), -(-start // pp)), MAX_GPUS_SEARCHED // pp

    def ok(dp: int) -> bool:
        return bool(fits_any(r.with_gpus(pp * dp)))

    if lo > hi or not ok(hi):
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if ok(mid) else (mid + 1, hi)
    return pp * lo


def _gib(x: int) -> str:
    return f"{x / 2**30:.1f} GiB"


def interval(e: Estimate) -> str:
    """' (90% interval 67.3-101.8 GiB)' after a need, or '' without a risk band."""
    if e.risk is None:
        return ""
    return (f" ({e.risk.coverage:.0%} interval {e.required_low_bytes / 2**30:.1f}-"
            f"{_gib(e.required_high_bytes)})")


def why_not(e: Estimate) -> str:
    if not e.fits_host:
        return (f"does not fit, host RAM {_gib(e.host_bytes_per_node)} per node exceeds "
                f"{_gib(e.host_capacity_bytes)}")
    if e.outcome == "at_risk":
        return (f"at risk, needs {_gib(e.required_bytes)}{interval(e)} per GPU of the usable "
                f"{_gib(e.usable_bytes)}: {e.oom_probability:.0%} probability of running out "
                "of memory")
    over = e.required_bytes - e.usable_bytes
    return (f"does not fit, needs {_gib(e.required_bytes)}{interval(e)} per GPU, "
            + (f"{_gib(over)} over the usable {_gib(e.usable_bytes)}" if over > 0 else
               f"more than the usable {_gib(e.usable_bytes)} at the interval's low end"))


def best_index(candidates: Sequence[Candidate], fits: Sequence[Any], per_token: Sequence[Any],
               multi_node: Any, tie: float = TIE) -> Any:
    """The recommendation's rule, per point: the index of the candidate that fits with the
    least time per token per GPU or, within ``tie`` of it, the simplest (``preference_key``,
    multi-node or not); -1 where none fits."""
    fastest: Any = math.inf
    for f, t in zip(fits, per_token):
        fastest = vec.where(f, vec.minimum(fastest, t), fastest)
    ranks = {}
    for multi in (False, True):
        order = sorted(range(len(candidates)),
                       key=lambda i: preference_key(candidates[i], multi))
        ranks[multi] = {i: k for k, i in enumerate(order)}
    best: Any = -1
    best_rank: Any = len(candidates)
    for i, (f, t) in enumerate(zip(fits, per_token)):
        rank = vec.where(multi_node, ranks[True][i], ranks[False][i])
        better = f & (t <= fastest * (1 + tie)) & (rank < best_rank)
        best = vec.where(better, i, best)
        best_rank = vec.where(better, rank, best_rank)
    return best


def per_token(st: StepEstimate) -> Any:
    """Time per token per GPU: under tensor parallel a step trains 1/tp of the tokens per GPU,
    so step times compare only through tokens/s/GPU."""
    return 1.0 / st.tokens_per_s_per_gpu


def recommend(estimates: Sequence[Estimate], steps: Sequence[StepEstimate], multi_node: bool,
              rank: str = "throughput") -> Recommendation | None:
    """The fastest candidate that fits; ties (within TIE) go to the simplest."""
    scored = list(zip(estimates, steps))
    i = best_index([e.candidate for e in estimates], [e.fits for e in estimates],
                   [per_token(st) for st in steps], multi_node,
                   math.inf if rank == "memory" else TIE)
    if i < 0:
        return None
    best, best_step = scored[i]

    def simple(pair: tuple[Estimate, StepEstimate]) -> tuple[int, int, int, int]:
        return preference_key(pair[0].candidate, multi_node)

    c = best.candidate
    reasons = [
        f"{label(c)} fits: needs {_gib(best.required_bytes)}{interval(best)} of "
        f"{_gib(best.usable_bytes)} usable per GPU ({_gib(best.headroom_bytes)} headroom); "
        f"step {best_step.step_time_s:.3g} s, "
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


def plan(r: Request, rank: str = "throughput", *, search_fewest: bool = True,
         references: bool = True) -> Answer:
    """The plan of a request; ``search_fewest=False`` skips the fewest-GPUs search when
    nothing fits (``min_gpus`` None: the mesh search plans many layouts and asks it once);
    ``references=False`` leaves ``ddp_steps`` empty (the mesh search shows the plan of one
    layout and adds them to it: ``with_references``)."""
    at = One(r)
    r = at.request
    skipped: list[str] = []
    estimates = [at.estimate(g.tries[g.pick]) for g in listing(at, skipped)]
    steps = tuple(at.step(e.candidate) for e in estimates)
    rec = recommend(estimates, steps, r.cluster.n_nodes > 1, rank)
    need = None if rec is not None or not search_fewest else min_gpus(
        r, start=r.cluster.n_gpus + 1)
    return Answer(request=r, estimates=tuple(estimates), steps=steps,
                  ddp_steps=reference_steps(at, estimates) if references else (),
                  recommendation=rec, min_gpus=need, skipped=tuple(skipped))


def reference_steps(at: One, estimates: Sequence[Estimate]) -> tuple[StepEstimate, ...]:
    """``Answer.ddp_steps``: per estimate, DDP's step with its checkpointing (one per mode)."""
    ddp: dict = {}
    for e in estimates:
        ck = e.candidate.checkpointing
        if ck not in ddp:
            ddp[ck] = at.step(Candidate(strategy=Strategy.DDP, checkpointing=ck))
    return tuple(ddp[e.candidate.checkpointing] for e in estimates)


def with_references(a: Answer) -> Answer:
    """``a`` (planned with ``references=False``) with its ``ddp_steps``, as ``plan`` gives
    them."""
    return dataclasses.replace(a, ddp_steps=reference_steps(One(a.request), a.estimates))


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
    v = largest(lambda v: bool(fits_any(r.with_training(**{field: v}))), FIND_LIMIT[what])
    return Found(question=what, value=v, answer=plan(r.with_training(**{field: v or 1}), rank))
