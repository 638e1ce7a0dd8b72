"""The mesh search (`fitcheck plan --mesh auto`): which parallel layout of the GPUs to run.

A layout is torchtitan's ``ParallelDims`` less what fitcheck does not search: tensor parallel
``tp`` inside a node, context parallel ``cp``, pipeline parallel ``pp`` and expert parallel
``ep`` (which borrows data-parallel ranks); the rest of the GPUs
is data parallel (FSDP2's dp_shard, or HSDP's dp_replicate x dp_shard, which the plan of each
layout already chooses among as strategies). ``layouts`` lists the layouts the model covers
(docs/model.md "Mesh search"): TP x CP (§8.4, §8.6) and PP alone or x TP and/or x CP (§8.7,
torchtitan's 4D mesh) and, for an MoE model, EP alone, x TP or x CP (§8.8; EP beside PP is
not modelled).

Each layout is planned by the plan every other path runs: its request is built by
``planner.request.build_request`` from the user's values with ``--tp``/``--pp``/``--cp``/``--ep`` set
(so every rule that refuses a degree for this model refuses it here, by the same message),
then ``planner.plan.plan``. The layouts whose recommendation fits are ranked by that
recommendation's predicted tokens/s per GPU; within ``planner.plan.TIE`` of the fastest the
simplest layout wins (``Layout.simplicity``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from planner.candidates import TP_DEGREES
from planner.errors import FitcheckError
from planner.fields import FLAGS, Naming, parse
from planner.lazy_dataclass import dataclass
from planner.pipeline import bubble_ratio
from planner.plan import TIE, Answer, Recommendation, plan, why_not, with_references
from planner.request import build_request

MESH_TP = (1,) + TP_DEGREES
"""TP degrees searched: none, then `--tp auto`'s (within one node)."""
MAX_CP = 1024
"""The largest --cp the request takes."""
PIPELINE_FIELDS = ("parallel.pp_schedule", "parallel.pp_microbatches",
                   "parallel.pp_virtual_stages", "parallel.pp_kept_outputs")
"""Given for the pipeline layouts only (the request builder refuses them without --pp)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Layout:
    """Model-parallel degrees of a mesh; the GPUs left over are data parallel."""

    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    """Expert parallel: borrows its ranks from the data-parallel ones (torchtitan), so the
    data-parallel degree stays n / (tp x pp x cp)."""

    def degrees(self) -> tuple[tuple[str, int], ...]:
        return (("TP", self.tp), ("CP", self.cp), ("EP", self.ep), ("PP", self.pp))

    def simplicity(self) -> tuple[int, int, int, int, int, int]:
        """Simplest first: fewer parallel dimensions, then a smaller model-parallel group
        (more of the GPUs plain data parallel), then PP last, EP before it, CP before that (PP
        adds a schedule and a bubble, EP all-to-alls in every MoE layer, CP a ring round
        attention, TP collectives inside a node only)."""
        dims = sum(d > 1 for _, d in self.degrees())
        return (dims, self.tp * self.pp * self.cp * self.ep, self.pp, self.ep, self.cp, self.tp)

    def label(self, n_gpus: int) -> str:
        """'TP 2 x CP 4 (dp 64)', or 'data parallel only (dp 512)'."""
        dp = n_gpus // (self.tp * self.pp * self.cp)
        parts = [f"{k} {d}" for k, d in self.degrees() if d > 1]
        return f"{' x '.join(parts) or 'data parallel only'} (dp {dp})"


def layouts(n_gpus: int, gpus_per_node: int, seq: int, experts: int = 1) -> list[Layout]:
    """Every layout of ``n_gpus`` the mesh search plans, simplest first.

    - TP in 1, 2, 4, 8 that fit in a node and divide the GPUs (torchtitan's TP inside a
      node);
    - CP a power of two whose 2 x CP chunks split the sequence (torch's load-balanced
      sharding) and whose group, times TP, divides the GPUs;
    - PP, every divisor of the GPUs leaving at least 2 data-parallel ranks per stage (the
      pipeline is modelled with FSDP2 inside each stage), alone or with a TP of the list
      above in each stage (torchtitan's FSDP x TP x PP), and with a CP as above whose group,
      times PP and TP, divides the GPUs (the 4D mesh; FSDP2 over dp_shard x cp);
    - EP (an MoE model's ``experts``), a power of two dividing the experts and the GPUs, alone
      or with a TP of the list above (torchtitan's EP x TP, docs/model.md §8.8: EP borrows
      the TP ranks too, so ep need not divide n / tp), or with a CP as above (no TP:
      EP x CP x TP is not modelled); EP beside PP is not modelled and not listed.
    Whether the model allows a degree (heads per TP rank, stages per layer count, CP's
    attention) is the request builder's to say, per layout."""
    out = []
    for tp in MESH_TP:
        if tp > gpus_per_node or n_gpus % tp:
            continue
        cp = 1
        while n_gpus % (tp * cp) == 0 and cp <= MAX_CP and (cp == 1 or seq % (2 * cp) == 0):
            out.append(Layout(tp=tp, cp=cp))
            cp *= 2
    for tp in MESH_TP:
        for pp in range(2, n_gpus // 2 + 1):
            if tp > gpus_per_node or n_gpus % (pp * tp) or n_gpus // (pp * tp) < 2:
                continue
            # CP beside the pipeline: FSDP2 shards each stage over dp_shard x cp, so the
            # n / (pp x tp) >= 2 ranks above hold whatever CP takes of them
            cp = 1
            while n_gpus % (pp * tp * cp) == 0 and cp <= MAX_CP and \
                    (cp == 1 or seq % (2 * cp) == 0):
                out.append(Layout(pp=pp, tp=tp, cp=cp))
                cp *= 2
    for tp in MESH_TP:
        if tp > gpus_per_node or n_gpus % tp:
            continue
        # EP borrows its ranks from dp_shard x tp (torchtitan's parallel_dims.py), so it
        # divides the GPUs, not the data-parallel ranks left beside TP
        ep = 2
        while experts > 1 and experts % ep == 0 and n_gpus % ep == 0:
            out.append(Layout(tp=tp, ep=ep))
            ep *= 2
    # EP beside CP (docs/model.md "Beside context parallel"; not beside TP as well): a CP as
    # above, an EP as above (dp_shard x cp a multiple of ep: ep divides the GPUs)
    cp = 2
    while experts > 1 and n_gpus % cp == 0 and cp <= MAX_CP and seq % (2 * cp) == 0:
        ep = 2
        while experts % ep == 0 and n_gpus % ep == 0:
            out.append(Layout(cp=cp, ep=ep))
            ep *= 2
        cp *= 2
    return sorted(out, key=Layout.simplicity)


@dataclass(frozen=True, slots=True, kw_only=True)
class Tried:
    """One layout and its plan, or why it cannot be planned."""

    layout: Layout
    answer: Answer | None = None
    problem: str | None = None
    """The request builder's message (the model or the options refuse this layout)."""

    @property
    def tokens_per_s_per_gpu(self) -> float | None:
        """Its recommendation's predicted tokens/s per GPU; None when nothing fits."""
        if self.answer is None or self.answer.recommendation is None:
            return None
        return float(self.answer.chosen()[1].tokens_per_s_per_gpu)


@dataclass(frozen=True, slots=True, kw_only=True)
class MeshAnswer:
    tried: tuple[Tried, ...]
    """Every layout searched, simplest first."""
    chosen: Tried | None
    """The layout recommended; None when no layout fits."""
    answer: Answer
    """The chosen layout's plan, its recommendation's reasons led by the mesh's; when nothing
    fits, the data-parallel layout's plan (with its fewest-GPUs search)."""
    reasons: tuple[str, ...]
    """Why this layout: one line for it, one per other layout."""

    def as_json(self) -> dict[str, Any]:
        """`--json`'s ``mesh`` object (docs/cli.md)."""
        n = self.answer.request.cluster.n_gpus

        def one(t: Tried) -> dict[str, Any]:
            lay = t.layout
            return {"tp": lay.tp, "pp": lay.pp, "cp": lay.cp, "ep": lay.ep,
                    "dp": n // (lay.tp * lay.pp * lay.cp),
                    "fits": t.tokens_per_s_per_gpu is not None,
                    "tokens_per_s_per_gpu": t.tokens_per_s_per_gpu, "problem": t.problem}

        return {"chosen": None if self.chosen is None else one(self.chosen),
                "tie": TIE, "layouts": [one(t) for t in self.tried],
                "reasons": list(self.reasons)}


def pick(scored: list[tuple[Layout, float]], tie: float = TIE) -> int:
    """The index of the layout to run among (layout, tokens/s per GPU) that fit: the simplest
    (``Layout.simplicity``) of those within ``tie`` of the fastest; -1 for none."""
    if not scored:
        return -1
    fastest = max(t for _, t in scored)
    near = [i for i, (_, t) in enumerate(scored) if t * (1 + tie) >= fastest]
    return min(near, key=lambda i: scored[i][0].simplicity())


def search(values: Mapping[str, Any], naming: Naming = FLAGS, rank: str = "throughput"
           ) -> MeshAnswer:
    """`--mesh auto`: plan every layout (``layouts``) of the request's GPUs, recommend the one
    that fits with the most tokens/s per GPU (``pick``), or the simpler within the tie."""
    v = parse({**values, "parallel.mesh": "given"}, naming)
    for path, free in (("parallel.tp", "auto"), ("parallel.pp", 1), ("parallel.cp", 1),
                       ("parallel.ep", 1)):
        if v[path] != free:
            raise naming.fail(path, "--mesh auto searches the TP, PP, CP and EP degrees itself; "
                              "give none of them (or --mesh given)")
    n, seq = v["hardware.n"], v["training.seq"]
    hardware: dict = {}  # the GPU profile and calibration, read once for every layout
    base = build_request({**values, "parallel.mesh": "given"}, naming,  # the plan as given
                         hardware=hardware)
    tried = [_plan(values, naming, lay, rank, hardware)
             for lay in layouts(n, base.cluster.gpus_per_node, seq, base.model.n_experts)]
    fit = [t for t in tried if t.tokens_per_s_per_gpu is not None]
    i = pick([(t.layout, t.tokens_per_s_per_gpu) for t in fit])
    if i < 0:
        none = plan(base, rank)
        reasons = tuple(_line(t, None, n) for t in tried)
        return MeshAnswer(tried=tuple(tried), chosen=None, answer=none, reasons=reasons)
    best = fit[i]
    reasons = (_winner(best, fit, n),) + tuple(_line(t, best, n) for t in tried if t is not best)
    ans = with_references(best.answer)  # the plan shown: its DDP reference steps too
    rec = ans.recommendation
    ans = dataclasses.replace(ans, recommendation=Recommendation(
        candidate=rec.candidate, reasons=_shown(best, tried, fit, n) + rec.reasons))
    return MeshAnswer(tried=tuple(tried), chosen=best, answer=ans, reasons=reasons)


SHOWN_FASTER = 2
"""Beside the simpler layouts, how many of the fastest other layouts that fit the
recommendation names (``MeshAnswer.reasons`` names every layout)."""


def _shown(best: Tried, tried: list[Tried], fit: list[Tried], n: int) -> tuple[str, ...]:
    """The recommendation's mesh lines: the chosen layout, why not each simpler one, and the
    fastest others that fit."""
    simpler = [t for t in tried if t.layout.simplicity() < best.layout.simplicity()]
    others = sorted((t for t in fit if t is not best and t not in simpler),
                    key=lambda t: -t.tokens_per_s_per_gpu)[:SHOWN_FASTER]
    return (_winner(best, fit, n),) + tuple(_line(t, best, n) for t in simpler + others)


def _plan(values: Mapping[str, Any], naming: Naming, lay: Layout, rank: str,
          hardware: dict | None = None) -> Tried:
    given = {**values, "parallel.mesh": "given", "parallel.tp": lay.tp,
             "parallel.pp": lay.pp, "parallel.cp": lay.cp, "parallel.ep": lay.ep}
    if lay.pp == 1:
        given.update(dict.fromkeys(PIPELINE_FIELDS))
    if lay.ep == 1:
        given["parallel.ep_imbalance"] = None  # given for the EP layouts only
    try:
        r = build_request(given, naming, hardware=hardware)
    except FitcheckError as exc:
        return Tried(layout=lay, problem=str(exc))
    return Tried(layout=lay, answer=plan(r, rank, search_fewest=False, references=False))


def _winner(best: Tried, fit: list[Tried], n: int) -> str:
    tps = best.tokens_per_s_per_gpu
    fastest = max(t.tokens_per_s_per_gpu for t in fit)
    how = ("the fastest layout that fits" if tps == fastest else
           f"the simplest layout within {TIE:.0%} of the fastest "
           f"({fastest:,.0f} tokens/s/GPU)")
    return (f"mesh {best.layout.label(n)}: {how}, {tps:,.0f} tokens/s/GPU predicted; "
            f"{len(fit)} of the layouts searched fit")


def _line(t: Tried, best: Tried | None, n: int) -> str:
    """Why not this layout."""
    head = f"not mesh {t.layout.label(n)}"
    if t.problem is not None:
        return f"{head}: not modelled here ({t.problem})"
    ans = t.answer
    if ans.recommendation is None:
        tightest = min(ans.estimates, key=lambda e: e.required_bytes, default=None)
        return f"{head}: " + ("no candidate" if tightest is None else
                              f"{why_not(tightest)} at best")
    e, st = ans.chosen()
    bubble = ""
    p = ans.request.training.pipeline
    if p.enabled:
        bubble = f", its pipeline bubble {bubble_ratio(p):.0%} of busy time"
    if best is None:
        return f"{head}: fits at {e.required_bytes / 2**30:.1f} GiB{bubble}"
    ratio = best.tokens_per_s_per_gpu / t.tokens_per_s_per_gpu
    word = (f"{ratio - 1:.0%} slower" if ratio > 1.005 else
            "as fast, not simpler" if ratio >= 1 else
            f"{1 / ratio - 1:.0%} faster but more complex (within the tie)")
    return (f"{head}: fits at {e.required_bytes / 2**30:.1f} GiB per GPU{bubble}, {word} "
            f"({st.tokens_per_s_per_gpu:,.0f} tokens/s/GPU)")
