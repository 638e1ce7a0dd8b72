"""Render an Answer as a table for people or as the JSON contract (docs/cli.md) for programs.

Bytes stay integers until here; GiB (2**30) is the only unit printed in tables.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from planner.error_bands import bands_json, bands_line
from planner.loss_dtype import assumption as loss_assumption
from planner.memory import DEFAULT_MARGIN, Estimate
from planner.params import active_params, total_params, trainable
from planner.pipeline import SPLIT_BACKWARD, V_SHAPED
from planner.candidates import label
from planner.plan import Answer, Found, interval
from planner.spec import (Allocator, Checkpointing, CompileMode, CpKv, GradSync, LossKind,
                          ModelSpec, Offload, Precision, Quantize, Strategy, TrainingSpec)
from planner.throughput import StepEstimate, default_compute_efficiency, efficiency_provenance

SCHEMA_VERSION = 1
GiB = 2**30


def gib(x: int) -> str:
    return f"{x / GiB:.1f}"


def model_json(model: ModelSpec, source: str) -> dict[str, Any]:
    return {
        "name": model.name,
        "source": source,
        "shape_assumed": model.shape_assumed,
        "params": total_params(model),
        "active_params": active_params(model),
        "layers": model.n_layers,
        "hidden": model.hidden,
        "heads": model.n_heads,
        "kv_heads": model.n_kv_heads,
        "head_dim": model.d_head,
        "ffn": model.ffn_hidden,
        "vocab": model.vocab,
        "tied_embeddings": model.tied_embeddings,
        "mlp": str(model.mlp),
        "norm": str(model.norm),
        "position": str(model.position),
        "experts": model.n_experts,
        "experts_per_token": model.experts_per_token,
    }


def breakdown_json(e: Estimate) -> dict[str, int]:
    out = e.breakdown.as_dict()
    out["allocator_overhead"] = e.allocator_overhead_bytes
    out["cuda_context"] = e.cuda_context_bytes
    out["nccl_buffers"] = e.nccl_bytes
    return out


def step_json(st: StepEstimate, ddp: StepEstimate) -> dict[str, Any]:
    return {
        "step_time_s": st.step_time_s,
        "tokens_per_s_per_gpu": st.tokens_per_s_per_gpu,
        "mfu": st.mfu,
        "compute_s": st.compute_s,
        "comm_s": st.comm_s,
        "exposed_comm_s": st.exposed_comm_s,
        "offload_s": st.offload_s,
        "slowdown_vs_ddp": st.slowdown_vs(ddp),
    }


def candidate_json(e: Estimate, st: StepEstimate | None = None,
                   ddp: StepEstimate | None = None, grad_accum: int | None = None,
                   compile: CompileMode = CompileMode.NONE, gpu: Any = None) -> dict[str, Any]:
    c = e.candidate
    speed = step_json(st, ddp) if st is not None and ddp is not None else {}
    if grad_accum is not None:
        speed["grad_accum"] = grad_accum  # what --global-batch needs with this candidate
    return {
        "strategy": str(c.strategy),
        "offload": str(c.offload),
        "checkpointing": str(c.checkpointing),
        "tp": c.tp,
        "fits": e.fits,
        "fits_gpu": e.fits_gpu,
        "fits_host": e.fits_host,
        "shard_degree": e.shard_degree,
        "peak_phase": str(e.peak_phase),
        "peak_allocated_bytes": e.peak_allocated_bytes,
        "peak_reserved_bytes": e.peak_reserved_bytes,
        "required_bytes": e.required_bytes,
        "device_used_bytes": e.device_used_bytes,
        "capacity_bytes": e.capacity_bytes,
        "usable_bytes": e.usable_bytes,
        "headroom_bytes": e.headroom_bytes,
        "breakdown_bytes": breakdown_json(e),
        "phase_allocated_bytes": e.phase_totals(),
        "phase_reserved_bytes": e.phase_reserved_bytes(),
        "host_bytes_per_node": e.host_bytes_per_node,
        "host_capacity_bytes": e.host_capacity_bytes,
        "notes": list(e.notes),
        "error_band": bands_json(c.strategy, compile, gpu),
        "risk": risk_json(e),
        **speed,
    }


def found_json(found: Found | None) -> dict[str, Any] | None:
    if found is None:
        return None
    rec = found.answer.recommendation
    return {
        "question": found.question,
        "value": found.value,
        "candidate": None if rec is None or found.value is None else {
            "strategy": str(rec.candidate.strategy),
            "offload": str(rec.candidate.offload),
            "checkpointing": str(rec.candidate.checkpointing),
            "tp": rec.candidate.tp,
        },
    }


def answer_json(answer: Answer, found: Found | None = None) -> dict[str, Any]:
    q = answer.request
    t, cl = q.training, q.cluster
    rec = answer.recommendation
    return {
        "schema_version": SCHEMA_VERSION,
        "inputs": {
            "model": (q.traced.as_json() if q.traced is not None
                      else model_json(q.model, q.model_source)),
            "training": training_json(t),
            "finetune": finetune_json(q),
            "deepspeed": deepspeed_json(t),
            "hardware": {
                "gpu": cl.gpu.id,
                "gpu_name": cl.gpu.name,
                "capacity_bytes": cl.gpu.memory_bytes,
                "n_gpus": cl.n_gpus,
                "gpus_per_node": cl.gpus_per_node,
                "n_nodes": cl.n_nodes,
                "host_ram_bytes_per_node": cl.host_ram_bytes_per_node,
                "compute_efficiency": default_compute_efficiency(cl.gpu, t.compile),
                "compute_efficiency_provenance": efficiency_provenance(cl.gpu, t.compile),
                "compute_efficiency_source": cl.gpu.sources.get(
                    _efficiency_key(cl.gpu, t.compile)),
            },
            "strategies": [str(s) for s in q.options.strategies],
            "offload": "auto" if q.options.offloads is None else [str(o) for o in q.options.offloads],
            "checkpointing": str(q.options.checkpointing),
            "margin": q.options.margin,
            "at_risk": q.options.at_risk,
            "global_batch": q.options.global_batch,
            "tp": "auto" if q.options.tp is None else q.options.tp,
            "pp": {"degree": t.pipeline.degree, "schedule": str(t.pipeline.schedule),
                   "microbatches": t.pipeline.microbatches,
                   "virtual_stages": t.pipeline.virtual,
                   "kept_outputs": str(t.pipeline.kept_outputs)},
            "cp": t.cp, "cp_rotate": str(t.cp_rotate), "cp_kv": str(t.cp_kv),
            "ep": t.ep, "ep_imbalance": t.ep_imbalance,
            "mesh": "given",  # the degrees above as given; `--mesh auto`: the cli says "auto"
        },
        "candidates": [candidate_json(e, st, d, t.grad_accum, t.compile, cl.gpu) for e, st, d
                       in zip(answer.estimates, answer.steps, answer.ddp_steps)],
        "recommendation": None if rec is None else {
            "strategy": str(rec.candidate.strategy),
            "offload": str(rec.candidate.offload),
            "checkpointing": str(rec.candidate.checkpointing),
            "tp": rec.candidate.tp,
            "reasons": list(rec.reasons),
            "error_band": bands_json(rec.candidate.strategy, t.compile, cl.gpu),
            "risk": risk_json(answer.chosen()[0]),
        },
        "calibration": q.runtime.calibration,
        "min_gpus": answer.min_gpus,
        "found": found_json(found),
        "skipped": list(answer.skipped),
        "assumptions": assumptions(answer),
    }


def _efficiency_key(gpu, compile: CompileMode) -> str:
    """The profile field ``default_compute_efficiency`` reads for this mode."""
    return ("compiled_compute_efficiency" if compile is not CompileMode.NONE
            and gpu.compiled_compute_efficiency is not None else "compute_efficiency")


def efficiency_line(gpu, compile: CompileMode) -> str | None:
    """The assumption line for a compute efficiency that is not measured on the GPU's family
    (None when it is measured)."""
    prov = efficiency_provenance(gpu, compile)
    if prov == "measured":
        return None
    how = ("from a measured sibling GPU by the roofline (peak FLOP/s and HBM bandwidth; the "
           "profile's [sources] and docs/throughput.md §2 give the numbers)" if prov == "derived"
           else "without a measurement (the profile's [sources])")
    return (f"compute efficiency {default_compute_efficiency(gpu, compile):.3f} of the dense "
            f"peak ({gpu.id}): {prov.upper()} {how}, not measured on this GPU family; the "
            "tokens/s band is widened for it")


def training_json(t) -> dict[str, Any]:
    """The training loop planned, one key per ``training.*`` registry field that is an
    attribute of the run (planner.request.TRAINING_ATTRS: --global-batch is a search option,
    echoed beside the others), and the loss's chunk count after the loss."""
    from planner.fields import FIELDS
    from planner.request import TRAINING_ATTRS

    out: dict[str, Any] = {}
    for f in FIELDS:
        if f.section == "training" and f.key in TRAINING_ATTRS:
            out[f.key] = _plain(getattr(t, f.key))
            if f.key == "loss":
                out["loss_chunks"] = t.loss_chunks
    return out


def deepspeed_json(t) -> dict[str, Any]:
    """The DeepSpeed engine settings the ZeRO candidates were planned with, one key per
    registry field (planner/fields.py section "deepspeed"; "auto" values already filled in
    from the model by planner.request.resolve_deepspeed)."""
    from planner.fields import FIELDS

    return {f.key: _plain(getattr(t.deepspeed, f.key)) for f in FIELDS
            if f.section == "deepspeed"}


def _plain(v: Any) -> Any:
    if isinstance(v, tuple):  # a list of names (training.sac_force_recompute)
        return [_plain(x) for x in v]
    return v if v is None or isinstance(v, (bool, int, float)) else str(v)


def finetune_json(q) -> dict[str, Any]:
    ft = q.training.finetune
    T = trainable(q.model, ft)
    return {
        "lora_rank": ft.lora_rank, "lora_targets": list(ft.lora_targets) if ft.lora else [],
        "lora_dtype": "fp32" if ft.lora_fp32 else "base", "lora_dropout": ft.lora_dropout,
        "quantize_base": str(ft.quantize_base), "double_quant": ft.double_quant,
        "freeze_embeddings": ft.freeze_embeddings, "freeze_layers": ft.freeze_layers,
        "train_last_layers": ft.train_last_layers, "trainable_params": T.train,
    }


def cp_words(t: TrainingSpec) -> str:
    """', context parallel 4 (allgather): 16384 tokens per GPU' ('' without CP)."""
    if t.cp <= 1:
        return ""
    return (f", context parallel {t.cp} ({t.cp_rotate} ring): {t.local_seq} tokens of each "
            "sequence per GPU")


def finetune_line(q) -> str | None:
    """'LoRA r 8 on q, v: 4,194,304 trainable (0.06 %), fp32 adapters' (None: full training)."""
    ft = q.training.finetune
    if ft.full:
        return None
    T = trainable(q.model, ft)
    share = f"{T.train:,} trainable ({T.train / total_params(q.model):.2%})"
    if ft.lora:
        base = "" if ft.quantize_base is Quantize.NONE else (
            f", {ft.quantize_base} base" + (" (double quant)" if ft.double_quant
                                            and ft.quantize_base is Quantize.NF4 else ""))
        return (f"LoRA r {ft.lora_rank} on {', '.join(ft.lora_targets)}: {share}, "
                f"{'fp32' if ft.lora_fp32 else 'base-dtype'} adapters{base}"
                + (", dropout" if ft.lora_dropout else ""))
    parts = []
    if ft.train_last_layers:
        parts.append(f"all but the last {ft.train_last_layers} blocks")
    if ft.freeze_embeddings:
        parts.append("embeddings" + (" (and the tied head)" if q.model.tied_embeddings else ""))
    if ft.freeze_layers:
        parts.append(f"the first {ft.freeze_layers} blocks")
    return f"frozen {' and '.join(parts)}: {share}"


def assumptions(answer: Answer) -> list[str]:
    q = answer.request
    ov = q.runtime.overheads
    out = []
    if q.model.shape_assumed:
        out.append(f"shape assumed from the parameter count ({q.model.n_layers} layers x "
                   f"{q.model.hidden} hidden, vocab {q.model.vocab}); pass --model, --config or "
                   "shape flags for a real one")
    cal = q.runtime.calibration
    out.append("calibration: none (raw analytic model; defaults below)" if cal is None else
               f"calibration {cal['id']} from {cal['source']}"
               + (f" (STALE: {cal['stale'].split(' is stale: ', 1)[-1]})"
                  if cal.get("stale") else ""))
    out += [
        "bf16/fp16-amp: torch.autocast over fp32 params for DDP and 1 GPU; FSDP2 "
        "MixedPrecisionPolicy(param_dtype=low, reduce_dtype=fp32); DeepSpeed bf16 module + fp32 master for ZeRO",
        "FSDP units: one per transformer block plus the root (embeddings, final norm, head)",
        f"runtime: CUDA context {gib(q.cluster.gpu.cuda_context_bytes)} GiB, NCCL "
        f"{gib(ov.nccl_bytes_per_communicator)} GiB per communicator, cuBLAS workspace "
        f"{ov.cublas_workspace_bytes // 2**20} MiB, allocator reserved/allocated "
        + ("1.00 with expandable segments" if q.training.allocator is Allocator.EXPANDABLE
           else f"{1 + ov.allocator_fragmentation:.2f}") + " (not releasable)",
        "fits = the 90% interval of the needed memory, from the planner's measured error on "
        "public runs of that kind of job (docs/accuracy.md §5), is within capacity x (1 - "
        f"margin {q.options.margin:g}); at risk = the interval straddles it (the probability "
        "of running out of memory is shown); does not fit = all of it is above. The "
        "allocator's cache of freed segments is not counted: it is released before an "
        "out-of-memory"
        + ("" if q.options.margin != DEFAULT_MARGIN else
           "; no margin by default: the interval covers the measured error"),
    ]
    t = q.training
    eff = efficiency_line(q.cluster.gpu, t.compile)
    if eff:
        out.append(eff)
    loss = f"chunked:{t.loss_chunks}" if t.loss is LossKind.CHUNKED else str(t.loss)
    out.append(f"training loop: gradients synced {'every micro-batch' if t.grad_sync is GradSync.EVERY else 'on the last micro-batch only'}, "
               f"loss {loss}{' (logits kept through backward)' if t.keep_logits else ''}, "
               f"compile {t.compile}, allocator {t.allocator}, FSDP{t.fsdp_version}, init {t.init}"
               + (f", float8 {t.float8}{' (float8 all-gather)' if t.float8_all_gather else ''}"
                  if t.float8.value != "none" else ""))
    ds_line = deepspeed_assumption(t)
    if ds_line:
        out.append(ds_line)
    loss_line = loss_assumption(q.model, t)
    if loss_line:
        out.append(f"loss: {loss_line}")
    if q.attention:
        out.append(q.attention)
    ft = finetune_line(q)
    out.append(f"fine-tuning: {ft}" if ft else "fine-tuning: none (every parameter trains)")
    tp = q.options.tp
    out.append(("tensor parallel: auto (TP 2/4/8 with sequence parallel, FSDP over the rest, "
                "tried only when nothing fits without it)" if tp is None else
                f"tensor parallel: {tp}" + (" (with sequence parallel)" if tp > 1 else ""))
               + cp_assumption(t) + ("; pipeline parallel: none" if not t.pipeline.enabled
                                     else "") + ep_assumption(t))
    if t.pipeline.enabled:
        out.append(pipeline_line(t))
    return out


def pipeline_line(t) -> str:
    """The pipeline the plan assumed (``--pp``), or that there is none."""
    p = t.pipeline
    v = ((" in a V (rank 0 holds the first and the last stage)" if p.schedule in V_SHAPED
          else "")
         + ("; the backward split into input and weight steps in the schedule's own order, "
            "the bubble from its action lists at *assumed* equal forward, input- and "
            "weight-backward times, no activation checkpointing"
            if p.schedule in SPLIT_BACKWARD else ""))
    kept = {"last": "; the last stage's logits of every micro-batch kept to the step's end "
                    "(torch's output_chunks, return_outputs=True)",
            "all": "; every stage's output of every micro-batch kept to the step's end "
                   "(torch's output_chunks before PR #153383)"}.get(str(p.kept_outputs), "")
    return (f"pipeline parallel: {p.degree} ranks, schedule {p.schedule}, {p.virtual} "
            f"stage(s) per rank{v}, {p.microbatches} micro-batches of {t.micro_batch} per "
            f"step{kept}; "
            "torchtitan's layer split (embedding and head count as a layer each), FSDP2 "
            "inside each stage not resharded after forward or backward until the "
            "stage's gradient reduction after its last backward; the fullest rank decides "
            "the fit; the public pipeline-parallel runs (torchtitan's 405B tables) use what "
            "fitcheck does not model and are not fitted: the error band shown is FSDP's and "
            "the step time *assumed* (docs/model.md §8.7, docs/accuracy.md §2.1)")


def cp_assumption(t: TrainingSpec) -> str:
    """The context-parallel part of the parallelism assumption line."""
    if t.cp <= 1:
        return "; context parallel: none"
    kv = ("keys and values repeated to the query heads" if t.cp_kv is CpKv.REPEATED else
          "keys and values with the model's key/value heads (enable_gqa)")
    return (f"; context parallel: {t.cp} (torch's ring attention, {t.cp_rotate} rotation "
            f"counted on the critical path, assumed not overlapped; {kv}; FSDP2 over "
            "dp_shard x cp)")


def ep_assumption(t: TrainingSpec) -> str:
    """The expert-parallel part of the parallelism assumption line."""
    if t.ep <= 1:
        return "; expert parallel: none"
    return (f"; expert parallel: {t.ep} (torchtitan's all-to-all token dispatch, dropless, "
            f"the busiest GPU's experts receiving {t.ep_imbalance:g} x the balanced "
            "tokens x top_k, *assumed*; the all-to-alls counted on the critical path, "
            "assumed not overlapped; FSDP2 over every GPU for the dense parameters and over "
            "GPUs / ep for each GPU's experts; derived from torchtitan's source and checked "
            "against the whole step traced on fake tensors at small widths (docs/model.md "
            "\"Expert parallel\"))")


def deepspeed_assumption(t) -> str | None:
    """Which optimizer wrapper and master dtypes DeepSpeed runs, when the settings change them
    (planner/memory/zero.py)."""
    ds = t.deepspeed
    parts = []
    if ds.grad_accum_dtype is not None:
        parts.append(f"grad_accum_dtype {ds.grad_accum_dtype}"
                     + (": zero1 without offload runs BF16_Optimizer (a full fp32 gradient "
                        "buffer beside the bf16 grads); ZeRO-2/3 do not read it"
                        if ds.grad_accum_dtype == "fp32" and t.precision is Precision.BF16_AMP
                        else ": no memory change"))
    if ds.bf16_master_weights_and_grads:
        parts.append("bf16 master weights and stepped gradients, optimizer states in "
                     + ("bf16" if ds.bf16_optimizer_states else "fp32 (on the host)"))
    return "DeepSpeed: " + "; ".join(parts) if parts else None


def why_never(q) -> str:
    """Why more GPUs of the type do not help."""
    unsharded = [s for s in q.options.strategies if s in (Strategy.DDP, Strategy.NO_SHARD)]
    if len(unsharded) == len(q.options.strategies):
        verb = "keeps" if len(unsharded) == 1 else "keep"
        hint = ("DeepSpeed's 1-bit optimizers run without ZeRO: try another optimizer with "
                "a sharded strategy" if q.training.optimizer.onebit
                else "try a sharded strategy")
        return (f"{' and '.join(map(str, unsharded))} {verb} every parameter, gradient and "
                f"optimizer state on every GPU, so more GPUs do not shrink them ({hint})")
    return ("per-GPU activations or working set alone exceed capacity, or the high end of "
            "their interval does (try a shorter --seq or --micro-batch, or checkpointing)")


def _label(e: Estimate) -> list[str]:
    c = e.candidate
    return [str(c.strategy) + (f"+tp{c.tp}" if c.tp > 1 else ""),
            str(c.offload) if c.offload is not Offload.NONE else "-",
            str(c.checkpointing) if c.checkpointing is not Checkpointing.NONE else "-"]


def columns(rows: list[list[str]], headers: list[str], left: int) -> str:
    """A plain fixed-width table (tabulate's "simple" layout): the first `left` columns
    left-aligned, the rest right-aligned. Written here rather than imported because
    tabulate >= 0.10 reads its version through importlib.metadata at import, about 30 ms,
    which the planning fast path (benchmarks/startup.py) cannot afford."""
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(len(headers))]

    def line(cells: list[str]) -> str:
        out = [str(c).ljust(w) if i < left else str(c).rjust(w)
               for i, (c, w) in enumerate(zip(cells, widths))]
        return "  ".join(out).rstrip()

    return "\n".join([line(headers), "  ".join("-" * w for w in widths)] + [line(r) for r in rows])


Row = tuple  # (Estimate, StepEstimate, DDP's StepEstimate)


def _runtime(e: Estimate) -> int:
    return (e.breakdown.cublas_workspace + e.allocator_overhead_bytes + e.cuda_context_bytes
            + e.nccl_bytes)


def _fits(e: Estimate) -> str:
    """✓ fits; 'risk 43%' at risk (the probability of running out of memory); ✗ does not."""
    if not e.fits_host:
        return "✗ host"
    if e.fits_gpu:
        return "✓"
    if e.may_fit_gpu:
        return f"risk {e.oom_probability:.0%}"
    return "✗"


def risk_json(e: Estimate) -> dict[str, Any]:
    """The verdict with the risk (docs/cli.md): outcome, oom_probability, the need's interval
    and the band it is from."""
    return {"outcome": e.outcome,
            "oom_probability": None if e.risk is None else round(e.oom_probability, 4),
            "required_low_bytes": e.required_low_bytes,
            "required_high_bytes": e.required_high_bytes,
            "band": None if e.risk is None else e.risk.as_dict()}


# (header, cell) per column. One format per column: GiB with one decimal, seconds with three,
# milliseconds with one, tokens/s as an integer.
MEMORY_COLUMNS: list[tuple[str, Callable[[Row], str]]] = [
    ("params", lambda r: gib(r[0].breakdown.params)),
    ("grads", lambda r: gib(r[0].breakdown.gradients)),
    ("optim", lambda r: gib(r[0].breakdown.optimizer_states
                            + r[0].breakdown.optimizer_temporaries)),
    ("gathered", lambda r: gib(r[0].breakdown.gathered_params)),
    ("activ", lambda r: gib(r[0].breakdown.activations)),
    ("transient", lambda r: gib(r[0].breakdown.transients)),
    ("buffers", lambda r: gib(r[0].breakdown.comm_buffers)),
    ("runtime", lambda r: gib(_runtime(r[0]))),
    ("reserved", lambda r: gib(r[0].peak_reserved_bytes)),
    ("needs GiB", lambda r: gib(r[0].required_bytes)),
    ("usable", lambda r: gib(r[0].usable_bytes)),
    ("fits", lambda r: _fits(r[0])),
    ("headroom", lambda r: gib(r[0].headroom_bytes)),
]
SPEED_COLUMNS: list[tuple[str, Callable[[Row], str]]] = [
    ("step s", lambda r: f"{r[1].step_time_s:.3f}"),
    ("tokens/s/GPU", lambda r: f"{r[1].tokens_per_s_per_gpu:,.0f}"),
    ("MFU", lambda r: f"{r[1].mfu:.0%}"),
    ("exposed comm ms", lambda r: f"{r[1].exposed_comm_s * 1e3:.1f}"),
    ("offload s", lambda r: f"{r[1].offload_s:.3f}"),
    ("vs DDP", lambda r: f"{r[1].slowdown_vs(r[2]):.2f}x"),
    ("fits", lambda r: _fits(r[0])),
]
COMPACT_ORDER = ("needs GiB", "fits", "headroom", "step s", "tokens/s/GPU", "MFU", "usable",
                 "activ", "params", "grads", "optim", "gathered", "buffers", "runtime",
                 "transient", "reserved", "vs DDP", "exposed comm ms", "offload s")
"""Compact mode adds columns in this order while the table fits the terminal."""
MEMORY_NOTE = ("(GiB per GPU at each candidate's peak moment; needs = the terms to its left: "
               "runtime = CUDA context + NCCL + cuBLAS workspace + what the allocator cannot "
               "release; reserved = max_memory_reserved, with the cache it would release "
               "before an out-of-memory)")


def _compact(rows: list[Row], width: int) -> str:
    cells = dict(MEMORY_COLUMNS + SPEED_COLUMNS)
    chosen: list[str] = []
    for name in COMPACT_ORDER:
        trial = [n for n in COMPACT_ORDER if n in chosen or n == name]
        text = columns([_label(r[0]) + [cells[n](r) for n in trial] for r in rows],
                       ["strategy", "offload", "ckpt", *trial], left=3)
        if chosen and max(map(len, text.splitlines())) > width:
            break
        chosen = trial
    return columns([_label(r[0]) + [cells[n](r) for n in chosen] for r in rows],
                   ["strategy", "offload", "ckpt", *chosen], left=3)


def _wrap(text: str, width: int, indent: str = "") -> list[str]:
    import textwrap

    return textwrap.wrap(text, width=max(width, 40), subsequent_indent=indent,
                         break_long_words=False, break_on_hyphens=False) or [""]


def table(answer: Answer, found: Found | None = None, *, width: int = 100,
          wide: bool = False) -> str:
    """The plan for people. ``wide``: the full memory and speed tables; otherwise one table
    with as many columns as fit in ``width`` characters (the terminal's)."""
    q = answer.request
    m, t, cl = q.model, q.training, q.cluster
    lines: list[str] = []
    wrap_width = 10**6 if wide else width
    shape = (f"{m.n_layers} layers, hidden {m.hidden}, {m.n_heads} heads ({m.n_kv_heads} kv), "
             f"ffn {m.ffn_hidden}, vocab {m.vocab}")
    assumed = " [shape ASSUMED from --params]" if m.shape_assumed else ""
    active = active_params(m)
    n_total = total_params(m)
    params = f"{n_total / 1e9:.2f}B params" + (f" ({active / 1e9:.2f}B active)" if active != n_total else "")
    head = [f"model     {m.name}: {params}; {shape}{assumed}"]
    if q.options.global_batch is not None:
        head.append(f"global    {q.options.global_batch} sequences per step requested -> "
                    f"grad-accum {t.grad_accum} ({t.grad_accum * t.micro_batch * cl.n_gpus} "
                    "sequences)")
    head.append(f"training  seq {t.seq}, micro-batch {t.micro_batch}, grad-accum {t.grad_accum}, "
                f"{t.precision}, {t.optimizer} ({t.optimizer_impl}"
                f"{', in backward' if t.optimizer_in_backward else ''}), attention {t.attention}"
                + cp_words(t))
    ft = finetune_line(q)
    if ft:
        head.append(f"finetune  {ft}")
    head.append(f"hardware  {cl.n_gpus} x {cl.gpu.name} ({gib(cl.gpu.memory_bytes)} GiB), "
                f"{cl.gpus_per_node} per node, {cl.n_nodes} node(s), host RAM "
                f"{gib(cl.host_ram_bytes_per_node)} GiB per node")
    for h in head:
        lines += _wrap(h, wrap_width, " " * 10)
    lines.append("")
    rows = list(zip(answer.estimates, answer.steps, answer.ddp_steps))
    tp_note = ("; +tpN rows: a tensor-parallel group of N GPUs shares each micro-batch"
               if any(e.candidate.tp > 1 for e in answer.estimates) else "")
    pp = t.pipeline
    step_note = (f"(one optimizer step = {t.grad_accum} micro-batch(es) of {t.micro_batch} x "
                 f"{t.local_seq} tokens per GPU; vs DDP = step time over DDP's with the same "
                 f"checkpointing, whether or not DDP fits{tp_note})") if not pp.enabled else (
        f"(one optimizer step = {pp.microbatches} micro-batches of {t.micro_batch} x {t.seq} "
        f"tokens through {pp.degree} pipeline ranks; vs DDP: not meaningful under --pp, the "
        "same pipeline is its reference)")
    if wide:
        for cols, note in ((MEMORY_COLUMNS, MEMORY_NOTE), (SPEED_COLUMNS, step_note)):
            lines.append(columns([_label(r[0]) + [cell(r) for _, cell in cols] for r in rows],
                                 ["strategy", "offload", "ckpt", *(h for h, _ in cols)], left=3))
            lines.append(note)
            lines.append("")
    else:
        lines.append(_compact(rows, width))
        per_step = (f"{t.grad_accum} x {t.micro_batch} x {t.local_seq} tokens per GPU"
                    if not pp.enabled else f"{pp.microbatches} x {t.micro_batch} x {t.seq} "
                    f"tokens through {pp.degree} pipeline ranks")
        lines += _wrap("(GiB per GPU at each candidate's peak moment; step time of one optimizer "
                       f"step of {per_step}{tp_note}; --wide for every term)", width)
        lines.append("")
    if found is not None:
        what = {"min-gpus": "fewest GPUs", "max-micro-batch": "largest micro-batch",
                "max-seq": "largest sequence length"}[found.question]
        if found.value is None:
            lines.append(f"found: no {what} fits (shown: the plan at the smallest value)")
        else:
            c = answer.recommendation.candidate if answer.recommendation else None
            lines += _wrap(f"found: {what} = {found.value}"
                           + (f" (with {c.strategy}, checkpointing {c.checkpointing}, offload "
                              f"{c.offload}{f', TP {c.tp}' if c.tp > 1 else ''})" if c else ""),
                           wrap_width, "  ")
    rec = answer.recommendation
    if rec is not None:
        c = rec.candidate
        extra = "".join([
            f" + TP {c.tp}" if c.tp > 1 else "",
            f" + {c.checkpointing} checkpointing" if c.checkpointing is not Checkpointing.NONE else "",
            f" + {c.offload} offload" if c.offload is not Offload.NONE else ""])
        lines.append(f"recommendation: {c.strategy}{extra}")
        for r in rec.reasons:
            lines += _wrap(f"  - {r}", wrap_width, "    ")
        band = bands_line(c.strategy, t.compile, cl.gpu)
        if band:
            lines += _wrap(f"  - {band}", wrap_width, "    ")
        e, _ = answer.chosen()
        if e is not None and e.risk is not None:
            lines += _wrap(f"  - risk: {e.oom_probability:.1%} probability of running out of "
                           f"memory; {e.risk.text()}", wrap_width, "    ")
    risky = False
    if rec is None:
        e, st = answer.least_risk()
        risky = e is not None
        if e is not None:
            lines += _wrap(f"at risk: {label(e.candidate)} needs {gib(e.required_bytes)} GiB"
                           f"{interval(e)} of {gib(e.usable_bytes)} GiB usable per GPU, "
                           f"{e.oom_probability:.0%} probability of running out of memory "
                           f"({e.risk.text()})", wrap_width, "  ")
    if rec is None and answer.min_gpus is not None:
        lines += _wrap(f"does not fit{' for sure' if risky else ''}: needs {answer.min_gpus} "
                       f"GPUs of this type ({cl.gpu.id}) with the best of these candidates",
                       wrap_width, "  ")
    elif rec is None:
        lines += _wrap(f"does not fit{' for sure' if risky else ''} on any number of GPUs of "
                       "this type: " + why_never(q), wrap_width, "  ")
    for s in answer.skipped:
        lines += _wrap(f"skipped: {s}", wrap_width, "  ")
    lines.append("")
    lines.append("assumptions:")
    for a_ in assumptions(answer):
        lines += _wrap(f"  - {a_}", wrap_width, "    ")
    return "\n".join(lines)
