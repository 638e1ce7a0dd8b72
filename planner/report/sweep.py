"""The sweep: every configuration of a report request, planned by planner.plan's own rules.

Per model, the GPU types that share their runtime terms (a calibration changes them) form one
``Setup``; a ``Grid`` is planner.plan's ``Points`` over it, one configuration per element of
numpy arrays (GPU type, GPU count, sequence length, micro-batch). planner.plan's rules run on
it as they run on one configuration: ``listing`` (the candidates, `--checkpointing auto`,
`--tp auto`, `--offload auto`), ``best_index`` (the recommendation: tokens/s per GPU, ties to
the simplest) and ``fewest_gpus`` (the fewest GPUs: ``fits_any`` and the bisection). The
numbers are ``planner.memory.estimator.evaluate`` and ``planner.throughput.step_core`` over
``step_inputs_at``, the functions `fitcheck plan` runs, on arrays. So a row is the plan's
candidate at that configuration, and a row flagged ``best`` is what `fitcheck --model M --gpu
G --n N --seq T --micro-batch B` (with the report's other flags) recommends; tests/
test_report_plan.py checks both on drawn requests. Nothing here computes a byte, a second or a
rule; it converts units (tokens to train / throughput, GPU-hours x price) and lays out rows.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import field
from typing import Any

import numpy as np

from planner.lazy_dataclass import dataclass
from planner.candidates import OFFLOAD_ORDER, label, tp_problem
from planner.error_bands import RiskBand
from planner.memory import PHASES, Estimate, Phase
from planner.memory.estimator import (
    activation_plan,
    adapter_input_bytes,
    evaluate,
    uses_autocast_amp,
)
from planner.memory.moments import Activations
from planner.plan import (
    Listed,
    best_index,
    fewest_gpus,
    listing,
    multi_node,
    offload_modes,
    per_token,
)
from planner.report.progress import Progress
from planner.report.request import ReportRequest
from planner.request import Request
from planner.spec import Candidate, Checkpointing, Offload, Strategy
from planner.throughput import Rates, StepEstimate, step_core, step_inputs_at

COLUMNS = (
    "model", "gpu", "n", "nodes", "seq", "micro_batch", "grad_accum", "precision",
    "strategy", "checkpointing", "offload", "tp", "fits", "fits_gpu", "fits_host",
    "outcome", "oom_probability", "required_bytes", "device_used_bytes", "peak_allocated_bytes", "capacity_bytes",
    "usable_bytes",
    "host_bytes_per_node", "peak_phase", "step_time_s", "tokens_per_s_per_gpu", "tokens_per_s",
    "mfu", "train_days", "gpu_hours", "cost_usd", "best",
)  # fmt: skip
"""report.csv's columns, one row per configuration. ``best``: the planner's recommendation for
that (model, gpu, n, seq, micro_batch). outcome: fits / at_risk / does_not_fit, with
oom_probability (the interval of the need from the kind's measured error, docs/accuracy.md §5;
empty without a band). train_days / gpu_hours / cost_usd: to train
``tokens`` at this configuration's throughput (cost empty without a price)."""


@dataclass(slots=True, kw_only=True)
class Report:
    request: ReportRequest
    rows: Any
    """pandas.DataFrame, one row per configuration (COLUMNS)."""
    min_gpus: Any
    """pandas.DataFrame per model x gpu x seq x micro_batch: the fewest GPUs without offload
    (and with the request's offload, unless --offload none) and the recommended candidate
    there."""
    notes: list[str] = field(default_factory=list)
    sweep_s: float = 0.0


# ---------------------------------------------------------------------------------------------
# Configurations as arrays


class Setup:
    """One model on the GPU types that share their runtime terms (overheads, step-time
    assumptions): what every grid of it reads besides its elements. ``plans`` holds the plan's
    request of each GPU type; every (sequence length, micro-batch) is a ``pair``."""

    def __init__(self, plans: Sequence[Request], gpus: Sequence[int],
                 modes: Sequence[Checkpointing], seqs: Sequence[int],
                 micro_batches: Sequence[int]) -> None:
        self.plans, self.gpus = tuple(plans), np.asarray(gpus, dtype=np.int64)
        """The plan's requests, and their GPU types' indexes in the report request."""
        self.request, self.modes = plans[0], tuple(modes)
        pairs = [(s, b) for s in seqs for b in micro_batches]
        self.seq = np.array([s for s, _ in pairs], dtype=np.int64)
        self.mb = np.array([b for _, b in pairs], dtype=np.int64)
        clusters = [r.cluster for r in plans]
        self.gpn = np.array([c.gpus_per_node for c in clusters], dtype=np.int64)
        self.capacity = np.array([c.gpu.memory_bytes for c in clusters], dtype=np.int64)
        self.context = np.array([c.gpu.cuda_context_bytes for c in clusters], dtype=np.int64)
        self.host = np.array([c.host_ram_bytes_per_node for c in clusters], dtype=np.int64)
        rates = [Rates.of(r.cluster.gpu, r.training, r.runtime.assumptions) for r in plans]
        self.rates = {f: np.array([getattr(x, f) for x in rates], dtype=np.float64)
                      for f in Rates.__slots__}
        self._acts: dict[tuple, tuple[dict[str, np.ndarray], int]] = {}
        self._fits: dict[Candidate, tuple[np.ndarray, np.ndarray]] = {}
        self._by_count: dict[int, bool] = {}

    def known_fits(self, c: Candidate, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(known, fits) at the configurations ``keys`` (``Grid.keys``) where a search already
        evaluated ``c``: the two GPU-count searches (without offload, with it) ask the same
        counts until offload makes a difference."""
        seen, fit = self._fits.get(c, (np.zeros(0, np.int64), np.zeros(0, bool)))
        if not len(seen):
            return np.zeros(len(keys), bool), np.zeros(len(keys), bool)
        pos = np.minimum(np.searchsorted(seen, keys), len(seen) - 1)
        known = seen[pos] == keys
        return known, fit[pos] & known

    def column(self, request: Request, n: int) -> Grid:
        """Every GPU type and pair of the setup at ``n`` GPUs."""
        k, pairs = len(self.plans), len(self.seq)
        return Grid(self, request, np.repeat(np.arange(k, dtype=np.int64), pairs),
                    np.full(k * pairs, n, np.int64), np.tile(np.arange(pairs, dtype=np.int64), k))

    def by_count(self, c: Candidate, n: np.ndarray) -> np.ndarray:
        """Where the memory model must see the GPU count as a number, not an array element:
        planner.memory.zero.step_elems replays ZeRO-3's sub-groups (``sub_group_size``) for
        an int data-parallel degree and bounds them for arrays; where the two answers differ
        (a partition larger than a sub-group) the grid evaluates one count at a time."""
        if c.strategy is not Strategy.ZERO3 or c.offload is not Offload.NONE:
            return np.zeros(len(n), bool)
        uniq, inverse = np.unique(n, return_inverse=True)
        for d in uniq:
            if int(d) not in self._by_count:
                self._by_count[int(d)] = zero3_replayed(self.request, int(d))
        return np.array([self._by_count[int(d)] for d in uniq], bool)[inverse.reshape(-1)]

    def remember_fits(self, c: Candidate, keys: np.ndarray, fits: np.ndarray) -> None:
        seen, fit = self._fits.get(c, (np.zeros(0, np.int64), np.zeros(0, bool)))
        seen, first = np.unique(np.concatenate([seen, keys]), return_index=True)
        self._fits[c] = seen, np.concatenate([fit, fits])[first]

    def activations(self, c: Candidate) -> tuple[dict[str, np.ndarray], int]:
        """Activation totals per pair (the planner's count of each distinct (mb, seq)), and
        the residual stream's bytes per element."""
        r = self.request
        training = r.training
        # what the count depends on beyond (mb, seq): the checkpointing, the AMP regime, the
        # adapters' input copies (strategy family), the TP degree and whether the weights are
        # FSDP's unsharded copies (TRL's activation offloading skips parameters' storages)
        key = (c.checkpointing, uses_autocast_amp(c.strategy), adapter_input_bytes(training, c),
               c.tp, c.strategy.is_fsdp)
        if key not in self._acts:
            scale = r.runtime.overheads.activation_scale
            acts = []
            for s, b in zip(self.seq, self.mb):
                p = activation_plan(r.model, dataclasses.replace(
                    training, micro_batch=int(b), seq=int(s)), c)
                # a calibration's activation scale, as planner.memory.estimate applies it
                acts.append(Activations.of(p if scale == 1.0 else p.scaled(scale)))
            self._acts[key] = ({f: np.array([getattr(a, f) for a in acts], dtype=np.int64)
                                for f in Activations.__slots__ if f != "residual_bytes"},
                               acts[0].residual_bytes)
        return self._acts[key]


LEVELS = 3
"""Steps of the GPU-count bisection a grid asks at once (planner.search.bisect): 7 counts
per search and round, a third of the rounds; each candidate's estimate costs about the same
on a few hundred elements as on a few dozen."""


class Grid:
    """planner.plan's ``Points`` over a ``Setup``: per element a GPU type (an index into
    ``setup.plans``), a GPU count and a (sequence length, micro-batch) pair. Estimates and
    steps are computed once per candidate on every element; ``whole=False`` (the searches)
    evaluates ``fits`` only on the elements a rule still asks about."""

    def __init__(self, setup: Setup, request: Request, gpu: np.ndarray, n: np.ndarray,
                 pair: np.ndarray, *, whole: bool = True,
                 offloads: dict[Offload, np.ndarray] | None = None) -> None:
        self.setup, self.request, self.modes = setup, request, setup.modes
        self.gpu, self.pair = gpu, pair
        self.offloads = offloads
        """Where each offload mode of the request may be used (None: everywhere): searches
        with different offload modes stacked in one grid (``_min_gpus``)."""
        self.n_gpus = np.asarray(n, dtype=np.int64)
        self.gpus_per_node = setup.gpn[gpu]
        self.seq, self.mb = setup.seq[pair], setup.mb[pair]
        self.whole = whole
        self._estimates: dict[Candidate, Estimate] = {}
        self._steps: dict[Candidate, StepEstimate] = {}

    def __len__(self) -> int:
        return len(self.n_gpus)

    def take(self, idx: np.ndarray) -> Grid:
        return Grid(self.setup, self.request, self.gpu[idx], self.n_gpus[idx], self.pair[idx])

    def with_gpus(self, n: Any) -> Grid:
        return Grid(self.setup, self.request, self.gpu, n, self.pair, whole=False,
                    offloads=self.offloads)

    levels = LEVELS

    def search(self, queries: list[tuple[Any, Any]], rule: Callable[[Grid], Any]
               ) -> list[np.ndarray]:
        """``rule`` once over every query's live elements at its counts, stacked."""
        size = len(self)
        idx = [np.flatnonzero(full(live, size)) for _, live in queries]
        at = np.concatenate(idx)
        n = np.concatenate([full(q, size)[i] for (q, _), i in zip(queries, idx)])
        got = (full(rule(Grid(self.setup, self.request, self.gpu[at], n, self.pair[at],
                              whole=False, offloads=None if self.offloads is None else
                              {m: v[at] for m, v in self.offloads.items()})), len(at))
               if len(at) else np.zeros(0, bool))
        out, k = [], 0
        for i in idx:
            answer = np.zeros(size, dtype=bool)
            answer[i] = got[k:k + len(i)]
            out.append(answer)
            k += len(i)
        return out

    def activations(self, c: Candidate) -> Activations:
        table, residual = self.setup.activations(c)
        return Activations(**{f: v[self.pair] for f, v in table.items()},
                           residual_bytes=residual)

    def estimate(self, c: Candidate) -> Estimate:
        if c not in self._estimates:
            one = self.setup.by_count(c, self.n_gpus)
            if not one.any():
                self._estimates[c] = self._evaluate(c, self.n_gpus)
            else:  # those counts one at a time (Setup.by_count), the rest at once
                parts = [(np.flatnonzero(one & (self.n_gpus == n)), int(n))
                         for n in np.unique(self.n_gpus[one])]
                if not one.all():
                    parts.append((np.flatnonzero(~one), None))
                self._estimates[c] = assemble(
                    [(idx, self.take(idx)._evaluate(c, n)) for idx, n in parts], len(self))
        return self._estimates[c]

    def _evaluate(self, c: Candidate, n: Any = None) -> Estimate:
        """planner.memory.estimator.evaluate at every element (``n``: the GPU count as one
        number for all of them, else the elements')."""
        s, r = self.setup, self.request
        with np.errstate(divide="ignore", invalid="ignore"):  # where TP cannot run: unread
            return evaluate(r.model, r.training, c,
                            n_gpus=self.n_gpus if n is None else n,
                            gpus_per_node=self.gpus_per_node, tokens=self.mb * self.seq,
                            acts=self.activations(c), capacity=s.capacity[self.gpu],
                            context=s.context[self.gpu], host_capacity=s.host[self.gpu],
                            margin=r.options.margin, ov=r.runtime.overheads)

    def step(self, c: Candidate) -> StepEstimate:
        if c not in self._steps:
            r = self.request
            rates = Rates(**{f: v[self.gpu] for f, v in self.setup.rates.items()})
            with np.errstate(divide="ignore", invalid="ignore"):
                self._steps[c] = step_core(step_inputs_at(
                    r.model, r.training, c, r.runtime.assumptions, seq=self.seq, mb=self.mb,
                    n=self.n_gpus, gpn=self.gpus_per_node, rates=rates))
        return self._steps[c]

    @property
    def keys(self) -> np.ndarray:
        """One integer per configuration: GPU count, GPU type, pair."""
        return (self.n_gpus << 32) | (self.gpu << 16) | self.pair

    def fits(self, c: Candidate, among: Any) -> np.ndarray:
        if self.offloads is not None:  # where the offload mode is not allowed: no fit
            among = among & self.offloads[c.offload]
        if self.whole or among is True:
            return full(self.estimate(c).fits, len(self)) & among
        idx = np.flatnonzero(among)
        keys = self.keys[idx]
        known, fits = self.setup.known_fits(c, keys)
        todo = idx[~known]
        one = self.setup.by_count(c, self.n_gpus[todo])
        for n in np.unique(self.n_gpus[todo][one]):
            # a count the memory model takes one at a time: every GPU type and pair at it,
            # for the steps to come
            column = self.setup.column(self.request, int(n))
            self.setup.remember_fits(c, column.keys, full(column.estimate(c).fits,
                                                          len(column)))
        if one.any():
            known, fits = self.setup.known_fits(c, keys)
            todo = idx[~known]
        if len(todo):
            fits[~known] = full(self.take(todo).estimate(c).fits, len(todo))
            self.setup.remember_fits(c, keys[~known], fits[~known])
        out = np.zeros(len(self), dtype=bool)
        out[idx] = fits
        return out

    def each(self, rule: Callable[[int, int], bool]) -> np.ndarray:
        key = (self.n_gpus << 20) | self.gpus_per_node
        uniq, inverse = np.unique(key, return_inverse=True)
        answers = np.array([rule(int(k >> 20), int(k & 0xFFFFF)) for k in uniq], dtype=bool)
        return answers[inverse.reshape(-1)]


def zero3_replayed(r: Request, degree: int) -> bool:
    """Whether ZeRO-3's optimizer step at this degree differs between an int degree (the
    sub-groups replayed) and an array of them (bounded): planner.memory.zero.step_elems asked
    both ways with the arguments the memory model gives it."""
    from planner.memory.zero import ordered_sizes, step_elems
    from planner.params import numel, trainable

    T = trainable(r.model, r.training.finetune)
    sizes = ordered_sizes(r.model, T)
    if not sizes:
        return False
    local = -(-T.train // degree)
    largest = -(-max((numel(s) for _, s, _ in T.groups), default=0) // degree)
    ds = r.training.deepspeed
    return bool(step_elems(Strategy.ZERO3, ds, local, largest, sizes, degree)
                != step_elems(Strategy.ZERO3, ds, local, largest, sizes, np.int64(degree)))


def assemble(parts: list[tuple[np.ndarray, Any]], size: int) -> Any:
    """One value of ``size`` elements from values of some of them (``(index, value)``): an
    Estimate, a Breakdown, a dict of them, or numbers (a moment as its index in PHASES)."""
    first = parts[0][1]
    if isinstance(first, (Candidate, str, tuple, RiskBand)):  # one candidate: one risk band
        return first
    if isinstance(first, dict):
        return {k: assemble([(i, v[k]) for i, v in parts], size) for k in first}
    if dataclasses.is_dataclass(first):
        return type(first)(**{f.name: assemble([(i, getattr(v, f.name)) for i, v in parts],
                                                size)
                              for f in dataclasses.fields(first)})
    values = [(i, PHASES.index(v) if isinstance(v, Phase) else v) for i, v in parts]
    out = np.zeros(size, dtype=np.result_type(*(np.asarray(v) for _, v in values)))
    for i, v in values:
        out[i] = v
    return out


def full(x: Any, size: int) -> np.ndarray:
    """A number or an array as an array of ``size`` elements."""
    return np.broadcast_to(np.asarray(x), (size,))


@dataclass(slots=True)
class Planned:
    """planner.plan's answer on a grid: every listed candidate with every checkpointing mode
    (each a row where its group is listed) and the recommendation."""

    entries: list[tuple[Listed, Candidate]]
    shown: np.ndarray
    """[entry, element]: where the entry is a row."""
    best: np.ndarray
    """Per element: the recommended entry, -1 where nothing fits."""


def plan_grid(g: Grid) -> Planned:
    """``listing`` and the recommendation (``best_index``) at every element of ``g``: the
    recommendation among the candidates the plan lists (per group, the checkpointing
    ``listing`` picks), as ``planner.plan.plan`` ranks them."""
    listed = listing(g)
    entries = [(lg, c) for lg in listed for c in lg.tries]
    size = len(g)
    shown = (np.stack([full(lg.shown, size) for lg, _ in entries]) if entries
             else np.zeros((0, size), dtype=bool))
    picked = []
    for lg, c in entries:
        here = full(lg.shown, size) & (full(lg.pick, size) == lg.tries.index(c))
        picked.append(g.fits(c, here) & here)
    best = best_index([c for _, c in entries], picked,
                      [full(per_token(g.step(c)), size) for _, c in entries], multi_node(g))
    return Planned(entries=entries, shown=shown, best=full(best, size))


# ---------------------------------------------------------------------------------------------
# The sweep


def _setups(req: ReportRequest) -> list[tuple[int, Setup]]:
    """Per model, its GPU types grouped by runtime terms (most often one group)."""
    out = []
    for mi, row in enumerate(req.plans):
        groups: dict[tuple, list[int]] = {}
        for gi, r in enumerate(row):
            groups.setdefault((r.runtime.overheads, r.runtime.assumptions), []).append(gi)
        for gis in groups.values():
            out.append((mi, Setup([row[gi] for gi in gis], gis, req.checkpointings, req.seqs,
                                  req.micro_batches)))
    return out


def _counts(req: ReportRequest) -> tuple[dict[int, list[int]], list[str]]:
    """Per GPU type, the swept counts it can run (any up to a node, then whole nodes); notes
    for the others."""
    ok, notes = {}, []
    for gi, (g, r) in enumerate(zip(req.gpus, req.plans[0])):
        gpn = r.cluster.gpus_per_node
        ok[gi] = [n for n in req.ns if n <= gpn or n % gpn == 0]
        bad = [n for n in req.ns if n not in ok[gi]]
        if bad:
            notes.append(f"{g.id}: skipped n = {', '.join(map(str, bad))} (not a multiple of "
                         f"its {gpn} GPUs per node)")
    return ok, notes


def _grid(req: ReportRequest, mi: int, setup: Setup, counts: dict[int, list[int]]
          ) -> tuple[Grid, list[str]]:
    """Every configuration of one setup in report order (GPU type, seq, micro-batch, n), and
    notes for the counts a requested TP degree cannot run (``tp_problem``, the check
    build_request makes of a plan's count)."""
    notes, cols = [], []
    tp = setup.request.options.tp
    for j, gi in enumerate(setup.gpus):
        ns, bad = counts[int(gi)], {}
        if tp is not None:
            problems = {n: tp_problem(setup.request.model, tp, n, int(setup.gpn[j]),
                                      setup.request.training.ep)
                        for n in ns}
            bad = {n: p for n, p in problems.items() if p}
            ns = [n for n in ns if n not in bad]
        if bad:
            notes.append(f"{req.models[mi][0]} on {req.gpus[int(gi)].id}: skipped n = "
                         f"{', '.join(map(str, bad))} (--tp {tp}: {next(iter(bad.values()))})")
        for p in range(len(setup.seq)):
            cols += [(j, p, n) for n in ns]
    a = np.array(cols, dtype=np.int64).reshape(-1, 3)
    return Grid(setup, setup.request, a[:, 0], a[:, 2], a[:, 1]), notes


def _outcome(e: Estimate) -> np.ndarray:
    """fits / at_risk / does_not_fit at every element (Estimate.outcome on arrays)."""
    host = np.asarray(e.fits_host)
    return np.where(host & np.asarray(e.fits_gpu), "fits",
                    np.where(host & np.asarray(e.may_fit_gpu), "at_risk",
                             "does_not_fit")).astype(object)


def _p_oom(e: Estimate) -> np.ndarray:
    """The probability of running out of memory at every element (nan without a band)."""
    req, usable = np.broadcast_arrays(np.asarray(e.required_bytes), np.asarray(e.usable_bytes))
    if e.risk is None:
        return np.full(req.shape, np.nan)
    return np.vectorize(lambda r, u: e.risk.p_oom(int(r), int(u)), otypes=[float])(req, usable)


def _rows(req: ReportRequest, mi: int, g: Grid, planned: Planned) -> dict[str, np.ndarray]:
    gi, ci = np.nonzero(planned.shown.T)  # element-major, entries in order: report row order
    size = len(g)
    cands = [c for _, c in planned.entries]

    def pick(values: list[Any]) -> np.ndarray:
        return np.stack([full(v, size) for v in values])[ci, gi]

    mem = [g.estimate(c) for c in cands]
    steps = [g.step(c) for c in cands]
    n = g.n_gpus[gi]
    gpu = g.setup.gpus[g.gpu[gi]]
    tps = pick([s.tokens_per_s_per_gpu for s in steps]) * n
    hours = req.tokens / tps / 3600.0
    prices = np.array([(req.prices or {}).get(x.id, np.nan) for x in req.gpus])[gpu]
    training = g.request.training

    def names(attr: str) -> np.ndarray:
        return np.array([str(getattr(c, attr)) for c in cands], dtype=object)[ci]

    return {
        "model": np.full(len(gi), req.models[mi][0], dtype=object),
        "gpu": np.array([x.id for x in req.gpus], dtype=object)[gpu],
        "n": n, "nodes": -(-n // g.gpus_per_node[gi]), "seq": g.seq[gi],
        "micro_batch": g.mb[gi], "grad_accum": np.full(len(gi), training.grad_accum),
        "precision": np.full(len(gi), str(training.precision), dtype=object),
        "strategy": names("strategy"), "checkpointing": names("checkpointing"),
        "offload": names("offload"), "tp": np.array([c.tp for c in cands])[ci],
        "fits": pick([e.fits for e in mem]),
        "fits_gpu": pick([e.fits_gpu for e in mem]), "fits_host": pick([e.fits_host for e in mem]),
        "outcome": pick([_outcome(e) for e in mem]),
        "oom_probability": pick([_p_oom(e) for e in mem]),
        "required_bytes": pick([e.required_bytes for e in mem]),
        "device_used_bytes": pick([e.device_used_bytes for e in mem]),
        "peak_allocated_bytes": pick([e.peak_allocated_bytes for e in mem]),
        "capacity_bytes": g.setup.capacity[g.gpu[gi]],
        "usable_bytes": pick([e.usable_bytes for e in mem]),
        "host_bytes_per_node": pick([e.host_bytes_per_node for e in mem]),
        "peak_phase": np.array([str(p) for p in PHASES], dtype=object)[
            pick([e.peak_phase for e in mem])],
        "step_time_s": pick([s.step_time_s for s in steps]),
        "tokens_per_s_per_gpu": pick([s.tokens_per_s_per_gpu for s in steps]),
        "tokens_per_s": tps, "mfu": pick([s.mfu for s in steps]),
        "train_days": hours / 24.0, "gpu_hours": hours * n, "cost_usd": hours * n * prices,
        "best": planned.best[gi] == ci,
        "_gpu_order": gpu,
    }


def _min_gpus(req: ReportRequest, mi: int, setup: Setup) -> list[dict[str, Any]]:
    """Per (GPU type, seq, micro-batch): `--find min-gpus` (``fewest_gpus``, on arrays) and
    the recommendation there, without offload and, unless the request has none, with the
    request's offload.

    Both searches run as one bisection over their elements stacked: the request of the stack
    allows every offload mode either search allows, and the grid marks where each mode may
    be used (a mode a search does not allow never fits there). ``fits_any`` is an "any"
    over the candidates, so each element's answer is its own search's, and a candidate is
    evaluated once per step for both."""
    k, pairs = len(setup.plans), len(setup.seq)
    gpu = np.repeat(np.arange(k, dtype=np.int64), pairs)
    pair = np.tile(np.arange(pairs, dtype=np.int64), k)
    size = len(gpu)
    rows = [{"model": req.models[mi][0], "gpu": req.gpus[int(setup.gpus[j])].id,
             "seq": int(setup.seq[p]), "micro_batch": int(setup.mb[p]),
             "_gpu_order": int(setup.gpus[j])} for j, p in zip(gpu, pair)]
    r = setup.request
    searches = [("", r.with_options(offloads=(Offload.NONE,)))]
    if r.options.offloads != (Offload.NONE,):
        searches.append(("_offload", r))
    modes = [offload_modes(q, for_fit=True) for _, q in searches]
    union = tuple(m for m in OFFLOAD_ORDER if any(m in ms for ms in modes))
    allowed = {m: np.concatenate([np.full(size, m in ms) for ms in modes]) for m in union}
    stacked = Grid(setup, r.with_options(offloads=union), np.tile(gpu, len(searches)),
                   np.ones(size * len(searches), np.int64), np.tile(pair, len(searches)),
                   whole=False, offloads=allowed)
    found, n_min = fewest_gpus(stacked)
    found, n_min = full(found, len(stacked)), full(n_min, len(stacked))
    for v, (suffix, q) in enumerate(searches):
        ok, n = found[v * size:(v + 1) * size], n_min[v * size:(v + 1) * size]
        # only fits and step times are read here: the searches' memo serves the fits
        planned = plan_grid(Grid(setup, q, gpu, np.where(ok, n, 1), pair, whole=False))
        for row, f, m, b in zip(rows, ok, n, planned.best):
            row["min_gpus" + suffix] = int(m) if f else None
            row["recommended" + suffix] = (label(planned.entries[b][1]) if f and b >= 0
                                           else None)
    return rows


def run_sweep(req: ReportRequest, progress: bool = False, stream: Any = None) -> Report:
    """Plan every configuration of the request with planner.plan's rules, on arrays."""
    import pandas as pd

    t0 = time.perf_counter()
    setups = _setups(req)
    counts, notes = _counts(req)
    bar = Progress(len(setups) * 2, "fitcheck report", progress, stream)
    parts: list[dict[str, np.ndarray]] = []
    minrows: list[dict[str, Any]] = []
    for mi, setup in setups:
        grid, tp_notes = _grid(req, mi, setup, counts)
        notes += tp_notes
        planned = plan_grid(grid) if len(grid) else None
        if planned is not None and planned.entries:
            part = _rows(req, mi, grid, planned)
            part["_model_order"] = np.full(len(part["n"]), mi)
            parts.append(part)
        bar.update()
        minrows += [{**row, "_model_order": mi} for row in _min_gpus(req, mi, setup)]
        bar.update()
    bar.close()
    keys = (*COLUMNS, "_model_order", "_gpu_order")
    cols = {c: np.concatenate([p[c] for p in parts]) if parts else [] for c in keys}
    rows = pd.DataFrame(cols, columns=list(keys))
    # report order: model, GPU type (as requested), then each setup's own order
    rows = rows.sort_values(["_model_order", "_gpu_order"], kind="stable")
    rows = rows.drop(columns=["_model_order", "_gpu_order"]).reset_index(drop=True)
    for c in ("n", "nodes", "seq", "micro_batch", "grad_accum", "tp", "required_bytes",
              "device_used_bytes", "peak_allocated_bytes", "capacity_bytes", "usable_bytes",
              "host_bytes_per_node"):
        rows[c] = rows[c].astype("int64")
    for c in ("fits", "fits_gpu", "fits_host", "best"):
        rows[c] = rows[c].astype(bool)
    rows["cost_usd"] = rows["cost_usd"].astype("float64")
    mins = pd.DataFrame(minrows)
    if len(mins):
        mins = mins.sort_values(["_model_order", "_gpu_order"], kind="stable")
        mins = mins.drop(columns=["_model_order", "_gpu_order"]).reset_index(drop=True)
    for c in ("min_gpus", "min_gpus_offload"):
        if c in mins:
            mins[c] = mins[c].astype("Int64")
    return Report(request=req, rows=rows, min_gpus=mins, notes=notes + req.notes,
                  sweep_s=time.perf_counter() - t0)
