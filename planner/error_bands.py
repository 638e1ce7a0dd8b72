"""How sure an answer is: the planner's measured error on public runs, per kind of job.

``benchmarks/memory_accuracy.py`` and ``benchmarks/throughput_accuracy.py`` score the planner on
the public runs of ``benchmarks/*_measurements.csv`` and write what they measured to
``planner/data/error_bands.json`` (package data; ``tests/test_error_bands.py`` fails when it is
stale). This module reads it (no torch, no numpy) and answers two questions:

- ``band(strategy, compile)``: the measured peak-memory and step-time error of that kind of job
  (``family``: DDP / FSDP / ZeRO, eager or compiled), with the number of runs behind it; a kind
  with fewer than ``MIN_ROWS`` measured runs gets the all-runs band, and says so.
- ``default_margin()``: the default ``--margin``, derived from the measured error (the rule is
  in docs/accuracy.md and below), never a fixed guess.

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
from dataclasses import dataclass
from typing import Any

from planner.spec import CompileMode, Strategy

DATA_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "error_bands.json")
SCHEMA_VERSION = 1
MIN_ROWS = 3
"""A family with fewer measured runs than this reports the all-runs band instead."""
FALLBACK_MARGIN = 0.05
"""Only when error_bands.json is missing or unreadable (a broken install): the old default."""
MARGIN_QUANTILE = 0.9
"""The default margin covers this fraction of the measured under-predictions."""


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
    """The default --margin: the measured one (error_bands.json), else FALLBACK_MARGIN."""
    value = _table().get("memory", {}).get("margin", {}).get("value")
    return float(value) if isinstance(value, (int, float)) and 0 <= value < 1 else FALLBACK_MARGIN


DEFAULT_MARGIN = default_margin()
"""Fraction of device memory kept free by default (--margin): derived from the planner's
measured under-prediction on public runs (docs/accuracy.md)."""


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

    def as_dict(self) -> dict[str, Any]:
        return {"family": self.measured_family, "n": self.n, "median_abs": self.median_abs,
                "p90_abs": self.p90_abs, "median_signed": self.median_signed,
                "p90_under": self.p90_under}

    def text(self) -> str:
        """'4% median, 15% p90 over 13 public runs' (of all kinds when the family has few)."""
        who = ("" if self.measured_family == self.family
               else f" of all kinds (fewer than {MIN_ROWS} of this kind)")
        return (f"{self.median_abs:.0%} median, {self.p90_abs:.0%} p90 over {self.n} public "
                f"runs{who}")


def band(quantity: str, strategy: Strategy, compile: CompileMode = CompileMode.NONE
         ) -> Band | None:
    """The measured band of ``quantity`` ('memory' or 'step_time') for this kind of job, or
    None when error_bands.json has none."""
    section = _table().get({"memory": "memory", "step_time": "throughput"}[quantity], {})
    fam = family(strategy, compile)
    entry, measured = section.get("families", {}).get(fam), fam
    if not entry or entry.get("n", 0) < MIN_ROWS:
        entry, measured = section.get("all"), "all"
    if not entry or not entry.get("n"):
        return None
    return Band(quantity=quantity, family=fam, measured_family=measured, n=int(entry["n"]),
                median_abs=float(entry["median_abs"]), p90_abs=float(entry["p90_abs"]),
                median_signed=float(entry["median_signed"]),
                p90_under=float(entry["p90_under"]))


def bands_json(strategy: Strategy, compile: CompileMode = CompileMode.NONE) -> dict[str, Any]:
    """The JSON of a verdict's error band: {'kind', 'memory', 'step_time'} (None where the file
    has none). Each band: family, n, median_abs, p90_abs, median_signed, p90_under."""
    mem, step = band("memory", strategy, compile), band("step_time", strategy, compile)
    return {"kind": family(strategy, compile),
            "memory": None if mem is None else mem.as_dict(),
            "step_time": None if step is None else step.as_dict()}


def bands_line(strategy: Strategy, compile: CompileMode = CompileMode.NONE) -> str | None:
    """One line for people: how far off the planner has measured itself for this kind of job."""
    mem, step = band("memory", strategy, compile), band("step_time", strategy, compile)
    parts = []
    if mem is not None:
        parts.append(f"peak memory {mem.text()}")
    if step is not None:
        parts.append(f"tokens/s {step.text()}")
    if not parts:
        return None
    return (f"how sure: the planner's measured |error| on {family(strategy, compile)} jobs: "
            + "; ".join(parts))
