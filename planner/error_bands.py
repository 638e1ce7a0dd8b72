"""How sure an answer is: the planner's measured error on public runs, per kind of job.

``benchmarks/memory_accuracy.py`` and ``benchmarks/throughput_accuracy.py`` score the planner on
the public runs of ``benchmarks/*_measurements.csv`` and write what they measured to
``planner/data/error_bands.json`` (package data; ``tests/test_error_bands.py`` fails when it is
stale). This module reads it (no torch, no numpy) and answers two questions:

- ``band(strategy, compile)``: the measured peak-memory and step-time error of that kind of job
  (``family``: DDP / FSDP / ZeRO, eager or compiled), with the number of runs behind it; a kind
  with fewer than ``MIN_ROWS`` measured runs gets the all-runs band, and says so.
- ``risk_band(strategy, compile, finetune)``: the interval of the peak a job of that kind needs,
  from the measured error of that kind (``RiskBand``: a Student-t prediction interval of the log
  of measured / predicted, fitted on half of the public runs, its coverage checked on the other
  half by benchmarks/memory_accuracy.py), and its probability of running out of memory. A kind
  with fewer than ``RISK_MIN_ROWS`` fitted runs falls back to a coarser one, and says so.
- ``default_margin()``: the default ``--margin``: 0 since the risk replaced the single margin
  (docs/accuracy.md §5); a margin given explicitly is the user's own headroom.

Error conventions: ``err = (predicted - measured) / measured``; an *under-prediction* is
``max(0, -err)``: the fraction by which the planner said less than the run needed. Medians are
the usual median; p90s are nearest-rank (the ceil(0.9 n)-th smallest value), which never
interpolates below a value that was measured.
"""

from __future__ import annotations

import functools
import json
import math
import os
from collections.abc import Sequence
from typing import Any

from planner.lazy_dataclass import dataclass
from planner.spec import Allocator, CompileMode, Strategy, efficiency_provenance

DATA_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "error_bands.json")
SCHEMA_VERSION = 1
MIN_ROWS = 3
"""A family with fewer measured runs than this reports the all-runs band instead."""
MARGIN_QUANTILE = 0.9
"""``margin_from`` covers this fraction of the measured under-predictions (the single margin
the risk replaced; still printed by benchmarks/memory_accuracy.py for comparison)."""
RISK_COVERAGE = 0.9
"""The stated coverage of a verdict's interval: the need falls inside it 90 % of the time, below
its low end 5 % and above its high end 5 %."""
RISK_MIN_ROWS = 10
"""A kind needs this many fitted runs for its own interval, else a coarser kind is used (chosen
before fitting, as a common minimum for estimating a spread; not tuned)."""


def family(strategy: Strategy, compile: CompileMode = CompileMode.NONE) -> str:
    """The kind of job a band is measured for: 'ddp', 'fsdp' or 'zero', '-eager' or
    '-compiled'. One GPU counts as ddp (one replica); NO_SHARD is an FSDP wrapper."""
    base = "zero" if strategy.is_zero else "fsdp" if strategy.is_fsdp else "ddp"
    return f"{base}-{'eager' if compile is CompileMode.NONE else 'compiled'}"


def nearest_rank(values: Sequence[float], q: float) -> float:
    """The nearest-rank q-quantile: the ceil(q * n)-th smallest value (n >= 1)."""
    if not values:
        raise ValueError("no values")
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def summarize(errors: Sequence[float]) -> dict[str, Any]:
    """The band of relative errors (predicted - measured) / measured, as stored in the JSON."""
    import statistics  # the benchmarks' path only: not imported by a plan

    abs_errs = [abs(e) for e in errors]
    under = [max(0.0, -e) for e in errors]
    def r(x: float) -> float:  # stable text in the generated file
        return round(float(x), 4)

    return {"n": len(errors),
            "median_abs": r(statistics.median(abs_errs)),
            "p90_abs": r(nearest_rank(abs_errs, 0.9)),
            "median_signed": r(statistics.median(errors)),
            "p90_under": r(nearest_rank(under, 0.9)),
            "max_under": r(max(under)),
            "max_over": r(max(0.0, max(errors)))}


def margin_from(errors: Sequence[float]) -> float:
    """The default margin from memory errors: the nearest-rank p90 of the under-predictions,
    rounded up to a whole percent. If the plan keeps that fraction free, a run the planner
    under-predicts by u <= margin still fits: need = predicted / (1 - u) <= capacity."""
    u = nearest_rank([max(0.0, -e) for e in errors], MARGIN_QUANTILE)
    return math.ceil(round(u * 100, 6)) / 100


@functools.lru_cache(maxsize=1)
def _table() -> dict[str, Any]:
    try:
        with open(DATA_PATH, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) and data.get("schema_version") == SCHEMA_VERSION else {}


def default_margin() -> float:
    """The default --margin: 0. The verdict's risk (``risk_band``) is what covers the planner's
    measured error now; a margin given explicitly is headroom the user keeps on top of it."""
    return 0.0


DEFAULT_MARGIN = default_margin()
"""Fraction of device memory kept free by default (--margin): none; the measured error of the
kind of job decides the verdict instead (fits / at risk / does not fit, docs/accuracy.md §5)."""


# ---------------------------------------------------------------------------------------------
# Risk: an interval for the peak a job needs, from the measured error of its kind


AT_RISK_POLICIES = ("admit", "reject", "warn")
"""What the gate does with a job whose interval straddles the usable memory; a policy may also
be a probability P in (0, 1): reject the job when its probability of running out of memory is
at least P, else admit it with a warning (``parse_at_risk``, ``rejects``)."""
DEFAULT_AT_RISK = "warn"
"""Admit a job at risk with a warning that gives its probability of running out of memory
(docs/gating.md)."""


def parse_at_risk(raw: str) -> str:
    """admit, reject, warn, or a probability ('0.5', '50%') written as a plain decimal ('0.5');
    ValueError naming what is allowed."""
    text = raw.strip().lower()
    if text in AT_RISK_POLICIES:
        return text
    try:
        p = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        p = math.nan
    if not 0 < p < 1:  # NaN too
        raise ValueError(f"must be one of {', '.join(AT_RISK_POLICIES)} or a probability "
                         f"0 < P < 1 (or a percentage), got {raw[:40]!r}")
    return f"{p:g}"


def rejects(policy: str, p_oom: float | None) -> bool:
    """Whether the at-risk policy rejects a job with this probability of running out of
    memory (None: no measured band; a threshold then rejects, having nothing to weigh)."""
    if policy in ("admit", "warn"):
        return False
    if policy == "reject":
        return True
    return p_oom is None or p_oom >= float(policy)
FITS, AT_RISK, DOES_NOT_FIT = "fits", "at_risk", "does_not_fit"


def t_cdf(x: float, df: int) -> float:
    """Student's t distribution function with an integer number of degrees of freedom (the
    closed forms of Abramowitz & Stegun 26.7.3 / 26.7.4; no scipy on the planning path)."""
    if df < 1:
        raise ValueError("df must be >= 1")
    theta = math.atan(abs(x) / math.sqrt(df))
    s, c2 = math.sin(theta), math.cos(theta) ** 2
    if df % 2:  # odd: (2/pi) (theta + sin cos (1 + 2/3 cos^2 + 2.4/3.5 cos^4 + ...))
        total, term = 0.0, math.cos(theta)
        for j in range(1, (df - 1) // 2 + 1):
            total += term
            term *= (2 * j) / (2 * j + 1) * c2
        a = 2 / math.pi * (theta + s * total)
    else:  # even: sin (1 + 1/2 cos^2 + 1.3/2.4 cos^4 + ...)
        total, term = 0.0, 1.0
        for j in range(1, df // 2 + 1):
            total += term
            term *= (2 * j - 1) / (2 * j) * c2
        a = s * total
    a = min(1.0, max(0.0, a))
    return 0.5 + (a / 2 if x >= 0 else -a / 2)


def t_ppf(p: float, df: int) -> float:
    """The p-quantile of Student's t (0 < p < 1), by bisection of ``t_cdf``."""
    if not 0 < p < 1:
        raise ValueError("p must be in (0, 1)")
    if p < 0.5:
        return -t_ppf(1 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12:
            break
    return (lo + hi) / 2


def risk_kinds(strategy: Strategy, compile: CompileMode = CompileMode.NONE,
               finetune: bool = False) -> tuple[str, ...]:
    """The kinds a job belongs to, finest first: 'fsdp-eager-finetune', 'fsdp-eager', 'fsdp',
    'all'. finetune: LoRA / QLoRA or frozen parameters."""
    base = family(strategy, compile)
    return (f"{base}-{'finetune' if finetune else 'full'}", base, base.split("-")[0], "all")


def is_finetune(training: Any) -> bool:
    """Whether a training run trains only part of the model (LoRA, QLoRA, frozen parts)."""
    ft = getattr(training, "finetune", None)
    return ft is not None and bool(ft.lora or ft.freeze_embeddings or ft.freeze_layers
                                   or ft.train_last_layers)


def fit_log_ratios(log_ratios: Sequence[float]) -> dict[str, Any]:
    """The stored fit of one kind: n, the mean and sample standard deviation of
    log(measured / predicted) (n >= 2)."""
    import statistics  # the benchmarks' path only

    if len(log_ratios) < 2:
        return {"n": len(log_ratios)}
    return {"n": len(log_ratios), "mean_log": round(statistics.fmean(log_ratios), 6),
            "sd_log": round(statistics.stdev(log_ratios), 6)}


@dataclass(frozen=True, slots=True, kw_only=True)
class RiskBand:
    """The interval of the peak a job needs, from the measured error of its kind.

    x = log(measured / predicted) over the kind's fitted public runs has mean m and standard
    deviation s (n runs); a new job's x is taken as Student-t with n - 1 degrees of freedom
    around m, scale s * sqrt(1 + 1/n) (the prediction interval of one more draw from a normal
    sample). The need is predicted x exp(x)."""

    kind: str
    """The finest kind of the job asked for ('fsdp-eager-finetune')."""
    measured_kind: str
    """The kind whose runs the interval is from: the job's own, or a coarser one."""
    n: int
    mean_log: float
    sd_log: float
    coverage: float = RISK_COVERAGE
    high_floor: float = 1.0
    """The interval's high end is at least this multiple of the predicted need, where a
    measured mechanism the planner does not model can add that much (``routed_moe_band``)."""
    floor_reason: str = ""

    @property
    def scale(self) -> float:
        return self.sd_log * math.sqrt(1 + 1 / self.n)

    @property
    def quantile(self) -> float:
        return _two_sided(self.coverage, self.n - 1)

    @property
    def low(self) -> float:
        """The need at the interval's low end, as a multiple of the predicted need."""
        return math.exp(self.mean_log - self.quantile * self.scale)

    @property
    def high(self) -> float:
        """The need at the interval's high end, as a multiple of the predicted need (at least
        ``high_floor``)."""
        return max(math.exp(self.mean_log + self.quantile * self.scale), self.high_floor)

    def p_oom(self, required: int, usable: int) -> float:
        """The probability that the job needs more than ``usable`` bytes when ``required`` is
        predicted: the share of the kind's error distribution that would push it past."""
        if usable <= 0:
            return 1.0
        if required <= 0:
            return 0.0
        if self.scale <= 0:
            return float(required * math.exp(self.mean_log) > usable)
        z = (math.log(usable / required) - self.mean_log) / self.scale
        return 1.0 - t_cdf(z, self.n - 1)

    @property
    def fallback(self) -> bool:
        return self.measured_kind != self.kind

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "measured_kind": self.measured_kind, "n": self.n,
                "mean_log": self.mean_log, "sd_log": self.sd_log, "coverage": self.coverage,
                "low_factor": round(self.low, 4), "high_factor": round(self.high, 4),
                **({"high_floor": self.high_floor, "high_floor_reason": self.floor_reason}
                   if self.high_floor > 1 else {})}

    def text(self) -> str:
        """'90% interval -9% .. +31% of the predicted need, from 14 public runs of fsdp-eager
        jobs (too few fsdp-eager-finetune runs)'."""
        who = (f"{self.measured_kind} jobs" if self.measured_kind != "all" else "jobs of all kinds")
        few = (f" (fewer than {RISK_MIN_ROWS} {self.kind} runs)" if self.fallback else "")
        floor = (f"; its high end raised to {self.high_floor - 1:+.0%}: {self.floor_reason}"
                 if self.high_floor > 1 else "")
        return (f"{self.coverage:.0%} interval {self.low - 1:+.0%} .. {self.high - 1:+.0%} of "
                f"the predicted need, from {self.n} public runs of {who}{few}{floor}")


@functools.lru_cache(maxsize=64)
def _two_sided(coverage: float, df: int) -> float:
    return t_ppf((1 + coverage) / 2, df)


def risk_band(strategy: Strategy, compile: CompileMode = CompileMode.NONE,
              finetune: bool = False) -> RiskBand | None:
    """The risk interval of this kind of job: the finest of ``risk_kinds`` with at least
    RISK_MIN_ROWS fitted runs; None when error_bands.json has none."""
    risk = _table().get("memory", {}).get("risk", {})
    fitted = risk.get("kinds", {})
    kinds = risk_kinds(strategy, compile, finetune)
    coverage = risk.get("coverage", RISK_COVERAGE)
    for name in kinds:
        entry = fitted.get(name)
        if entry and entry.get("n", 0) >= max(RISK_MIN_ROWS, 2) and "sd_log" in entry:
            return RiskBand(kind=kinds[0], measured_kind=name, n=int(entry["n"]),
                            mean_log=float(entry["mean_log"]), sd_log=float(entry["sd_log"]),
                            coverage=float(coverage))
    return None


ROUTED_MOE_RESERVED_HIGH = 1.61
"""The largest max_reserved / max_allocated measured on our GPU runs of an MoE model without
expert parallel under the default allocator: benchmarks/gpu_runs, the seven HF-Mixtral-shaped
4-layer FSDP2 records on H100 and H200, 1.257 .. 1.605 (w8 .. w48; rounded up; w64 ran out
of memory on the H200 with a predicted need of 107 of 140 GiB). The allocator emulator
replays each within 1.1 % (benchmarks/gpu_runs/allocator_emulation.json): the routed
experts' tensors change size every step with the routing, and the free tails of the
segments they split stay reserved (an out-of-memory's release returns only whole free
segments; docs/model.md §7.4). Measured, not derived: the planner does not model it, so it
only raises the high end of the need's interval
(``routed_moe_band``), never the predicted need."""


def routed_moe_band(band: RiskBand | None) -> RiskBand | None:
    """``band`` for an MoE model without expert parallel under the default allocator: its high
    end at least ROUTED_MOE_RESERVED_HIGH (so such a job is called "fits" only where that much
    fragmentation would still fit; otherwise at risk)."""
    if band is None:
        return None
    from dataclasses import replace

    return replace(band, high_floor=ROUTED_MOE_RESERVED_HIGH,
                   floor_reason="an MoE model without expert parallel under the default "
                   "allocator fragmented its cache by up to that much on our GPU runs (the "
                   "routed tensors change size every step; NOT MODELLED; torch's CUDA notes "
                   "advise expandable segments where allocation sizes change often: "
                   "--allocator expandable, not measured with an MoE here)")


def plan_risk_band(training: Any, strategy: Strategy, moe: bool) -> RiskBand | None:
    """The risk band a plan trained as ``training`` carries: its kind's (``risk_band``), with
    ``routed_moe_band``'s floor for an MoE model (``moe``) without expert parallel under the
    default allocator. The one place every estimate (analytic, pipeline, trace-backed) takes
    it from."""
    band = risk_band(strategy, training.compile, is_finetune(training))
    if moe and training.ep == 1 and training.allocator is Allocator.DEFAULT:
        band = routed_moe_band(band)
    return band


def outcome(required: int, usable: int, band: RiskBand | None) -> tuple[str, float | None]:
    """(fits / at_risk / does_not_fit, probability of OOM) of a predicted need against the
    usable bytes. Without a band: the point verdict, no probability."""
    if band is None:
        return (FITS if required <= usable else DOES_NOT_FIT), None
    p = band.p_oom(required, usable)
    if math.ceil(required * band.high) <= usable:
        return FITS, p
    if math.floor(required * band.low) > usable:
        return DOES_NOT_FIT, p
    return AT_RISK, p


EFFICIENCY_WIDENING = {"eager": 0.15, "compiled": 0.22}
"""Points added to the tokens/s band of a GPU whose compute efficiency is not measured on its
family (derived from a sibling by the roofline, or assumed), per mode: the largest miss of the
same roofline transfer between the two measured families, A100 and H100 (eager -9.4 % and
+14.7 %, compiled -12.8 % and +21.9 %; rounded up to a whole point; docs/throughput.md section
2). For an assumed value it is a floor: nothing measured bounds an assumption."""


def efficiency_widening(provenance: str, compile: CompileMode = CompileMode.NONE) -> float:
    """The tokens/s band widening for an efficiency of this provenance (0 when measured)."""
    if provenance == "measured":
        return 0.0
    return EFFICIENCY_WIDENING["eager" if compile is CompileMode.NONE else "compiled"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Band:
    """The measured error of one kind of job on one quantity (peak memory or step time)."""

    quantity: str
    """'memory' (peak memory, the metric each source measured) or 'step_time' (tokens/s)."""
    family: str
    """The kind asked for (fsdp-eager, ...)."""
    measured_family: str
    """Whose runs the numbers are from: the family itself, or 'all' when it has < MIN_ROWS."""
    n: int
    median_abs: float
    p90_abs: float
    median_signed: float
    p90_under: float
    efficiency: str | None = None
    """step_time with a GPU: the provenance of its compute efficiency (measured / derived /
    assumed; planner.spec.efficiency_provenance); None: no GPU given."""
    widened_by: float = 0.0
    """Added to median_abs and p90_abs when the efficiency is not measured
    (EFFICIENCY_WIDENING); the measured fields stay as measured."""

    def as_dict(self) -> dict[str, Any]:
        out = {"family": self.measured_family, "n": self.n, "median_abs": self.median_abs,
               "p90_abs": self.p90_abs, "median_signed": self.median_signed,
               "p90_under": self.p90_under}
        if self.efficiency is not None:
            out["compute_efficiency"] = self.efficiency
            out["widened_by"] = self.widened_by
        return out

    def text(self) -> str:
        """'4% median, 15% p90 over 13 public runs' (of all kinds when the family has few),
        then the widening when the GPU's compute efficiency is not measured."""
        who = ("" if self.measured_family == self.family
               else f" of all kinds (fewer than {MIN_ROWS} of this kind)")
        base = (f"{self.median_abs:.0%} median, {self.p90_abs:.0%} p90 over {self.n} public "
                f"runs{who}")
        if not self.widened_by:
            return base
        return (f"{base}, widened by {self.widened_by * 100:.0f} points to "
                f"{self.median_abs + self.widened_by:.0%} median, "
                f"{self.p90_abs + self.widened_by:.0%} p90: this GPU's compute efficiency is "
                f"{self.efficiency.upper()}, not measured on its family")


def band(quantity: str, strategy: Strategy, compile: CompileMode = CompileMode.NONE,
         gpu: Any = None) -> Band | None:
    """The measured band of ``quantity`` ('memory' or 'step_time') for this kind of job, or
    None when error_bands.json has none. With ``gpu`` (a GpuProfile), the step-time band says
    its compute efficiency's provenance and is widened when that is not measured."""
    section = _table().get({"memory": "memory", "step_time": "throughput"}[quantity], {})
    fam = family(strategy, compile)
    entry, measured = section.get("families", {}).get(fam), fam
    if not entry or entry.get("n", 0) < MIN_ROWS:
        entry, measured = section.get("all"), "all"
    if not entry or not entry.get("n"):
        return None
    prov, widen = None, 0.0
    if gpu is not None and quantity == "step_time":
        prov = efficiency_provenance(gpu, compile)
        widen = efficiency_widening(prov, compile)
    return Band(quantity=quantity, family=fam, measured_family=measured, n=int(entry["n"]),
                median_abs=float(entry["median_abs"]), p90_abs=float(entry["p90_abs"]),
                median_signed=float(entry["median_signed"]),
                p90_under=float(entry["p90_under"]), efficiency=prov, widened_by=widen)


def bands_json(strategy: Strategy, compile: CompileMode = CompileMode.NONE,
               gpu: Any = None) -> dict[str, Any]:
    """The JSON of a verdict's error band: {'kind', 'memory', 'step_time'} (None where the file
    has none). Each band: family, n, median_abs, p90_abs, median_signed, p90_under; with
    ``gpu``, step_time also has compute_efficiency (its provenance) and widened_by."""
    mem, step = band("memory", strategy, compile), band("step_time", strategy, compile, gpu)
    return {"kind": family(strategy, compile),
            "memory": None if mem is None else mem.as_dict(),
            "step_time": None if step is None else step.as_dict()}


def bands_line(strategy: Strategy, compile: CompileMode = CompileMode.NONE,
               gpu: Any = None) -> str | None:
    """One line for people: how far off the planner has measured itself for this kind of job
    (the tokens/s part widened where the GPU's compute efficiency is not measured)."""
    mem, step = band("memory", strategy, compile), band("step_time", strategy, compile, gpu)
    parts = []
    if mem is not None:
        parts.append(f"peak memory {mem.text()}")
    if step is not None:
        parts.append(f"tokens/s {step.text()}")
    if not parts:
        return None
    return (f"how sure: the planner's measured |error| on {family(strategy, compile)} jobs: "
            + "; ".join(parts))
