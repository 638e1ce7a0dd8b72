"""The sweep: every configuration of a report request, evaluated with the planner's own model.

Memory is ``planner.memory.evaluate`` and step time ``planner.throughput.step_core``, the very
functions ``fitcheck plan`` runs, evaluated on numpy arrays: per model and candidate, one call
covers every (GPU type, sequence length, micro-batch, GPU count) of the request. The best
configuration of each (model, GPU, n, seq, micro-batch) is chosen by ``recommend``'s rule
(``best_index``: fastest that fits, ties within ``TIE`` to the simplest), and the fewest GPUs
by ``planner.search``'s bisection run on arrays, so a row flagged ``best`` is what ``fitcheck
--model M --gpu G --n N`` recommends (tests/test_report.py checks both on samples). Nothing
here computes a byte or a second itself; it only converts units (tokens to train /
throughput, GPU-hours x price).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from planner.candidates import (
    OFFLOAD_ORDER,
    UnsupportedCandidate,
    check_supported,
    fit_first_key,
    label,
    preference_key,
    skipped_on_one_gpu,
)
from planner.memory import PHASES, Overheads
from planner.memory.estimator import (
    activation_plan,
    adapter_input_bytes,
    evaluate,
    uses_autocast_amp,
)
from planner.memory.moments import Activations
from planner.params import total_params
from planner.plan import TIE
from planner.report.progress import Progress
from planner.report.request import ReportRequest
from planner.search import smallest_n_many
from planner.spec import Candidate, ModelSpec, Offload
from planner.throughput import (
    DEFAULT_ASSUMPTIONS,
    OFFLOAD_TRAFFIC,
    RECOMPUTE,
    StepInputs,
    collectives,
    default_compute_efficiency,
    finetune_inputs,
    gather_bytes,
    grad_reduce_bytes,
    matmul_params,
    peak_flops,
    step_core,
)

COLUMNS = (
    "model", "gpu", "n", "nodes", "seq", "micro_batch", "grad_accum", "precision",
    "strategy", "checkpointing", "offload", "fits", "fits_gpu", "fits_host",
    "required_bytes", "device_used_bytes", "peak_allocated_bytes", "capacity_bytes",
    "usable_bytes",
    "host_bytes_per_node", "peak_phase", "step_time_s", "tokens_per_s_per_gpu", "tokens_per_s",
    "mfu", "train_days", "gpu_hours", "cost_usd", "best",
)  # fmt: skip
"""report.csv's columns, one row per configuration. ``best``: the planner's recommendation for
that (model, gpu, n, seq, micro_batch). train_days / gpu_hours / cost_usd: to train
``tokens`` at this configuration's throughput (cost empty without a price)."""


@dataclass(slots=True, kw_only=True)
class Report:
    request: ReportRequest
    rows: Any
    """pandas.DataFrame, one row per configuration (COLUMNS)."""
    min_gpus: Any
    """pandas.DataFrame per model x gpu x seq x micro_batch: the fewest GPUs without offload
    (and with offload, unless --offload none) and the recommended candidate there."""
    notes: list[str] = field(default_factory=list)
    sweep_s: float = 0.0


# ---------------------------------------------------------------------------------------------
# Configurations as arrays


@dataclass(slots=True, kw_only=True)
class Grid:
    """Numeric configurations, one per element: which GPU type, its numbers, n, seq, mb."""

    gpu: np.ndarray
    """Index into the request's GPUs."""
    n: np.ndarray
    seq: np.ndarray
    mb: np.ndarray
    gpn: np.ndarray
    capacity: np.ndarray
    context: np.ndarray
    host: np.ndarray

    @classmethod
    def of(cls, req: ReportRequest, gpu: np.ndarray, n: np.ndarray, seq: np.ndarray,
           mb: np.ndarray) -> Grid:
        g = req.gpus
        pick = lambda attr: np.array([getattr(p, attr) for p in g], dtype=np.int64)[gpu]  # noqa: E731
        return cls(gpu=gpu, n=n.astype(np.int64), seq=seq.astype(np.int64),
                   mb=mb.astype(np.int64), gpn=pick("gpus_per_node"),
                   capacity=pick("memory_bytes"), context=pick("cuda_context_bytes"),
                   host=pick("host_ram_bytes_per_node"))

    def __len__(self) -> int:
        return len(self.n)


def candidates(req: ReportRequest) -> list[Candidate]:
    """Every candidate the request may show: offload-major (none first), then strategy, then
    checkpointing, as planner.plan lists them."""
    offloads = (Offload.NONE,) if req.offload == "none" else OFFLOAD_ORDER
    out = []
    for offload in offloads:
        for strategy in req.strategies:
            for ck in req.checkpointings:
                c = Candidate(strategy=strategy, offload=offload, checkpointing=ck)
                try:
                    check_supported(c)
                except UnsupportedCandidate:
                    continue
                out.append(c)
    return out


class Evaluator:
    """The planner's memory and step-time model of one model on a grid, per candidate."""

    def __init__(self, req: ReportRequest, model: ModelSpec) -> None:
        self.req, self.model = req, model
        self.training = req.training
        self.ov = Overheads()
        self._acts: dict[tuple, Activations] = {}

    def activations(self, grid: Grid, c: Candidate) -> Activations:
        """Activation totals per element: the scalar count of each distinct (mb, seq)."""
        pairs = np.stack([grid.mb, grid.seq], axis=1)
        uniq, inverse = np.unique(pairs, axis=0, return_inverse=True)
        inverse = inverse.reshape(-1)
        # what the plan depends on beyond (mb, seq): the checkpointing, the AMP regime, the
        # adapters' input copies (strategy family) and the TP degree
        key = (c.checkpointing, uses_autocast_amp(c.strategy),
               adapter_input_bytes(self.training, c), c.tp, uniq.tobytes(), inverse.tobytes())
        if key not in self._acts:
            plans = [Activations.of(activation_plan(
                self.model, dataclasses.replace(self.training, micro_batch=int(b), seq=int(s)),
                c)) for b, s in uniq]
            fields = {f: np.array([getattr(p, f) for p in plans], dtype=np.int64)[inverse]
                      for f in Activations.__slots__ if f != "residual_bytes"}
            self._acts[key] = Activations(**fields, residual_bytes=plans[0].residual_bytes)
        return self._acts[key]

    def memory(self, grid: Grid, c: Candidate):
        return evaluate(self.model, self.training, c, n_gpus=grid.n, gpus_per_node=grid.gpn,
                        tokens=grid.mb * grid.seq, acts=self.activations(grid, c),
                        capacity=grid.capacity, context=grid.context, host_capacity=grid.host,
                        margin=self.req.margin, ov=self.ov)

    def step(self, grid: Grid, c: Candidate):
        a, m, p = DEFAULT_ASSUMPTIONS, self.model, self.training.precision
        gpus = self.req.gpus
        per_gpu = lambda f: np.array([f(g) for g in gpus], dtype=np.float64)[grid.gpu]  # noqa: E731
        eff = (a.compute_efficiency if a.compute_efficiency is not None
               else per_gpu(lambda g: default_compute_efficiency(g, self.training.compile)))
        p_block, p_head = matmul_params(m)
        x = StepInputs(
            n_layers=float(m.n_layers), q_dim=float(m.q_dim), seq=grid.seq.astype(np.float64),
            mb=grid.mb.astype(np.float64), ga=float(self.training.grad_accum),
            n=grid.n.astype(np.float64), gpn=grid.gpn.astype(np.float64),
            p_total=float(total_params(m)), p_block=float(p_block), p_head=float(p_head),
            peak=per_gpu(lambda g: peak_flops(g, p)), eff=eff,
            bw_intra=per_gpu(lambda g: g.intra_node_bandwidth_bytes_per_s)
            * a.intra_node_comm_efficiency,
            bw_inter=per_gpu(lambda g: g.inter_node_bandwidth_bytes_per_s)
            * a.inter_node_comm_efficiency,
            lat_intra=a.intra_node_hop_latency_s, lat_inter=a.inter_node_hop_latency_s,
            pcie=per_gpu(lambda g: g.pcie_bandwidth_bytes_per_s) * a.pcie_efficiency,
            cpu_rate=a.cpu_adam_params_per_s, bucket=float(a.ddp_bucket_bytes),
            overlap=a.overlap_fraction, gather_b=float(gather_bytes(p)),
            grad_b=float(grad_reduce_bytes(p, c.strategy)), master_b=float(p.param_bytes),
            comm=collectives(c.strategy, self.training.grad_sync),
            recompute=RECOMPUTE[c.checkpointing],
            offload=OFFLOAD_TRAFFIC[c.offload],
            tp_bytes=grid.mb.astype(np.float64) * grid.seq.astype(np.float64) * m.hidden
            * p.compute_bytes,
            **self.finetune(grid))
        return step_core(x)

    def finetune(self, grid: Grid) -> dict:
        """throughput.finetune_inputs; the dequantization time per GPU type (HBM bandwidth)."""
        ft = finetune_inputs(self.model, self.training, self.req.gpus[0])
        if "dequant_s" in ft:
            ft["dequant_s"] = np.array([finetune_inputs(self.model, self.training, g)["dequant_s"]
                                        for g in self.req.gpus], dtype=np.float64)[grid.gpu]
        return ft


def present(grid: Grid, c: Candidate) -> np.ndarray:
    """Where the candidate is a row: everywhere but FSDP without offload on one GPU
    (planner.candidates.skipped_on_one_gpu)."""
    if skipped_on_one_gpu(c.strategy, c.offload):
        return grid.n > 1
    return np.ones(len(grid), dtype=bool)


def best_index(cands: list[Candidate], fits: np.ndarray, step_s: np.ndarray,
               multi_node: np.ndarray) -> np.ndarray:
    """planner.plan.recommend's pick per column (-1: nothing fits): the fastest candidate that
    fits; within TIE of it, the simplest (planner.candidates.preference_key)."""
    timed = np.where(fits, step_s, np.inf)
    fastest = timed.min(axis=0)
    tied = fits & (step_s <= fastest * (1 + TIE))
    big = np.iinfo(np.int64).max
    out = np.full(fits.shape[1], -1, dtype=np.int64)
    for multi in (False, True):
        rank = np.array([sorted(cands, key=lambda x: preference_key(x, multi)).index(c)
                         for c in cands], dtype=np.int64)
        score = np.where(tied, rank[:, None], big)
        pick = np.where(tied.any(axis=0), score.argmin(axis=0), -1)
        out = np.where(multi_node == multi, pick, out)
    return out


@dataclass(slots=True)
class Evaluated:
    """Every candidate on a grid: [candidate, element] arrays."""

    shown: np.ndarray
    fits: np.ndarray
    best: np.ndarray
    """Per element: the recommended candidate's index, -1 if none fits."""
    memory: list[Any]
    steps: list[Any]


def evaluate_grid(ev: Evaluator, grid: Grid, cands: list[Candidate], offload_mode: str
                  ) -> Evaluated:
    """The candidates plan() would list at each element (offload 'auto': offload candidates
    only where nothing else fits), their fit, and the recommendation."""
    mem = [ev.memory(grid, c) for c in cands]
    steps = [ev.step(grid, c) for c in cands]
    shown = np.stack([present(grid, c) for c in cands])
    fits = np.stack([np.asarray(e.fits, dtype=bool) for e in mem]) & shown
    off = np.array([c.offload is not Offload.NONE for c in cands])
    if offload_mode == "none":
        shown &= ~off[:, None]
    elif offload_mode == "auto":
        first_fits = (fits & ~off[:, None]).any(axis=0)
        shown &= ~(off[:, None] & first_fits[None, :])
    fits &= shown
    step_s = np.stack([np.broadcast_to(s.step_time_s, (len(grid),)) for s in steps])
    multi = grid.n > grid.gpn
    return Evaluated(shown=shown, fits=fits, best=best_index(cands, fits, step_s, multi),
                     memory=mem, steps=steps)


# ---------------------------------------------------------------------------------------------
# The sweep


def _grid(req: ReportRequest) -> tuple[Grid, list[str]]:
    """Every valid (gpu, seq, mb, n) in report order; notes for GPU counts skipped."""
    notes, cols = [], []
    for gi, g in enumerate(req.gpus):
        ok = [n for n in req.ns if n <= g.gpus_per_node or n % g.gpus_per_node == 0]
        bad = [n for n in req.ns if n not in ok]
        if bad:
            notes.append(f"{g.id}: skipped n = {', '.join(map(str, bad))} (not a multiple of "
                         f"its {g.gpus_per_node} GPUs per node)")
        for seq in req.seqs:
            for mb in req.micro_batches:
                cols += [(gi, seq, mb, n) for n in ok]
    a = np.array(cols, dtype=np.int64).reshape(-1, 4)
    return Grid.of(req, a[:, 0], a[:, 3], a[:, 1], a[:, 2]), notes


def _groups(req: ReportRequest) -> Grid:
    """One element per (gpu, seq, mb): the min-GPU searches."""
    cols = [(gi, seq, mb) for gi in range(len(req.gpus)) for seq in req.seqs
            for mb in req.micro_batches]
    a = np.array(cols, dtype=np.int64).reshape(-1, 3)
    return Grid.of(req, a[:, 0], np.ones(len(a), dtype=np.int64), a[:, 1], a[:, 2])


def _rows(req: ReportRequest, mname: str, grid: Grid, cands: list[Candidate],
          r: Evaluated) -> dict[str, np.ndarray]:
    gi, ci = np.nonzero(r.shown.T)  # element-major, candidates in order: report row order
    pick = lambda arrs: np.stack([np.broadcast_to(np.asarray(a), (len(grid),))  # noqa: E731
                                  for a in arrs])[ci, gi]
    mem, steps = r.memory, r.steps
    n = grid.n[gi]
    tps = pick([s.tokens_per_s_per_gpu for s in steps]) * n
    hours = req.tokens / tps / 3600.0
    prices = np.array([(req.prices or {}).get(g.id, np.nan) for g in req.gpus])[grid.gpu[gi]]
    strat = np.array([str(c.strategy) for c in cands], dtype=object)
    ckpt = np.array([str(c.checkpointing) for c in cands], dtype=object)
    offl = np.array([str(c.offload) for c in cands], dtype=object)
    return {
        "model": np.full(len(gi), mname, dtype=object),
        "gpu": np.array([g.id for g in req.gpus], dtype=object)[grid.gpu[gi]],
        "n": n, "nodes": -(-n // grid.gpn[gi]), "seq": grid.seq[gi],
        "micro_batch": grid.mb[gi], "grad_accum": np.full(len(gi), req.training.grad_accum),
        "precision": np.full(len(gi), str(req.training.precision), dtype=object),
        "strategy": strat[ci], "checkpointing": ckpt[ci], "offload": offl[ci],
        "fits": r.fits[ci, gi],
        "fits_gpu": pick([e.fits_gpu for e in mem]), "fits_host": pick([e.fits_host for e in mem]),
        "required_bytes": pick([e.required_bytes for e in mem]),
        "device_used_bytes": pick([e.device_used_bytes for e in mem]),
        "peak_allocated_bytes": pick([e.peak_allocated_bytes for e in mem]),
        "capacity_bytes": grid.capacity[gi], "usable_bytes": pick([e.usable_bytes for e in mem]),
        "host_bytes_per_node": pick([e.host_bytes_per_node for e in mem]),
        "peak_phase": np.array([str(p) for p in PHASES], dtype=object)[
            pick([e.peak_phase for e in mem])],
        "step_time_s": pick([s.step_time_s for s in steps]),
        "tokens_per_s_per_gpu": pick([s.tokens_per_s_per_gpu for s in steps]),
        "tokens_per_s": tps, "mfu": pick([s.mfu for s in steps]),
        "train_days": hours / 24.0, "gpu_hours": hours * n, "cost_usd": hours * n * prices,
        "best": r.best[gi] == ci,
    }


def _min_gpus(req: ReportRequest, ev: Evaluator, mname: str, cands: list[Candidate]
              ) -> list[dict[str, Any]]:
    """Per (gpu, seq, mb): the fewest GPUs (planner.search, on arrays) and the recommendation
    there, without offload and, unless --offload none, with it."""
    groups = _groups(req)
    rows = [{"model": mname, "gpu": req.gpus[g].id, "seq": int(s), "micro_batch": int(b)}
            for g, s, b in zip(groups.gpu, groups.seq, groups.mb)]
    searches = [("", (Offload.NONE,), "none")]
    if req.offload != "none":
        searches.append(("_offload", OFFLOAD_ORDER, "auto"))
    for suffix, offloads, mode in searches:
        allowed = sorted((c for c in cands if c.offload in offloads), key=fit_first_key)

        def fits(n: np.ndarray) -> np.ndarray:
            at = Grid(gpu=groups.gpu, n=n, seq=groups.seq, mb=groups.mb, gpn=groups.gpn,
                      capacity=groups.capacity, context=groups.context, host=groups.host)
            ok = np.zeros(len(at), dtype=bool)
            for c in allowed:  # the likeliest to fit first, until every search has one
                ok |= np.asarray(ev.memory(at, c).fits, dtype=bool) & present(at, c)
                if ok.all():
                    break
            return ok

        n_min = smallest_n_many(fits, groups.gpn)
        at = Grid(gpu=groups.gpu, n=np.where(n_min > 0, n_min, 1), seq=groups.seq,
                  mb=groups.mb, gpn=groups.gpn, capacity=groups.capacity,
                  context=groups.context, host=groups.host)
        best = evaluate_grid(ev, at, cands, mode).best
        for row, n, b in zip(rows, n_min, best):
            row["min_gpus" + suffix] = int(n) if n > 0 else None
            row["recommended" + suffix] = label(cands[b]) if n > 0 and b >= 0 else None
    return rows


def run_sweep(req: ReportRequest, progress: bool = False, stream: Any = None) -> Report:
    """Evaluate every configuration of the request with the planner's model."""
    import pandas as pd

    t0 = time.perf_counter()
    grid, notes = _grid(req)
    cands = candidates(req)
    bar = Progress(len(req.models) * 2, "fitcheck report", progress, stream)
    parts: list[dict[str, np.ndarray]] = []
    minrows: list[dict[str, Any]] = []
    for mname, model in req.models:
        ev = Evaluator(req, model)
        if len(grid):
            parts.append(_rows(req, mname, grid, cands, evaluate_grid(ev, grid, cands,
                                                                      req.offload)))
        bar.update()
        minrows += _min_gpus(req, ev, mname, cands)
        bar.update()
    bar.close()
    cols = {c: np.concatenate([p[c] for p in parts]) if parts else [] for c in COLUMNS}
    rows = pd.DataFrame(cols, columns=list(COLUMNS))
    for c in ("n", "nodes", "seq", "micro_batch", "grad_accum", "required_bytes",
              "device_used_bytes",
              "peak_allocated_bytes", "capacity_bytes", "usable_bytes", "host_bytes_per_node"):
        rows[c] = rows[c].astype("int64")
    for c in ("fits", "fits_gpu", "fits_host", "best"):
        rows[c] = rows[c].astype(bool)
    rows["cost_usd"] = rows["cost_usd"].astype("float64")
    mins = pd.DataFrame(minrows)
    for c in ("min_gpus", "min_gpus_offload"):
        if c in mins:
            mins[c] = mins[c].astype("Int64")
    return Report(request=req, rows=rows, min_gpus=mins, notes=notes,
                  sweep_s=time.perf_counter() - t0)
