"""Capacity-planning reports: sweep models x GPU types x GPU counts (x seq x micro-batch) x
strategies x checkpointing with the planner's own functions, then write tables and plots.

Every number comes from ``planner.memory.estimate`` (memory, fits) and
``planner.throughput.estimate_step`` (step time, tokens/s, MFU); the best configuration of each
(model, GPU, n, seq, micro-batch) is ``planner.plan.recommend``'s pick, so a row flagged
``best`` is what ``fitcheck --model M --gpu G --n N`` recommends. Nothing here computes a byte
or a second itself; it only counts GPUs (the min-GPU search of ``planner.plan.min_gpus``) and
converts units (tokens to train / throughput, GPU-hours x price).

pandas (tables) and matplotlib (plots) are imported only here, and matplotlib only when a plot
is asked for; the planning fast path never imports this module. docs/reports.md describes the
outputs.
"""

from __future__ import annotations

import base64
import html
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from planner import __version__
from planner.errors import UsageError
from planner.memory import Estimate, UnsupportedCandidate, check_supported, estimate
from planner.plan import (
    CHECKPOINTING_ORDER,
    MAX_GPUS_SEARCHED,
    OFFLOAD_ORDER,
    label,
    recommend,
    smallest_n,
)
from planner.spec import (
    Attention,
    Candidate,
    Checkpointing,
    Cluster,
    GpuProfile,
    ModelSpec,
    Offload,
    OptimizerImpl,
    OptimizerKind,
    Precision,
    Strategy,
    TrainingSpec,
)
from planner.throughput import StepEstimate, estimate_step

GiB = 2**30
FORMATS = ("csv", "md", "html", "png", "svg")
PLOT_FORMATS = frozenset({"html", "png", "svg"})
DEFAULT_FORMATS = ("csv", "md", "html", "png")
PLOT_KINDS = ("memory", "min_gpus", "throughput", "train_time_cost")
OFFLOAD_MODES = ("auto", "none", "all")
MATPLOTLIB_MISSING = "plots need matplotlib: pip install 'fitcheck[plots]'"
PANDAS_MISSING = "fitcheck report needs pandas: pip install 'fitcheck[reports]'"

COLUMNS = (
    "model", "gpu", "n", "nodes", "seq", "micro_batch", "grad_accum", "precision",
    "strategy", "checkpointing", "offload", "fits", "fits_gpu", "fits_host",
    "device_used_bytes", "peak_allocated_bytes", "capacity_bytes", "usable_bytes",
    "host_bytes_per_node", "peak_phase", "step_time_s", "tokens_per_s_per_gpu", "tokens_per_s",
    "mfu", "train_days", "gpu_hours", "cost_usd", "best",
)  # fmt: skip
"""report.csv's columns, one row per configuration. ``best``: the planner's recommendation for
that (model, gpu, n, seq, micro_batch). train_days / gpu_hours / cost_usd: to train
``tokens`` at this configuration's throughput (cost empty without a price)."""


# --------------------------------------------------------------------------------------------
# The request
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class ReportRequest:
    models: tuple[tuple[str, ModelSpec], ...]
    """(label, spec): the label is what the user typed (a preset id or a config path)."""
    gpus: tuple[GpuProfile, ...]
    ns: tuple[int, ...]
    seqs: tuple[int, ...] = (2048,)
    micro_batches: tuple[int, ...] = (1,)
    strategies: tuple[Strategy, ...] = tuple(Strategy)
    checkpointings: tuple[Checkpointing, ...] = CHECKPOINTING_ORDER
    offload: str = "auto"
    """auto: no offload, plus offload candidates where nothing else fits (as `fitcheck plan`);
    none: never offload; all: every offload mode for every configuration."""
    precision: Precision = Precision.BF16_AMP
    optimizer: OptimizerKind = OptimizerKind.ADAMW
    optimizer_impl: OptimizerImpl = OptimizerImpl.FOREACH
    attention: Attention = Attention.SDPA
    grad_accum: int = 1
    margin: float = 0.05
    tokens: float = 1e12
    """Tokens to train, for the time and cost columns."""
    prices: dict[str, float] | None = None
    """GPU profile id -> $ per GPU-hour; None: no cost columns."""

    @property
    def n_configurations(self) -> int:
        """Upper bound of report rows before offload expansion (for the progress bar)."""
        return (len(self.models) * len(self.gpus) * len(self.ns) * len(self.seqs)
                * len(self.micro_batches) * len(self.strategies) * len(self.checkpointings))


def parse_list(text: str | Iterable[str], flag: str) -> list[str]:
    """'a,b' (or repeated values) -> ['a', 'b']; empty -> UsageError."""
    parts = [text] if isinstance(text, str) else list(text)
    out = [p.strip() for part in parts for p in part.split(",") if p.strip()]
    if not out:
        raise UsageError(f"{flag}: give at least one value")
    return list(dict.fromkeys(out))


def parse_ints(text: str | Iterable[str], flag: str) -> tuple[int, ...]:
    out = []
    for raw in parse_list(text, flag):
        try:
            value = int(raw)
        except ValueError:
            raise UsageError(f"{flag}: expected positive integers, got {raw!r}") from None
        if value <= 0:
            raise UsageError(f"{flag}: expected positive integers, got {raw!r}")
        out.append(value)
    return tuple(sorted(set(out)))


def _enum_list(enum_cls: type, text: str | Iterable[str], flag: str) -> tuple[Any, ...]:
    out = []
    for raw in parse_list(text, flag):
        try:
            value = enum_cls(raw.lower())
        except ValueError:
            choices = [str(e) for e in enum_cls if e is not Checkpointing.AUTO]
            raise UsageError(f"{flag}: unknown value {raw!r}; choose from "
                             + ", ".join(choices)) from None
        if value is Checkpointing.AUTO:
            raise UsageError(f"{flag}: give modes explicitly (none, selective, full); "
                             "the report sweeps them")
        out.append(value)
    return tuple(dict.fromkeys(out))


def parse_prices(text: str | None, gpu_ids: Sequence[str]) -> dict[str, float] | None:
    """'2.5' (every GPU), '2.5,1.8' (in --gpus order) or 'h100-80=2.5,a100-80=1.8'."""
    if text is None or not text.strip():
        return None
    flag = "--price-per-gpu-hour"
    parts = parse_list(text, flag)

    def num(raw: str) -> float:
        try:
            value = float(raw)
        except ValueError:
            raise UsageError(f"{flag}: expected $ per GPU-hour like 2.5, got {raw!r}") from None
        if not math.isfinite(value) or value < 0:
            raise UsageError(f"{flag}: must be a non-negative number, got {raw!r}")
        return value

    if all("=" in p for p in parts):
        prices = {}
        for p in parts:
            key, _, raw = p.partition("=")
            key = key.strip()
            if key not in gpu_ids:
                raise UsageError(f"{flag}: {key!r} is not one of --gpus ({', '.join(gpu_ids)})")
            prices[key] = num(raw)
        return prices
    if any("=" in p for p in parts):
        raise UsageError(f"{flag}: give one price, one per GPU, or GPU=PRICE pairs, not a mix")
    values = [num(p) for p in parts]
    if len(values) == 1:
        return {g: values[0] for g in gpu_ids}
    if len(values) != len(gpu_ids):
        raise UsageError(f"{flag}: {len(values)} prices for {len(gpu_ids)} GPUs "
                         f"({', '.join(gpu_ids)}); give one, or one per GPU")
    return dict(zip(gpu_ids, values))


def build_request(*, models: str | Iterable[str], gpus: str | Iterable[str],
                  ns: str | Iterable[str], seqs: str | Iterable[str] = "2048",
                  micro_batches: str | Iterable[str] = "1",
                  strategies: str | Iterable[str] = (),
                  checkpointing: str | Iterable[str] = "none,selective,full",
                  offload: str = "auto", precision: str = "bf16-amp", optimizer: str = "adamw",
                  grad_accum: int = 1, margin: float = 0.05, tokens: str | float = "1e12",
                  prices: str | None = None) -> ReportRequest:
    """Strings as typed -> a request; bad values raise planner.errors.UsageError (one line)."""
    from planner.inputs import parse_params, resolve_gpu, resolve_model

    resolved_models = []
    for name in parse_list(models, "--models"):
        try:
            if name.endswith(".json") and os.path.isfile(name):
                spec, _ = resolve_model(config=name)
            else:
                spec, _ = resolve_model(preset=name)
        except UsageError as exc:
            raise UsageError(str(exc).replace("--model:", "--models:", 1)
                             .replace("--config:", "--models:", 1)) from None
        resolved_models.append((name, spec))
    profiles = []
    for name in parse_list(gpus, "--gpus"):
        try:
            profiles.append(resolve_gpu(name))
        except UsageError as exc:
            raise UsageError(str(exc).replace("--gpu:", "--gpus:", 1)) from None
    ids = [p.id for p in profiles]
    if len(set(ids)) != len(ids):
        raise UsageError(f"--gpus: a GPU type is named twice ({', '.join(ids)})")
    strategies_t = _enum_list(Strategy, strategies, "--strategy") if (
        strategies if isinstance(strategies, str) else list(strategies)) else tuple(Strategy)
    if offload not in OFFLOAD_MODES:
        raise UsageError(f"--offload: choose from {', '.join(OFFLOAD_MODES)}, got {offload!r}")
    if not math.isfinite(margin) or not 0 <= margin < 1:
        raise UsageError(f"--margin: must be a fraction in [0, 1), got {margin}")
    if grad_accum <= 0:
        raise UsageError(f"--grad-accum: must be a positive integer, got {grad_accum}")
    if isinstance(tokens, str):
        try:
            tokens_f = parse_params(tokens)
        except UsageError:
            raise UsageError(f"--tokens: expected a positive number like 1e12 or 1T, "
                             f"got {tokens!r}") from None
    else:
        tokens_f = float(tokens)
        if not math.isfinite(tokens_f) or tokens_f <= 0:
            raise UsageError(f"--tokens: must be a positive number, got {tokens!r}")
    return ReportRequest(
        models=tuple(resolved_models), gpus=tuple(profiles),
        ns=parse_ints(ns, "--n"), seqs=parse_ints(seqs, "--seq"),
        micro_batches=parse_ints(micro_batches, "--micro-batch"),
        strategies=strategies_t,
        checkpointings=tuple(sorted(_enum_list(Checkpointing, checkpointing, "--checkpointing"),
                                    key=CHECKPOINTING_ORDER.index)),
        offload=offload, precision=_enum_list(Precision, precision, "--precision")[0],
        optimizer=_enum_list(OptimizerKind, optimizer, "--optimizer")[0],
        grad_accum=grad_accum, margin=margin, tokens=tokens_f, prices=parse_prices(prices, ids))


# --------------------------------------------------------------------------------------------
# Progress on stderr
# --------------------------------------------------------------------------------------------


class Progress:
    """A one-line progress bar on a stream (stderr), redrawn at most every 0.1 s."""

    def __init__(self, total: int, label: str, enabled: bool, stream: Any = None,
                 width: int = 30) -> None:
        self.total, self.label, self.enabled = max(total, 1), label, enabled
        self.stream = stream if stream is not None else sys.stderr
        self.width, self.done, self._last, self._t0 = width, 0, 0.0, time.perf_counter()

    def update(self, k: int = 1) -> None:
        self.done += k
        if not self.enabled:
            return
        now = time.perf_counter()
        if now - self._last >= 0.1 or self.done >= self.total:
            self._last = now
            self._draw(now)

    def _draw(self, now: float) -> None:
        frac = min(self.done / self.total, 1.0)
        bar = "#" * int(frac * self.width)
        self.stream.write(f"\r{self.label} [{bar:<{self.width}}] {frac:4.0%} "
                          f"{self.done}/{self.total} {now - self._t0:5.1f}s")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self._draw(time.perf_counter())
            self.stream.write("\n")
            self.stream.flush()


def progress_wanted(flag: bool | None, stream: Any = None) -> bool:
    """--progress / --no-progress; by default only when stderr is a terminal."""
    if flag is not None:
        return flag
    stream = stream if stream is not None else sys.stderr
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


# --------------------------------------------------------------------------------------------
# The sweep
# --------------------------------------------------------------------------------------------


def _candidates(req: ReportRequest, offloads: Sequence[Offload], single: bool) -> list[Candidate]:
    """The candidates planner.plan._expand generates, with every checkpointing mode listed."""
    out = []
    for offload in offloads:
        for strategy in req.strategies:
            if single and strategy is not Strategy.DDP and not strategy.is_zero \
                    and offload is Offload.NONE:
                continue  # as planner.plan._expand: one GPU, FSDP is plain training + overhead
            for ck in req.checkpointings:
                cand = Candidate(strategy=strategy, offload=offload, checkpointing=ck)
                try:
                    check_supported(cand)
                except UnsupportedCandidate:
                    break
                out.append(cand)
    return out


class _Planner:
    """The planner's estimate and step functions, memoized per configuration.

    The min-GPU searches and the swept grid meet at the same (model, GPU, n, training,
    candidate) configurations; each is estimated once.
    """

    def __init__(self, req: ReportRequest) -> None:
        self.req = req
        self._est: dict[tuple, Estimate] = {}
        self._step: dict[tuple, StepEstimate] = {}
        self._cands: dict[tuple, list[Candidate]] = {}
        self._clusters: dict[tuple[int, int], Cluster | None] = {}

    def candidates(self, offloads: tuple[Offload, ...], single: bool) -> list[Candidate]:
        key = (offloads, single)
        if key not in self._cands:
            self._cands[key] = _candidates(self.req, offloads, single)
        return self._cands[key]

    def cluster(self, gi: int, n: int) -> Cluster | None:
        """None when n is not a whole number of nodes past one node."""
        key = (gi, n)
        if key not in self._clusters:
            from planner.inputs import resolve_cluster

            try:
                self._clusters[key] = resolve_cluster(self.req.gpus[gi], n, None, None)
            except UsageError:
                self._clusters[key] = None
        return self._clusters[key]

    def estimate(self, mi: int, gi: int, n: int, training: TrainingSpec,
                 cand: Candidate) -> Estimate:
        key = (mi, gi, n, training, cand)
        e = self._est.get(key)
        if e is None:
            cluster = self.cluster(gi, n)
            assert cluster is not None
            e = estimate(self.req.models[mi][1], training, cluster, cand, margin=self.req.margin)
            self._est[key] = e
        return e

    def step(self, mi: int, gi: int, n: int, training: TrainingSpec,
             cand: Candidate) -> StepEstimate:
        key = (mi, gi, n, training, cand)
        s = self._step.get(key)
        if s is None:
            cluster = self.cluster(gi, n)
            assert cluster is not None
            s = estimate_step(self.req.models[mi][1], training, cluster, cand)
            self._step[key] = s
        return s

    def evaluate(self, mi: int, gi: int, n: int, training: TrainingSpec, offload_mode: str
                 ) -> tuple[list[Estimate], list[StepEstimate], Candidate | None]:
        """Every candidate of one configuration, its step, and the planner's recommendation."""
        single = n == 1
        if offload_mode == "all":
            first: tuple[Offload, ...] = tuple(OFFLOAD_ORDER)
        else:
            first = (Offload.NONE,)
        ests = [self.estimate(mi, gi, n, training, c) for c in self.candidates(first, single)]
        if offload_mode == "auto" and not any(e.fits for e in ests):
            ests += [self.estimate(mi, gi, n, training, c)
                     for c in self.candidates(tuple(OFFLOAD_ORDER[1:]), single)]
        steps = [self.step(mi, gi, n, training, e.candidate) for e in ests]
        cluster = self.cluster(gi, n)
        assert cluster is not None
        rec = recommend(ests, steps, cluster.n_nodes > 1)
        return ests, steps, (rec.candidate if rec is not None else None)

    def fits_any(self, mi: int, gi: int, n: int, training: TrainingSpec,
                 offloads: tuple[Offload, ...]) -> bool:
        if self.cluster(gi, n) is None:
            return False
        key = ("fit-first", offloads, n == 1)
        if key not in self._cands:  # the likeliest to fit first, for the early exit
            self._cands[key] = sorted(self.candidates(offloads, n == 1), key=_fit_first)
        for c in self._cands[key]:
            if self.estimate(mi, gi, n, training, c).fits:
                return True
        return False

    def min_gpus(self, mi: int, gi: int, training: TrainingSpec,
                 offloads: tuple[Offload, ...]) -> int | None:
        """Fewest GPUs of the type for which a candidate fits: planner.plan.min_gpus's search
        (every n up to a node, then whole nodes by doubling and bisection) over the
        requested strategies, checkpointing modes and these offload modes."""
        gpn = self.req.gpus[gi].gpus_per_node

        def fits(n: int) -> bool:
            return self.fits_any(mi, gi, n, training, offloads)

        return smallest_n(fits, gpn)


_SHARDING = {s: i for i, s in enumerate(
    (Strategy.ZERO3, Strategy.FULL_SHARD, Strategy.HYBRID_SHARD, Strategy.ZERO2,
     Strategy.SHARD_GRAD_OP, Strategy.ZERO1, Strategy.NO_SHARD, Strategy.DDP))}


def _fit_first(c: Candidate) -> tuple[int, int, int]:
    """Most memory saved first: offload, checkpointing, sharding."""
    return (-OFFLOAD_ORDER.index(c.offload), -CHECKPOINTING_ORDER.index(c.checkpointing),
            _SHARDING[c.strategy])


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


def _training(req: ReportRequest, seq: int, mb: int) -> TrainingSpec:
    return TrainingSpec(seq=seq, micro_batch=mb, grad_accum=req.grad_accum,
                        precision=req.precision, optimizer=req.optimizer,
                        optimizer_impl=req.optimizer_impl, attention=req.attention)


def run_sweep(req: ReportRequest, progress: bool = False, stream: Any = None) -> Report:
    """Evaluate every configuration of the request with the planner's functions."""
    return _run_sweep(req, progress, stream)


def _run_sweep(req: ReportRequest, progress: bool, stream: Any) -> Report:
    import pandas as pd

    t0 = time.perf_counter()
    P = _Planner(req)
    cols: dict[str, list[Any]] = {c: [] for c in COLUMNS}
    notes: list[str] = []
    groups = (len(req.models) * len(req.gpus) * len(req.seqs) * len(req.micro_batches))
    bar = Progress(groups * (len(req.ns) + 1), "fitcheck report", progress, stream)
    minrows: list[dict[str, Any]] = []
    for gi, gpu in enumerate(req.gpus):
        bad = [n for n in req.ns if P.cluster(gi, n) is None]
        if bad:
            notes.append(f"{gpu.id}: skipped n = {', '.join(map(str, bad))} (not a multiple of "
                         f"its {gpu.gpus_per_node} GPUs per node)")
    price_of = req.prices or {}
    for mi, (mname, _model) in enumerate(req.models):
        for gi, gpu in enumerate(req.gpus):
            price = price_of.get(gpu.id)
            for seq in req.seqs:
                for mb in req.micro_batches:
                    training = _training(req, seq, mb)
                    for n in req.ns:
                        cluster = P.cluster(gi, n)
                        if cluster is None:
                            bar.update()
                            continue
                        ests, steps, best = P.evaluate(mi, gi, n, training, req.offload)
                        for e, st in zip(ests, steps):
                            c = e.candidate
                            tps = st.tokens_per_s_per_gpu * n
                            hours = req.tokens / tps / 3600.0
                            cols["model"].append(mname)
                            cols["gpu"].append(gpu.id)
                            cols["n"].append(n)
                            cols["nodes"].append(cluster.n_nodes)
                            cols["seq"].append(seq)
                            cols["micro_batch"].append(mb)
                            cols["grad_accum"].append(training.grad_accum)
                            cols["precision"].append(str(training.precision))
                            cols["strategy"].append(str(c.strategy))
                            cols["checkpointing"].append(str(c.checkpointing))
                            cols["offload"].append(str(c.offload))
                            cols["fits"].append(e.fits)
                            cols["fits_gpu"].append(e.fits_gpu)
                            cols["fits_host"].append(e.fits_host)
                            cols["device_used_bytes"].append(e.device_used_bytes)
                            cols["peak_allocated_bytes"].append(e.peak_allocated_bytes)
                            cols["capacity_bytes"].append(e.capacity_bytes)
                            cols["usable_bytes"].append(e.usable_bytes)
                            cols["host_bytes_per_node"].append(e.host_bytes_per_node)
                            cols["peak_phase"].append(e.peak_phase)
                            cols["step_time_s"].append(st.step_time_s)
                            cols["tokens_per_s_per_gpu"].append(st.tokens_per_s_per_gpu)
                            cols["tokens_per_s"].append(tps)
                            cols["mfu"].append(st.mfu)
                            cols["train_days"].append(hours / 24.0)
                            cols["gpu_hours"].append(hours * n)
                            cols["cost_usd"].append(hours * n * price if price is not None
                                                    else None)
                            cols["best"].append(c == best)
                        bar.update()
                    # the fewest GPUs, and the recommendation there
                    row: dict[str, Any] = {"model": mname, "gpu": gpu.id, "seq": seq,
                                           "micro_batch": mb}
                    searches = [("", (Offload.NONE,), "none")]
                    if req.offload != "none":
                        searches.append(("_offload", tuple(OFFLOAD_ORDER), "auto"))
                    for suffix, offloads, mode in searches:
                        n_min = P.min_gpus(mi, gi, training, offloads)
                        rec = None
                        if n_min is not None:
                            rec = P.evaluate(mi, gi, n_min, training, mode)[2]
                        row["min_gpus" + suffix] = n_min
                        row["recommended" + suffix] = label(rec) if rec is not None else None
                    minrows.append(row)
                    bar.update()
    bar.close()
    rows = pd.DataFrame(cols, columns=list(COLUMNS))
    rows["cost_usd"] = rows["cost_usd"].astype("float64")
    mins = pd.DataFrame(minrows)
    for c in ("min_gpus", "min_gpus_offload"):
        if c in mins:
            mins[c] = mins[c].astype("Int64")
    return Report(request=req, rows=rows, min_gpus=mins, notes=notes,
                  sweep_s=time.perf_counter() - t0)


# --------------------------------------------------------------------------------------------
# Tables
# --------------------------------------------------------------------------------------------


def _fmt_count(x: float) -> str:
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:g}{unit}"
    return f"{x:g}"


def describe(req: ReportRequest) -> list[str]:
    """The request, as bullet lines (both the Markdown and the HTML header)."""
    price = ("none given (no cost columns)" if not req.prices else
             ", ".join(f"{g} ${p:g}" for g, p in req.prices.items()))
    return [
        f"models: {', '.join(m for m, _ in req.models)}",
        f"GPUs: {', '.join(g.id for g in req.gpus)}; n: {', '.join(map(str, req.ns))}",
        f"seq: {', '.join(map(str, req.seqs))}; micro-batch: "
        f"{', '.join(map(str, req.micro_batches))}; grad-accum: {req.grad_accum}",
        f"precision: {req.precision}; optimizer: {req.optimizer} ({req.optimizer_impl}); "
        f"attention: {req.attention}; margin: {req.margin:g}",
        f"strategies: {', '.join(map(str, req.strategies))}; checkpointing: "
        f"{', '.join(map(str, req.checkpointings))}; offload: {req.offload}",
        f"tokens to train: {_fmt_count(req.tokens)}; $ per GPU-hour: {price}",
    ]


def min_gpu_tables(report: Report) -> list[tuple[str, Any]]:
    """(title, DataFrame) per seq x micro-batch: model rows x GPU columns, cells "n: strategy"."""
    import pandas as pd

    req, mins = report.request, report.min_gpus
    gpu_ids = [g.id for g in req.gpus]
    model_ids = [m for m, _ in req.models]
    out = []
    variants = [("", "without offload")]
    if "min_gpus_offload" in mins:
        variants.append(("_offload", "CPU offload allowed (as `fitcheck --find min-gpus`)"))
    for seq in req.seqs:
        for mb in req.micro_batches:
            sel = mins[(mins.seq == seq) & (mins.micro_batch == mb)]
            for suffix, words in variants:
                cell = {}
                for r in sel.itertuples(index=False):
                    n = getattr(r, "min_gpus" + suffix)
                    rec = getattr(r, "recommended" + suffix)
                    cell[(r.model, r.gpu)] = (f"none up to {MAX_GPUS_SEARCHED}" if pd.isna(n)
                                              else f"{int(n)}: {rec}")
                table = pd.DataFrame([[cell.get((m, g), "") for g in gpu_ids] for m in model_ids],
                                     columns=gpu_ids)
                table.insert(0, "model", model_ids)
                out.append((f"seq {seq}, micro-batch {mb}, {words}", table))
    return out


def best_table(report: Report, model: str) -> Any:
    """The recommended configuration at each swept (gpu, n, seq, micro-batch) of one model."""
    req, rows = report.request, report.rows
    b = rows[(rows.model == model) & rows.best]
    out = b[["gpu", "n", "seq", "micro_batch"]].copy()
    out["recommended"] = [label(Candidate(strategy=Strategy(s), checkpointing=Checkpointing(c),
                                          offload=Offload(o)))
                          for s, c, o in zip(b.strategy, b.checkpointing, b.offload)]
    out["GiB/GPU"] = (b.device_used_bytes / GiB).round(1)
    out["tokens/s/GPU"] = b.tokens_per_s_per_gpu.round(0).astype("int64")
    out["tokens/s"] = b.tokens_per_s.round(0).astype("int64")
    out["MFU"] = (b.mfu * 100).round(1).astype(str) + " %"
    out[f"days for {_fmt_count(req.tokens)} tokens"] = b.train_days.map(lambda d: f"{d:.3g}")
    out["GPU-hours"] = b.gpu_hours.map(lambda h: f"{h:,.0f}")
    if req.prices:
        out["cost $"] = b.cost_usd.map(lambda c: f"{c:,.0f}")
    return out.reset_index(drop=True)


def markdown(report: Report) -> str:
    req = report.request
    rows = report.rows
    lines = ["# fitcheck capacity report", "",
             f"fitcheck {__version__}: {len(rows)} configurations, {int(rows.fits.sum())} fit. "
             "Every number is the planner's own (`planner.memory.estimate`, "
             "`planner.throughput.estimate_step`); `report.csv` has one row per configuration.",
             ""]
    lines += [f"- {d}" for d in describe(req)]
    lines += [f"- note: {n}" for n in report.notes]
    lines += ["", "## Minimum GPUs per model and GPU type", "",
              "The fewest GPUs of each type for which some candidate fits (every count up to "
              "one node, then whole nodes), and the planner's recommendation at that count.", ""]
    for title, table in min_gpu_tables(report):
        lines += [f"### {title}", "", table.to_markdown(index=False), ""]
    lines += ["## Throughput and time to train per model", "",
              f"At each swept GPU count where something fits: the recommended configuration "
              f"(fastest that fits, ties to the simplest), its throughput, and the time "
              f"{'and cost ' if req.prices else ''}to train {_fmt_count(req.tokens)} tokens.", ""]
    for m, _ in req.models:
        t = best_table(report, m)
        lines += [f"### {m}", ""]
        lines += [t.to_markdown(index=False) if len(t) else "Nothing fits at the swept GPU counts.",
                  ""]
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# Plots (matplotlib, imported here only)
# --------------------------------------------------------------------------------------------


def have_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


_GPU_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">")


def _gpu_style(j: int) -> dict[str, Any]:
    """Colour and marker per GPU type (lines that coincide stay distinguishable)."""
    return {"color": f"C{j % 10}", "marker": _GPU_MARKERS[j % len(_GPU_MARKERS)], "ms": 4.5,
            "lw": 1.5, "mfc": "none", "mew": 1.2}


_STRATEGY_STYLE = {  # named equivalents share a colour: FSDP solid, DeepSpeed dashed
    Strategy.DDP: ("C0", "-", "o"),
    Strategy.NO_SHARD: ("C0", "--", "x"),
    Strategy.SHARD_GRAD_OP: ("C1", "-", "s"),
    Strategy.ZERO2: ("C1", "--", "x"),
    Strategy.FULL_SHARD: ("C2", "-", "^"),
    Strategy.ZERO3: ("C2", "--", "x"),
    Strategy.HYBRID_SHARD: ("C3", "-", "D"),
    Strategy.ZERO1: ("C4", "--", "x"),
}


class _Layout:
    """A fixed grid in inches (no constrained/tight layout: it costs more than the drawing)."""

    def __init__(self, nrows: int, ncols: int, w: float, h: float, *, left: float = 0.8,
                 right: float = 0.2, top: float = 0.65, bottom: float = 0.95,
                 wgap: float = 0.75, hgap: float = 0.75, sharey: Any = False) -> None:
        from matplotlib.figure import Figure

        W = left + right + ncols * w + (ncols - 1) * wgap
        H = top + bottom + nrows * h + (nrows - 1) * hgap
        self.W, self.H, self.bottom = W, H, bottom
        self.fig = Figure(figsize=(W, H), dpi=100)
        self.axes = self.fig.subplots(
            nrows, ncols, squeeze=False, sharey=sharey,
            gridspec_kw=dict(left=left / W, right=1 - right / W, top=1 - top / H,
                             bottom=bottom / H, wspace=wgap / w, hspace=hgap / h))

    def finish(self, title: str, handles: Sequence[Any], labels: Sequence[str],
               ncol: int) -> Any:
        self.fig.suptitle(title, fontsize=11, y=1 - 0.12 / self.H, va="top")
        if handles:
            self.fig.legend(handles, labels, loc="lower center", ncol=max(1, ncol), fontsize=9,
                            frameon=False, bbox_to_anchor=(0.5, 0.0))
        return self.fig


def _log2_x(ax: Any, ns: Sequence[int], label: bool = True) -> None:
    from matplotlib.ticker import FixedFormatter, FixedLocator, NullLocator

    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(list(ns)))
    ax.xaxis.set_major_formatter(FixedFormatter([str(n) for n in ns]))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.tick_params(labelsize=8)
    if len(ns) > 1:
        ax.set_xlim(min(ns) / 1.3, max(ns) * 1.3)
    ax.grid(True, which="major", alpha=0.3)
    if label:
        ax.set_xlabel("GPUs (log scale)", fontsize=9)


def _log_y(ax: Any, fmt: Callable[[float, Any], str] | None = None) -> None:
    """Log y with ticks at 1, 2, 5 x 10^k written plainly (no 2 x 10^2), no minor ticks."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator

    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(fmt or (lambda v, _: _fmt_count(v))))
    ax.yaxis.set_minor_locator(NullLocator())
    ax.grid(True, which="major", axis="y", alpha=0.3)


def _first(req: ReportRequest) -> tuple[int, int]:
    return req.seqs[0], req.micro_batches[0]


def _plot_setting(req: ReportRequest) -> str:
    seq, mb = _first(req)
    return f"seq {seq}, micro-batch {mb}, {req.precision}"


def _hide_unused(axes: Any, used: int, ncols: int) -> None:
    for k in range(used, len(axes) * ncols):
        axes[k // ncols][k % ncols].set_visible(False)


def plot_memory(report: Report) -> Any:
    """Device memory per GPU vs GPU count, one line per strategy (no offload, the lightest
    requested checkpointing), one panel per model x GPU type, capacity and usable lines."""
    from matplotlib.lines import Line2D

    req, rows = report.request, report.rows
    seq, mb = _first(req)
    ck, ck_heavy = req.checkpointings[0], req.checkpointings[-1]
    d_all = rows[(rows.seq == seq) & (rows.micro_batch == mb) & (rows.offload == "none")]
    d = d_all[d_all.checkpointing == str(ck)]
    d_heavy = d_all[d_all.checkpointing == str(ck_heavy)] if ck_heavy is not ck else None
    nm, ng = len(req.models), len(req.gpus)
    lay = _Layout(nm, ng, 3.0, 2.3, wgap=0.3, hgap=0.65, sharey="row")
    axes = lay.axes
    handles: dict[str, Any] = {}
    for i, (m, _) in enumerate(req.models):
        lo, hi = math.inf, 0.0
        for j, g in enumerate(req.gpus):
            ax = axes[i][j]
            sel = d[(d.model == m) & (d.gpu == g.id)]
            heavy = (d_heavy[(d_heavy.model == m) & (d_heavy.gpu == g.id)]
                     if d_heavy is not None else None)
            for s in req.strategies:
                ss = sel[sel.strategy == str(s)].sort_values("n")
                if not len(ss):
                    continue
                color, ls, marker = _STRATEGY_STYLE[s]
                if heavy is not None:  # the same strategy with the heaviest checkpointing
                    hh = heavy[heavy.strategy == str(s)].sort_values("n")
                    yh = hh.device_used_bytes / GiB
                    if len(hh):
                        lo = min(lo, float(yh.min()))
                        ax.plot(hh.n, yh, color=color, ls=ls, lw=0.9, alpha=0.35)
                y = ss.device_used_bytes / GiB
                lo, hi = min(lo, float(y.min())), max(hi, float(y.max()))
                (h,) = ax.plot(ss.n, y, color=color, ls=ls, marker=marker, ms=3.5, lw=1.3,
                               label=str(s))
                handles.setdefault(str(s), h)
            cap = g.memory_bytes / GiB
            lo, hi = min(lo, cap * (1 - req.margin)), max(hi, cap)
            h = ax.axhline(cap, color="black", lw=1.6, label="GPU capacity")
            handles.setdefault("GPU capacity", h)
            h = ax.axhline(cap * (1 - req.margin), color="black", lw=1.0, ls=":",
                           label=f"usable ({1 - req.margin:.0%} of capacity)")
            handles.setdefault("usable", h)
            ax.axhspan(cap, 1e12, color="tab:red", alpha=0.07, lw=0)
            _log2_x(ax, req.ns, label=i == nm - 1)
            ax.set_title(f"{m} on {g.id}", fontsize=10)
        _log_y(axes[i][0], lambda v, _: f"{v:,.0f}" if v >= 1 else f"{v:g}")
        if hi > 0:
            axes[i][0].set_ylim(lo / 1.4, hi * 1.4)
        axes[i][0].set_ylabel("GiB per GPU (log scale)", fontsize=9)
        axes[i][0].tick_params(axis="y", labelsize=8)
    if d_heavy is not None:
        handles[f"{ck_heavy} checkpointing"] = Line2D(
            [], [], color="gray", lw=0.9, alpha=0.5, label=f"faint: {ck_heavy} checkpointing")
    faint = f", faint: {ck_heavy}" if d_heavy is not None else ""
    title = (f"Device memory per GPU vs GPU count ({_plot_setting(req)}, no offload; "
             f"checkpointing {ck}{faint}); shaded: over capacity")
    hs = list(handles.values())
    return lay.finish(title, hs, [h.get_label() for h in hs], min(len(hs), 7))


def plot_min_gpus(report: Report) -> Any:
    """Grouped bars: the fewest GPUs per model (x) and GPU type (bars), one panel per
    seq x micro-batch, without offload."""
    import numpy as np
    import pandas as pd
    from matplotlib.ticker import FuncFormatter, NullLocator

    req, mins = report.request, report.min_gpus
    combos = [(s, b) for s in req.seqs for b in req.micro_batches]
    ncols = min(len(combos), 2)
    nrows = -(-len(combos) // ncols)
    width = max(5.0, 0.35 * len(req.models) * (len(req.gpus) + 1))
    lay = _Layout(nrows, ncols, width, 3.2, bottom=0.8, hgap=0.8)
    axes = lay.axes
    models = [m for m, _ in req.models]
    x = np.arange(len(models))
    bw = 0.8 / max(len(req.gpus), 1)
    for k, (seq, mb) in enumerate(combos):
        ax = axes[k // ncols][k % ncols]
        sel = mins[(mins.seq == seq) & (mins.micro_batch == mb)]
        top = 1
        for j, g in enumerate(req.gpus):
            vals = []
            for m in models:
                r = sel[(sel.model == m) & (sel.gpu == g.id)]
                v = r.min_gpus.iloc[0] if len(r) else None
                vals.append(None if v is None or pd.isna(v) else int(v))
            xs = x - 0.4 + bw * (j + 0.5)
            ax.bar(xs, [v if v is not None else 0 for v in vals], bw * 0.92, color=f"C{j}",
                   label=g.id)
            for xi, v in zip(xs, vals):
                ax.annotate("none" if v is None else str(v), (xi, v or 1), ha="center",
                            va="bottom", fontsize=7, xytext=(0, 1), textcoords="offset points")
                top = max(top, v or 1)
        ax.set_yscale("log", base=2)
        ax.set_ylim(0.8, top * 2.2)
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_locator(NullLocator())
        ax.set_xticks(x)
        ax.set_xticklabels(models, fontsize=9)
        ax.tick_params(axis="y", labelsize=8)
        ax.set_ylabel("minimum GPUs (log scale)", fontsize=9)
        ax.set_title(f"seq {seq}, micro-batch {mb}", fontsize=10)
        ax.grid(True, axis="y", alpha=0.3)
    _hide_unused(axes, len(combos), ncols)
    return lay.finish(f"Fewest GPUs for which some strategy fits, without offload "
                      f"({req.precision})", *axes[0][0].get_legend_handles_labels(),
                      len(req.gpus))


def _best_first(report: Report) -> Any:
    req, rows = report.request, report.rows
    seq, mb = _first(req)
    return rows[(rows.seq == seq) & (rows.micro_batch == mb) & rows.best]


def _model_grid(n_models: int) -> tuple[int, int]:
    ncols = min(n_models, 4)
    return -(-n_models // ncols), ncols


def plot_throughput(report: Report) -> Any:
    """Tokens/s per GPU of the recommended configuration vs GPU count, per model, a line per
    GPU type (missing points: nothing fits)."""
    from matplotlib.ticker import FuncFormatter

    req = report.request
    b = _best_first(report)
    nrows, ncols = _model_grid(len(req.models))
    lay = _Layout(nrows, ncols, 3.2, 2.5, bottom=0.9)
    axes = lay.axes
    for k, (m, _) in enumerate(req.models):
        ax = axes[k // ncols][k % ncols]
        for j, g in enumerate(req.gpus):
            sel = b[(b.model == m) & (b.gpu == g.id)].sort_values("n")
            ax.plot(sel.n, sel.tokens_per_s_per_gpu, label=g.id, **_gpu_style(j))
        _log2_x(ax, req.ns)
        ax.set_ylim(bottom=0)
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
        ax.tick_params(labelsize=8)
        ax.set_title(m, fontsize=10)
        if k % ncols == 0:
            ax.set_ylabel("tokens/s per GPU", fontsize=9)
    _hide_unused(axes, len(req.models), ncols)
    return lay.finish(f"Throughput of the recommended strategy ({_plot_setting(req)}; "
                      "no point: nothing fits)", *axes[0][0].get_legend_handles_labels(),
                      len(req.gpus))


def plot_train_time_cost(report: Report) -> Any:
    """Days (and $, with prices) to train the tokens vs GPU count, per model, per GPU type."""
    req = report.request
    b = _best_first(report)
    per_model = 2 if req.prices else 1
    ncols = min(len(req.models), 4)
    blocks = -(-len(req.models) // ncols)
    lay = _Layout(blocks * per_model, ncols, 3.2, 2.4, bottom=0.9)
    axes = lay.axes
    kinds = [("train_days", "days to train (log scale)")]
    if req.prices:
        kinds.append(("cost_usd", "cost, $"))
    for k, (m, _) in enumerate(req.models):
        r0, c = (k // ncols) * per_model, k % ncols
        for dr, (col, ylabel) in enumerate(kinds):
            ax = axes[r0 + dr][c]
            for j, g in enumerate(req.gpus):
                sel = b[(b.model == m) & (b.gpu == g.id)].sort_values("n")
                if col == "cost_usd" and (req.prices or {}).get(g.id) is None:
                    continue
                ax.plot(sel.n, sel[col], label=g.id, **_gpu_style(j))
            if col == "cost_usd":  # linear from 0: cost differences read as ratios
                from matplotlib.ticker import FuncFormatter

                ax.set_ylim(bottom=0)
                ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"${_fmt_count(v)}"))
                ax.grid(True, which="major", axis="y", alpha=0.3)
            else:
                _log_y(ax)
            ax.tick_params(labelsize=8)
            _log2_x(ax, req.ns)
            ax.set_title(f"{m}: {'time' if col == 'train_days' else 'cost'}", fontsize=10)
            if c == 0:
                ax.set_ylabel(ylabel, fontsize=9)
    for k in range(len(req.models), blocks * ncols):
        for dr in range(per_model):
            axes[(k // ncols) * per_model + dr][k % ncols].set_visible(False)
    what = "Time and cost" if req.prices else "Time"
    price = "" if req.prices else "; no $ per GPU-hour given"
    return lay.finish(f"{what} to train {_fmt_count(req.tokens)} tokens with the recommended "
                      f"strategy ({_plot_setting(req)}{price})",
                      *axes[0][0].get_legend_handles_labels(), len(req.gpus))


PLOTS: dict[str, tuple[Callable[[Report], Any], str, str]] = {
    "memory": (plot_memory, "Memory per GPU vs GPU count",
               "Predicted device memory per GPU (allocator reserve, CUDA context and NCCL "
               "buffers included) for each strategy, against the GPU's capacity (solid black) "
               "and the usable part after the margin (dotted); above capacity is shaded red."),
    "min_gpus": (plot_min_gpus, "Minimum GPUs per model and GPU type",
                 "The fewest GPUs of each type for which some requested strategy fits "
                 "without offload (the table below also lists the count with offload)."),
    "throughput": (plot_throughput, "Throughput vs GPU count",
                   "Tokens per second per GPU of the planner's recommendation at each GPU "
                   "count; a missing point means nothing fits there."),
    "train_time_cost": (plot_train_time_cost, "Time and cost to train",
                        "Days (and dollars, from the given price per GPU-hour) to train the "
                        "given number of tokens with the recommended configuration."),
}


def render_plot(fig: Any, fmt: str) -> bytes:
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format=fmt, dpi=100 if fmt == "png" else None,
                **({"metadata": {"Date": None}} if fmt == "svg" else {}))
    return buf.getvalue()


# --------------------------------------------------------------------------------------------
# HTML
# --------------------------------------------------------------------------------------------

_CSS = """body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;
margin:2em auto;max-width:1400px;padding:0 1em;color:#222}
h1{font-size:1.6em}h2{margin-top:2em;border-bottom:1px solid #ddd}
img{max-width:100%;height:auto;border:1px solid #eee}
table{border-collapse:collapse;font-size:0.85em;margin:0.6em 0}
th,td{border:1px solid #ccc;padding:3px 7px;text-align:right}
th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}
.note{color:#555}"""


def html_page(report: Report, pngs: dict[str, bytes]) -> str:
    """One self-contained page: tables inline, plots as base64 PNG data URIs."""
    req, rows = report.request, report.rows
    e = html.escape
    out = ["<!doctype html>", '<html lang="en"><head><meta charset="utf-8">',
           "<title>fitcheck capacity report</title>", f"<style>{_CSS}</style></head><body>",
           "<h1>fitcheck capacity report</h1>",
           f"<p>fitcheck {e(__version__)}: {len(rows)} configurations, {int(rows.fits.sum())} "
           "fit. Every number is the planner's own; report.csv has one row per "
           "configuration.</p>", "<ul>"]
    out += [f"<li>{e(d)}</li>" for d in describe(req)]
    out += [f'<li class="note">note: {e(n)}</li>' for n in report.notes]
    out.append("</ul>")
    for kind, (_, title, words) in PLOTS.items():
        out.append(f'<h2 id="{kind}">{e(title)}</h2><p>{e(words)}</p>')
        if kind in pngs:
            data = base64.b64encode(pngs[kind]).decode("ascii")
            out.append(f'<img src="data:image/png;base64,{data}" alt="{e(title)}">')
        if kind == "min_gpus":
            for t_title, table in min_gpu_tables(report):
                out.append(f"<h3>{e(t_title)}</h3>")
                out.append(table.to_html(index=False, border=0))
        if kind == "train_time_cost":
            for m, _ in req.models:
                t = best_table(report, m)
                out.append(f"<h3>{e(m)}</h3>")
                out.append(t.to_html(index=False, border=0) if len(t)
                           else "<p>Nothing fits at the swept GPU counts.</p>")
    out.append("</body></html>")
    return "\n".join(out)


# --------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------


def write_atomic(path: str, data: bytes | str) -> None:
    """Write via a temporary file in the same directory and os.replace: readers see the old
    file or the new one, never a part; nothing is left behind on failure."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(path)}.",
                               suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(tmp, 0o666 & ~mask)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def parse_formats(text: str | Iterable[str]) -> tuple[str, ...]:
    out = []
    for f in parse_list(text, "--format"):
        f = f.lower()
        if f not in FORMATS:
            raise UsageError(f"--format: unknown format {f!r}; choose from {', '.join(FORMATS)}")
        out.append(f)
    return tuple(dict.fromkeys(out))


def check_formats(formats: Sequence[str]) -> None:
    """pandas missing, or plots asked for without matplotlib: one line, exit 2, before any
    work."""
    try:
        import pandas  # noqa: F401
    except ImportError:
        raise UsageError(PANDAS_MISSING) from None
    if PLOT_FORMATS.intersection(formats) and not have_matplotlib():
        raise UsageError(MATPLOTLIB_MISSING)


@dataclass(slots=True, kw_only=True)
class Written:
    report: Report
    paths: list[str]
    timings: dict[str, float]


def write_report(req: ReportRequest, out_dir: str, formats: Sequence[str] = DEFAULT_FORMATS,
                 progress: bool = False, stream: Any = None) -> Written:
    """Sweep and write the requested outputs into out_dir (created if missing)."""
    check_formats(formats)
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise UsageError(f"--out: {out_dir!r} exists and is not a directory")
    os.makedirs(out_dir, exist_ok=True)
    timings: dict[str, float] = {}
    report = run_sweep(req, progress=progress, stream=stream)
    timings["sweep"] = report.sweep_s
    paths: list[str] = []

    def put(name: str, data: bytes | str) -> None:
        path = os.path.join(out_dir, name)
        write_atomic(path, data)
        paths.append(path)

    t = time.perf_counter()
    if "csv" in formats:
        put("report.csv", report.rows.to_csv(index=False))
    if "md" in formats:
        put("report.md", markdown(report))
    timings["tables"] = time.perf_counter() - t
    if PLOT_FORMATS.intersection(formats):
        t = time.perf_counter()
        pngs: dict[str, bytes] = {}
        plot_bar = Progress(len(PLOTS), "plots          ", progress, stream)
        for kind, (fn, _, _) in PLOTS.items():
            fig = fn(report)
            if "png" in formats or "html" in formats:
                pngs[kind] = render_plot(fig, "png")
                if "png" in formats:
                    put(f"{kind}.png", pngs[kind])
            if "svg" in formats:
                put(f"{kind}.svg", render_plot(fig, "svg"))
            plot_bar.update()
        plot_bar.close()
        if "html" in formats:
            put("report.html", html_page(report, pngs))
        timings["plots"] = time.perf_counter() - t
    return Written(report=report, paths=paths, timings=timings)


__all__ = ["COLUMNS", "FORMATS", "PLOT_KINDS", "Progress", "Report", "ReportRequest",
           "build_request", "check_formats", "html_page", "markdown", "parse_formats",
           "run_sweep", "write_atomic", "write_report"]
