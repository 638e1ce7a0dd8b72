"""Settle the source articles' memory claims (/work/shared/seeds/000..003) with fitcheck.

    python benchmarks/seed_claims.py            # prints the report, writes docs/seed-claims.md
    python benchmarks/seed_claims.py --stdout   # print only

For every quantitative memory claim the script writes down (a) the article's own arithmetic
under the article's own stated assumptions, spelled out term by term, and (b) fitcheck's
answer for the closest real model under PyTorch's actual allocation (the planner is called
in-process: ``planner.memory.estimate``). The verdicts are chosen from the computed numbers.

Each claim is one ``Claim`` record in ``ARTICLES``: the article's words, the planner calls it
needs (``runs``, by name), values derived from them (``let``), and its text as templates over
those names (``str.format`` with the units of ``Units``). Arithmetic on constants only is done
in place with f-strings.

Units: GB = 1e9 bytes, GiB = 2**30 bytes. Articles say "GB"; we read them as 1e9 bytes.
"""

from __future__ import annotations

import argparse
import os
import string
import sys
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from planner.hardware import load_gpu  # noqa: E402
from planner.memory import DEFAULT_MARGIN, Estimate, activation_plan, estimate  # noqa: E402
from planner.params import total_params  # noqa: E402
from planner.presets import get_preset  # noqa: E402
from planner.request import resolve_cluster  # noqa: E402
from planner.scaling import shape_from_params  # noqa: E402
from planner.search import largest, smallest_n  # noqa: E402
from planner.spec import (  # noqa: E402
    Candidate,
    Checkpointing,
    ModelSpec,
    Offload,
    Precision,
    Strategy,
    TrainingSpec,
)

MARGIN_PCT = f"{DEFAULT_MARGIN * 100:g} %"
"""The planner's default margin as the claims below quote it."""

GB = 1e9
GiB = 2**30
OUT = ROOT / "docs" / "seed-claims.md"
COMMAND = "python benchmarks/seed_claims.py"

# Defaults for every fitcheck run unless a claim states otherwise.
SEQ = 2048
MICRO_BATCH = 1
PRECISION = Precision.BF16_AMP
# Largest-model searches: a geometric grid of GRID + 1 counts, steps of 0.48 %.
PARAMS_LO, PARAMS_HI, GRID = 1e8, 2e12, 2048

DDP, SGO, FS = Strategy.DDP, Strategy.SHARD_GRAD_OP, Strategy.FULL_SHARD
Z1, Z2, Z3 = Strategy.ZERO1, Strategy.ZERO2, Strategy.ZERO3
SEL, FULL = Checkpointing.SELECTIVE, Checkpointing.FULL
OFFLOAD = Offload.PARAMS_AND_OPTIMIZER
FP32, FP16_AMP, BF16 = Precision.FP32, Precision.FP16_AMP, Precision.BF16

GPU_WORDS = {"h100-80": "H100 SXM 80GB", "a100-80": "A100 SXM 80GB", "a100-40": "A100 SXM 40GB"}
TERM_WORDS = {
    "params": "params", "gradients": "grads", "optimizer_states": "optimizer states",
    "gathered_params": "gathered/cast weights", "activations": "activations",
    "transients": "loss/backward transients", "comm_buffers": "comm buffers",
    "optimizer_temporaries": "optimizer temporaries", "cublas_workspace": "cuBLAS workspace"}

# --------------------------------------------------------------------------------------
# units


def gb(x: float) -> str:
    return f"{x / GB:,.1f} GB"


def billions(x: float | None) -> str:
    if x is None:
        return "none (< 0.1B)"
    if x >= PARAMS_HI:
        return "≥ 2000B"
    return f"{x / 1e9:.1f}B" if x >= 1e9 else f"{x / 1e9:.2f}B"


def mark(ok: bool) -> str:
    return "✓" if ok else "✗"


def at_least(x: float | None, threshold: float) -> bool:
    return x is not None and x >= threshold


class Units(string.Formatter):
    """``str.format`` with the doc's units as format specs: ``{x:gb}`` bytes in GB,
    ``{P:gb×16}`` P × 16 in GB (P parameters at 16 B each), ``{x:B}`` a parameter count in
    billions, ``{P:e9}`` a count as 13.02e9, ``{ok:mark}`` ✓ or ✗, ``{x:≥13e9}`` ✓ when x
    (None: not) is at least 13e9, ``{ok:?text}`` the text when ok, else nothing."""

    NAMED: ClassVar[dict[str, Callable[[Any], str]]] = {
        "B": billions, "e9": lambda x: f"{x / 1e9:.2f}e9", "mark": mark}

    def format_field(self, value: Any, spec: str) -> str:
        unit, _, scale = spec.partition("×")
        if unit == "gb":
            return gb(value * float(scale) if scale else value)
        if spec in self.NAMED:
            return self.NAMED[spec](value)
        if spec.startswith("≥"):
            return mark(at_least(value, float(spec[1:])))
        if spec.startswith("?"):
            return spec[1:] if value else ""
        return format(value, spec)


UNITS = Units()


def fill(template: Any, names: Mapping[str, Any]) -> Any:
    """A template, or a list of them (nested), formatted with ``names`` and the units."""
    if isinstance(template, str):
        return UNITS.vformat(template, (), names)
    return [fill(t, names) for t in template]


def ratios(a: Mapping[int, Outcome], b: Mapping[int, Outcome]) -> dict[int, float]:
    """Device use of sweep ``a`` over sweep ``b``, per GPU count."""
    return {n: a[n].used / b[n].used for n in a}


def joined(outcomes: Mapping[int, Outcome], template: str) -> str:
    """``template`` over ``{n}`` and ``{e}`` for each GPU count of a sweep, joined by '; '."""
    return "; ".join(fill(template, {"n": n, "e": e}) for n, e in outcomes.items())


def zero_paper(n: int) -> str:
    """Model-state bytes per parameter with Adam in mixed precision, ZeRO paper (Rajbhandari
    et al. 2020, fig. 1): 2 + 2 + 12 = 16; stage 1 shards the 12, stage 2 the grads too."""
    s1, s2, s3 = 4 + 12 / n, 2 + 14 / n, 16 / n
    return (f"ZeRO paper, Ψ-bytes at N_d = {n}: baseline 16, stage 1 {s1:.2f} (×{16 / s1:.1f}), "
            f"stage 2 {s2:.2f} (×{16 / s2:.1f}), stage 3 {s3:.2f} (×{16 / s3:.0f}).")


# --------------------------------------------------------------------------------------
# planner calls: each query is a frozen record whose value() asks the planner


@dataclass(frozen=True)
class Run:
    """One planner estimate. ``model`` is a preset name or a --params count."""

    model: str | float
    gpu: str
    n: int
    strategy: Strategy
    precision: Precision = PRECISION
    ckpt: Checkpointing = Checkpointing.NONE
    offload: Offload = Offload.NONE

    def value(self) -> Outcome:
        m = (get_preset(self.model) if isinstance(self.model, str)
             else shape_from_params(self.model))
        training = TrainingSpec(seq=SEQ, micro_batch=MICRO_BATCH, precision=self.precision)
        cand = Candidate(strategy=self.strategy, offload=self.offload, checkpointing=self.ckpt)
        cluster = resolve_cluster(load_gpu(self.gpu), self.n, None, None)
        return Outcome(self, m, estimate(m, training, cluster, cand))


@dataclass(frozen=True)
class Outcome:
    """A Run's estimate (its fields read through: ``e.breakdown``, ``e.fits``) and the
    doc's sentences about it."""

    run: Run
    model: ModelSpec
    est: Estimate

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.est, name)

    @property
    def used(self) -> int:
        return self.est.device_used_bytes

    @property
    def offloaded(self) -> bool:
        return self.run.offload is not Offload.NONE

    @property
    def setting(self) -> str:
        r, m = self.run, self.model
        return (f"`{m.name}` ({total_params(m) / 1e9:.2f}e9 params, vocab {m.vocab}); seq {SEQ}, "
                f"micro-batch {MICRO_BATCH}, {r.precision}, AdamW (foreach); {r.n} × "
                f"{GPU_WORDS[r.gpu]}, {r.strategy}, checkpointing {r.ckpt}"
                + (f", offload {r.offload}" if self.offloaded else ""))

    @property
    def terms(self) -> str:
        e = self.est
        terms = e.breakdown.as_dict().items()
        parts = [f"{TERM_WORDS[k]} {gb(v)}" for k, v in terms if v >= 0.05 * GB]
        runtime = e.allocator_overhead_bytes + e.cuda_context_bytes + e.nccl_bytes
        return ", ".join([*parts, f"allocator reserve + CUDA context + NCCL {gb(runtime)}"])

    @property
    def describe(self) -> str:
        e = self.est
        return (f"peak at `{e.peak_phase}`: {self.terms} → device used **{gb(self.used)} "
                f"({self.used / GiB:,.1f} GiB)** of {gb(e.capacity_bytes)} "
                f"({gb(e.usable_bytes)} usable at {MARGIN_PCT} margin): **fits {mark(e.fits_gpu)}**"
                + ("" if e.fits_gpu or not e.may_fit_gpu else
                   f" (at risk: P(OOM) {e.oom_probability:.0%})"))

    @property
    def describe_host(self) -> str:
        e = self.est
        return (f"{self.describe}; host RAM {gb(e.host_bytes_per_node)} per node of "
                f"{gb(e.host_capacity_bytes)}: {mark(e.fits_host)}")

    @property
    def host_check(self) -> str:
        e = self.est
        return (f"host {gb(e.host_bytes_per_node)} of {gb(e.host_capacity_bytes)} "
                f"{mark(e.fits_host)}")


@dataclass(frozen=True)
class Sweep:
    """``run`` at each GPU count in ``ns``: {n: Outcome}."""

    run: Run
    ns: tuple[int, ...]

    def value(self) -> dict[int, Outcome]:
        return {n: replace(self.run, n=n).value() for n in self.ns}


@dataclass(frozen=True)
class Fewest:
    """Fewest GPUs (any count up to a node, then whole nodes, up to 512) for which ``run``
    fits (its ``n`` is what is searched); None when none does."""

    run: Run

    def value(self) -> int | None:
        def fits(n: int) -> bool:
            return replace(self.run, n=n).value().fits

        return smallest_n(fits, load_gpu(self.run.gpu).gpus_per_node, limit=512)


def grid_params(i: int) -> float:
    """The i-th (from 0) of GRID + 1 parameter counts from PARAMS_LO to PARAMS_HI."""
    return PARAMS_LO * (PARAMS_HI / PARAMS_LO) ** (i / GRID)


@dataclass(frozen=True)
class Largest:
    """Largest --params (scaling-rule shape) that fits on 8 ``gpu``s, by planner.search.largest
    over the grid: the model's total parameters, PARAMS_HI when even that fits, None when
    PARAMS_LO does not. Near the boundary a fit is not monotone in --params (the shape rule
    trades depth for width from one count to the next), so this is the boundary the bisection
    finds, not necessarily the largest count of all that fit."""

    gpu: str
    strategy: Strategy
    ckpt: Checkpointing = Checkpointing.NONE
    offload: Offload = Offload.NONE

    def fits(self, i: int) -> bool:
        run = Run(grid_params(i), self.gpu, 8, self.strategy, ckpt=self.ckpt, offload=self.offload)
        return run.value().fits

    def value(self) -> float | None:
        if not self.fits(0):
            return None
        i = largest(self.fits, GRID) or 0
        return PARAMS_HI if i == GRID else float(total_params(shape_from_params(grid_params(i))))


@dataclass(frozen=True)
class Acts:
    """Saved activations at the end of forward (all blocks + embeddings/head/loss), bytes."""

    model: str
    strategy: Strategy
    ckpt: Checkpointing = Checkpointing.NONE
    mb: int = MICRO_BATCH

    def value(self) -> int:
        training = TrainingSpec(seq=SEQ, micro_batch=self.mb, precision=PRECISION)
        cand = Candidate(strategy=self.strategy, checkpointing=self.ckpt)
        return activation_plan(get_preset(self.model), training, cand).saved_total


@dataclass(frozen=True)
class Params:
    """A preset's total parameter count."""

    model: str

    def value(self) -> int:
        return total_params(get_preset(self.model))


Query = Run | Sweep | Fewest | Largest | Acts | Params


def names(runs: Mapping[str, Query], let: Mapping[str, Any]) -> dict[str, Any]:
    """What a record's templates can name: the defaults, its runs' values, then its lets (in
    order; a callable is called with everything named before it)."""
    v = SimpleNamespace(seq=SEQ, mb=MICRO_BATCH, precision=PRECISION,
                        **{k: q.value() for k, q in runs.items()})
    for k, f in let.items():
        setattr(v, k, f(v) if callable(f) else f)
    return vars(v)


# --------------------------------------------------------------------------------------
# records


@dataclass(frozen=True, kw_only=True)
class Claim:
    """One quantitative claim, the article's arithmetic redone, and fitcheck's answer. Every
    text field is a template over ``runs`` and ``let``."""

    TEXT: ClassVar[tuple[str, ...]] = ("title", "quote", "assumption", "arithmetic", "fitcheck",
                                       "verdict", "why", "article_figure", "fitcheck_figure")
    id: str
    title: str
    quote: str
    assumption: str
    arithmetic: list[str]
    runs: Mapping[str, Query] = field(default_factory=dict)
    let: Mapping[str, Any] = field(default_factory=dict)
    fitcheck: list[str]
    verdict: str
    why: str
    article_figure: str
    fitcheck_figure: str

    def settle(self) -> Claim:
        v = names(self.runs, self.let)
        return replace(self, **{k: fill(getattr(self, k), v) for k in self.TEXT})


@dataclass(frozen=True, kw_only=True)
class Table:
    """An article's table redone: ``rows`` are cell templates over ``runs`` and ``let``;
    ``each`` adds one row per (row text, Run), its cells ``columns`` over ``{row}`` and
    ``{r}`` (the Run's Outcome)."""

    TEXT: ClassVar[tuple[str, ...]] = ("title", "quote", "setup", "rows", "note")
    id: str
    title: str
    quote: str
    setup: str
    header: list[str]
    runs: Mapping[str, Query] = field(default_factory=dict)
    let: Mapping[str, Any] = field(default_factory=dict)
    rows: list[list[str]] = field(default_factory=list)
    columns: list[str] = field(default_factory=list)
    each: list[tuple[tuple[str, ...], Run]] = field(default_factory=list)
    note: str = ""

    def settle(self) -> Table:
        v = names(self.runs, self.let)
        done = replace(self, **{k: fill(getattr(self, k), v) for k in self.TEXT}, each=[])
        more = [fill(self.columns, v | {"row": row, "r": run.value()}) for row, run in self.each]
        return replace(done, rows=done.rows + more)


@dataclass(frozen=True)
class Article:
    id: str
    title: str
    claims: list[Claim]
    tables: list[Table] = field(default_factory=list)


# --------------------------------------------------------------------------------------
# the claims

L13, L7, L70 = "llama2-13b", "llama2-7b", "llama2-70b"
L3_70, L31_70 = "llama3-70b", "llama3.1-70b"
H100, A80, A40 = "h100-80", "a100-80", "a100-40"
LARGEST_HEADER = ["article's row", "strategy as stated", "largest that fits (fitcheck)", "holds?"]

ARTICLE_000 = Article("000", "DDP vs FSDP switch (13B on 8 × H100)", claims=[
    Claim(
        id="H", title="Headline: \"DDP fits 13B on an 80 GB H100\"",
        quote="For H100 80GB GPUs, the practical threshold is around 13B parameters for DDP with "
              "FP16. Beyond that, FSDP is required.",
        assumption="Mixed precision with torch.cuda.amp (the article's words), Adam, 80 GB H100.",
        arithmetic=[
            ("Article's own count: 13e9 × (2 + 8 + 2) B = 156.0 GB model states, + ~15 GB "
             "activations = 171 GB (its own table), already 2.1× the 80 GB it says 13B fits in."),
            ("With the fp32 master weights the article leaves out (torch AMP keeps the parameters "
             "themselves in fp32, and their gradients too): 13e9 × (4 params + 4 grads + 8 Adam "
             f"m,v) = {gb(13e9 * 16)} of model states alone — {13e9 * 16 / (80 * GB):.1f}× an 80 "
             f"GB card, {13e9 * 16 / 85520809984:.1f}× the H100's real 85.5 GB (81559 MiB)."),
        ],
        runs={"e": Run(L13, H100, 8, DDP, ckpt=FULL), "big": Largest(H100, DDP, FULL),
              "P": Params(L13)},
        let={"replica": lambda v: v.P * 8 / GB},
        fitcheck=["{e.setting}:", "{e.describe}.",
                  ("Largest model DDP fits on an H100 80GB (scaling-rule shape, full "
                   "checkpointing): **{big:B}** parameters.")],
        verdict="wrong",
        why="DDP replicates 16 B/param of model states (fp32 params, fp32 grads, fp32 Adam m and "
            "v) plus a 4 B/param gradient bucket copy (gradient_as_bucket_view=False) and a 4 "
            "B/param foreach-Adam temporary at the step: {replica:.0f} GB for params + buckets "
            "before the first forward, {e.peak_allocated_bytes:gb} allocated at the optimizer "
            "step. The DDP ceiling on an 80 GB H100 is ~{big:B}, not 13B.",
        article_figure="13B fits (own table: 171 GB)",
        fitcheck_figure="{e.used:gb} ✗; DDP max {big:B}",
    ),
    Claim(
        id="000-1", title="13B under DDP: ~171 GB per GPU",
        quote="Model params (FP16) 26 GB · Optimizer states (Adam FP32) 104 GB · Gradients (FP16) "
              "26 GB · Activations (seq len 2048) ~15 GB · Total ~171 GB",
        assumption="FP16 params and grads, two FP32 Adam buffers, torch.cuda.amp; 8 × H100 80GB.",
        arithmetic=[
            ("13e9 × 2 B = 26 GB params; 13e9 × 8 B = 104 GB Adam; 13e9 × 2 B = 26 GB grads; 26 + "
             "104 + 26 + 15 = 171 GB. The sum is right under its own assumptions."),
            ("Its assumptions are not torch.cuda.amp's: autocast leaves the parameters in fp32 "
             "(13e9 × 4 = 52 GB) and backward writes fp32 grads (52 GB); 16 B/param → 208 GB "
             "before activations."),
        ],
        runs={"e": Run(L13, H100, 8, DDP), "P": Params(L13)},
        let={"x171": lambda v: v.e.used / 171e9},
        fitcheck=["{e.setting}:", "{e.describe}.",
                  ("Forward moment: {e.phases[forward].total:gb} allocated, of which the autocast "
                   "cache of bf16 weight copies is {P:gb×2} (fp32 params are cast once per "
                   "forward and cached).")],
        verdict="wrong (under-count; the conclusion \"does not fit\" stands)",
        why="Forgot the fp32 master weights (params stay fp32 under torch AMP: +{P:gb×2} vs FP16) "
            "and fp32 grads (+{P:gb×2}), DDP's gradient buckets ({e.breakdown.comm_buffers:gb}), "
            "the foreach-Adam temporary ({e.breakdown.optimizer_temporaries:gb}), and, in "
            "forward, the autocast weight cache. fitcheck: {e.used:gb} per GPU, ~{x171:.1f}× the "
            "article's 171 GB.",
        article_figure="171 GB", fitcheck_figure="{e.used:gb} ✗",
    ),
    Claim(
        id="000-2", title="13B under FSDP on 8 GPUs: 19.5 GB static, ~34.5 GB total",
        quote="The per-GPU footprint becomes 26GB/8 + 104GB/8 + 26GB/8 = 19.5GB for static "
              "components, plus activations ... With activation checkpointing enabled, activation "
              "memory can be reduced by ~60%, bringing the total to approximately 34.5GB per GPU.",
        assumption="FULL_SHARD over 8 × H100 80GB, FP16 params/grads, FP32 Adam, seq 2048.",
        arithmetic=[
            ("156 GB / 8 = 19.5 GB (right). 19.5 + 15 = 34.5 GB: the 34.5 GB is the total "
             "*without* checkpointing; with the article's own 60 % reduction it would be 19.5 + "
             "0.4 × 15 = 25.5 GB. The paragraph contradicts its own table."),
            ("With fp32 sharded params + grads (FSDP2 MixedPrecisionPolicy keeps the sharded "
             "parameters in fp32): 13e9 × 16 B / 8 = 26.0 GB static."),
        ],
        runs={"fs": Run(L13, H100, 8, FS), "ck": Run(L13, H100, 8, FS, ckpt=FULL)},
        fitcheck=["{fs.setting}:", "{fs.describe}.", "{ck.setting}:", "{ck.describe}."],
        verdict="right for the wrong reason",
        why="The figure (34.5 GB) lands between fitcheck's {ck.used:gb} (full checkpointing) and "
            "{fs.used:gb} (none), but only because two errors cancel: the static part is 26 GB "
            "not 19.5 GB (fp32 sharded params/grads), plus a foreach-Adam temporary "
            "({ck.breakdown.optimizer_temporaries:gb}) and ~2 GB of runtime (CUDA context, NCCL, "
            "allocator reserve), while the claimed 60 % activation saving was never applied. Both "
            "settings fit an 80 GB H100, so the conclusion holds.",
        article_figure="34.5 GB ✓", fitcheck_figure="{ck.used:gb}–{fs.used:gb} ✓",
    ),
    Claim(
        id="000-3", title="13B activations at seq 2048: ~15 GB",
        quote="Activations (seq len 2048) ~15 GB",
        assumption="Micro-batch not stated; read as 1 sequence of 2048 tokens.",
        arithmetic=[("No derivation given. Korthikanti et al. (34·s·b·h bytes per layer, fp16, no "
                     f"dropout counted) give 34 × 2048 × 5120 × 40 = {gb(34 * 2048 * 5120 * 40)} "
                     "for the blocks.")],
        runs={"fs": Acts(L13, FS), "ddp": Acts(L13, DDP)},
        let={"logits": 2048 * 32000 * 4, "fs_share": lambda v: 15e9 / v.fs,
             "ddp_share": lambda v: 15e9 / v.ddp, "fs_tok": lambda v: v.fs / 2048 / 1e6,
             "ddp_tok": lambda v: v.ddp / 2048 / 1e6},
        fitcheck=[("`llama2-13b`, seq 2048, micro-batch 1, bf16-amp, saved activations at the end "
                   "of forward: **{fs:gb}** when the module computes in bf16 (FSDP/ZeRO), "
                   "**{ddp:gb}** under torch.autocast over fp32 params (DDP: the residual stream "
                   "and norm outputs stay fp32 and each of q/k/v and gate/up saves its own bf16 "
                   "cast of its input). Both include the fp32 log-softmax of the logits "
                   "({logits:gb} at vocab 32000).")],
        verdict="roughly right for FSDP (low by a quarter); the same 15 GB for DDP is not",
        why="15 GB is {fs_share:.0%} of fitcheck's bf16-module count and {ddp_share:.0%} of the "
            "autocast count; the article does not say which regime or micro-batch it means. "
            "Activations scale with micro-batch × seq, so the figure is only meaningful per "
            "token: fitcheck gives {fs_tok:.1f} MB/token (module) and {ddp_tok:.1f} MB/token "
            "(autocast).",
        article_figure="~15 GB", fitcheck_figure="{fs:gb} (FSDP) / {ddp:gb} (DDP)",
    ),
    Claim(
        id="000-4", title="Activation checkpointing cuts activations by ~60 %",
        quote="This reduces activation memory by ~60% but increases compute time by ~10-15%.",
        assumption="Checkpointing granularity not stated.",
        arithmetic=["A flat percentage; no derivation."],
        runs={"fs": Acts(L13, FS), "fs_sel": Acts(L13, FS, SEL), "fs_full": Acts(L13, FS, FULL),
              "ddp": Acts(L13, DDP), "ddp_sel": Acts(L13, DDP, SEL),
              "ddp_full": Acts(L13, DDP, FULL)},
        let={"fs_sel_cut": lambda v: 1 - v.fs_sel / v.fs,
             "fs_full_cut": lambda v: 1 - v.fs_full / v.fs,
             "ddp_sel_cut": lambda v: 1 - v.ddp_sel / v.ddp,
             "ddp_full_cut": lambda v: 1 - v.ddp_full / v.ddp},
        fitcheck=["`llama2-13b`, seq 2048, micro-batch 1, bf16-amp, saved activations:",
                  ("FSDP (bf16 module): none {fs:gb}, selective {fs_sel:gb} (−{fs_sel_cut:.0%}), "
                   "full {fs_full:gb} (−{fs_full_cut:.0%})."),
                  ("DDP (autocast): none {ddp:gb}, selective {ddp_sel:gb} (−{ddp_sel_cut:.0%}), "
                   "full {ddp_full:gb} (−{ddp_full_cut:.0%}).")],
        verdict="wrong for both common forms",
        why="Full (per-block) checkpointing keeps only each block's input: a >90 % cut, not 60 %; "
            "selective checkpointing with flash-style SDPA recomputes little that is saved (the "
            "T×T scores are never stored), so it cuts far less than 60 %. What remains under full "
            "checkpointing is dominated by the fp32 logits/log-softmax, which checkpointing the "
            "blocks does not touch.",
        article_figure="−60 %",
        fitcheck_figure="selective −{fs_sel_cut:.0%}, full −{fs_full_cut:.0%}",
    ),
    Claim(
        id="000-5", title="Adam needs ~8 B/param; 13B needs 104 GB per GPU under DDP",
        quote="DDP requires ~8 bytes per parameter for Adam optimizer states alone; a 13B model "
              "needs 104GB per GPU before accounting for activations.",
        assumption="Two fp32 Adam buffers per parameter.",
        arithmetic=["13e9 × 8 B = 104 GB — right for exp_avg + exp_avg_sq alone."],
        runs={"e": Run(L13, H100, 8, DDP), "P": Params(L13)},
        let={"bd": lambda v: v.e.breakdown,
             "before_acts": lambda v: v.bd.params + v.bd.gradients + v.bd.optimizer_states
             + v.bd.comm_buffers + v.bd.optimizer_temporaries},
        fitcheck=[("`llama2-13b` DDP optimizer states: {bd.optimizer_states:gb} (2 × 4 B × "
                   "{P:e9}); the step adds a foreach temporary of {bd.optimizer_temporaries:gb} "
                   "(torch._foreach_sqrt(exp_avg_sqs)).")],
        verdict="right (states alone); misleading as \"needs 104 GB before activations\"",
        why="8 B/param is Adam's two moments. \"Before activations\" the 13B DDP replica also "
            "holds fp32 params ({bd.params:gb}), fp32 grads ({bd.gradients:gb}), DDP buckets "
            "({bd.comm_buffers:gb}) and the step temporary: {before_acts:gb}, not 104 GB.",
        article_figure="104 GB",
        fitcheck_figure="{bd.optimizer_states:gb} states; {e.peak_allocated_bytes:gb} allocated",
    ),
    Claim(
        id="000-6", title="DDP that does not fit OOMs during the backward pass",
        quote="DDP for a model that exceeds GPU memory results in OOM errors during the backward "
              "pass.",
        assumption="—",
        arithmetic=["No numbers."],
        runs={"e": Run(L13, H100, 8, DDP)},
        let={"construct": lambda v: v.e.breakdown.params + v.e.breakdown.comm_buffers,
             "phases": lambda v: ", ".join(f"{k} {gb(p.total)}" for k, p in v.e.phases.items())},
        fitcheck=[("`llama2-13b` DDP on H100 80GB: fp32 params ({e.breakdown.params:gb}) + DDP's "
                   "flat gradient buckets, allocated when DDP(model) is constructed "
                   "({e.breakdown.comm_buffers:gb}) = {construct:gb} > {e.usable_bytes:gb} "
                   "usable: the OOM comes at `DDP(...)`, before the first forward."),
                  ("For a model just over the line the peak moment is `{e.peak_phase}` (phases, "
                   "allocated: {phases}), i.e. the first `optimizer.step()`, when Adam lazily "
                   "allocates m, v and the foreach temporary.")],
        verdict="wrong",
        why="In fitcheck's DDP model the step is the peak (states + foreach temporary on top of "
            "params, grads and buckets), and a clearly-too-big model fails at wrap time; backward "
            "is never the largest moment for DDP with Adam.",
        article_figure="OOM in backward",
        fitcheck_figure="OOM at DDP() ({construct:gb}); peak = {e.peak_phase}",
    ),
    Claim(
        id="000-7", title="BF16 instead of FP16 shifts the numbers / halves parameter memory",
        quote="The numbers shift if using BF16 instead of FP16 ... Using BF16 reduces memory by "
              "~50% for model parameters, shifting the thresholds upward.",
        assumption="The thresholds were computed with FP16 params and grads.",
        arithmetic=[("bf16 and fp16 are both 2 bytes: 13e9 × 2 B = 26 GB either way. The ~50 % "
                     "cut is fp32 → 16-bit, which the article's FP16 count already assumed.")],
        runs={"fp16": Run(L13, H100, 8, FS, FP16_AMP), "bf16": Run(L13, H100, 8, FS)},
        fitcheck=[("`llama2-13b`, 8 × H100, full_shard: fp16-amp {fp16.used:gb}, bf16-amp "
                   "{bf16.used:gb} (identical bytes).")],
        verdict="wrong",
        why="Same element size; under torch AMP neither changes the fp32 master parameters.",
        article_figure="−50 % params", fitcheck_figure="0 % difference",
    ),
    Claim(
        id="000-8",
        title="70B: not under DDP; FULL_SHARD + checkpointing is the only viable option",
        quote="The 70B parameter models common in LLM training cannot fit under DDP on any "
              "reasonable GPU configuration. FSDP with FULL_SHARD and activation checkpointing is "
              "the only viable option.",
        assumption="H100 80GB (the article's running setup: 8 GPUs).",
        arithmetic=[("Its own 12 B/param: 70e9 × 12 = 840 GB per GPU under DDP; FULL_SHARD over "
                     "8: 105 GB per GPU of states — already over 80 GB by its own count.")],
        runs={"ddp": Run(L70, H100, 8, DDP, ckpt=FULL), "fs": Run(L70, H100, 8, FS, ckpt=FULL),
              "n": Fewest(Run(L70, H100, 8, FS, ckpt=FULL)),
              "off": Run(L70, H100, 8, FS, ckpt=FULL, offload=OFFLOAD), "P": Params(L70)},
        fitcheck=["{ddp.setting}: {ddp.describe}.", "{fs.setting}: {fs.describe}.",
                  "Fewest H100 80GB for FULL_SHARD + full checkpointing without offload: **{n}**.",
                  ("FULL_SHARD + CPU offload of params and optimizer on 8 GPUs: "
                   "{off.describe_host}.")],
        verdict="right about DDP; wrong that FULL_SHARD + checkpointing makes 70B viable on 8 × "
                "80 GB",
        why="16 B/param / 8 = {P:gb×2} of sharded model states per GPU before any activation. On "
            "one 8-GPU node 70B needs offload (fits: {off.fits:mark}) or ≥ {n} GPUs.",
        article_figure="FULL_SHARD + ckpt viable",
        fitcheck_figure="{fs.used:gb} ✗ on 8; needs {n} GPUs or offload",
    ),
], tables=[
    Table(
        id="T-000", title="Switch thresholds on H100 80GB",
        quote="<10B: DDP yes · 10-13B: DDP marginal, SHARD_GRAD_OP · 13-20B: DDP no, FULL_SHARD · "
              ">20B: FULL_SHARD + checkpointing (and: \"the practical threshold is around 13B "
              "parameters for DDP with FP16\")",
        setup="8 × H100 SXM 80GB, scaling-rule shape (vocab 32000), seq {seq}, micro-batch {mb}, "
              "{precision} (fp16-amp is byte-identical), AdamW foreach, " + MARGIN_PCT + " margin.",
        header=LARGEST_HEADER,
        runs={"ddp": Largest(H100, DDP), "ddp_ck": Largest(H100, DDP, FULL),
              "sgo": Largest(H100, SGO), "sgo_ck": Largest(H100, SGO, FULL),
              "fs": Largest(H100, FS), "fs_ck": Largest(H100, FS, FULL)},
        let={"more": lambda v: (v.sgo or 0) > 14e9},
        rows=[
            ["< 10B: DDP feasible", "ddp (none / full ckpt)", "{ddp:B} / {ddp_ck:B}",
             "✗ — DDP stops near {ddp_ck:B}"],
            ["10–13B: SHARD_GRAD_OP", "shard_grad_op (none / full)", "{sgo:B} / {sgo_ck:B}",
             "{sgo:≥13e9} — SGO covers 13B{more:? (and more)}"],
            ["13–20B: FULL_SHARD", "full_shard (no ckpt)", "{fs:B}",
             "{fs:≥20e9} — FULL_SHARD without checkpointing reaches {fs:B}"],
            ["> 20B: FULL_SHARD + ckpt", "full_shard (full ckpt)", "{fs_ck:B}",
             "partly — tops out at {fs_ck:B} on 8 GPUs (70B needs offload or more GPUs)"],
        ],
        note="The article's own 12 B/param + 15 GB would put the DDP ceiling at "
             f"(80 − 15) / 12 = {65 / 12:.1f}B, not 10–13B: its table contradicts its own "
             "arithmetic. A 128k-vocabulary model (Llama-3) lowers every row: its fp32 logits and "
             "embedding/head are ~4× larger.",
    ),
])

ARTICLE_001 = Article("001", "DDP vs FSDP guide (A100 size guidelines)", claims=[
    Claim(
        id="001-1", title="FSDP memory per GPU is 1/N of each; linear reduction with more GPUs",
        quote="Memory per GPU | DDP: Full model + optimizer + gradients | FSDP: 1/N of each "
              "(sharded) ... Scalability: Linear memory reduction with more GPUs",
        assumption="—",
        arithmetic=["1/N applies to params, grads and optimizer state only."],
        runs={"s": Sweep(Run(L13, H100, 8, FS), (8, 16, 32, 64))},
        let={"per_n": lambda v: joined(v.s, "N={n}: {e.used:gb} (activations "
                                             "{e.breakdown.activations:gb})"),
             "x": lambda v: v.s[8].used / v.s[64].used},
        fitcheck=[("`llama2-13b` FULL_SHARD on H100 80GB, seq {seq}, micro-batch 1, no "
                   "checkpointing: {per_n}.")],
        verdict="right for model states; wrong as a statement about memory per GPU",
        why="Going from 8 to 64 GPUs divides the states by 8 but per-GPU use only by {x:.1f}×: "
            "activations, the unsharded units being gathered, reduce-scatter buffers and the "
            "CUDA/NCCL runtime do not shard.",
        article_figure="1/N", fitcheck_figure="×{x:.1f} from N=8→64",
    ),
    Claim(
        id="001-2", title="7B+ → FSDP, even on 80 GB A100s",
        quote="Large Model Training → FSDP: Training 7B+ parameter models. Using 80GB A100s but "
              "still memory-limited.",
        assumption="A100 80GB.",
        arithmetic=["No numbers."],
        runs={"e": Run(L7, A80, 8, DDP, ckpt=FULL)},
        fitcheck=["{e.setting}: {e.describe}."],
        verdict="right",
        why=f"6.74e9 × 16 B = {gb(6.74e9 * 16)} of DDP model states alone exceeds 80 GB.",
        article_figure="7B needs FSDP", fitcheck_figure="DDP {e.used:gb} ✗",
    ),
], tables=[
    Table(
        id="T-001", title="Model Size Guidelines (A100)",
        quote="< 1B, 40GB+: DDP · 1-3B, 40GB: DDP with gradient checkpointing · 3-7B, 40GB: FSDP "
              "(SHARD_GRAD_OP or FULL_SHARD) · 7-13B, 80GB: FSDP FULL_SHARD · 13B+, any: FSDP + "
              "CPU offload or tensor parallel",
        setup="GPU count not stated: one 8-GPU node. Scaling-rule shape (vocab 32000), seq {seq}, "
              "micro-batch {mb}, {precision}, AdamW foreach, " + MARGIN_PCT + " margin.",
        header=LARGEST_HEADER,
        runs={"ddp": Largest(A40, DDP), "ddp_ck": Largest(A40, DDP, FULL),
              "sgo": Largest(A40, SGO), "sgo_ck": Largest(A40, SGO, FULL),
              "fs": Largest(A40, FS), "fs_ck": Largest(A40, FS, FULL),
              "fs80": Largest(A80, FS), "fs80_ck": Largest(A80, FS, FULL),
              "off80": Largest(A80, FS, FULL, OFFLOAD)},
        let={"sgo_short": lambda v: v.sgo_ck is not None and v.sgo_ck < 7e9,
             "offload_cell": lambda v: (f"✗ — offload is not needed until ~{billions(v.fs80_ck)}"
                                        if (v.fs80_ck or 0) > 13e9 else "✓")},
        rows=[
            ["< 1B on A100 40GB: DDP", "ddp, no ckpt", "{ddp:B}",
             "{ddp:≥1e9} — DDP without checkpointing reaches {ddp:B}"],
            ["1–3B on A100 40GB: DDP + checkpointing", "ddp, full ckpt", "{ddp_ck:B}",
             "{ddp_ck:≥3e9} — DDP tops out at {ddp_ck:B}"],
            ["3–7B on A100 40GB: FSDP SGO or FULL_SHARD",
             "shard_grad_op / full_shard (none / full ckpt)",
             "SGO {sgo:B} / {sgo_ck:B}; FS {fs:B} / {fs_ck:B}",
             "{fs_ck:≥7e9}{sgo_short:? — SGO alone only to {sgo_ck:B}}"],
            ["7–13B on A100 80GB: FULL_SHARD", "full_shard (none / full ckpt)",
             "{fs80:B} / {fs80_ck:B}", "{fs80:≥13e9} — with room to spare"],
            ["13B+: needs CPU offload or TP", "full_shard + full ckpt, no offload, 8 × A100 80GB",
             "{fs80_ck:B} (with params+optimizer offload: {off80:B})", "{offload_cell}"],
        ],
        note="DDP rows do not depend on the GPU count, and checkpointing does not move them: "
             "DDP's peak is the optimizer step (fp32 params, grads, Adam m and v, buckets, "
             "foreach temporary = 24 B/param), when activations are already freed. FULL_SHARD "
             "rows grow with the GPU count (states / N); the table gives none, so they are for "
             "one 8-GPU node.",
    ),
])

ARTICLE_002 = Article("002", "FSDP vs DDP vs DeepSpeed (70B on 8 GPUs)", claims=[
    Claim(
        id="002-1", title="70B takes ~140 GB in FP32",
        quote="Model weights: Your 70B model takes about 140 GB in FP32 (280 GB per GPU if you're "
              "in FP32 - yes, really)",
        assumption="FP32 weights.",
        arithmetic=[("70e9 × 4 B = 280 GB in FP32; 140 GB is 70e9 × 2 B (FP16/BF16). The sentence "
                     "gives both numbers for the same thing.")],
        runs={"P": Params(L3_70)},
        fitcheck=["`llama3-70b`: {P:e9} params → fp32 {P:gb×4}, bf16 {P:gb×2}."],
        verdict="wrong (140 GB is the 16-bit size)",
        why="Off by the element size; every figure the article derives from \"140 GB\" inherits "
            "it.",
        article_figure="140 GB", fitcheck_figure="{P:gb×4}",
    ),
    Claim(
        id="002-2", title="70B FP32 training: ~560 GB (DDP, per GPU)",
        quote="That's 140 GB × 4 (or more) per GPU. A single 70B parameter model in FP32 needs "
              "about 560 GB of memory just for training ... If your model is 140 GB, add 140 GB "
              "for gradients, add 280 GB for Adam states. You're at 560 GB per GPU",
        assumption="FP32 weights, grads and two Adam states; DDP replica per GPU.",
        arithmetic=[("Its own formula is weights × 4 (weights + grads + 2 Adam states): with the "
                     "correct fp32 size, 280 GB × 4 = 1,120 GB (70e9 × 16 B), not 560 GB."),
                    "With `llama3-70b`'s count: {P:e9} × 16 B = {P:gb×16}."],
        runs={"e": Run(L3_70, A80, 8, DDP, FP32, FULL), "P": Params(L3_70)},
        fitcheck=["{e.setting}: {e.describe}."],
        verdict="wrong (half the real model states)",
        why="560 GB is 8 B/param: it used the 16-bit weight size for an fp32 run. fitcheck adds "
            "DDP buckets ({e.breakdown.comm_buffers:gb}) and the foreach temporary "
            "({e.breakdown.optimizer_temporaries:gb}): {e.used:gb}. \"DDP doesn't fit\" stands "
            "either way.",
        article_figure="560 GB", fitcheck_figure="{e.used:gb} ✗",
    ),
    Claim(
        id="002-3", title="Sharded over 8 GPUs: only 70 GB per GPU",
        quote="Multiply that by 8 GPUs, and you need 560 GB of VRAM total just for one copy of "
              "model state. With sharding, you can divide that among GPUs, requiring only 70 GB "
              "per GPU.",
        assumption="FP32, 8 GPUs, full sharding.",
        arithmetic=[("560 / 8 = 70 GB (its arithmetic); with fp32 states 1,120 GB / 8 = 140 GB "
                     "per GPU. (\"Multiply that by 8 GPUs\" then \"one copy\" is muddled: 560 GB "
                     "was already per GPU.)")],
        runs={"e": Run(L3_70, A80, 8, FS, FP32, FULL), "P": Params(L3_70)},
        fitcheck=["{e.setting}: {e.describe}."],
        verdict="wrong (under-count by 2× before activations)",
        why="16 B/param fp32 states / 8 = {P:gb×2} per GPU; with the foreach-Adam temporary "
            "({e.breakdown.optimizer_temporaries:gb}) and runtime fitcheck reaches {e.used:gb}: "
            "no 8 × 80 GB node holds fp32 70B training.",
        article_figure="70 GB", fitcheck_figure="{e.used:gb} ✗",
    ),
    Claim(
        id="002-4", title="FULL_SHARD on 8 GPUs: 35.75 GB per GPU, \"suddenly a 70B fits\"",
        quote="With 8 GPUs and a 140 GB model, that's roughly 70 GB ÷ 8 + 70 GB ÷ 8 + 140 GB ÷ 8 "
              "= 35.75 GB per GPU. Suddenly a 70B model fits.",
        assumption="8 GPUs (80 GB, per the surrounding text), 140 GB model.",
        arithmetic=[("70/8 + 70/8 + 140/8 = 8.75 + 8.75 + 17.5 = **35.0 GB**, not 35.75; and it "
                     "halves its own 140 GB model to 70 GB for params and grads. With 140 GB "
                     "(16-bit) params and grads and 8 B/param Adam: (140 + 140 + 560) / 8 = 105 "
                     "GB. Mixed precision with fp32 master/params: 70e9 × 16 B / 8 = 140 GB.")],
        runs={"fs": Run(L3_70, A80, 8, FS), "ck": Run(L3_70, A80, 8, FS, ckpt=FULL),
              "P": Params(L3_70)},
        fitcheck=["{fs.setting}: {fs.describe}.", "{ck.setting}: {ck.describe}."],
        verdict="wrong (arithmetic slip, wrong inputs, wrong conclusion)",
        why="Sharded model states are {P:gb×2} per GPU (fp32 params {ck.breakdown.params:gb}, "
            "fp32 grads, Adam {ck.breakdown.optimizer_states:gb}), plus the foreach temporary "
            "({ck.breakdown.optimizer_temporaries:gb}); 70B does not fit on 8 × 80 GB with "
            "FULL_SHARD, with or without checkpointing.",
        article_figure="35.75 GB ✓", fitcheck_figure="{ck.used:gb} ✗",
    ),
    Claim(
        id="002-5",
        title="70B under DDP on 8 × 80 GB: OOM before the first forward completes",
        quote="Try training a 70B model with DDP on 8×80GB GPUs and you'll hit OOM before your "
              "first forward pass completes.",
        assumption="8 × 80 GB.",
        arithmetic=["No numbers; 70e9 × 2 B = 140 GB of weights alone > 80 GB."],
        runs={"e": Run(L3_70, A80, 8, DDP, ckpt=FULL)},
        fitcheck=[("fp32 params alone ({e.breakdown.params:gb}) exceed the card: the OOM is at "
                   "`model.to(device)`, before DDP or any forward. Full DDP peak {e.used:gb} ✗.")],
        verdict="right",
        why="Even bf16 weights alone (141 GB) exceed 80 GB.",
        article_figure="OOM",
        fitcheck_figure="OOM at .to(device) ({e.breakdown.params:gb} params)",
    ),
    Claim(
        id="002-6", title="ZeRO stages save ~4× / ~8× / ~16×",
        quote="Stage 1: Shard optimizer states ... Saves roughly 4× memory. Stage 2 ... Saves "
              "roughly 8× memory. Stage 3 ... Saves roughly 16× memory per GPU",
        assumption="Mixed-precision Adam (ZeRO paper: 2Ψ + 2Ψ + 12Ψ).",
        arithmetic=[zero_paper(8), zero_paper(64),
                    ("4× and 8× are the large-N_d limits of (2+2+12)/(2+2) and 16/2; stage 3 "
                     "divides the states by N_d, not by a fixed 16.")],
        runs={k: Sweep(Run(L7, A80, 8, s, ckpt=FULL), (8, 64))
              for k, s in (("d", DDP), ("z1", Z1), ("z2", Z2), ("z3", Z3))},
        let={"x1": lambda v: ratios(v.d, v.z1), "x2": lambda v: ratios(v.d, v.z2),
             "x3": lambda v: ratios(v.d, v.z3)},
        fitcheck=[("`llama2-7b`, A100 80GB, full ckpt, N = 8: DDP {d[8].used:gb}; zero1 "
                   "{z1[8].used:gb} (×{x1[8]:.1f}), zero2 {z2[8].used:gb} (×{x2[8]:.1f}), zero3 "
                   "{z3[8].used:gb} (×{x3[8]:.1f})."),
                  ("`llama2-7b`, A100 80GB, full ckpt, N = 64: DDP {d[64].used:gb}; zero1 "
                   "{z1[64].used:gb} (×{x1[64]:.1f}), zero2 {z2[64].used:gb} (×{x2[64]:.1f}), "
                   "zero3 {z3[64].used:gb} (×{x3[64]:.1f}).")],
        verdict="stage 1/2: the paper's large-N limits, not what 8 GPUs give; stage 3: wrong (×N "
                "for states, not ×16)",
        why="At 8 GPUs the model-state savings are ×2.9 / ×4.3 / ×8. fitcheck's whole-GPU ratios "
            "against PyTorch DDP come out larger at N = 8 (×{x1[8]:.1f} / ×{x2[8]:.1f} / "
            "×{x3[8]:.1f}) because torch DDP carries 24 B/param at its step (16 B states + 4 B "
            "buckets + 4 B foreach temporary) where the ZeRO baseline counts 16, and far below N "
            "at N = 64 (zero3 ×{x3[64]:.0f}, not ×64) because activations, gathered units and "
            "runtime do not shard. No fixed 16× exists for stage 3.",
        article_figure="4× / 8× / 16×",
        fitcheck_figure="N=8: ×{x1[8]:.1f} / ×{x2[8]:.1f} / ×{x3[8]:.1f}; N=64: ×{x1[64]:.1f} / "
                        "×{x2[64]:.1f} / ×{x3[64]:.1f}",
    ),
    Claim(
        id="002-7", title="70B activations at batch 4: 20–40 GB; 2–3 GB with checkpointing",
        quote="For a 70B model with a batch size of 4, this can be 20-40 GB per GPU ... With "
              "activation checkpointing, you can often reduce the per-GPU activation memory from "
              "20 GB to 2-3 GB.",
        assumption="Micro-batch 4 per GPU; sequence length not stated (read: 2048).",
        arithmetic=[("No derivation. Korthikanti's 34·s·b·h per layer: "
                     f"34 × 2048 × 4 × 8192 × 80 = {gb(34 * 2048 * 4 * 8192 * 80)}.")],
        runs={"a": Acts(L3_70, FS, mb=4), "ck": Acts(L3_70, FS, FULL, mb=4)},
        let={"logits": 4 * SEQ * 128256 * 4,
             "tok": lambda v: v.a / (4 * SEQ), "tok_ck": lambda v: v.ck / (4 * SEQ),
             "tok_mb": lambda v: v.tok / 1e6, "tok_ck_mb": lambda v: v.tok_ck / 1e6,
             "t": lambda v: (20e9 / v.tok, 40e9 / v.tok, 2e9 / v.tok_ck, 3e9 / v.tok_ck),
             "low": lambda v: (v.a / 40e9, v.a / 20e9, v.ck / 3e9, v.ck / 2e9)},
        fitcheck=[("`llama3-70b`, micro-batch 4, seq {seq}, bf16 module (FSDP): no checkpointing "
                   "**{a:gb}**, full checkpointing **{ck:gb}** (of which the fp32 log-softmax "
                   "over the 128256-token vocabulary is {logits:gb})."),
                  ("Per token: {tok_mb:.1f} MB without, {tok_ck_mb:.2f} MB with full "
                   "checkpointing; 20–40 GB corresponds to only {t[0]:,.0f}–{t[1]:,.0f} tokens "
                   "per GPU, and 2–3 GB with checkpointing to {t[2]:,.0f}–{t[3]:,.0f} tokens.")],
        verdict="wrong at seq 2048 ({low[0]:.0f}–{low[1]:.0f}× low; {low[2]:.0f}–{low[3]:.0f}× "
                "low with checkpointing)",
        why="At batch 4 × 2048 tokens a 70B model keeps ~hundreds of GB of block activations; "
            "even fully checkpointed, the block inputs (2 B × tokens × 8192 × 80 layers) and the "
            "128k-vocab fp32 logits exceed 2–3 GB. The figures fit batch 4 only for sequences of "
            "a few hundred tokens.",
        article_figure="20–40 GB / 2–3 GB", fitcheck_figure="{a:gb} / {ck:gb}",
    ),
    Claim(
        id="002-8", title="SHARD_GRAD_OP uses 8× less memory (than DDP)",
        quote="FSDP SHARD_GRAD_OP ... uses 8× less memory ... It's 85% the speed of DDP with 8× "
              "memory savings.",
        assumption="8 GPUs.",
        arithmetic=[("SHARD_GRAD_OP shards grads and optimizer state but keeps params: mixed "
                     "precision (fp32 sharded params + bf16 unsharded copy) ≈ 2 + 14/8 = 3.75 "
                     "B/param vs DDP 16 → ×4.3 at best for states.")],
        runs={"sgo": Run(L3_70, A80, 8, SGO, ckpt=FULL),
              "ddp": Run(L3_70, A80, 8, DDP, ckpt=FULL)},
        let={"x": lambda v: v.ddp.used / v.sgo.used},
        fitcheck=[("`llama3-70b`, 8 × A100 80GB, full ckpt: DDP {ddp.used:gb}, shard_grad_op "
                   "{sgo.used:gb} (×{x:.1f}); SGO's unsharded bf16 weights alone: "
                   "{sgo.breakdown.gathered_params:gb}.")],
        verdict="overstated, and beside the point for 70B",
        why="By the state formula SHARD_GRAD_OP saves at most ×4.3 at N = 8 (8× is FULL_SHARD's "
            "figure); fitcheck's ×{x:.1f} is against PyTorch DDP's 24 B/param step (buckets + "
            "foreach temporary), which SGO shards. Either way SGO replicates the 16-bit weights "
            "and still needs {sgo.used:gb} per GPU for 70B.",
        article_figure="8×", fitcheck_figure="×{x:.1f}",
    ),
    Claim(
        id="002-9", title="7–13B on 8 × 80 GB: use DDP, \"fits comfortably\"",
        quote="A 7-13B model and 8× 80GB GPUs: Use DDP. It's fast, simple, and fits comfortably. "
              "(also: \"If you've got a 7B parameter model and fat GPU memory (80 GB A100s), DDP "
              "is your friend.\")",
        assumption="8 × A100 80GB.",
        arithmetic=[("By the article's own 4 × weight-size rule: 7e9 × 2 B × 4 = 56 GB, 13e9 → "
                     "104 GB; so even by its count 13B does not fit. With 16 B/param: 112 GB and "
                     "208 GB.")],
        runs={"e7": Run(L7, A80, 8, DDP, ckpt=FULL), "e13": Run(L13, A80, 8, DDP, ckpt=FULL),
              "big": Largest(A80, DDP, FULL)},
        fitcheck=["{e7.setting}: {e7.describe}.", "{e13.setting}: {e13.describe}."],
        verdict="wrong",
        why="Neither end of the range fits under DDP on an 80 GB card; the DDP ceiling there is "
            "~{big:B} (000's table, T-000).",
        article_figure="fits comfortably",
        fitcheck_figure="7B {e7.used:gb} ✗, 13B {e13.used:gb} ✗",
    ),
    Claim(
        id="002-10", title="70B at batch size 1 fits on 8 × 80 GB with FSDP",
        quote="You might fit a 70B model with batch size 1 on 8× 80GB GPUs using FSDP",
        assumption="8 × 80 GB, micro-batch 1.",
        arithmetic=["No numbers."],
        runs={"e": Run(L3_70, A80, 8, FS, ckpt=FULL),
              "off": Run(L3_70, A80, 8, FS, ckpt=FULL, offload=OFFLOAD), "P": Params(L3_70)},
        fitcheck=["{e.setting}: {e.describe}.",
                  "With CPUOffloadPolicy (params + optimizer on host): {off.describe_host}."],
        verdict="wrong without offload; right only with FSDP CPU offload",
        why="Batch size is not the problem: the sharded model states are {P:gb×2} per GPU.",
        article_figure="fits",
        fitcheck_figure="{e.used:gb} ✗; offload {off.used:gb} {off.fits:mark}",
    ),
], tables=[
    Table(
        id="T-002a", title="\"Head-to-Head: Memory Profiles\" (Llama-3 70B, 8 GPUs)",
        quote="DDP (FP32) 560 GB · DDP (FP16) 280 GB · FSDP FULL_SHARD (FP32) 70 GB · FSDP "
              "FULL_SHARD (FP16) 35 GB · DeepSpeed ZeRO-3 (FP16) 35 GB · ZeRO-3 + CPU Offload ~4 "
              "GB ... \"FSDP and DeepSpeed ZeRO-3 are roughly equivalent at 35 GB per GPU with "
              "FP16 - very doable on an 80 GB A100.\"",
        setup="`llama3-70b` ({P:e9} params, vocab 128256), 8 × A100 SXM 80GB, seq {seq}, "
              "micro-batch {mb}, full checkpointing (the most favourable), AdamW foreach (ZeRO: "
              "DeepSpeed's fused Adam, 2+2+12 B/param). \"FP16\" is read two ways: torch AMP "
              "(fp32 params, bf16-amp) and pure 16-bit params/grads/Adam state (`bf16`), which is "
              "the only reading under which the article's 2+2+4 B/param holds.",
        header=["row", "article total", "article arithmetic", "fitcheck setting",
                "fitcheck device used", "peak", "fits 80 GB"],
        runs={"P": Params(L3_70)},
        columns=["{row[0]}", "{row[1]}", "{row[2]}",
                 ("{r.run.strategy}, {r.run.precision}, ckpt {r.run.ckpt}{r.offloaded:?, offload "
                  "params+optimizer}"),
                 "{r.used:gb}", "{r.peak_phase}",
                 "{r.fits_gpu:mark}{r.offloaded:? ({r.host_check})}"],
        each=[
            (("DDP (FP32)", "560 GB", "140+140+280 (should be 280+280+560 = 1,120)"),
             Run(L3_70, A80, 8, DDP, FP32, FULL)),
            (("DDP (FP16)", "280 GB", "70+70+140: halves the 140 GB 16-bit size again"),
             Run(L3_70, A80, 8, DDP, ckpt=FULL)),
            (("DDP (FP16) as pure 16-bit", "280 GB", "140+140+280 = 560 (2+2+4 B/param)"),
             Run(L3_70, A80, 8, DDP, BF16, FULL)),
            (("FSDP FULL_SHARD (FP32)", "70 GB", "560/8 (should be 1,120/8 = 140)"),
             Run(L3_70, A80, 8, FS, FP32, FULL)),
            (("FSDP FULL_SHARD (FP16)", "35 GB", "280/8 (mixed precision: 70e9 × 16 / 8 = 140)"),
             Run(L3_70, A80, 8, FS, ckpt=FULL)),
            (("FSDP FULL_SHARD (FP16) as pure 16-bit", "35 GB", "560/8 = 70 (2+2+4 B/param)"),
             Run(L3_70, A80, 8, FS, BF16, FULL)),
            (("DeepSpeed ZeRO-3 (FP16)", "35 GB",
              "280/8 (ZeRO paper 2+2+12 B: 70e9 × 16 / 8 = 140)"),
             Run(L3_70, A80, 8, Z3, FP16_AMP, FULL)),
            (("DeepSpeed ZeRO-3 + CPU Offload", "~4 GB", "2 + 2 GB on GPU, rest on CPU"),
             Run(L3_70, A80, 8, Z3, FP16_AMP, FULL, OFFLOAD)),
        ],
        note="Every row's article figure is low: the table starts from \"140 GB in FP32\" "
             "(002-1), halves it for \"FP16\", and counts Adam at 2 × the (16-bit) weight size "
             "instead of 2 × 4 B. The only 8-GPU configuration that fits is ZeRO-3 with params "
             "and optimizer offloaded, and it needs ~1.1 TB of host RAM per node, not \"∞ "
             "(CPU)\". fitcheck's ZeRO-3 working set is 2 × max(block, root) params in 16-bit "
             "plus the 50M-element prefetch bucket; the root here (embedding + lm_head, 2.1e9 "
             "params) makes that 8.5 GB. DeepSpeed gathers per submodule (lm_head alone: 1.05e9 "
             "params, 2.1 GB), so the offload row may be ~6 GB high; the verdict does not change.",
    ),
    Table(
        id="T-002b", title="\"Speed Profiles\" table: Llama-3 70B on 8 × A100 40GB",
        quote="Benchmarks from actual training runs (Llama-3 70B, 8× A100 40GB, mixed precision): "
              "FSDP SHARD_GRAD_OP 580 tokens/sec · FSDP FULL_SHARD 520 · DeepSpeed ZeRO-3 (no "
              "offload) 510 · DeepSpeed ZeRO-3 + CPU Offload 180",
        setup="`llama3-70b`, 8 × A100 SXM 40GB (host RAM per node: the profile's 1152 GiB, AWS "
              "p4d), seq {seq}, micro-batch {mb}, bf16-amp, full checkpointing.",
        header=["row", "article says", "fitcheck setting", "device used", "fits 40 GB"],
        runs={"P": Params(L3_70)},
        columns=["{row[0]}", "runs (580/520/510/180 tok/s)",
                 "{r.run.strategy}, ckpt {r.run.ckpt}{r.offloaded:?, offload params+optimizer}",
                 "{r.used:gb}", "{r.fits_gpu:mark}{r.offloaded:?, {r.host_check}}"],
        each=[
            (("FSDP SHARD_GRAD_OP",), Run(L3_70, A40, 8, SGO, ckpt=FULL)),
            (("FSDP FULL_SHARD",), Run(L3_70, A40, 8, FS, ckpt=FULL)),
            (("DeepSpeed ZeRO-3 (no offload)",), Run(L3_70, A40, 8, Z3, ckpt=FULL)),
            (("DeepSpeed ZeRO-3 + CPU Offload",),
             Run(L3_70, A40, 8, Z3, ckpt=FULL, offload=OFFLOAD)),
        ],
        note="Only the offload row can run. SHARD_GRAD_OP keeps a full bf16 copy of the weights "
             "({P:gb×2}) on every GPU, so \"580 tokens/sec\" on 40 GB cards cannot be a "
             "measurement of this setup. Throughput figures themselves are not settled here.",
    ),
    Table(
        id="T-002c", title="Decision tree and \"When to Compromise\"",
        quote="10B-30B, 80GB+: FSDP FULL_SHARD · 10B-30B, 40GB: FSDP SHARD_GRAD_OP · 30B-100B, "
              "speed: FSDP FULL_SHARD + activation checkpointing · 7-13B and 8× 80GB: DDP · "
              "13-70B and limited memory: FSDP SHARD_GRAD_OP",
        setup="One 8-GPU node (\"eight high-end GPUs\"), scaling-rule shape (vocab 32000), seq "
              "{seq}, micro-batch {mb}, {precision}, AdamW foreach.",
        header=LARGEST_HEADER,
        runs={"fs80": Largest(A80, FS), "fs80_ck": Largest(A80, FS, FULL),
              "sgo40": Largest(A40, SGO), "sgo40_ck": Largest(A40, SGO, FULL),
              "fs40_ck": Largest(A40, FS, FULL), "sgo80_ck": Largest(A80, SGO, FULL),
              "ddp80": Largest(A80, DDP, FULL)},
        let={"short": lambda v: not at_least(v.fs80, 30e9)},
        rows=[
            ["10–30B, 80 GB: FULL_SHARD", "full_shard, A100 80GB (none / full ckpt)",
             "{fs80:B} / {fs80_ck:B}",
             "{fs80_ck:≥30e9}{short:? (needs checkpointing toward 30B)}"],
            ["10–30B, 40 GB: SHARD_GRAD_OP", "shard_grad_op, A100 40GB (none / full ckpt)",
             "{sgo40:B} / {sgo40_ck:B}",
             "{sgo40_ck:≥30e9} — backwards: FULL_SHARD reaches {fs40_ck:B} on the same GPUs"],
            ["30–100B, speed: FULL_SHARD + ckpt", "full_shard, A100 80GB, full ckpt",
             "{fs80_ck:B}",
             "{fs80_ck:≥100e9} — needs more than one node (or offload) beyond {fs80_ck:B}"],
            ["7–13B, 8 × 80 GB: DDP", "ddp, A100 80GB, full ckpt", "{ddp80:B}", "{ddp80:≥13e9}"],
            ["13–70B, limited memory: SHARD_GRAD_OP", "shard_grad_op, A100 80GB, full ckpt",
             "{sgo80_ck:B}", "{sgo80_ck:≥70e9} — SGO is the *less* memory-saving FSDP mode"],
        ],
    ),
])

ARTICLE_003 = Article("003", "Multi-GPU PyTorch training (70B on 4 A100s)", claims=[
    Claim(
        id="003-1", title="Llama 3.1 70B: ~70 GB/GPU on 2, ~35 GB/GPU on 4 A100 80GB "
                          "(\"comfortable\")",
        quote="Need to train Llama 3.1 70B? With FP16 weights (~140GB), a single A100 80GB is "
              "insufficient. With FSDP across 2 GPUs, you need ~70GB per GPU—still tight. Across "
              "4 GPUs, you need ~35GB per GPU, which is comfortable.",
        assumption="Only the FP16 weights count.",
        arithmetic=[("{P:e9} × 2 B = {P:gb×2}; /2 = {P:gb}, /4 = {P:gb×0.5}. Right for the "
                     "weights; training also needs grads and Adam state: 16 B/param mixed "
                     "precision → {P:gb×16} total, /4 = {P:gb×4} per GPU.")],
        runs={"s": Sweep(Run(L31_70, A80, 2, FS, ckpt=FULL), (2, 4, 8)),
              "n": Fewest(Run(L31_70, A80, 8, FS, ckpt=FULL)),
              "n_none": Fewest(Run(L31_70, A80, 8, FS)),
              "acts": Acts(L31_70, FS), "P": Params(L31_70)},
        let={"per_n": lambda v: joined(v.s, "N={n}: {e.used:gb} {e.fits_gpu:mark}"),
             "without": lambda v: (f"{v.n_none}" if v.n_none else
                                   f"no count up to 512 fits (activations alone are {gb(v.acts)} "
                                   "per GPU at micro-batch 1, and they do not shard)")},
        fitcheck=[("`llama3.1-70b`, FULL_SHARD, full checkpointing, A100 80GB, seq {seq}, "
                   "micro-batch 1, bf16-amp: {per_n}."),
                  ("Fewest A100 80GB that fit FULL_SHARD without offload: **{n}** with full "
                   "checkpointing; without checkpointing {without}.")],
        verdict="wrong (right only for inference-style weight storage)",
        why="It counts 2 of the 16 bytes per parameter. On 4 GPUs the sharded states are {P:gb×4} "
            "per GPU; training needs {n} A100 80GB (FULL_SHARD + checkpointing) or offload.",
        article_figure="35 GB ✓ on 4", fitcheck_figure="{s[4].used:gb} ✗ on 4; needs {n}",
    ),
    Claim(
        id="003-2", title="4 × A100 80GB: ~35 GB of params per GPU leaves ample room for grads "
                          "and optimizer",
        quote="For a 70B model in FP16 (~140GB), sharding across 4 A100 80GB GPUs reduces the "
              "per-GPU parameter footprint to ~35GB, leaving ample room for gradients and "
              "optimizer states.",
        assumption="FP16 params sharded 4 ways; the rest must fit in 80 − 35 = 45 GB.",
        arithmetic=[("Grads (16-bit) {P:gb×0.5} + Adam fp32 m, v {P:gb×2} per GPU = {P:gb×2.5} > "
                     "45 GB, by the article's own FP16/FP32 convention.")],
        runs={"e": Run(L31_70, A80, 4, FS, ckpt=FULL), "P": Params(L31_70)},
        fitcheck=["{e.setting}: {e.describe}."],
        verdict="wrong",
        why="Adam's two fp32 moments alone are {P:gb×2} per GPU on 4 GPUs — more than the whole "
            "card.",
        article_figure="ample room", fitcheck_figure="{e.used:gb} ✗",
    ),
    Claim(
        id="003-3", title="FSDP over 4 GPUs cuts the VRAM requirement by 4×",
        quote="Before buying more GPUs, try FSDP — it shards the model across 4 GPUs and cuts "
              "your VRAM requirement by 4x.",
        assumption="—",
        arithmetic=["4× holds for params, grads and optimizer state only."],
        runs={"one": Run(L13, A80, 1, DDP, ckpt=FULL), "four": Run(L13, A80, 4, FS, ckpt=FULL)},
        let={"x": lambda v: v.one.used / v.four.used},
        fitcheck=[("`llama2-13b`, A100 80GB, full checkpointing: 1 GPU {one.used:gb}, FULL_SHARD "
                   "on 4 {four.used:gb} (×{x:.1f}).")],
        verdict="right for model states; roughly right here only because the 1-GPU baseline is "
                "state-dominated",
        why="The single-GPU run carries the autocast cache and, in the peak step, a full-size "
            "foreach temporary, which FSDP also shards; activations and runtime do not shard, so "
            "the ratio drops below N as activations grow (001-1).",
        article_figure="×4", fitcheck_figure="×{x:.1f}",
    ),
    Claim(
        id="003-4", title="ZeRO-3 + CPU offload (4 GPUs) trains models far larger than GPU memory",
        quote="deepspeed --num_gpus=4 ... DeepSpeed's ZeRO-3 will shard parameters across GPUs "
              "and optionally page them to CPU RAM, allowing you to train models vastly larger "
              "than total GPU VRAM.",
        assumption="The article's ds_config: ZeRO-3, offload_optimizer + offload_param to CPU, "
                   "fp16; 4 GPUs.",
        arithmetic=[("No numbers. Host RAM must hold 2 + 2 + 12 B/param (fp16 params and grads, "
                     "fp32 master + m + v): 70B → {P:gb×16}.")],
        runs={"e": Run(L31_70, A80, 4, Z3, ckpt=FULL, offload=OFFLOAD), "P": Params(L31_70)},
        fitcheck=["{e.setting}: {e.describe_host}."],
        verdict="right (GPU side), with a host-RAM condition the article omits",
        why="The GPU holds only working copies, activations and buffers; the limit moves to host "
            "RAM: {e.host_bytes_per_node:gb} for 70B, which a 1.1–2 TB server has but a "
            "workstation does not.",
        article_figure="vastly larger than VRAM",
        fitcheck_figure="GPU {e.used:gb} {e.fits_gpu:mark}, host {e.host_bytes_per_node:gb} "
                        "{e.fits_host:mark}",
    ),
    Claim(
        id="003-5", title="Inference table: Llama 3.1 70B FP16 on one A100/H100 80GB → \"DDP (if "
                          "it fits)\"",
        quote="A100 80GB | Llama 3.1 70B | 58 | DDP (If it fits) or FSDP · H100 80GB | Llama 3.1 "
              "70B | 95 | DDP (If it fits) or FSDP",
        assumption="FP16 inference (fitcheck models training; weights-only arithmetic here).",
        arithmetic=[("Weights alone: {P:e9} × 2 B = {P:gb×2} > 85.9 GB (A100 80GB, 81920 MiB) and "
                     "> 85.5 GB (H100 80GB, 81559 MiB).")],
        runs={"P": Params(L31_70)},
        fitcheck=["Not a training claim; no planner run. For training, see 003-1."],
        verdict="wrong",
        why="It never fits: a full FP16 replica per GPU (what DDP means) is 141 GB.",
        article_figure="DDP if it fits", fitcheck_figure="weights {P:gb×2} > 85.9 GB",
    ),
])

ARTICLES = [ARTICLE_000, ARTICLE_001, ARTICLE_002, ARTICLE_003]

OUT_OF_SCOPE = [
    ("002: \"A 140 GB checkpoint on 8 GPUs means 280 GB of data to write (full model + optimizer "
     "state)\" — disk, not GPU memory. Weights + fp32 Adam state for 70B: 70e9 × (4 + 8) B = 840 "
     "GB (fp32 weights) or 70e9 × (2 + 4 + 8) B = 980 GB (bf16 weights + fp32 master + m, v); 280 "
     "GB is 3–3.5× low."),
    ("002: \"FSDP FULL_SHARD: ~560 GB of weights all-gathered (140 GB × 4 GPUs)\" and \"DDP: ~280 "
     "GB of gradients per sync\" — communication volume, not memory. A ring all-gather moves "
     "(N−1)/N of the 16-bit weights into each GPU, twice per step (forward and backward): 2 × 141 "
     "GB × 7/8 ≈ 247 GB per GPU; the DDP ring all-reduce moves 2 × (N−1)/N of the gradients (fp32 "
     "under AMP: 2 × 282 GB × 7/8 ≈ 494 GB per GPU)."),
    ("002/003: throughput, overhead percentages and tokens/s: not memory claims, not settled here "
     "(except where a throughput table implies a configuration fits: T-002b)."),
]

INTRO = [
    "# Source-article memory claims, settled with fitcheck",
    (f"Generated by `{COMMAND}` (do not edit by hand; rerun after planner changes). Articles: "
     "`/work/shared/seeds/000…003`."),
    ("Each claim gets (a) the article's own arithmetic under its own stated assumptions, redone, "
     "and (b) fitcheck's per-GPU figure under what PyTorch actually allocates, from "
     "`planner.memory.estimate` called in-process. Units: **GB = 1e9 bytes, GiB = 2³⁰ bytes**; "
     "the articles' \"GB\" is read as 1e9. \"80 GB\" cards are larger than 80e9 bytes: H100 SXM "
     "85.5 GB (81559 MiB, 79.6 GiB), A100 80GB 85.9 GB (81920 MiB); fitcheck keeps a "
     f"{MARGIN_PCT} margin (its default) and marks a figure ✓ when the whole 90 % interval of "
     "the need, from its measured error on public runs of that kind of job, is within the "
     "device, ✗ otherwise (at risk or does not fit; docs/accuracy.md §5)."),
    (f"fitcheck settings unless a claim says otherwise: seq {SEQ}, micro-batch {MICRO_BATCH}, "
     f"{PRECISION} (torch AMP: fp32 parameters and master state; fp16-amp is byte-identical), "
     "AdamW with PyTorch's default foreach implementation, flash-style SDPA, one 8-GPU node. "
     "DDP/single-GPU runs use torch.autocast over fp32 params; FSDP is FSDP2 with "
     "MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32); zero1/2/3 follow the ZeRO "
     "paper's 2 + 2 + 12 bytes/param. Real presets stand in for \"13B\" (`llama2-13b`) and "
     "\"70B\" (`llama2-70b` in 000, `llama3-70b` in 002 where the article names Llama-3, "
     "`llama3.1-70b` in 003); threshold searches use the `--params` scaling-rule shape "
     "(`planner.scaling.shape_from_params`, vocab 32000)."),
    "## Summary",
]

FORGOTTEN = (
    "What the articles forget, in order of size: the fp32 parameters (master weights) and fp32 "
    "gradients that torch AMP keeps (16 B/param of model states, not 12 or 8); DDP's gradient "
    "buckets (a second 4 B/param gradient copy by default); the foreach-Adam step temporary (one "
    "state-sized copy); the autocast cache of bf16 weight copies (2 B/param in DDP's forward); "
    "activations that do not shard, including the fp32 logits/log-softmax (4 B × tokens × vocab, "
    "four times larger at Llama-3's 128k vocabulary); and ~1–2 GB of CUDA context, NCCL buffers "
    "and allocator reserve.")

# --------------------------------------------------------------------------------------
# report


def md_row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    return [md_row(header), "|" + "---|" * len(header), *map(md_row, rows)]


def render_claim(c: Claim) -> list[str]:
    return [f"### {c.id}: {c.title}", "", f"> {c.quote}", "",
            f"- **Article's assumption:** {c.assumption}",
            "- **Article's arithmetic, redone:**", *(f"  - {line}" for line in c.arithmetic),
            "- **fitcheck:**", *(f"  - {line}" for line in c.fitcheck),
            f"- **Verdict: {c.verdict}.** {c.why}", ""]


def render_table(t: Table) -> list[str]:
    return [f"### {t.id}", "", f"**{t.title}**", "", f"> {t.quote}", "", f"Setup: {t.setup}", "",
            *md_table(t.header, t.rows), "", *([t.note, ""] if t.note else [])]


def render_summary(claims: list[Claim], tables: list[Table]) -> list[str]:
    rows = [[c.id, c.title, c.article_figure, c.fitcheck_figure, c.verdict] for c in claims]
    links = ", ".join(f"[{t.id}](#{t.id.lower()})" for t in tables)
    return [*md_table(["id", "claim", "article's figure", "fitcheck", "verdict"], rows), "",
            f"Threshold tables redone: {links}.", "", FORGOTTEN, ""]


def render() -> str:
    articles = [replace(a, claims=[c.settle() for c in a.claims],
                        tables=[t.settle() for t in a.tables]) for a in ARTICLES]
    out = [line for paragraph in INTRO for line in (paragraph, "")]
    out += render_summary([c for a in articles for c in a.claims],
                          [t for a in articles for t in a.tables])
    for a in articles:
        out += [f"## {a.id} — {a.title}", ""]
        out += [line for c in a.claims for line in render_claim(c)]
        out += [line for t in a.tables for line in render_table(t)]
    out += ["## Not memory claims (not settled by the planner)", ""]
    return "\n".join([*out, *(f"- {line}" for line in OUT_OF_SCOPE), ""])


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; give the doc normal permissions
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stdout", action="store_true", help="print only; do not write the doc")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    text = render()
    print(text)
    if not args.stdout:
        write_atomic(args.out, text)
        print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
